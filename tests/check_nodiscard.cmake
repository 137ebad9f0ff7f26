# SPDX-License-Identifier: Apache-2.0
# The guards of dlsync.hpp are [[nodiscard]]: an unnamed temporary, which
# would end at its semicolon, does not compile with -Werror; the same guard
# named compiles (the control: the failure is the temporary, not the file).
#   cmake -DCXX=<c++> -DINCLUDE=<include> -DWORK=<dir> -P check_nodiscard.cmake
foreach(v CXX INCLUDE WORK)
  if(NOT ${v})
    message(FATAL_ERROR "pass -D${v}=")
  endif()
endforeach()
set(head "#include <dlsync/dlsync.hpp>\nvoid f(dlsync::stream_t a, dlsync::stream_t b, dlsync_lane *ls, dlsync_lane &c) {\n")
# Bodies hold semicolons: one variable per case, not a list.
set(body_named "  dlsync::exchange ex(a, b);\n  dlsync::exchange_many m(ls, 2, c);\n  dlsync::exchange_fanout fo(c, ls, 2);\n  dlsync::fence fe(a);\n")
set(body_exchange "  dlsync::exchange(a, b);\n")
set(body_exchange_many "  dlsync::exchange_many(ls, 2, c);\n")
set(body_exchange_fanout "  dlsync::exchange_fanout(c, ls, 2);\n")
set(body_fence "  dlsync::fence(a);\n")
set(body_env_stream_scope "  dlsync::env_stream_scope(2, 0, nullptr);\n")
file(MAKE_DIRECTORY ${WORK})
foreach(name named exchange exchange_many exchange_fanout fence env_stream_scope)
  if(name STREQUAL "named")
    set(must_fail 0)
  else()
    set(must_fail 1)
  endif()
  file(WRITE ${WORK}/nodiscard_${name}.cpp "${head}${body_${name}}}\n")
  execute_process(COMMAND ${CXX} -std=c++17 -fsyntax-only -Wall -Werror -I${INCLUDE}
                          ${WORK}/nodiscard_${name}.cpp
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(must_fail AND rc EQUAL 0)
    message(FATAL_ERROR "an unnamed dlsync::${name} temporary compiled with -Werror: no [[nodiscard]]")
  elseif(must_fail AND NOT err MATCHES "nodiscard|unused|discard")
    message(FATAL_ERROR "dlsync::${name} temporary: failed, but not for [[nodiscard]]:\n${err}")
  elseif(NOT must_fail AND NOT rc EQUAL 0)
    message(FATAL_ERROR "the named guards do not compile:\n${err}")
  endif()
endforeach()
message(STATUS "unnamed guard temporaries are refused; named guards compile")
