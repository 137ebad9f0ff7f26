#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The framework regression suite on a GPU machine:
#   bash python/run_gpu_suite.sh BUILD_DIR
# BUILD_DIR holds libdlsync.so (scripts/gpu-check.sh passes its own). Builds
# the example kernel library, then runs pytest over python/tests/gpu and
# prints the table last.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/release}
export DLSYNC_LIBRARY="$build/libdlsync.so"
python3 - <<'PY'
import importlib
for m in ("torch", "cupy", "jax", "cuda.core"):
    try:
        mod = importlib.import_module(m)
        print(f"{m} {getattr(mod, '__version__', '?')}")
    except Exception as e:  # noqa: BLE001
        print(f"{m}: not available ({e})")
PY
if bash "$root/examples/kernel_lib/build.sh" "$build" >"$build/kernel_lib.log" 2>&1; then
  export KERNEL_LIB="$build/libkernel_lib.so"
else
  echo "example kernel library did not build:"; tail -5 "$build/kernel_lib.log"
fi
# GPU_SUITE_TESTS: a narrower selection (files or node ids under python/).
cd "$root/python" && PYTHONUNBUFFERED=1 python3 -m pytest -q -rs -p no:cacheprovider ${GPU_SUITE_TESTS:-tests/gpu}
