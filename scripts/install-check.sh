#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# How users get dlsync, checked from a copy of the tree (what git would clone):
#   1. cmake --install --prefix to a folder other than the one configured (a
#      relocated install); the CMake package, dlsync.pc (its prefix from
#      ${pcfiledir}), public headers only, no libcuda or libhwloc NEEDED, the
#      SONAME libdlsync.so.0.MINOR; find_package(dlsync 0.0) must not match
#      0.x with x > 0, and find_package(dlsync MAJOR.MINOR) must;
#   2. examples/cmake_consumer against it: dlsync::dlsync and dlsync::dlsync_static;
#   3. examples/pkgconfig_consumer against it (shared and static);
#   4. examples/cmake_consumer with dlsync as a FetchContent subproject, cmocka
#      hidden: only the libraries are built, the parent's build type is left alone;
#      cmake --install of the parent: the installed programs run (static, and
#      shared with libdlsync.so.0.MINOR installed beside them, nothing else);
#   5. pip wheel (cp39-abi3) built where no CUDA toolkit is seen
#      (DLSYNC_IGNORE_CUDA_TOOLKIT=1, no nvcc, no CUDA_HOME): first without
#      the nvidia-cuda-runtime wheel (the build must stop, naming it), then
#      with it (cuda.h from its nvidia/cu13/include); the wheel has
#      dlsync/_native, libdlsync.so, the headers, the CMake package,
#      dlsync.pc and dlsync/bin/dlsync-info; installed into a fresh venv; the
#      Python unit tests run from a folder outside the tree against the
#      installed package, on the compiled binding and on the ctypes fallback
#      (test_native);
#   5b. against the installed wheel: a C program through its dlsync.pc, the
#      CMake consumer through the `cmake.prefix` entry point, its dlsync-info
#      (no libhwloc NEEDed; the topology shown where libhwloc.so.15 is);
#   6. python/bench/bench_python.py without a GPU (its skip line) and
#      python/tests/test_bench.py (its rows, the in-place build of _native);
#   7. the tree configured, built and tested with CMake 3.21 (the floor; from
#      PyPI), and the CMake consumer with it;
#   8. pip install -e (editable) into a fresh venv: import dlsync from
#      outside the tree finds its libdlsync.
# Run by `bash scripts/dev.sh test`; alone: bash scripts/install-check.sh [WORKDIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$(mktemp -d)}
jobs=$(nproc 2>/dev/null || echo 2)
python=${PYTHON:-python3}
mkdir -p "$work"
work=$(cd "$work" && pwd) # absolute: it is handed to CMake and pkg-config
log="$work/log"
: >"$log"
step() { echo "-- $*"; }
run() { "$@" >>"$log" 2>&1 || { echo "FAILED: $*" >&2; tail -n 40 "$log" >&2; exit 1; }; }

step "a copy of the tree (tracked and new files, no build folders)"
src="$work/src"
rm -rf "$src" && mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard |
  xargs -0 -I{} sh -c '[ -e "{}" ] && echo "{}"' | tar -cf - -T -) | tar -xf - -C "$src"

step "cmake --install --prefix $work/prefix (configured for another prefix: relocated)"
prefix="$work/prefix"
rm -rf "$prefix" "$work/build"
run cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DDLSYNC_WERROR=ON \
  -DDLSYNC_BUILD_TESTS=OFF -DDLSYNC_BUILD_GPU_TESTS=OFF -DDLSYNC_BUILD_BENCH=OFF \
  -DCMAKE_INSTALL_PREFIX="$work/configured-prefix" -DCMAKE_INSTALL_LIBDIR=lib
run cmake --build "$work/build" -j"$jobs"
run cmake --install "$work/build" --prefix "$prefix"
[ ! -e "$work/configured-prefix" ] || { echo "installed into the configured prefix" >&2; exit 1; }
for f in lib/cmake/dlsync/dlsyncConfig.cmake lib/cmake/dlsync/dlsyncConfigVersion.cmake \
  lib/cmake/dlsync/dlsyncTargets.cmake lib/pkgconfig/dlsync.pc lib/libdlsync.a \
  include/dlsync/dlsync.h include/dlsync/version.h bin/dlsync-info; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
