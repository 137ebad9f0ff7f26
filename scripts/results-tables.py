#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The docs' tables of GPU results, generated from docs/results/.

docs/results/manifest.json names one folder per kind of run (commit, GPU, driver, date). This
script reads it and the bench run's bench.txt, and rewrites what lies between
    <!-- generated: NAME (scripts/results-tables.py) -->  and  <!-- end generated: NAME -->
in README.md (NAME readme-costs), docs/performance.md (current-figures) and docs/results/README.md
(runs). Edit the results or the manifest, then run it; never edit a generated part by hand.

    python3 scripts/results-tables.py            rewrite the generated parts
    python3 scripts/results-tables.py --check    exit 1, naming them, when one is out of date
                                                 (bash scripts/dev.sh test runs this)
"""
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")


def fail(msg):
    sys.exit("results-tables.py: " + msg)


def manifest():
    with open(os.path.join(RESULTS, "manifest.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    kinds = [r["kind"] for r in runs]
    if len(set(kinds)) != len(kinds):
        fail("manifest.json: a kind of run appears twice (one folder per kind)")
    for r in runs:
        for key in ("kind", "folder", "commit", "gpu", "driver", "date", "what"):
            if not r.get(key):
                fail("manifest.json: run %r has no %s" % (r.get("folder"), key))
        if not os.path.isdir(os.path.join(RESULTS, r["folder"])):
            fail("manifest.json: no folder docs/results/%s" % r["folder"])
    listed = {r["folder"] for r in runs}
    for d in sorted(os.listdir(RESULTS)):
        if os.path.isdir(os.path.join(RESULTS, d)) and d not in listed:
            fail("docs/results/%s is not in manifest.json (one current folder per kind)" % d)
    return runs


NUM = r"([0-9]+(?:\.[0-9]+)?)"


def measure(text, label, path):
    """dlsync, baseline, ratio, range of one line of the bench's `measure` blocks."""
    m = re.search(r"^\s*" + re.escape(label) + r"\s+" + NUM + r"\s+" + NUM + r"\s+" + NUM +
                  r"\b[^\[\n]*(\[[0-9.]+-[0-9.]+\])?", text, re.M)
    if not m:
        fail("%s: no line %r" % (path, label))
    return m.group(1), m.group(2), m.group(3), m.group(4) or ""


def table_row(text, label, path):
    """The columns of one line of the bench's `rows of the table` block."""
    m = re.search(r"^" + re.escape(label) + r"\s+" + NUM + r"\s+" + NUM + r"\s+" + NUM + r"\s+" +
                  NUM + r"\s+\S+\s+(\[[0-9.]+-[0-9.]+\])\s+" + NUM + r"\s+" + NUM, text, re.M)
    if not m:
        fail("%s: no row %r in its rows of the table" % (path, label))
    ds, raw, _floor, ratio, rng, flr, dsflr = m.groups()
    return ds, raw, ratio, rng, flr, dsflr


def ns(s):
    return str(int(float(s) + 0.5))


def bench_rows(run):
    path = os.path.join("docs", "results", run["folder"], "bench.txt")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    rows = []
    ds, raw, ratio, rng = measure(text, "EAGER_EAGER begin+end vs raw fork+join", path)
    flr = measure(text, "raw fork+join + its 3 status queries vs raw", path)[2]
    dsflr = measure(text, "eager begin+end vs its floor", path)[2]
    rows.append(("`EAGER_EAGER` begin+end", ds, raw, ratio, rng, flr, dsflr))
    ds, raw, ratio, rng = measure(text, "with CAPTURE_STABLE vs raw fork+join", path)
    flr = measure(text, "raw fork+join + 1 status query vs raw", path)[2]
    dsflr = measure(text, "with CAPTURE_STABLE vs its floor", path)[2]
    rows.append(("`EAGER_EAGER`, `CAPTURE_STABLE`", ds, raw, ratio, rng, flr, dsflr))
    for label, name in (("SAME_CAPTURE begin+end in capture", "`SAME_CAPTURE` begin+end"),
                        ("TWO_CAPTURES order", "`TWO_CAPTURES` order"),
                        ("EAGER_TO_CAPTURE order", "`EAGER_TO_CAPTURE` order"),
                        ("EAGER_TO_BUILT order", "`EAGER_TO_BUILT` order"),
                        ("TWO_BUILT order", "`TWO_BUILT` order"),
                        ("CAPTURE_TO_BUILT order", "`CAPTURE_TO_BUILT` order"),
                        ("BUILT_TO_CAPTURE order", "`BUILT_TO_CAPTURE` order")):
        rows.append((name,) + table_row(text, label, path))
    # The launch row: by hand is the floor (the same calls dlsync makes).
    ds, raw, ratio, rng = measure(text, "dlsync_graph_launch in capture vs by hand", path)
    rows.append(("`dlsync_graph_launch` in a capture", ds, raw, ratio, rng, "1.00", ratio))
    return rows


