# SPDX-License-Identifier: Apache-2.0
# dlsync_test_env_prepend(<tests> <VAR> <value>): the tests run with <value>
# put in front of <VAR>'s value at test time. CMake 3.22 and newer:
# ENVIRONMENT_MODIFICATION (the value ctest sees). CMake 3.21: ENVIRONMENT,
# with the value the variable had when CMake configured (a value set only
# for ctest is then not kept). The separator is ':' for both uses
# (LD_LIBRARY_PATH, ASAN_OPTIONS).
function(dlsync_test_env_prepend tests var value)
  if(NOT CMAKE_VERSION VERSION_LESS 3.22)
    set_tests_properties(${tests} PROPERTIES
      ENVIRONMENT_MODIFICATION "${var}=path_list_prepend:${value}")
  else()
    set(now "$ENV{${var}}")
    if(now STREQUAL "")
      set(all "${value}")
    else()
      set(all "${value}:${now}")
    endif()
    foreach(t ${tests})
      set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT "${var}=${all}")
    endforeach()
  endif()
endfunction()