[ ! -e "$prefix/include/dlsync/private" ] || { echo "private headers installed" >&2; exit 1; }
if readelf -d "$prefix/lib/libdlsync.so" | grep NEEDED | grep -Eq 'libcuda|hwloc'; then
  echo "libdlsync.so NEEDs libcuda or libhwloc" >&2; exit 1
fi
if grep -q 'PkgConfig::\|HWLOC' "$prefix"/lib/cmake/dlsync/*.cmake; then
  echo "the CMake package names a target its users cannot have" >&2; exit 1
fi
vmajor=$(sed -n 's/^#define DLSYNC_VERSION_MAJOR \([0-9]*\)/\1/p' "$src/include/dlsync/version.h")
vminor=$(sed -n 's/^#define DLSYNC_VERSION_MINOR \([0-9]*\)/\1/p' "$src/include/dlsync/version.h")
soname=$(readelf -d "$prefix/lib/libdlsync.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
if [ "$vmajor" = 0 ]; then want_soname="libdlsync.so.0.$vminor"; else want_soname="libdlsync.so.$vmajor"; fi
[ "$soname" = "$want_soname" ] ||
  { echo "SONAME is '$soname', want $want_soname (0.x: each minor version its own ABI)" >&2; exit 1; }

step "relocated dlsync.pc: its paths under $prefix (\${pcfiledir})"
cflags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags dlsync)
incdir=$(echo "$cflags" | sed -n 's/^-I\([^ ]*\).*/\1/p')
[ -n "$incdir" ] && [ "$(cd "$incdir" 2>/dev/null && pwd -P)" = "$(cd "$prefix/include" && pwd -P)" ] ||
  { echo "pkg-config --cflags dlsync after a relocated install: '$cflags', not $prefix/include" >&2; exit 1; }
libdir=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --variable=libdir dlsync)
[ "$(cd "$libdir" 2>/dev/null && pwd -P)" = "$(cd "$prefix/lib" && pwd -P)" ] ||
  { echo "pkg-config libdir after a relocated install: '$libdir', not $prefix/lib" >&2; exit 1; }

step "find_package(dlsync VERSION CONFIG): 0.x matches the same minor only"
rm -rf "$work/fp" && mkdir -p "$work/fp"
cat >"$work/fp/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.21)
project(dlsync_version_check LANGUAGES C)
find_package(dlsync ${ASK} CONFIG QUIET)
if(dlsync_FOUND)
  message(STATUS "found dlsync ${dlsync_VERSION} for ${ASK}")
else()
  message(STATUS "no dlsync for ${ASK}")
endif()
file(WRITE ${CMAKE_BINARY_DIR}/found "${dlsync_FOUND}")
CMAKE
fp_found() { # fp_found VERSION: 1 when find_package accepts the installed dlsync for it
  rm -rf "$work/fp/b"
  run cmake -S "$work/fp" -B "$work/fp/b" -DCMAKE_PREFIX_PATH="$prefix" -DASK="$1"
  case "$(cat "$work/fp/b/found")" in 1 | ON | TRUE) echo 1 ;; *) echo 0 ;; esac
}
[ "$(fp_found "$vmajor.$vminor")" = 1 ] || { echo "find_package(dlsync $vmajor.$vminor) does not find $vmajor.$vminor" >&2; exit 1; }
if [ "$vmajor" = 0 ]; then
  for other in "0.$((vminor > 0 ? vminor - 1 : vminor + 1))" "0.$((vminor + 1))"; do
    [ "$(fp_found "$other")" = 0 ] ||
      { echo "find_package(dlsync $other CONFIG) accepts $vmajor.$vminor (0.x: SameMinorVersion)" >&2; exit 1; }
  done
fi

step "find_package consumer: dlsync::dlsync and dlsync::dlsync_static"
rm -rf "$work/consumer"
run cmake -S "$src/examples/cmake_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix"
run cmake --build "$work/consumer" -j"$jobs"
run ctest --test-dir "$work/consumer" --output-on-failure
if readelf -d "$work/consumer/consumer_static" | grep -q libdlsync; then
  echo "consumer_static NEEDs libdlsync.so" >&2; exit 1
