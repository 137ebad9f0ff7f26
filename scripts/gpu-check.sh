#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One command for a GPU machine: builds dlsync (Release, warnings fatal), runs
# dlsync-info, the whole ctest suite (unit tests on the fake driver and the
# GPU tests), the graph-capture regression suite and the benchmark, and
# prints a short table last. Logs go to $OUT (or a temporary folder).
#
#   bash scripts/gpu-check.sh            # everything
#   SUITE_ONLY=1 bash scripts/gpu-check.sh
#   SANITIZER=1 bash scripts/gpu-check.sh  # also: the GPU suite under
#                                          # compute-sanitizer memcheck and synccheck
#   BENCH_ONLY=1 bash scripts/gpu-check.sh # the build and the bench only
#   ECO_ONLY=1 bash scripts/gpu-check.sh   # the build and the ecosystem examples only
#   NO_BENCH=1 bash scripts/gpu-check.sh   # everything but the two benches
#   NO_WHEEL=1 bash scripts/gpu-check.sh   # not the wheel from .whl-dlsync/
#   ECO_CASES="nanobind_ext tvm_ffi" ...   # only these ecosystem examples
#   BENCH_RUNS=3 HARNESS_RUNS=3 ...        # the bench and dlsync.testing's GPU
#                                          # tests three times
#
# .baseline/ (ignored; git archive of an earlier commit) adds the bench's
# before/after table: that tree's libdlsync.so against this one, same run.
#
# A wheel in .whl-dlsync/ (built elsewhere: python3 -m pip wheel . --no-deps
# -w .whl-dlsync) is installed with pip --no-index into /tmp/dlsyncpkg and the
# framework suite runs again against that installed package.
#
# cmocka, where the machine lacks it, is taken from .deps/cmocka (Debian's
# libcmocka0 and libcmocka-dev unpacked with dpkg -x; see docs/gpu-suite.md).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$(mktemp -d)}
build=${BUILD_DIR:-/tmp/dlsync-gpu-build}
jobs=$(nproc 2>/dev/null || echo 4)
status=0
stamp() { echo "$SECONDS s: $*" >>"$out/times.txt"; }

if ! pkg-config --exists cmocka 2>/dev/null && [ -d "$root/.deps/cmocka/usr" ]; then
  deps="$root/.deps/cmocka/usr"
  pcdir=$(mktemp -d)
  sed -e "s|-L/usr/lib|-L$deps/lib|" -e "s|-I/usr/include|-I$deps/include|" \
    "$deps"/lib/x86_64-linux-gnu/pkgconfig/cmocka.pc >"$pcdir/cmocka.pc"
  export PKG_CONFIG_PATH="$pcdir${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# The bench (BENCH_RUNS times, 1 by default) with, when .baseline/ (git
# archive of the commit to compare with) is there, its libdlsync.so built here
# and timed in the same run (DLSYNC_BASELINE_LIBRARY): the before/after table.
bench_runs() {
  if [ -f "$root/.baseline/CMakeLists.txt" ]; then
    base_build=/tmp/dlsync-baseline-build
    rm -rf "$base_build"
    if cmake -S "$root/.baseline" -B "$base_build" -DCMAKE_BUILD_TYPE=Release \
      -DDLSYNC_BUILD_TESTS=OFF -DDLSYNC_BUILD_GPU_TESTS=OFF -DDLSYNC_BUILD_TOOLS=OFF \
      -DDLSYNC_BUILD_BENCH=OFF >"$out/baseline-build.log" 2>&1 &&
      cmake --build "$base_build" -j"$jobs" >>"$out/baseline-build.log" 2>&1; then
      export DLSYNC_BASELINE_LIBRARY="$base_build/libdlsync.so"
    else
      echo "== the baseline in .baseline/ did not build (baseline-build.log)"
    fi
  fi
  "$build"/bench/bench_exchange >"$out/bench.txt" 2>&1 || bench_rc=$?
  for i in $(seq 2 "${BENCH_RUNS:-1}"); do
    "$build"/bench/bench_exchange >"$out/bench$i.txt" 2>&1 || bench_rc=$?
  done
  # The before/after table's own noise: this build against a copy of itself.
  if [ -n "${DLSYNC_BASELINE_LIBRARY:-}" ]; then
    cp "$build"/libdlsync.so /tmp/dlsync-same-copy.so
    DLSYNC_BASELINE_LIBRARY=/tmp/dlsync-same-copy.so DLSYNC_BENCH_BEFORE_AFTER_ONLY=1 \
      "$build"/bench/bench_exchange >"$out/bench-aa.txt" 2>&1 || bench_rc=$?
  fi
  # Release on a launch path: 60 s of 8 releasing threads + 15 s on one
  # stream + the per-call rows (~77 s). Exit 1: a target MISSED (printed);
  # 2: a deleter did not run exactly once (fails the run).
  release_rc=0
  DLSYNC_BENCH_RELEASE_SECONDS=${RELEASE_SECONDS:-60} \
    "$build"/bench/bench_release >"$out/bench-release.txt" 2>&1 || release_rc=$?
}

