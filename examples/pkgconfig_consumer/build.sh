#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Builds and runs the consumer against an installed dlsync through pkg-config:
#   PKG_CONFIG_PATH=<prefix>/lib/pkgconfig sh examples/pkgconfig_consumer/build.sh OUTDIR
# consumer_shared links libdlsync.so (run with the library directory on the
# loader's path); consumer_static links libdlsync.a with Libs.private.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-.}
cc=${CC:-cc}
src="$here/../cmake_consumer/consumer.c"
libdir=$(pkg-config --variable=libdir dlsync)
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Werror $(pkg-config --cflags dlsync) "$src" -o "$out/consumer_shared" \
  $(pkg-config --libs dlsync)
# shellcheck disable=SC2046
$cc -std=c11 -Wall -Werror -DDLSYNC_STATIC_DEFINE $(pkg-config --cflags dlsync) "$src" \
  -o "$out/consumer_static" "$libdir/libdlsync.a" $(pkg-config --libs-only-other --static dlsync) \
  $(pkg-config --static --libs-only-l dlsync | sed 's/-ldlsync//')
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$out/consumer_shared"
"$out/consumer_static"
if readelf -d "$out/consumer_static" | grep -q 'libdlsync'; then
  echo "consumer_static needs libdlsync.so" >&2
  exit 1
fi
