#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Instructions that libdlsync itself spends per operation of each row of the
# decision table, counted with valgrind's callgrind over the fake driver (no
# GPU needed): the driver, libc and the loader are left out, so the figure
# moves only with dlsync's own code. A measuring aid for changes to the hot
# paths; the speed that counts is bench/bench_exchange's on a GPU
# (docs/performance.md), where driver calls and atomic operations weigh more than
# instructions.
#
#   bash scripts/instr-count.sh                 # this tree
#   BASELINE=.baseline bash scripts/instr-count.sh   # and another source tree, side by side
#   N=2000 ROWS="eager two-captures" bash scripts/instr-count.sh
#
# Needs valgrind (callgrind_annotate), python3 and a C compiler; builds into
# $BUILD_DIR (default /tmp/dlsync-instr). Prints, per row, the instructions
# per operation, how many of them ran in .cold code (gcc's split-off
# unlikely parts: 0 on a hot path) and the driver calls of one operation.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-/tmp/dlsync-instr}
n=${N:-2000}
rows=${ROWS:-eager eager-stable in-capture in-capture-stable two-captures eager-to-capture eager-to-built two-built capture-to-built built-to-capture release fanout fanout-stable fanout-in-capture}
cc=${CC:-cc}
command -v valgrind >/dev/null && command -v callgrind_annotate >/dev/null || {
  echo "instr-count: needs valgrind (apt-get install valgrind)" >&2
  exit 2
}
cuda_inc=$(for d in "${CUDA_HOME:-}/include" /usr/local/cuda/include /usr/include; do
  [ -f "$d/cuda.h" ] && echo "$d" && break
done)
[ -n "$cuda_inc" ] || { echo "instr-count: cuda.h not found (set CUDA_HOME)" >&2; exit 2; }
mkdir -p "$build"

# libdlsync.so (Release, with symbols) of a source tree into $build/$2.
build_lib() {
  cmake -S "$1" -B "$build/$2" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS=-g \
    -DDLSYNC_BUILD_TESTS=OFF -DDLSYNC_BUILD_GPU_TESTS=OFF -DDLSYNC_BUILD_TOOLS=OFF \
    -DDLSYNC_BUILD_BENCH=OFF >"$build/$2.configure.log" 2>&1
  cmake --build "$build/$2" --target dlsync -j "$(nproc 2>/dev/null || echo 4)" \
    >"$build/$2.build.log" 2>&1
  ls "$build/$2"/libdlsync.so.*.*.* | head -1
}

lib_this=$(build_lib "$root" this)
lib_base=
if [ -n "${BASELINE:-}" ]; then
  # A build folder per baseline tree: CMake keeps a folder's first source tree.
  base_src=$(cd "$BASELINE" && pwd)
  lib_base=$(build_lib "$base_src" "baseline-$(echo "$base_src" | cksum | cut -d' ' -f1)")
fi