# ---- ecosystems: examples/jax_ffi, nanobind_ext, tvm_ffi, launcher ----
# nanobind and apache-tvm-ffi come from .whl/ (pip download there elsewhere; this
# machine has no registry), installed with pip --no-index into /tmp/dlsync-eco-site;
# each example is skipped, with the reason, when its package is not importable.
# (ECO_ONLY=1: the build and this block alone.)
ecosystems() {
  eco_rc=skipped
  if [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ]; then
    stamp "ecosystems"
    eco_rc=0
    eco=/tmp/dlsync-eco-site
    eco_txt="$out/ecosystems.txt"
    rm -rf "$eco" && mkdir -p "$eco" && : >"$eco_txt"
    for pkg in nanobind apache-tvm-ffi; do
      python3 -m pip install -q --no-index --find-links "$root/.whl" --target "$eco" "$pkg" \
        >>"$out/eco-pip.txt" 2>&1 || echo "$pkg: not installed from .whl/ (see eco-pip.txt)" >>"$eco_txt"
    done
    eco_env=(env PYTHONPATH="$eco:$root/python${PYTHONPATH:+:$PYTHONPATH}"
      DLSYNC_LIBRARY="$build/libdlsync.so" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1)
    eco_case() { # name module build-command... -- run-command...
      local name=$1 module=$2 rc=0
      shift 2
      local buildcmd=() runcmd=()
      while [ "$1" != "--" ]; do buildcmd+=("$1"); shift; done
      shift
      runcmd=("$@")
      if [ -n "${ECO_CASES:-}" ] && ! [[ " $ECO_CASES " == *" $name "* ]]; then
        echo "$name: not run (ECO_CASES=$ECO_CASES)" >>"$eco_txt"; return 0
      fi
      if ! "${eco_env[@]}" python3 -c "import $module" >/dev/null 2>&1; then
        echo "$name: skipped ($module not importable)" >>"$eco_txt"; return 0
      fi
      if ! "${eco_env[@]}" "${buildcmd[@]}" >"$out/$name-build.log" 2>&1; then
        echo "$name: BUILD FAILED ($name-build.log)" >>"$eco_txt"; tail -n 15 "$out/$name-build.log" >>"$eco_txt"
        eco_rc=1; return 0
      fi
      # A case that hangs is stopped (rc 124) and fails the block, not the run.
      timeout "${ECO_TIMEOUT:-180}" "${eco_env[@]}" "${runcmd[@]}" >"$out/$name.txt" 2>&1 || rc=$?
      echo "$name (rc $rc):" >>"$eco_txt"; cat "$out/$name.txt" >>"$eco_txt"
      [ "$rc" = 0 ] || eco_rc=1
    }
    eco_case jax_ffi jax.ffi bash "$root/examples/jax_ffi/build.sh" "$build" -- \
      python3 "$root/examples/jax_ffi/run.py" "$build/libdlsync_jax_ffi.so"
    eco_case nanobind_ext nanobind bash "$root/examples/nanobind_ext/build.sh" "$build" -- \
      env PYTHONPATH="$build/nanobind_ext:$eco:$root/python" python3 "$root/examples/nanobind_ext/run.py"
    eco_case tvm_ffi tvm_ffi bash "$root/examples/tvm_ffi/build.sh" "$build" -- \
      python3 "$root/examples/tvm_ffi/run.py" "$build/libdlsync_tvm_ffi.so"
    eco_case launcher torch bash "$root/examples/launcher/build.sh" "$build" -- \
      python3 "$root/examples/launcher/run.py" "$build/libdlsync_launcher_kernel.so"
    eco_case launcher_memcheck torch true -- \
      python3 "$root/examples/launcher/run.py" --memcheck "$build/libdlsync_launcher_kernel.so"
  fi
  if [ "$eco_rc" != skipped ]; then
    echo "== ecosystems: XLA FFI, nanobind, TVM FFI, the releasing launcher (rc $eco_rc)"
    cat "$eco_txt"
    [ "$eco_rc" = 0 ] || status=1
  fi
}
# ---- end ecosystems ----