fi

step "pkg-config consumer"
mkdir -p "$work/pc"
PKG_CONFIG_PATH="$prefix/lib/pkgconfig" run sh "$src/examples/pkgconfig_consumer/build.sh" "$work/pc"

step "FetchContent consumer, cmocka hidden"
# pkg-config sees hwloc only (the library uses its headers when found).
pcdir="$work/pc-hidden"
rm -rf "$pcdir" && mkdir -p "$pcdir"
hwloc_pc=$(pkg-config --variable=pcfiledir hwloc 2>/dev/null || true)
[ -z "$hwloc_pc" ] || cp "$hwloc_pc/hwloc.pc" "$pcdir/"
rm -rf "$work/fetch"
PKG_CONFIG_LIBDIR="$pcdir" PKG_CONFIG_PATH="" run cmake -S "$src/examples/cmake_consumer" \
  -B "$work/fetch" -DDLSYNC_SOURCE_DIR="$src"
PKG_CONFIG_LIBDIR="$pcdir" PKG_CONFIG_PATH="" run cmake --build "$work/fetch" -j"$jobs"
run ctest --test-dir "$work/fetch" --output-on-failure
ntests=$(ctest --test-dir "$work/fetch" -N | sed -n 's/^Total Tests: //p')
[ "$ntests" = 2 ] || { echo "the subproject added tests ($ntests in all)" >&2; exit 1; }
if grep -q '^CMAKE_BUILD_TYPE:STRING=.' "$work/fetch/CMakeCache.txt"; then
  echo "the subproject set the parent's CMAKE_BUILD_TYPE" >&2; exit 1
fi
if [ -e "$work/fetch/_deps/dlsync-build/tools" ] || [ -e "$work/fetch/_deps/dlsync-build/tests" ]; then
  echo "the subproject built its tools or tests" >&2; exit 1
fi
step "FetchContent consumer installed: the installed programs run from their prefix"
# install(TARGETS app) in the parent: consumer_static needs no libdlsync;
# consumer_shared finds libdlsync.so.0.MINOR, which the subproject installs
# into the parent's lib/ (its runtime file only: no headers, no package).
fprefix="$work/fetch-prefix"
rm -rf "$fprefix"
run cmake --install "$work/fetch" --prefix "$fprefix"
for app in consumer_shared consumer_static; do
  [ -x "$fprefix/bin/$app" ] || { echo "FetchContent consumer: $app not installed" >&2; exit 1; }
  env -u LD_LIBRARY_PATH "$fprefix/bin/$app" >"$work/fetch-$app.txt" 2>&1 ||
    { echo "FetchContent consumer: the installed $app does not run:" >&2; cat "$work/fetch-$app.txt" >&2; exit 1; }
done
[ -e "$fprefix/lib/$want_soname" ] || { echo "FetchContent consumer: $want_soname not installed" >&2; exit 1; }
for f in include lib/cmake lib/pkgconfig lib/libdlsync.a lib/libdlsync.so bin/dlsync-info; do
  [ ! -e "$fprefix/$f" ] || { echo "FetchContent consumer: the subproject installed $f (only the runtime file is wanted)" >&2; exit 1; }
done

step "the wheel where no CUDA toolkit is seen: the hint without nvidia-cuda-runtime, cuda.h from it with"
# A venv that builds without isolation (so that it sees what is installed in
# it), the toolkit hidden: DLSYNC_IGNORE_CUDA_TOOLKIT (cmake/dlsyncCudaHeaders.cmake),
# no nvcc on PATH, no CUDA_HOME or CUDA_PATH.
rm -rf "$work/wheel" "$work/venv" "$work/pytests" "$work/buildvenv" "$src/build/wheel"
run "$python" -m venv "$work/buildvenv"
run "$work/buildvenv/bin/python" -m pip install -q 'scikit-build-core>=0.10'
nocuda_path=$(echo "$PATH" | tr ':' '\n' | grep -v -i cuda | paste -sd: -)
nocuda() { env -u CUDA_HOME -u CUDA_PATH -u DLSYNC_CUDA_INCLUDE PATH="$nocuda_path" DLSYNC_IGNORE_CUDA_TOOLKIT=1 "$@"; }
if nocuda "$work/buildvenv/bin/python" -m pip wheel --no-build-isolation --no-deps "$src" \
  -w "$work/wheel" >"$work/nocuda.log" 2>&1; then
  echo "the wheel built with no cuda.h anywhere (toolkit hidden, no nvidia-cuda-runtime)" >&2; exit 1