def readme_costs(runs):
    run = by_kind(runs, "bench")
    where = "docs/results/%s/" % run["folder"]
    out = ["%s, driver %s, %s, library commit %s (`bench/bench_exchange.c`, raw output in [%s](%s)):"
           % (run["gpu"], run["driver"], run["date"], run["commit"], where, where), "",
           "| row | dlsync / by hand | floor / by hand |", "|---|---:|---:|"]
    for name, _ds, _raw, ratio, _rng, flr, _dsflr in bench_rows(run):
        out.append("| %s | %s | %s |" % (name, ratio, flr))
    return out


def current_figures(runs):
    run = by_kind(runs, "bench")
    where = "results/%s/" % run["folder"]
    out = ["%s, driver %s, %s, library commit %s; raw output in [%s](%s) (`bench.txt`)." %
           (run["gpu"], run["driver"], run["date"], run["commit"], where, where), "",
           "| row | dlsync ns | raw ns | dlsync / raw [range over rounds] | floor / raw | "
           "dlsync / floor |", "|---|---:|---:|---:|---:|---:|"]
    for name, ds, raw, ratio, rng, flr, dsflr in bench_rows(run):
        out.append("| %s | %s | %s | %s%s | %s | %s |" %
                   (name, ns(ds), ns(raw), ratio, " " + rng if rng else "", flr, dsflr))
    return out


def runs_table(runs):
    out = ["| kind | folder | GPU | driver | date | commit | what | read it with |",
           "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        docs = ", ".join("[%s](%s)" % (os.path.basename(d), d) for d in r.get("docs", []))
        out.append("| %s | [%s/](%s/) | %s | %s | %s | %s | %s | %s |" %
                   (r["kind"], r["folder"], r["folder"], r["gpu"], r["driver"], r["date"],
                    r["commit"], r["what"], docs))
    return out


def by_kind(runs, kind):
    for r in runs:
        if r["kind"] == kind:
            return r
    fail("manifest.json: no run of kind %r" % kind)


PARTS = (("README.md", "readme-costs", readme_costs),
         ("docs/performance.md", "current-figures", current_figures),
         ("docs/results/README.md", "runs", runs_table))


def main(argv):
    check = argv[1:] == ["--check"]
    if argv[1:] and not check:
        fail("usage: python3 scripts/results-tables.py [--check]")
    runs = manifest()
    stale = []
    for rel, name, make in PARTS:
        path = os.path.join(ROOT, rel)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        begin = "<!-- generated: %s (scripts/results-tables.py) -->\n" % name
        end = "<!-- end generated: %s -->" % name
        i, j = text.find(begin), text.find(end)
        if i < 0 or j < i:
            fail("%s: no generated part %r (its two marker comments)" % (rel, name))
        new = text[:i + len(begin)] + "\n".join(make(runs)) + "\n" + text[j:]
        if new != text:
            stale.append("%s (%s)" % (rel, name))
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if check and stale:
        fail("out of date: %s; run python3 scripts/results-tables.py" % ", ".join(stale))
    print("results-tables.py: %s" % ("up to date" if not stale else "rewrote " + ", ".join(stale)))


if __name__ == "__main__":
    main(sys.argv)