print_bench() {
  echo "== bench (rc $bench_rc)"
  grep -v '^FAIL' "$out/bench.txt"
  for i in $(seq 2 "${BENCH_RUNS:-1}"); do
    echo "== bench run $i: the lines with a target"
    grep -E 'ok|MISSED|SLOWER|noise|not slower' "$out/bench$i.txt"
  done
  if [ -f "$out/bench-aa.txt" ]; then
    echo "== before/after of this build against a copy of itself (the table's noise)"
    cat "$out/bench-aa.txt"
  fi
  [ "$bench_rc" -eq 0 ] || { tail -5 "$out/bench.txt"; status=1; }
  echo "== bench_release (rc ${release_rc:-none}: 0 all ok, 1 a target MISSED, 2 exactly-once failed)"
  cat "$out/bench-release.txt" 2>/dev/null
  [ "${release_rc:-0}" -le 1 ] || status=1
}

rm -rf "$build" # a fresh configure: no cached paths from an earlier run
echo "== $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$out/gpu.txt"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLSYNC_WERROR=ON ${CMAKE_ARGS:-} >"$build.configure.log" 2>&1 &&
  cmake --build "$build" -j"$jobs" >"$out/build.log" 2>&1
if [ $? -ne 0 ]; then
  echo "BUILD FAILED"; tail -n 60 "$out/build.log"; tail -n 20 "$build.configure.log"; exit 1
fi
echo "== readelf: $(readelf -d "$build"/libdlsync.so | grep -c 'NEEDED.*libcuda') libcuda, $(readelf -d "$build"/libdlsync.so | grep -c 'NEEDED.*hwloc') libhwloc NEEDED entries"

if [ -n "${ECO_ONLY:-}" ]; then # the ecosystem examples alone
  ecosystems
  exit $status
fi

if [ -n "${BENCH_ONLY:-}" ]; then # the bench alone (BENCH_RUNS times)
  stamp "bench"
  bench_rc=0
  bench_runs
  print_bench
  exit $status
fi

stamp "dlsync-info"
echo "== dlsync-info"
"$build"/tools/dlsync-info | tee "$out/info.txt" || status=1
"$build"/tools/dlsync-info --json >"$out/info.json" || status=1

# ---- packaging: --version, --selftest (the table is printed at the end) ----
echo "== dlsync-info --version"
"$build"/tools/dlsync-info --version | tee "$out/version.txt" || status=1
selftest_rc=0
"$build"/tools/dlsync-info --selftest >"$out/selftest.txt" 2>&1 || selftest_rc=$?
# ---- end packaging ----

if [ -z "${SUITE_ONLY:-}" ]; then
stamp "ctest"
  echo "== ctest (unit tests on the fake driver, GPU smoke)"
  (cd "$build" && ctest -E '^gpu_suite$' --output-on-failure -j4) >"$out/ctest.txt" 2>&1 || status=1
  tail -15 "$out/ctest.txt"
fi

stamp "rules"
echo "== the CUDA rules dlsync relies on, on this driver (tests/gpu/gpu_rules; docs/design.md section 6)"
"$build"/tests/gpu/gpu_rules >"$out/rules.txt" 2>&1 || status=1
cat "$out/rules.txt"

stamp "gpu suite"
echo "== GPU regression suite"
"$build"/tests/gpu/gpu_suite >"$out/suite.txt" 2>&1 || status=1
grep -v '^  ' "$out/suite.txt" | sed -n '1p'

