#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""No library function takes more than MAX parameters.

    python3 scripts/check-params.py [ROOT]

Reads the library's sources and private headers (the folders in LIBRARY) and
exits non-zero naming each function defined with more than MAX parameters
(a parameter list of `void` counts 0, `...` and a va_list count one each),
except the public entry points in EXCEPTIONS, whose signatures are the ABI
(each must still be defined over MAX: one that is not is named too).
Parameters that travel together go in a small struct instead.
"""
import os
import re
import sys

MAX = 5
LIBRARY = ["base", "driver", "stream", "event", "graph", "order", "interop"]
# Public functions over MAX: changing them would break the ABI.
EXCEPTIONS = {
    "dlsync_exchange_begin_many",
    "dlsync_exchange_begin_fanout",
    "dlsync_fence_import",
}


def blank(m):
    return re.sub(r"[^\n]", " ", m.group(0))


def clean(text):
    """Comments, string and character literals and preprocessor lines blanked
    (newlines kept, so that offsets still give line numbers)."""
    text = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, text,
                  flags=re.S)
    return re.sub(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", blank, text, flags=re.M)


def close(text, i):
    """The index just past the parenthesis that closes the one at text[i]."""
    depth = 0
    while i < len(text):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
        if depth == 0:
            break
    return i


def count(params):
    params = params.strip()
    if params in ("", "void"):
        return 0
    depth, n = 0, 1
    for c in params:
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(c, 0)
        n += c == "," and depth == 0
    return n


def definitions(text):
    """(name, line, parameter count) of each function defined at file scope:
    an identifier, its parameter list, then a body."""
    depth, i, scopes = 0, 0, []
    while i < len(text):
        c = text[i]
        if c == "{":
            # extern "C" { (the string blanked) keeps file scope.
            scopes.append(0 if re.search(r"\bextern\s*$", text[:i]) else 1)
            depth += scopes[-1]
        elif c == "}":
            depth -= scopes.pop() if scopes else 1
        elif c == "(" and depth == 0:
            end = close(text, i)
            name = re.search(r"\b([A-Za-z_]\w*)\s*$", text[:i])
            if name and text[end:].lstrip().startswith("{"):
                yield name.group(1), text.count("\n", 0, i) + 1, count(text[i + 1:end - 1])
            i = end
            continue
        i += 1


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = seen = 0
    excepted = set()
    for folder in LIBRARY:
        for dirpath, _, files in sorted(os.walk(os.path.join(root, folder))):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as fh:
                    text = clean(fh.read())
                for name, line, n in definitions(text):
                    seen += 1
                    if n > MAX and name in EXCEPTIONS:
                        excepted.add(name)
                    elif n > MAX:
                        print("%s:%d: %s takes %d parameters (at most %d: group the ones that"
                              " travel together in a struct)" %
                              (os.path.relpath(path, root), line, name, n, MAX))
                        bad += 1
    for name in sorted(EXCEPTIONS - excepted):
        print("%s: listed as an exception but not defined with more than %d parameters: take it"
              " off the list" % (name, MAX))
        bad += 1
    if not seen:
        print("check-params: no function definitions found under %s" % root)
        return 1
    if not bad:
        print("%d functions, none over %d parameters (%d public exceptions)" %
              (seen, MAX, len(EXCEPTIONS)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