fi
grep -q "pip install scikit-build-core nvidia-cuda-runtime" "$work/nocuda.log" ||
  { echo "no cuda.h: the build failed without naming nvidia-cuda-runtime:" >&2; tail -n 30 "$work/nocuda.log" >&2; exit 1; }
cat "$work/nocuda.log" >>"$log"
rm -rf "$src/build/wheel"
run "$work/buildvenv/bin/python" -m pip install -q nvidia-cuda-runtime
run nocuda "$work/buildvenv/bin/python" -m pip wheel --no-build-isolation --no-deps -v "$src" -w "$work/wheel"
cuda_h_dir=$(sed -n 's/^DLSYNC_CUDA_INCLUDE:PATH=//p' "$src"/build/wheel/*/CMakeCache.txt)
case "$cuda_h_dir" in
"$work/buildvenv/"*/nvidia/cu13/include) ;;
*) echo "the wheel's cuda.h is from '$cuda_h_dir', not the nvidia-cuda-runtime wheel in $work/buildvenv" >&2; exit 1 ;;
esac

step "wheel into a fresh venv; Python unit tests against the installed package"
wheel=$(ls "$work"/wheel/dlsync-*.whl)
run "$python" -m venv "$work/venv"
run "$work/venv/bin/python" -m pip install --no-deps --no-index "$wheel"
case "$(basename "$wheel")" in
*-cp39-abi3-*.whl) ;;
*) echo "the wheel is not a cp39-abi3 one: $(basename "$wheel")" >&2; exit 1 ;;
esac
"$python" -m zipfile -l "$wheel" >"$work/wheel.list"
for f in dlsync/libdlsync.so 'dlsync/_native.*abi3.so' dlsync/include/dlsync/dlsync.h \
  dlsync/include/dlsync/dlsync.hpp dlsync/include/dlsync/version.h \
  dlsync/lib/cmake/dlsync/dlsyncConfig.cmake dlsync/lib/cmake/dlsync/dlsyncConfigVersion.cmake \
  dlsync/lib/cmake/dlsync/dlsyncTargets.cmake dlsync/lib/pkgconfig/dlsync.pc dlsync/bin/dlsync-info; do
  grep -q "^$f " "$work/wheel.list" || { echo "the wheel lacks $f" >&2; exit 1; }
done
! grep -q '^dlsync/include/.*private\|^dlsync/.*\.a ' "$work/wheel.list" ||
  { echo "the wheel has private headers or a static library" >&2; exit 1; }
site=$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')

step "against the installed wheel: a C program through dlsync.pc, the CMake consumer through cmake.prefix, dlsync-info"
# dlsync.pc inside the wheel: its prefix from ${pcfiledir}; cc, no CMake.
pcw="$site/dlsync/lib/pkgconfig"
wlibdir=$(PKG_CONFIG_PATH="$pcw" pkg-config --variable=libdir dlsync)
[ "$(cd "$wlibdir" && pwd -P)" = "$(cd "$site/dlsync" && pwd -P)" ] ||
  { echo "the wheel's dlsync.pc: libdir '$wlibdir', not $site/dlsync" >&2; exit 1; }
mkdir -p "$work/wheel-c"
# shellcheck disable=SC2046
run cc -std=c11 -Wall -Werror $(PKG_CONFIG_PATH="$pcw" pkg-config --cflags dlsync) \
  "$src/examples/cmake_consumer/consumer.c" -o "$work/wheel-c/consumer" \
  $(PKG_CONFIG_PATH="$pcw" pkg-config --libs dlsync) -Wl,-rpath,"$wlibdir"