# The GPU suite under compute-sanitizer (SANITIZER=1): memcheck, then
# synccheck; one clean / NOT CLEAN line each, logs in $out/sanitizer-*.txt. API
# errors are not counted: the suite's error scenarios provoke them on purpose.
if [ -n "${SANITIZER:-}" ]; then
  cs=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
  for tool in memcheck synccheck; do
    log="$out/sanitizer-$tool.txt"
    "$cs" --tool "$tool" --error-exitcode 99 --target-processes all --report-api-errors no \
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

stamp "python suite"
py_rc=0
if [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ]; then
  rm -f "$out/reports.txt"
  DLSYNC_REPORT_FILE="$out/reports.txt" bash "$root/python/run_gpu_suite.sh" "$build" \
    >"$out/python.txt" 2>&1 || py_rc=$?
fi

stamp "caller"
# The capture-conformance harness's own GPU tests again (HARNESS_RUNS=3: three
# runs in a row in all, the first above): any flaky case shows here.
harness_rc=skipped
if [ -n "${HARNESS_RUNS:-}" ] && [ -z "${NO_PYTHON:-}" ]; then
  harness_rc=0
  : >"$out/harness-runs.txt"
  for i in $(seq 2 "$HARNESS_RUNS"); do
    (cd "$root/python" && DLSYNC_LIBRARY="$build/libdlsync.so" KERNEL_LIB="$build/libkernel_lib.so" \
      PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_testing.py \
      tests/gpu/test_harness_hygiene.py) \
      >"$out/harness-run$i.txt" 2>&1 || harness_rc=$?
    echo "harness run $i: $(tail -n 1 "$out/harness-run$i.txt")" >>"$out/harness-runs.txt"
  done
fi

# ---- packaging: the example kernel library's Python caller ----
caller_rc=skipped
if [ -f "$build/libkernel_lib.so" ]; then
  caller_rc=0
  python3 "$root/examples/kernel_lib/caller.py" "$build/libkernel_lib.so" >"$out/caller.txt" 2>&1 ||
    caller_rc=$?
fi
# ---- packaging: the wheel from .whl-dlsync/, installed, framework suite ----
# This machine's architecture (scripts/release-wheels.sh leaves x86_64 and aarch64 ones).
wheel=$(ls "$root"/.whl-dlsync/dlsync-*"$(uname -m)".whl 2>/dev/null | head -n 1)
wheel_rc=skipped
stamp wheel
if [ -n "$wheel" ] && [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ] && [ -z "${NO_WHEEL:-}" ]; then
  wheel_rc=0
  pkg=/tmp/dlsyncpkg
  tests=$(mktemp -d) # the tests outside the tree: they must import the installed dlsync
  rm -rf "$pkg"
  mkdir -p "$tests/tests"
  cp -r "$root/python/tests/gpu" "$root/python/tests/test_binding.py" \
    "$root/python/tests/test_package.py" "$tests/tests/"
  {
    python3 -m pip install --no-deps --no-index --target "$pkg" "$wheel" &&
      cd "$tests/tests" &&
      env -u DLSYNC_LIBRARY PYTHONPATH="$pkg" DLSYNC_EXPECT_BUNDLED=1 python3 -c \
        'import dlsync, sys; print("dlsync", dlsync.__version__, dlsync.__file__, dlsync.library_path(), "native" if dlsync._native_active() else "ctypes"); sys.exit(not dlsync.library_path().startswith("/tmp/dlsyncpkg/") or not dlsync._native_active())' &&
      env -u DLSYNC_LIBRARY PYTHONPATH="$pkg" DLSYNC_EXPECT_BUNDLED=1 python3 -m unittest -q \
        test_binding test_package &&
      env -u DLSYNC_LIBRARY PYTHONPATH="$pkg" DLSYNC_SOURCE_ROOT="$root" KERNEL_LIB="$build/libkernel_lib.so" \
        PYTHONUNBUFFERED=1 python3 -m pytest -q -p no:cacheprovider gpu &&
      echo "== the wheel's dlsync-info --version --selftest" &&
      { "$pkg/dlsync/bin/dlsync-info" --version --selftest >"$out/wheel-info.txt" 2>&1; info_rc=$?
        sed 's/^/wheel-info: /' "$out/wheel-info.txt"; [ "$info_rc" = 0 ]; } &&
      echo "== examples/torch_extension against the wheel alone (its headers and libdlsync)" &&
      rm -rf "$pkg/dlsync/torch_extension" &&
      env -u DLSYNC_LIBRARY PYTHONPATH="$pkg" python3 "$root/examples/torch_extension/build.py" \
        "$pkg/dlsync" >"$out/wheel-ext.txt" 2>&1 &&
      sed 's/^/wheel-ext: /' "$out/wheel-ext.txt" &&
      grep -q "^headers: $pkg/dlsync/include$" "$out/wheel-ext.txt"
  } >"$out/wheel.txt" 2>&1 || wheel_rc=$?
  cd "$root" || exit 1
  rm -rf "$tests"
