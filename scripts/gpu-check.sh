#!/usr/bin/env bash
# One command for a GPU machine: builds dlsync (Release, warnings fatal), runs
# dlsync-info, the whole ctest suite (unit tests on the fake driver and the
# GPU tests), the graph-capture regression suite and the benchmark, and
# prints a short table last. Logs go to $OUT (or a temporary folder).
#
#   bash scripts/gpu-check.sh            # everything
#   SUITE_ONLY=1 bash scripts/gpu-check.sh
#   SANITIZER=1 bash scripts/gpu-check.sh  # also: the GPU suite under
#                                          # compute-sanitizer memcheck and synccheck
#
# cmocka, where the machine lacks it, is taken from .deps/cmocka (Debian's
# libcmocka0 and libcmocka-dev unpacked with dpkg -x; see docs/gpu.md).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$(mktemp -d)}
build=${BUILD_DIR:-/tmp/dlsync-gpu-build}
jobs=$(nproc 2>/dev/null || echo 4)
status=0

if ! pkg-config --exists cmocka 2>/dev/null && [ -d "$root/.deps/cmocka/usr" ]; then
  deps="$root/.deps/cmocka/usr"
  pcdir=$(mktemp -d)
  sed -e "s|-L/usr/lib|-L$deps/lib|" -e "s|-I/usr/include|-I$deps/include|" \
    "$deps"/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc >"$pcdir/cmocka.pc"
  export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

rm -rf "$build" # a fresh configure: no cached paths from an earlier run
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLSYNC_WERROR=ON ${CMAKE_ARGS:-} >"$build.configure.log" 2>&1 &&
  cmake --build "$build" -j"$jobs" >"$out/build.log" 2>&1
if [ $? -ne 0 ]; then
  echo "BUILD FAILED"; tail -n 60 "$out/build.log"; tail -n 20 "$build.configure.log"; exit 1
fi
echo "== readelf: $(readelf -d "$build"/libdlsync.so | grep -c 'NEEDED.*libcuda') libcuda NEEDED entries"

echo "== dlsync-info"
"$build"/tools/dlsync-info | tee "$out/info.txt" || status=1
"$build"/tools/dlsync-info --json >"$out/info.json" || status=1

if [ -z "${SUITE_ONLY:-}" ]; then
  echo "== ctest (unit tests on the fake driver, GPU smoke)"
  (cd "$build" && ctest -E '^gpu_suite$' --output-on-failure -j4) >"$out/ctest.txt" 2>&1 || status=1
  tail -15 "$out/ctest.txt"
fi

echo "== GPU regression suite"
"$build"/tests/gpu/gpu_suite >"$out/suite.txt" 2>&1 || status=1
grep -v '^  ' "$out/suite.txt" | sed -n '1p'

# The GPU suite under compute-sanitizer (SANITIZER=1): memcheck, then
# synccheck; one clean / NOT CLEAN line each, logs in $out/sanitizer-*.txt.
if [ -n "${SANITIZER:-}" ]; then
  cs=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  for tool in memcheck synccheck; do
    log="$out/sanitizer-$tool.txt"
    "$cs" --tool "$tool" --error-exitcode 99 --target-processes all \
      "$build"/tests/gpu/gpu_suite >"$log" 2>&1
    rc=$?
    summary=$(grep -E 'ERROR SUMMARY' "$log" | tail -1)
    if [ $rc -eq 0 ] && grep -q 'ERROR SUMMARY: 0 errors' "$log"; then
      echo "== compute-sanitizer $tool: clean ($summary)"
    else
      echo "== compute-sanitizer $tool: NOT CLEAN (rc $rc; ${summary:-no summary})"
      grep -E '^========= (Invalid|Program hit|Race|Barrier|Error|  )' "$log" | head -20
      status=1
    fi
  done
fi

py_rc=0
if [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ]; then
  bash "$root/python/run_gpu_suite.sh" "$build" >"$out/python.txt" 2>&1 || py_rc=$?
fi

bench_rc=0
if [ -z "${SUITE_ONLY:-}" ]; then
  "$build"/bench/bench_exchange >"$out/bench.txt" 2>&1 || bench_rc=$?
fi

echo
echo "== notes from the suite"
grep '^  ' "$out/suite.txt" | head -40
echo
echo "== suite table"
sed -n '/^scenario/,$p' "$out/suite.txt"
if [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ]; then
  echo "== python frameworks suite (rc $py_rc)"
  head -4 "$out/python.txt"
  sed -n '/^case /,$p' "$out/python.txt"
  [ "$py_rc" -eq 0 ] || { grep -E "^(FAILED|ERROR)|Error" "$out/python.txt" | head -20; status=1; }
fi
if [ -z "${SUITE_ONLY:-}" ]; then
  echo "== bench (rc $bench_rc)"
  grep -v '^FAIL' "$out/bench.txt"
  [ "$bench_rc" -eq 0 ] || { tail -5 "$out/bench.txt"; status=1; }
fi
exit $status
