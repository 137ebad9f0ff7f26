#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# How users get dlsync, checked from a copy of the tree (what git would clone):
#   1. cmake --install to a temporary prefix; the CMake package, dlsync.pc,
#      public headers only, no libcuda or libhwloc NEEDED;
#   2. examples/cmake_consumer against it: dlsync::dlsync and dlsync::dlsync_static;
#   3. examples/pkgconfig_consumer against it (shared and static);
#   4. examples/cmake_consumer with dlsync as a FetchContent subproject, cmocka
#      hidden: only the libraries are built, the parent's build type is left alone;
#   5. pip wheel (cp39-abi3, with dlsync/_native and libdlsync.so), installed
#      into a fresh venv; the Python unit tests run from a folder outside the
#      tree against the installed package, on the compiled binding and on the
#      ctypes fallback (test_native);
#   6. python/bench/bench_python.py without a GPU (its skip line) and
#      python/tests/test_bench.py (its rows, the in-place build of _native).
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

step "cmake --install to $work/prefix"
prefix="$work/prefix"
rm -rf "$prefix" "$work/build"
run cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DDLSYNC_WERROR=ON \
  -DDLSYNC_BUILD_TESTS=OFF -DDLSYNC_BUILD_GPU_TESTS=OFF -DDLSYNC_BUILD_BENCH=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib
run cmake --build "$work/build" -j"$jobs"
run cmake --install "$work/build"
for f in lib/cmake/dlsync/dlsyncConfig.cmake lib/cmake/dlsync/dlsyncConfigVersion.cmake \
  lib/cmake/dlsync/dlsyncTargets.cmake lib/pkgconfig/dlsync.pc lib/libdlsync.a \
  include/dlsync/dlsync.h include/dlsync/version.h; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f" >&2; exit 1; }
done
[ ! -e "$prefix/include/dlsync/private" ] || { echo "private headers installed" >&2; exit 1; }
if readelf -d "$prefix/lib/libdlsync.so" | grep NEEDED | grep -Eq 'libcuda|hwloc'; then
  echo "libdlsync.so NEEDs libcuda or libhwloc" >&2; exit 1
fi
if grep -q 'PkgConfig::\|HWLOC' "$prefix"/lib/cmake/dlsync/*.cmake; then
  echo "the CMake package names a target its users cannot have" >&2; exit 1
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

step "wheel into a fresh venv; Python unit tests against the installed package"
rm -rf "$work/wheel" "$work/venv" "$work/pytests"
run "$python" -m pip wheel "$src" --no-deps -w "$work/wheel"
wheel=$(ls "$work"/wheel/dlsync-*.whl)
run "$python" -m venv "$work/venv"
run "$work/venv/bin/python" -m pip install --no-deps --no-index "$wheel"
case "$(basename "$wheel")" in
*-cp39-abi3-*.whl) ;;
*) echo "the wheel is not a cp39-abi3 one: $(basename "$wheel")" >&2; exit 1 ;;
esac
"$python" -m zipfile -l "$wheel" >"$work/wheel.list"
for f in dlsync/libdlsync.so 'dlsync/_native.*abi3.so'; do
  grep -q "^$f " "$work/wheel.list" || { echo "the wheel lacks $f" >&2; exit 1; }
done
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
(cd "$work/pytests" && env -u DLSYNC_LIBRARY PYTHONDONTWRITEBYTECODE=1 \
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
echo "install check passed: $(basename "$wheel"); logs in $log"