run "$work/wheel-c/consumer"
# The CMake package, found where the cmake.prefix entry point says.
cmake_prefix=$(cd "$work" && "$work/venv/bin/python" -c '
import importlib.util
from importlib.metadata import entry_points
eps = entry_points()
eps = eps.select(group="cmake.prefix") if hasattr(eps, "select") else eps.get("cmake.prefix", [])
mine = [e for e in eps if e.name == "dlsync"]
assert len(mine) == 1, "no cmake.prefix entry point named dlsync"
print(importlib.util.find_spec(mine[0].value).submodule_search_locations[0])')
[ -f "$cmake_prefix/lib/cmake/dlsync/dlsyncConfig.cmake" ] ||
  { echo "cmake.prefix entry point: $cmake_prefix has no lib/cmake/dlsync" >&2; exit 1; }
rm -rf "$work/wheel-cmake"
run cmake -S "$src/examples/cmake_consumer" -B "$work/wheel-cmake" -DCMAKE_PREFIX_PATH="$cmake_prefix"
run cmake --build "$work/wheel-cmake" -j"$jobs"
run ctest --test-dir "$work/wheel-cmake" --output-on-failure
grep -q "dlsync_DIR:PATH=$site/dlsync/lib/cmake/dlsync" "$work/wheel-cmake/CMakeCache.txt" ||
  { echo "the CMake consumer did not take the wheel's package" >&2; exit 1; }
# dlsync-info from the wheel: runs with the wheel's library, needs no hwloc.
"$site/dlsync/bin/dlsync-info" --version >"$work/wheel-info.txt" 2>&1 ||
  { echo "the wheel's dlsync-info --version failed:" >&2; cat "$work/wheel-info.txt" >&2; exit 1; }
grep -q "^libdlsync: $(cd "$site/dlsync" && pwd -P)/libdlsync.so$" "$work/wheel-info.txt" ||
  { echo "the wheel's dlsync-info does not use the wheel's libdlsync:" >&2; cat "$work/wheel-info.txt" >&2; exit 1; }
if readelf -d "$site/dlsync/bin/dlsync-info" | grep NEEDED | grep -Eq 'hwloc|libcuda'; then
  echo "the wheel's dlsync-info NEEDs hwloc or libcuda" >&2; exit 1
fi
# It loads libhwloc at run time: where this machine has libhwloc.so.15 (the
# build found hwloc's headers), its report shows the machine's topology.
if pkg-config --exists 'hwloc >= 2.1' && ldconfig -p | grep -q 'libhwloc\.so\.15 '; then
  "$site/dlsync/bin/dlsync-info" >"$work/wheel-report.txt" 2>&1 || true
  grep -q '^machine: [0-9]* package' "$work/wheel-report.txt" ||
    { echo "the wheel's dlsync-info shows no topology although libhwloc.so.15 is here:" >&2
      cat "$work/wheel-report.txt" >&2; exit 1; }
fi
mkdir -p "$work/pytests"
# test_native checks the compiled binding is the one in use (DLSYNC_EXPECT_NATIVE)
# and runs test_binding, test_hardening, test_producers and itself again with
# DLSYNC_NO_NATIVE=1: both paths, against the installed package.
for t in test_binding test_package test_native test_hardening test_producers; do
  cp "$src/python/tests/$t.py" "$work/pytests/"
done
(cd "$work/pytests" && env -u DLSYNC_LIBRARY -u DLSYNC_NO_NATIVE DLSYNC_EXPECT_BUNDLED=1 \
  DLSYNC_EXPECT_NATIVE=1 PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m unittest -v \
  test_binding test_package test_native test_hardening test_producers) >>"$log" 2>&1 ||
  { echo "FAILED: Python unit tests on the installed wheel" >&2; tail -n 40 "$log" >&2; exit 1; }
step "dlsync.testing from the installed wheel: its pytest plugin by its entry point"
# pytest (PyPI) into the venv, so that test_testing_cpu's plugin tests run
# instead of skipping: the plugin comes from the wheel's pytest11 entry point,
# and its cases skip with the reason (no GPU, no PyTorch here).
run "$work/venv/bin/python" -m pip install -q pytest
cp "$src/python/tests/test_testing_cpu.py" "$work/pytests/"
(cd "$work/pytests" && env -u DLSYNC_LIBRARY PYTHONDONTWRITEBYTECODE=1 DLSYNC_SOURCE_ROOT="$src" \
  "$work/venv/bin/python" -m unittest -v test_testing_cpu) >"$work/testing.log" 2>&1 ||
  { echo "FAILED: test_testing_cpu on the installed wheel" >&2; tail -n 40 "$work/testing.log" >&2; exit 1; }
if grep -q "skipped 'pytest is not installed'" "$work/testing.log"; then
  echo "FAILED: the plugin tests were skipped (pytest missing in the venv)" >&2; exit 1
fi
cat "$work/testing.log" >>"$log"

step "python bench without a GPU: its skip line, its rows, the in-place build of dlsync._native"
# A fresh venv has no torch: bench_python.py must say so and exit 0. test_bench
# checks its lines and builds dlsync._native from the copy (CMake, then cc
# alone) into temporary folders.
(cd "$src/python" && PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" bench/bench_python.py) \
  >"$work/pybench.txt" 2>&1 && grep -q '^bench_python: skipped' "$work/pybench.txt" ||
  { echo "FAILED: bench_python.py without torch" >&2; cat "$work/pybench.txt" >&2; exit 1; }
(cd "$src/python/tests" && PYTHONDONTWRITEBYTECODE=1 "$work/venv/bin/python" -m unittest -v \
  test_bench) >>"$log" 2>&1 ||
  { echo "FAILED: python/tests/test_bench.py" >&2; tail -n 40 "$log" >&2; exit 1; }
step "CMake 3.21 (the floor, from PyPI): the tree builds and its tests pass; the consumer"
rm -rf "$work/cmake321" "$work/build321" "$work/consumer321"
run "$python" -m venv "$work/cmake321"
run "$work/cmake321/bin/python" -m pip install -q 'cmake==3.21.*'
cmake321="$work/cmake321/bin/cmake"
"$cmake321" --version | grep -q '^cmake version 3\.21\.' ||
  { echo "not CMake 3.21: $("$cmake321" --version | head -1)" >&2; exit 1; }
# FindPython of 3.21 does not look for python3.11 and newer by name: named here.
run "$cmake321" -S "$src" -B "$work/build321" -DCMAKE_BUILD_TYPE=Release -DDLSYNC_WERROR=ON \
  -DDLSYNC_BUILD_BENCH=OFF -DPython3_EXECUTABLE="$("$python" -c 'import sys; print(sys.executable)')"
run "$cmake321" --build "$work/build321" -j"$jobs"
run "$work/cmake321/bin/ctest" --test-dir "$work/build321" --output-on-failure -j"$jobs"
tests321=$(ctest --test-dir "$work/build321" -N)
echo "$tests321" | grep -q ' python_binding$' ||
  { echo "CMake 3.21: the Python tests were not added (Python3 not found)" >&2; exit 1; }
run "$cmake321" -S "$src/examples/cmake_consumer" -B "$work/consumer321" -DCMAKE_PREFIX_PATH="$prefix"
run "$cmake321" --build "$work/consumer321" -j"$jobs"
run "$work/cmake321/bin/ctest" --test-dir "$work/consumer321" --output-on-failure

step "pip install -e (editable) into a fresh venv: import dlsync from outside the tree"
# The copy is the editable source: the package is imported from its
# python/dlsync, the compiled files from where the editable install put them.
rm -rf "$work/editvenv" "$src/build/wheel"
run "$python" -m venv "$work/editvenv"
run "$work/editvenv/bin/python" -m pip install --no-deps -e "$src"
(cd "$work" && env -u DLSYNC_LIBRARY PYTHONDONTWRITEBYTECODE=1 "$work/editvenv/bin/python" -c '
import os, dlsync
src = os.path.realpath(os.path.dirname(dlsync.__file__))
assert src.endswith(os.path.join("python", "dlsync")), "not the editable source: " + src
assert dlsync.version() == dlsync.__version__, (dlsync.version(), dlsync.__version__)
print("editable:", dlsync.__file__, dlsync.version())
') >"$work/editable.txt" 2>&1 ||
  { echo "FAILED: import dlsync after pip install -e:" >&2; cat "$work/editable.txt" >&2; exit 1; }
cat "$work/editable.txt" >>"$log"

echo "install check passed: $(basename "$wheel"); logs in $log"
