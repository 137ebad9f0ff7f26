# SPDX-License-Identifier: Apache-2.0
# dlsync_find_cuda_headers(): sets DLSYNC_CUDA_INCLUDE (cache) to the folder
# holding cuda.h, or stops with a message naming what to install.
#
# dlsync needs cuda.h's declarations only (libcuda is dlopened), so any of
# these will do, tried in order:
#   1. DLSYNC_CUDA_INCLUDE, as a cache variable or an environment variable;
#   2. the CUDA toolkit: find_package(CUDAToolkit), CUDA_HOME, CUDA_PATH,
#      /usr/local/cuda; skipped when the environment has
#      DLSYNC_IGNORE_CUDA_TOOLKIT=1 (a machine without a toolkit, as the
#      install check makes one);
#   3. the nvidia-cuda-runtime wheel (PyPI) in the Python that builds:
#      <site-packages>/nvidia/cu13/include (CUDA 13) or
#      <site-packages>/nvidia/cuda_runtime/include (CUDA 12's wheels).
function(dlsync_find_cuda_headers)
  if(DLSYNC_CUDA_INCLUDE AND EXISTS "${DLSYNC_CUDA_INCLUDE}/cuda.h")
    return()
  endif()
  if(DEFINED ENV{DLSYNC_CUDA_INCLUDE} AND NOT "$ENV{DLSYNC_CUDA_INCLUDE}" STREQUAL "")
    if(NOT EXISTS "$ENV{DLSYNC_CUDA_INCLUDE}/cuda.h")
      message(FATAL_ERROR "DLSYNC_CUDA_INCLUDE=$ENV{DLSYNC_CUDA_INCLUDE} (environment) has no cuda.h")
    endif()
    set(DLSYNC_CUDA_INCLUDE "$ENV{DLSYNC_CUDA_INCLUDE}" CACHE PATH "Folder with cuda.h" FORCE)
    return()
  endif()
  set(hide "$ENV{DLSYNC_IGNORE_CUDA_TOOLKIT}")
  if(NOT hide)
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      foreach(d ${CUDAToolkit_INCLUDE_DIRS})
        if(EXISTS "${d}/cuda.h")
          set(DLSYNC_CUDA_INCLUDE "${d}" CACHE PATH "Folder with cuda.h" FORCE)
          return()
        endif()
      endforeach()
    endif()
    find_path(dlsync_toolkit_cuda_h cuda.h
      HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda
      PATH_SUFFIXES include NO_CACHE)
    if(dlsync_toolkit_cuda_h)
      set(DLSYNC_CUDA_INCLUDE "${dlsync_toolkit_cuda_h}" CACHE PATH "Folder with cuda.h" FORCE)
      return()
    endif()
  endif()

  # The nvidia-cuda-runtime wheel: ask the Python that builds (the wheel
  # build hands CMake its interpreter) for its site-packages folders.
  set(py "")
  foreach(v Python_EXECUTABLE Python3_EXECUTABLE)
    if(NOT py AND ${v})
      set(py "${${v}}")
    endif()
  endforeach()
  if(NOT py)
    find_program(dlsync_python3 NAMES python3 python NO_CACHE)
    set(py "${dlsync_python3}")
  endif()
  set(wheel_dirs "")
  if(py)
    execute_process(
      COMMAND "${py}" -c "import sys, site\nfor p in sys.path + site.getsitepackages() + [site.getusersitepackages()]:\n    print(p)"
      OUTPUT_VARIABLE py_paths ERROR_QUIET RESULT_VARIABLE py_rc)
    if(py_rc EQUAL 0)
      string(REPLACE "\n" ";" py_paths "${py_paths}")
      foreach(p ${py_paths})
        if(p)
          list(APPEND wheel_dirs "${p}/nvidia/cu13/include" "${p}/nvidia/cuda_runtime/include")
        endif()
      endforeach()
    endif()
  endif()
  foreach(d ${wheel_dirs})
    if(EXISTS "${d}/cuda.h")
      message(STATUS "cuda.h from the nvidia-cuda-runtime wheel: ${d}")
      set(DLSYNC_CUDA_INCLUDE "${d}" CACHE PATH "Folder with cuda.h" FORCE)
      return()
    endif()
  endforeach()

  if(hide)
    set(toolkit_note "the CUDA toolkit was not looked for (DLSYNC_IGNORE_CUDA_TOOLKIT is set)")
  else()
    set(toolkit_note "no CUDA toolkit was found (find_package(CUDAToolkit), CUDA_HOME, CUDA_PATH, /usr/local/cuda)")
  endif()
  message(FATAL_ERROR
    "dlsync needs cuda.h (declarations only: libcuda is loaded at run time) and found none: "
    "${toolkit_note}, and the Python '${py}' has no nvidia-cuda-runtime wheel. Either\n"
    "  pip install scikit-build-core nvidia-cuda-runtime   (the build backend, and cuda.h in\n"
    "    nvidia/cu13/include), then build with\n"
    "  pip install --no-build-isolation .   (pip's isolated build does not see the wheel)\n"
    "  or DLSYNC_CUDA_INCLUDE=<site-packages>/nvidia/cu13/include pip install .\n"
    "or install the CUDA toolkit (its headers are enough), or set CUDA_HOME, or pass "
    "-DDLSYNC_CUDA_INCLUDE=<folder with cuda.h>.")
endfunction()
