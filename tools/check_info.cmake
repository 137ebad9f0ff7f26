# Checks on dlsync-info, run by ctest through cmake -P.
#   -DINFO=<dlsync-info> -DMODE=json -DPYTHON=<python3>: --json exits 0 and
#     prints one valid JSON object with the expected sections.
#   -DINFO=<dlsync-info> -DMODE=usage: --help exits 0 and prints usage on
#     stdout; an unknown option exits 2 and prints usage on stderr.
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
else()
  message(FATAL_ERROR "unknown MODE '${MODE}'")
endif()
