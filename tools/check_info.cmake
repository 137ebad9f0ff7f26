# SPDX-License-Identifier: Apache-2.0
# Checks on dlsync-info, run by ctest through cmake -P.
#   -DINFO=<dlsync-info> -DMODE=json -DPYTHON=<python3>: --json exits 0 and
#     prints one valid JSON object with the expected sections.
#   -DINFO=<dlsync-info> -DMODE=usage: --help exits 0 and prints usage on
#     stdout; an unknown option exits 2 and prints usage on stderr.
#   -DINFO=<dlsync-info> -DMODE=version -DLIB=<libdlsync file>: --version exits
#     0, names matching library and header versions and the libdlsync loaded.
#   -DINFO=<dlsync-info> -DMODE=selftest: --selftest exits 77 saying there is
#     nothing to test where there is no GPU; on a GPU it exits 0 with PASS.
#   -DINFO=<dlsync-info> -DMODE=combos -DPYTHON=<python3>: options combine
#     (getopt_long): --json --version prints one JSON object; --version
#     --selftest runs both; --help --bogus, --json --selftest and a stray
#     argument are usage errors (exit 2, usage on stderr); a value given to
#     an option that takes none (--version=1, --json=x, --vers=1) is one too,
#     and the message names that option as it was written.
#   -DINFO=<dlsync-info-hwloc-dl> -DLINKED=<dlsync-info> -DMODE=hwloc_dlopen:
#     the variant that loads libhwloc at run time (the wheel's) NEEDs no
#     libhwloc and prints the same machine line as the one linked with it.
if(NOT INFO)
  message(FATAL_ERROR "pass -DINFO=<path of dlsync-info>")
endif()

if(MODE STREQUAL "json")
  set(check [=[
import json, sys
d = json.load(sys.stdin)
assert isinstance(d, dict), "not an object"
for key in ("dlsync", "driver", "gpus", "capabilities", "machine", "ok"):
    assert key in d, "missing key " + key
assert d["ok"] is True, "ok is false"
]=])
  execute_process(COMMAND ${INFO} --json
                  COMMAND ${PYTHON} -c "${check}"
                  RESULTS_VARIABLE rcs
                  ERROR_VARIABLE err)
  if(NOT rcs STREQUAL "0;0")
    message(FATAL_ERROR "dlsync-info --json | json check: exit codes ${rcs}\n${err}")
  endif()
