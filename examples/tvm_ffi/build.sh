#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the example TVM FFI module libdlsync_tvm_ffi.so into BUILD_DIR (the
# folder holding libdlsync.so): bash examples/tvm_ffi/build.sh BUILD_DIR
# Needs nvcc and apache-tvm-ffi importable (its headers and libtvm_ffi).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:?BUILD_DIR}" && pwd)
inc=$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_include_path())')
lib=$(python3 -c 'import tvm_ffi.libinfo as l; print(l.find_libtvm_ffi())')
nvcc -O2 -std=c++17 -arch="${CUDA_ARCH:-sm_90}" -shared -Xcompiler -fPIC -I"$root/include" \
  -isystem "$inc" "$here/scale_tvm.cu" -L"$build" -ldlsync "$lib" \
  -Xlinker -rpath -Xlinker "$build" -Xlinker -rpath -Xlinker "$(dirname "$lib")" \
  -o "$build/libdlsync_tvm_ffi.so"
echo "$build/libdlsync_tvm_ffi.so"
