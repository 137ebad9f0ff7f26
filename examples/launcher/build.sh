#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the launcher example's kernel: bash examples/launcher/build.sh BUILD_DIR
# (prints BUILD_DIR/libdlsync_launcher_kernel.so). Needs nvcc.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?BUILD_DIR}" && pwd)
nvcc -O2 -std=c++17 -arch="${CUDA_ARCH:-sm_90}" -shared -Xcompiler -fPIC "$here/kernel.cu" \
  -o "$build/libdlsync_launcher_kernel.so"
echo "$build/libdlsync_launcher_kernel.so"