# The fake driver as libcuda.so.1, and the harness.
mkdir -p "$build/fake"
"$cc" -Wall -Wextra -shared -fPIC -O2 -fvisibility=hidden -D_GNU_SOURCE -DDLSYNC_STATIC_DEFINE -I"$root/include" -I"$root" \
  -I"$root/tests/fake" -isystem "$cuda_inc" -o "$build/fake/libcuda.so.1" \
  "$root/bench/instr/fake_libcuda.c" "$root"/tests/fake/fake_{model,entries,api}.c "$root/driver/driver.c" \
  "$root"/base/*.c -lpthread -ldl
"$cc" -Wall -Wextra -O2 -I"$root/include" -isystem "$cuda_inc" -o "$build/instr_rows" \
  "$root/bench/instr/instr_rows.c" -ldl

# Instructions per operation inside libdlsync for one row and library.
count() {
  local lib=$1 row=$2 out="$build/cg.$3.$2" toggles
  case $row in
  eager | eager-stable | in-capture | in-capture-stable)
    toggles="--toggle-collect=dlsync_exchange_begin_flags --toggle-collect=dlsync_exchange_end" ;;
  release) toggles="--toggle-collect=dlsync_release" ;; # the releasing thread's part alone
  fanout*) toggles="--toggle-collect=instr_fan_once" ;; # the end calls dlsync_exchange_end inside
  *) toggles="--toggle-collect=dlsync_order" ;;
  esac
  LD_LIBRARY_PATH="$build/fake" valgrind --tool=callgrind --dump-instr=yes --collect-atstart=no $toggles \
    --callgrind-out-file="$out" "$build/instr_rows" "$lib" "$row" "$n" >/dev/null 2>"$out.log" || {
    echo "instr-count: $row failed under valgrind (see $out.log)" >&2
    exit 1
  }
  # A function's own lines name its object; code inlined into it from a
  # header is listed apart, "header:function" without the object: those
  # count too, for the functions of this library.
  callgrind_annotate --threshold=100 --auto=no "$out" 2>/dev/null >"$out.txt"
  awk -v n="$n" -v so="$(basename "$lib")" '
    function fn(   i, f) {
      for (i = 2; i <= NF; i++)
        if ($i ~ /:/ && $i !~ /%\)$/) { f = $i; sub(/^.*:/, "", f); return f }
      return ""
    }
    $1 !~ /^[0-9,]+$/ { next }
    NR == FNR { if (index($0, so)) ours[fn()] = 1; next }
    index($0, so) || (index($0, "[") == 0 && fn() in ours) { gsub(",", "", $1); s += $1 }
    END {printf "%d", s / n}' "$out.txt" "$out.txt"
}

# Instructions per operation that ran in the library's .cold parts (gcc's
# split-off unlikely code, a far page of the text): 0 on every row's hot path,
# or a branch sends success through an error path's code.
cold() {
  local lib=$1 out="$build/cg.$3.$2"
  nm -S --defined-only "$lib" | awk '$4 ~ /\.cold$/ {print $1, $2}' >"$out.cold"
  python3 - "$out" "$out.cold" "$n" <<'PY'
import sys
out, syms, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ranges = []
for line in open(syms):
    a, size = line.split()
    ranges.append((int(a, 16), int(a, 16) + int(size, 16)))
total, addr, ours = 0, 0, False
for line in open(out):
    if line.startswith("ob="):
        ours = "libdlsync" in line
        continue
    if line.startswith(("fl=", "fi=", "fe=", "fn=")):
        continue
    if line.startswith("calls="):
        continue
    parts = line.split()
    if not parts:
        continue
    t = parts[0]
    if t.startswith("0x"):
        addr = int(t, 16)
    elif t[0] in "+-" and t[1:].isdigit():
        addr += int(t)
    elif t != "*":
        continue
    if ours and len(parts) >= 3 and parts[2].isdigit():
        if any(lo <= addr < hi for lo, hi in ranges):
            total += int(parts[2])
print("%.1f" % (total / n) if total else "0")
PY
}

calls() {
  LD_LIBRARY_PATH="$build/fake" "$build/instr_rows" "$1" "$2" 200 --log | tail -1 | tr ',' ' ' | wc -w
}

printf '%-20s %12s %6s %8s' row "this" cold calls
[ -n "$lib_base" ] && printf ' %12s %6s %8s' baseline cold calls
printf '   (instructions in libdlsync per operation, %d operations; cold: of them in .cold code)\n' "$n"
for r in $rows; do
  printf '%-20s %12s' "$r" "$(count "$lib_this" "$r" this)"
  printf ' %6s %8s' "$(cold "$lib_this" "$r" this)" "$(calls "$lib_this" "$r")"
  if [ -n "$lib_base" ]; then
    printf ' %12s' "$(count "$lib_base" "$r" baseline)"
    printf ' %6s %8s' "$(cold "$lib_base" "$r" baseline)" "$(calls "$lib_base" "$r")"
  fi
  printf '\n'
done
