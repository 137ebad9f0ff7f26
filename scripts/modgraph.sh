#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The library's module graph, read from the object files of a build.
#
#   bash scripts/modgraph.sh BUILD_DIR
#
# For each library folder (base/, driver/, ...), the folders whose dlsync_ /
# dlsync__ symbols its objects use (nm: undefined there, defined there). Prints
# one line per folder, "folder -> used folders", bottom layer first, and exits
# non-zero when the graph has a cycle (tsort), when an edge goes up the layer
# order below, or when a folder is not in that order.
set -euo pipefail
layers=(base driver stream event graph order interop)
build=${1:?usage: modgraph.sh BUILD_DIR}
objdir=$build/CMakeFiles/dlsync_shared_objects.dir
[ -d "$objdir" ] || { echo "modgraph: no $objdir (build the library first)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

objs=$(cd "$objdir" && find . -name '*.o' | sed 's|^\./||' | sort)
[ -n "$objs" ] || { echo "modgraph: no object files under $objdir" >&2; exit 2; }
for o in $objs; do
  folder=${o%%/*}
  nm --defined-only "$objdir/$o" | awk -v f="$folder" '$3 ~ /^dlsync_/ && $2 ~ /[TDBRtdbrVW]/ { print $3, f }' >>"$tmp/defs"
  nm -u "$objdir/$o" | awk -v f="$folder" '$2 ~ /^dlsync_/ { print f, $2 }' >>"$tmp/uses"
done
# folder -> folder edges (a folder's use of its own symbols is no edge).
awk 'NR == FNR { def[$1] = $2; next } ($2 in def) && def[$2] != $1 { print $1, def[$2] }' \
  "$tmp/defs" "$tmp/uses" | sort -u >"$tmp/edges"

rank() {
  local i
  for i in "${!layers[@]}"; do [ "${layers[$i]}" = "$1" ] && { echo "$i"; return; }; done
  echo -1
}
bad=0
folders=$(awk '{ print $2 }' "$tmp/defs" | sort -u)
echo "module graph (folder -> folders it uses), bottom layer first:"
for f in "${layers[@]}" $folders; do
  [ -e "$tmp/seen.$f" ] && continue
  touch "$tmp/seen.$f"
  echo "$folders" | grep -qx "$f" || continue
  echo "  $f -> $(awk -v f="$f" '$1 == f { printf "%s%s", s, $2; s = " " }' "$tmp/edges")"
  if [ "$(rank "$f")" -lt 0 ]; then
    echo "modgraph: folder $f/ is not in the layer order (${layers[*]})" >&2
    bad=1
  fi
done
while read -r from to; do
  if [ "$(rank "$from")" -ge 0 ] && [ "$(rank "$to")" -gt "$(rank "$from")" ]; then
    echo "modgraph: $from/ uses $to/, a layer above it:" >&2
    bad=1
    for o in $objs; do
      [ "${o%%/*}" = "$from" ] || continue
      nm -u "$objdir/$o" | awk '{ print $2 }' | while read -r s; do
        awk -v s="$s" -v t="$to" '$1 == s && $2 == t { found = 1 } END { exit !found }' "$tmp/defs" &&
          echo "    $o uses $s" >&2
      done
    done
  fi
done <"$tmp/edges"
if ! tsort "$tmp/edges" >/dev/null 2>"$tmp/tsort"; then
  echo "modgraph: the module graph has a cycle:" >&2
  cat "$tmp/tsort" >&2
  bad=1
fi
if [ "$bad" = 0 ]; then
  echo "modgraph: no cycle, no edge going up"
fi
exit "$bad"
