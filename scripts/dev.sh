#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The two commands of the README.
#
#   bash scripts/dev.sh info   builds dlsync (Release) and runs dlsync-info
#   bash scripts/dev.sh test   checks the docs' links (scripts/check-links.py)
#                              and that their tables of GPU results are those
#                              docs/results/ gives (scripts/results-tables.py
#                              --check), then
#                              builds and runs the tests: Release (with the
#                              optional nanobind, TVM FFI and XLA FFI headers
#                              compiled against the real packages: nanobind
#                              and apache-tvm-ffi from PyPI into a venv under
#                              build/, XLA's FFI headers out of the jaxlib
#                              wheel; those three tests must run, not skip),
#                              then
#                              the module graph check (scripts/modgraph.sh),
#                              Debug with ASan+UBSan, then ThreadSanitizer on
#                              every C test; warnings are errors;
#                              then scripts/install-check.sh (install, the
#                              consumers, the wheel; pip reaches PyPI for
#                              scikit-build-core)
#                              then the libFuzzer harness (fuzz/, clang) for
#                              60 s on fuzz/corpus (any finding fails);
#                              it ends with one verdict line over its stages,
#                              "verdict: N passed, M failed" (M is 0 or 1:
#                              the first failure stops it, and is named)
#
# Missing build dependencies (cmake, pkg-config, cmocka, hwloc) are installed
# with apt-get when running as root, otherwise the command to do so is printed.
# The CUDA toolkit's headers are needed (nvcc on PATH, or CUDA_HOME); the
# driver and a GPU are not: GPU tests skip themselves where none is found.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
jobs=$(nproc 2>/dev/null || echo 2)

ensure_deps() {
  local missing=()
  command -v cmake >/dev/null || missing+=(cmake)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v cc >/dev/null || missing+=(gcc)
  command -v c++ >/dev/null || missing+=(g++)
  # install-check.sh: a wheel and a fresh venv.
  command -v python3 >/dev/null || missing+=(python3)
  python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
  python3 -m pip --version >/dev/null 2>&1 || missing+=(python3-pip)
  if [ "$mode" = test ]; then
    # libFuzzer: clang and its runtime (Debian: libclang-rt-<version>-dev).
    if ! command -v clang >/dev/null; then
      missing+=(clang)
    elif ! echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' |
      clang -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1; then
      missing+=("libclang-rt-$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)-dev")
    fi
  fi
  if command -v pkg-config >/dev/null; then
    pkg-config --exists cmocka || missing+=(libcmocka-dev)
    pkg-config --exists 'hwloc >= 2.1' || missing+=(libhwloc-dev)
  else
    missing+=(libcmocka-dev libhwloc-dev)
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "installing: ${missing[*]}"
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "missing build dependencies; install them with:" >&2
      echo "  sudo apt-get install ${missing[*]}" >&2
      exit 1
    fi
  fi
  if ! command -v nvcc >/dev/null && [ -z "${CUDA_HOME:-}" ] && [ ! -f /usr/local/cuda/include/cuda.h ]; then
    echo "the CUDA toolkit's headers (cuda.h) were not found: put nvcc on PATH or set CUDA_HOME" >&2
    exit 1
  fi
}

# The verdict line: each "== stage" that finished counts as passed; the one
# running when the script stopped on an error counts as failed.
stages_passed=0
stage_now=""
stage() {
  [ -z "$stage_now" ] || stages_passed=$((stages_passed + 1))
  stage_now=$1
  echo "== $1"
}
# failed_what: the tests that failed in the stage that stopped the run (set
# by run_ctest), named on the very last line.
failed_what=""
verdict() {
  local rc=$?
  if [ "$rc" = 0 ]; then
    [ -z "$stage_now" ] || stages_passed=$((stages_passed + 1))
    echo "verdict: $stages_passed passed, 0 failed"
  else
    echo "verdict: $stages_passed passed, 1 failed"
    echo "dev.sh test: failed in '$stage_now' (exit $rc)${failed_what:+: $failed_what}" >&2
  fi
}

