#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds libdlsync_jax_ffi.so: bash examples/jax_ffi/build.sh BUILD_DIR
# (BUILD_DIR holds libdlsync.so). Needs nvcc and jax (for jax.ffi.include_dir()).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build/release}
ffi_include=${XLA_FFI_INCLUDE_DIR:-$(python3 -c 'import jax.ffi; print(jax.ffi.include_dir())')}
arch=${CUDA_ARCH:-sm_90}
nvcc -O2 -std=c++17 -arch="$arch" -shared -Xcompiler -fPIC -I"$root/include" -isystem "$ffi_include" \
  "$here/scale_ffi.cu" -L"$build" -ldlsync -Xlinker -rpath -Xlinker "$build" \
  -o "$build/libdlsync_jax_ffi.so"
echo "$build/libdlsync_jax_ffi.so"
