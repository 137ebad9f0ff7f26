#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds libkernel_lib.so: bash examples/kernel_lib/build.sh BUILD_DIR
# (BUILD_DIR holds libdlsync.so). Needs nvcc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build/release}
nvcc -O2 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I"$root/include" \
  "$here/scale.cu" -L"$build" -ldlsync -Xlinker -rpath -Xlinker "$build" \
  -o "$build/libkernel_lib.so"
echo "$build/libkernel_lib.so"