# run_ctest BUILD-DIR ctest-args...: ctest with its output shown; on a
# failure the failing tests' names go to failed_what.
run_ctest() {
  local dir=$1 log
  shift
  log="$dir.ctest.log"
  if ctest --test-dir "$dir" --output-on-failure "$@" 2>&1 | tee "$log"; then
    return 0
  fi
  failed_what="failing tests: $(sed -n '/The following tests FAILED/,$p' "$log" |
    sed -n 's/^[[:space:]]*[0-9]* - \([^ ]*\).*/\1/p' | tr '\n' ' ' | sed 's/ $//')"
  return 1
}

# The packages behind the optional headers (include/dlsync/nanobind.h,
# tvm_ffi.h, xla_ffi.h), from PyPI: nanobind and apache-tvm-ffi into
# build/eco-venv (it sees the system's packages too, so the other Python
# tests run with it as they do with python3); jaxlib's wheel is only
# downloaded and its include/ (xla/ffi/api/*.h) taken out into
# build/eco/include: its headers are all the test needs.
eco_venv="$root/build/eco-venv"
eco_include="$root/build/eco/include"
eco_setup() {
  [ -x "$eco_venv/bin/python3" ] || python3 -m venv --system-site-packages "$eco_venv"
  "$eco_venv/bin/python3" -m pip install -q --disable-pip-version-check nanobind apache-tvm-ffi
  if [ ! -f "$eco_include/xla/ffi/api/ffi.h" ]; then
    rm -rf "$root/build/eco" && mkdir -p "$root/build/eco/wheel"
    "$eco_venv/bin/python3" -m pip download -q --disable-pip-version-check --no-deps jaxlib \
      -d "$root/build/eco/wheel"
    "$eco_venv/bin/python3" - "$root/build/eco/wheel" "$root/build/eco" <<'PY'
import glob, os, sys, zipfile
(whl,) = glob.glob(os.path.join(sys.argv[1], "jaxlib-*.whl"))
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("jaxlib/include/") and not name.endswith("/"):
            out = os.path.join(sys.argv[2], name[len("jaxlib/"):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as src, open(out, "wb") as dst:
                dst.write(src.read())
PY
  fi
  [ -f "$eco_include/xla/ffi/api/ffi.h" ] || { echo "no xla/ffi/api/ffi.h in the jaxlib wheel" >&2; return 1; }
}

build() { # build DIR cmake-args...
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; return 1; }
  cmake --build "$dir" -j"$jobs"
}

case "$mode" in
info)
  ensure_deps
  mkdir -p "$root/build"
  build "$root/build/release" -DCMAKE_BUILD_TYPE=Release >/dev/null
  "$root/build/release/tools/dlsync-info" "${@:2}"
  ;;
