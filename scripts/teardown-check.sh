#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The library's teardown has one owner, base/thread.c (base/base.h says the
# order): exactly one object of the static library has a destructor (a
# .fini_array or .dtors section) and exactly one creates a pthread key, and
# both are base/thread.c's. Run by ctest on an uninstrumented build (a
# sanitizer adds a destructor of its own to every object).
#
#   bash scripts/teardown-check.sh path/to/libdlsync.a
set -euo pipefail
lib=${1:?usage: teardown-check.sh path/to/libdlsync.a}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && ar x "$lib")
fini=() keys=()
for o in "$tmp"/*.o; do
  objdump -h "$o" | grep -qE '[[:space:]]\.(fini_array|dtors)(\.[0-9]+)?[[:space:]]' && fini+=("$(basename "$o")")
  nm -u "$o" | grep -qE '[[:space:]]pthread_key_create(@.*)?$' && keys+=("$(basename "$o")")
done
echo "objects with a destructor: ${fini[*]:-none}; creating a pthread key: ${keys[*]:-none}"
[ "${#fini[@]}" -eq 1 ] && [ "${fini[0]}" = thread.c.o ] || {
  echo "teardown-check: want one destructor, base/thread.c's (base/base.h: one unload, its hooks in order)" >&2
  exit 1
}
[ "${#keys[@]}" -eq 1 ] && [ "${keys[0]}" = thread.c.o ] || {
  echo "teardown-check: want one pthread key, base/thread.c's (dlsync__thread_exit_arm)" >&2
  exit 1
}
