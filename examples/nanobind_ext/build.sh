#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the example nanobind extension into BUILD_DIR/nanobind_ext:
#   bash examples/nanobind_ext/build.sh BUILD_DIR [cmake args, e.g. -DNB_EXAMPLE_CUDA=OFF]
# Needs nanobind importable (pip install nanobind) and, by default, nvcc.
# Prints the folder holding the module (put it on PYTHONPATH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?BUILD_DIR}" && pwd)
shift
nbdir=$(python3 -m nanobind --cmake_dir)
cmake -S "$here" -B "$build/nanobind_ext" -DCMAKE_BUILD_TYPE=Release -Dnanobind_DIR="$nbdir" \
  -DPython_EXECUTABLE="$(command -v python3)" "$@" >"$build/nanobind_ext.configure.log" 2>&1 ||
  { cat "$build/nanobind_ext.configure.log" >&2; exit 1; }
cmake --build "$build/nanobind_ext" -j"$(nproc 2>/dev/null || echo 4)" >&2
echo "$build/nanobind_ext"
