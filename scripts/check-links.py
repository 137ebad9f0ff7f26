#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Relative links in README.md, CHANGELOG.md and docs/**/*.md: the file exists, and a #anchor
   names a heading of it (GitHub's slug rules).  python3 scripts/check-links.py [ROOT]"""
import os, re, sys
root = sys.argv[1] if len(sys.argv) > 1 else "."
files = [os.path.join(root, "README.md"), os.path.join(root, "CHANGELOG.md")]
for d, _, fs in os.walk(os.path.join(root, "docs")):
    files += [os.path.join(d, f) for f in fs if f.endswith(".md")]
def slugs(path):
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#+\s+(.*)", line)
        if m:
            t = m.group(1).strip().lower()
            t = re.sub(r"[^\w\- ]", "", t).replace(" ", "-")
            out.add(t)
    return out
bad = 0
for f in files:
    text = open(f, encoding="utf-8").read()
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        link = m.group(1)
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
        if not os.path.exists(target):
            print(f"{f}: {link}: no such file"); bad += 1; continue
        if anchor and target.endswith(".md") and anchor not in slugs(target):
            print(f"{f}: {link}: no heading #{anchor}"); bad += 1
print(f"{len(files)} files, {bad} broken links")
sys.exit(1 if bad else 0)
