#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ctest launcher_cpu: the launcher example (examples/launcher/launcher.py) on
# the fake driver with its stub kernel library (examples/launcher/stub_kernel.c).
#   bash tests/launcher_cpu.sh SOURCE_ROOT LIBDLSYNC FAKE_LIBCUDA_DIR OUT_DIR
set -euo pipefail
root=$1 lib=$2 fake=$3 out=$4
mkdir -p "$out"
"${CC:-cc}" -shared -fPIC -o "$out/libstub_launcher_kernel.so" "$root/examples/launcher/stub_kernel.c"
LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONPATH="$root/python" \
  DLSYNC_LIBRARY="$lib" python3 "$root/examples/launcher/test_cpu.py" "$out/libstub_launcher_kernel.so"