fi
# ---- end packaging ----

stamp "bench"
bench_rc=0
[ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_BENCH:-}" ] && bench_runs

# The Python bench (python/bench/bench_python.py): dlsync's Python rows against
# torch's own calls in the same run.
pybench_rc=skipped
if [ -z "${SUITE_ONLY:-}" ] && [ -z "${NO_PYTHON:-}" ] && [ -z "${NO_BENCH:-}" ] &&
  [ -f "$root/python/bench/bench_python.py" ]; then
  stamp "python bench"
  pybench_rc=0
  (cd "$root/python" && DLSYNC_LIBRARY="$build/libdlsync.so" PYTHONUNBUFFERED=1 \
    python3 bench/bench_python.py) >"$out/pybench.txt" 2>&1 || pybench_rc=$?
  for i in $(seq 2 "${BENCH_RUNS:-1}"); do
    (cd "$root/python" && DLSYNC_LIBRARY="$build/libdlsync.so" PYTHONUNBUFFERED=1 \
      python3 bench/bench_python.py) >>"$out/pybench.txt" 2>&1 || pybench_rc=$?
  done
fi
stamp "report"
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
if [ "$harness_rc" != skipped ]; then
  echo "== dlsync.testing's GPU tests, runs 2..$HARNESS_RUNS (rc $harness_rc)"
  cat "$out/harness-runs.txt"
  [ "$harness_rc" = 0 ] || status=1
fi
echo "== unloading and fork (ctest: gpu_unload on the GPU; test_dlclose, test_fork on the fake)"
grep -E "(gpu_unload|test_dlclose|test_fork) " "$out/ctest.txt" 2>/dev/null || echo "  not found in ctest.txt"
# ---- packaging ----
echo "== dlsync-info --selftest (rc $selftest_rc)"
cat "$out/selftest.txt"
[ "$selftest_rc" -eq 0 ] || status=1
echo "== examples/kernel_lib/caller.py (rc $caller_rc)"
[ "$caller_rc" = skipped ] || cat "$out/caller.txt"
[ "$caller_rc" = skipped ] || [ "$caller_rc" = 0 ] || status=1
if [ "$wheel_rc" != skipped ]; then
  echo "== wheel $(basename "$wheel"): installed in /tmp/dlsyncpkg, framework suite (rc $wheel_rc)"
  grep '^dlsync ' "$out/wheel.txt"
  sed -n '/^case /,/^== the wheel/p' "$out/wheel.txt"
  grep -E '^wheel-info: (dlsync library|libdlsync|selftest)|^wheel-ext: (headers|/)' "$out/wheel.txt"
  [ "$wheel_rc" = 0 ] || { grep -E "^(FAILED|ERROR)|Error" "$out/wheel.txt" | head -20; status=1; }
else
  echo "== wheel: none in .whl-dlsync/ (or SUITE_ONLY/NO_PYTHON/NO_WHEEL): not tested"
fi
# ---- end packaging ----
if [ -z "${SUITE_ONLY:-}" ]; then
  print_bench
fi
if [ "$pybench_rc" != skipped ]; then
  echo "== python bench (rc $pybench_rc)"
  cat "$out/pybench.txt"
  [ "$pybench_rc" = 0 ] || status=1
fi
ecosystems
stamp end
echo "== times"; cat "$out/times.txt"
exit $status