test)
  trap verdict EXIT
  ensure_deps
  mkdir -p "$root/build"
  if command -v clang-format >/dev/null; then
    stage "clang-format"
    (cd "$root" && git ls-files '*.c' '*.h' '*.cpp' | xargs clang-format --dry-run --Werror)
  fi
  stage "public functions in the files their headers map to"
  python3 "$root/scripts/check-entry-points.py" "$root"
  stage "no library function over 5 parameters"
  python3 "$root/scripts/check-params.py" "$root"
  stage "docs: relative links and their anchors; generated tables current"
  python3 "$root/scripts/check-links.py" "$root"
  python3 "$root/scripts/results-tables.py" --check
  stage "packages for the optional headers (nanobind, apache-tvm-ffi, jaxlib's FFI headers; PyPI)"
  eco_setup
  stage "Release, warnings as errors; the optional headers against the real packages"
  PATH="$eco_venv/bin:$PATH" build "$root/build/release" -DCMAKE_BUILD_TYPE=Release \
    -DDLSYNC_WERROR=ON -DPython3_EXECUTABLE="$eco_venv/bin/python3" \
    -DDLSYNC_XLA_FFI_INCLUDE_DIR="$eco_include"
  PATH="$eco_venv/bin:$PATH" run_ctest "$root/build/release"
  # Each of the three ran: none of them may be a skip here.
  skipped=$(grep -E ' (test_xla_ffi|nanobind_cpu|test_tvm_ffi) [.]+[*]+Skipped' \
    "$root/build/release.ctest.log" | sed 's/.*: \([a-z_]*\) .*/\1/' | tr '\n' ' ' || true)
  if [ -n "$skipped" ]; then
    failed_what="skipped although their packages were installed: $skipped"
    exit 1
  fi
  stage "module graph (no cycle, no edge going up)"
  bash "$root/scripts/modgraph.sh" "$root/build/release"
  stage "Debug with AddressSanitizer and UndefinedBehaviorSanitizer"
  build "$root/build/asan" -DCMAKE_BUILD_TYPE=Debug -DDLSYNC_WERROR=ON -DDLSYNC_SANITIZE=ON \
    -DDLSYNC_BUILD_BENCH=OFF
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} run_ctest "$root/build/asan"
  stage "ThreadSanitizer (every C test; the Python ones load the library into an uninstrumented python)"
  build "$root/build/tsan" -DCMAKE_BUILD_TYPE=Debug -DDLSYNC_WERROR=ON -DDLSYNC_TSAN=ON \
    -DDLSYNC_BUILD_BENCH=OFF -DDLSYNC_BUILD_TOOLS=OFF -DDLSYNC_BUILD_GPU_TESTS=OFF
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1} run_ctest "$root/build/tsan" -E '^python_'
  stage "Install check: CMake package, pkg-config, FetchContent, wheel in a fresh venv"
  bash "$root/scripts/install-check.sh" "$root/build/install-check"
  stage "libFuzzer (fuzz/fuzz_dlsync, ${DLSYNC_FUZZ_SECONDS:-60} s, ASan+UBSan)"
  # Only the harness (with the static library): clang does not put the
  # sanitizer runtimes into a shared library, which links with --no-undefined.
  CC=clang CXX=clang++ cmake -S "$root" -B "$root/build/fuzz" -DCMAKE_BUILD_TYPE=Debug \
    -DDLSYNC_BUILD_FUZZ=ON -DDLSYNC_SANITIZE=ON -DDLSYNC_WERROR=ON -DDLSYNC_BUILD_TESTS=OFF \
    -DDLSYNC_BUILD_GPU_TESTS=OFF -DDLSYNC_BUILD_TOOLS=OFF -DDLSYNC_BUILD_BENCH=OFF \
    >"$root/build/fuzz.configure.log" 2>&1 || { cat "$root/build/fuzz.configure.log"; exit 1; }
  cmake --build "$root/build/fuzz" -j"$jobs" --target fuzz_dlsync
  # New inputs go to build/fuzz/corpus; the seeds in fuzz/corpus are only read.
  mkdir -p "$root/build/fuzz/corpus" "$root/build/fuzz/artifacts"
  if ! "$root/build/fuzz/fuzz/fuzz_dlsync" -max_total_time="${DLSYNC_FUZZ_SECONDS:-60}" -timeout=30 \
    -artifact_prefix="$root/build/fuzz/artifacts/" -print_final_stats=1 \
    "$root/build/fuzz/corpus" "$root/fuzz/corpus" >"$root/build/fuzz.log" 2>&1; then
    tail -n 60 "$root/build/fuzz.log"
    echo "the fuzzer found a crash: input in build/fuzz/artifacts/, log in build/fuzz.log" >&2
    exit 1
  fi
  grep -E '^Done|stat::number_of_executed_units' "$root/build/fuzz.log" || true
  ;;
*)
  echo "usage: bash scripts/dev.sh info|test" >&2
  exit 2
  ;;
esac
