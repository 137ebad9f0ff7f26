#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every public function where its header says: include/dlsync/X.h's DLSYNC_API
functions are defined in the file(s) MAP gives for X.h, and nowhere else.

    python3 scripts/check-entry-points.py [ROOT]

Reads each public header's DLSYNC_API declarations and the library's sources
(the folders in LIBRARY), and exits non-zero naming each function defined
outside its header's file(s) or not defined there, and each header with
DLSYNC_API functions that MAP does not name.
"""
import fnmatch
import glob
import os
import re
import sys

# Public header -> the library source(s) that define its functions (fnmatch
# patterns: a subsystem split into several files is one pattern).
MAP = {
    "arrow.h": ["interop/arrow.c"],
    "conditional.h": ["order/conditional.c"],
    "context.h": ["order/context.c"],
    "dlpack.h": ["interop/dlpack.c"],
    "env.h": ["interop/env.c"],
    "exchange.h": ["order/exchange.c", "order/fanout.c"],
    "fence.h": ["order/fence.c"],
    # Imported fences are fences: their functions need the fence's private layout.
    "foreign.h": ["order/fence.c"],
    "graph.h": ["order/graph.c"],
    "lane.h": ["order/lane.c"],
    "release.h": ["order/release*.c"],
    "status.h": ["base/status.c"],
    "version.h": ["base/version.c"],
}
LIBRARY = ["base", "driver", "stream", "event", "graph", "order", "interop"]

DECL = re.compile(r"\bDLSYNC_API\b[^;{(]*?\b(dlsync_\w+)\s*\(")


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text,
                  flags=re.S)


def definitions(text, name):
    """Line numbers where `name` is defined: at the start of a line (after its
    return type), its parameter list followed by a body, not a ';'."""
    lines = []
    for m in re.finditer(r"^[A-Za-z_][^;{}()\n]*\b%s\s*\(" % re.escape(name), text, re.M):
        rest = text[m.end():]
        depth, i = 1, 0
        while depth and i < len(rest):
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        if rest[i:].lstrip().startswith("{"):
            lines.append(text.count("\n", 0, m.start()) + 1)
    return lines


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    sources = {}
    for folder in LIBRARY:
        for path in sorted(glob.glob(os.path.join(root, folder, "**", "*.c"), recursive=True)):
            with open(path, encoding="utf-8") as f:
                sources[os.path.relpath(path, root)] = strip_comments(f.read())
    bad = 0
    count = 0
    for header in sorted(glob.glob(os.path.join(root, "include", "dlsync", "*.h"))):
        hname = os.path.basename(header)
        with open(header, encoding="utf-8") as f:
            names = sorted(set(DECL.findall(strip_comments(f.read()))))
        if not names:
            continue
        if hname not in MAP:
            print(f"include/dlsync/{hname}: declares {', '.join(names)} but names no source "
                  f"in scripts/check-entry-points.py's MAP")
            bad += 1
            continue
        want = MAP[hname]
        for name in names:
            count += 1
            where = [(path, line) for path, text in sources.items()
                     for line in definitions(text, name)]
            outside = [f"{p}:{n}" for p, n in where
                       if not any(fnmatch.fnmatch(p, w) for w in want)]
            if outside:
                print(f"{name} (include/dlsync/{hname}) is defined in {', '.join(outside)}, "
                      f"not in {' or '.join(want)}")
                bad += 1
            elif not where:
                print(f"{name} (include/dlsync/{hname}): no definition in {' or '.join(want)}")
                bad += 1
    if count < 30:
        print(f"found only {count} public functions: is the DLSYNC_API pattern still right?")
        return 1
    if bad:
        return 1
    print(f"{count} public functions, each defined in the file its header maps to")
    return 0


if __name__ == "__main__":
    sys.exit(main())