elseif(MODE STREQUAL "combos")
  set(check [=[
import json, sys
d = json.load(sys.stdin)
assert d["library_version"] == d["headers_version"], d
assert d["versions_match"] is True, d
assert d["libdlsync"], d
assert "libcuda" in d and "libhwloc" in d, d
]=])
  execute_process(COMMAND ${INFO} --json --version
                  COMMAND ${PYTHON} -c "${check}"
                  RESULTS_VARIABLE rcs ERROR_VARIABLE err)
  if(NOT rcs STREQUAL "0;0")
    message(FATAL_ERROR "dlsync-info --json --version | json check: exit codes ${rcs}\n${err}")
  endif()
  execute_process(COMMAND ${INFO} --version --selftest RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  set(both_ran 0)
  if(out MATCHES "^dlsync library [0-9]+\\.[0-9]+\\.[0-9]+(\\.dev[0-9]+)? ")
    if(rc EQUAL 77 AND out MATCHES "nothing to test")
      set(both_ran 1)
    elseif(rc EQUAL 0 AND out MATCHES "selftest: PASS")
      set(both_ran 1)
    endif()
  endif()
  if(NOT both_ran)
    message(FATAL_ERROR "--version --selftest: exit ${rc}, not both ran\n${out}\n${err}")
  endif()
  foreach(args "--help;--bogus" "--bogus;--help" "--json;--selftest" "--version;stray" "-x")
    execute_process(COMMAND ${INFO} ${args} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: dlsync-info" OR NOT out STREQUAL "")
      message(FATAL_ERROR "dlsync-info ${args}: exit ${rc} (want 2)\nstdout: ${out}\nstderr: ${err}")
    endif()
  endforeach()
  foreach(arg "--version=1" "--json=x" "--vers=1" "--help=")
    execute_process(COMMAND ${INFO} ${arg} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                    ERROR_VARIABLE err)
    string(FIND "${err}" "dlsync-info: option takes no value '${arg}'\n" at)
    if(NOT rc EQUAL 2 OR at LESS 0 OR NOT out STREQUAL "")
      message(FATAL_ERROR "dlsync-info ${arg}: exit ${rc} (want 2, naming ${arg})\nstdout: ${out}\nstderr: ${err}")
    endif()
  endforeach()
elseif(MODE STREQUAL "usage")
  execute_process(COMMAND ${INFO} --help RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "usage: dlsync-info" OR NOT err STREQUAL "")
    message(FATAL_ERROR "--help: exit ${rc}\nstdout: ${out}\nstderr: ${err}")
  endif()
  execute_process(COMMAND ${INFO} --no-such-option RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "usage: dlsync-info" OR NOT out STREQUAL "")
    message(FATAL_ERROR "unknown option: exit ${rc} (want 2)\nstdout: ${out}\nstderr: ${err}")
  endif()
elseif(MODE STREQUAL "version")
  execute_process(COMMAND ${INFO} --version RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  file(REAL_PATH "${LIB}" lib)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "dlsync library ([0-9]+\\.[0-9]+\\.[0-9]+(\\.dev[0-9]+)?) \\(([0-9]+)\\), headers ([0-9.a-z]+) \\(([0-9]+)\\)\n"
     OR NOT CMAKE_MATCH_1 STREQUAL CMAKE_MATCH_4 OR NOT CMAKE_MATCH_3 STREQUAL CMAKE_MATCH_5)
    message(FATAL_ERROR "--version: exit ${rc}, versions not found or differ\nstdout: ${out}\nstderr: ${err}")
  endif()
  string(FIND "${out}" "libdlsync: ${lib}\n" at)
  if(at LESS 0 OR NOT out MATCHES "\nlibcuda: " OR NOT out MATCHES "\nlibhwloc: ")
    message(FATAL_ERROR "--version does not name ${lib}, libcuda and libhwloc:\n${out}")
  endif()
elseif(MODE STREQUAL "hwloc_dlopen")
  execute_process(COMMAND readelf -d ${INFO} RESULT_VARIABLE rc OUTPUT_VARIABLE dyn)
  if(NOT rc EQUAL 0 OR dyn MATCHES "NEEDED[^\n]*hwloc")
    message(FATAL_ERROR "${INFO} NEEDs libhwloc (or readelf failed, exit ${rc}):\n${dyn}")
  endif()
  foreach(which INFO LINKED)
    execute_process(COMMAND ${${which}} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    if(NOT rc EQUAL 0 OR NOT out MATCHES "\n(machine: [0-9]+ packages?, [^\n]*)\n")
      message(FATAL_ERROR "${${which}}: exit ${rc}, no machine line\n${out}\n${err}")
    endif()
    set(machine_${which} "${CMAKE_MATCH_1}")
  endforeach()
  if(NOT machine_INFO STREQUAL machine_LINKED)
    message(FATAL_ERROR "hwloc loaded at run time: '${machine_INFO}', linked: '${machine_LINKED}'")
  endif()
elseif(MODE STREQUAL "selftest")
  execute_process(COMMAND ${INFO} --selftest RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(rc EQUAL 77)
    if(NOT out MATCHES "nothing to test")
      message(FATAL_ERROR "--selftest exit 77 without saying why:\n${out}")
    endif()
    message(STATUS "no GPU: ${out}")
  elseif(NOT rc EQUAL 0 OR NOT out MATCHES "\nselftest: PASS")
    message(FATAL_ERROR "--selftest: exit ${rc}\n${out}\n${err}")
  endif()
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
