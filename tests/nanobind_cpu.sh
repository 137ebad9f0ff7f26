#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest nanobind_cpu: builds examples/nanobind_ext without CUDA into OUT_DIR
# and runs its bad-input tests (examples/nanobind_ext/test_cpu.py) on the fake
# driver. Exit 77 (a skip) when nanobind is not importable.
#   bash tests/nanobind_cpu.sh SOURCE_ROOT LIBDLSYNC FAKE_LIBCUDA_DIR OUT_DIR
set -euo pipefail
root=$1 lib=$2 fake=$3 out=$4
if ! python3 -c 'import nanobind' 2>/dev/null; then
  echo "nanobind_cpu skipped: nanobind is not importable by python3 (pip install nanobind)"
  exit 77
fi
mkdir -p "$out"
mod=$(bash "$root/examples/nanobind_ext/build.sh" "$out" -DNB_EXAMPLE_CUDA=OFF 2>"$out/build.log") ||
  { cat "$out/build.log"; exit 1; }
LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$mod:$root/python" \
  DLSYNC_LIBRARY="$lib" python3 "$root/examples/nanobind_ext/test_cpu.py"
