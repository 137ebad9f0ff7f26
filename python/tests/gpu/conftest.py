# SPDX-License-Identifier: Apache-2.0
"""Collects each case's outcome (with dlsync, and the control without it),
asserts it, and prints the table at the end of the session."""
import pytest

_rows = []


@pytest.fixture
def record():
    def _record(case, setting, mode, with_dlsync, control):
        runs, wrong, broken, note = with_dlsync
        _, c_wrong, c_broken, c_note = control
        ok_with = runs > 0 and wrong == 0 and broken == 0
        control_failed = c_wrong > 0 or c_broken > 0
        verdict = "PASS" if ok_with and control_failed else "FAIL"
        _rows.append((case, setting, mode, runs, wrong, broken, c_wrong, c_broken, verdict,
                      note, c_note))
        assert ok_with, f"with dlsync: {runs} runs, {wrong} wrong, {broken} broken ({note})"
        assert control_failed, "the control without dlsync did not fail: the case cannot fail"

    return _record


_harness = []


@pytest.fixture
def harness_row():
    """A row of the harness table (test_harness_hygiene.py): what was
    checked, whether it passed, the check's time, what the harness said."""

    def _row(test, what, ok, seconds, note):
        _harness.append((test, what, "PASS" if ok else "FAIL", seconds, note))

    return _row


def pytest_terminal_summary(terminalreporter):
    _frameworks(terminalreporter.write_line)
    _harness_table(terminalreporter.write_line)


def _harness_table(w):
    if not _harness:
        return
    w("")
    w(f"{'dlsync.testing in a suite':32} {'what':44} {'time':>6}   verdict")
    for test, what, verdict, seconds, _ in _harness:
        t = "" if seconds is None else f"{seconds:5.2f}s"
        w(f"{test:32} {what[:44]:44} {t:>6}   {verdict}")
    w("what the harness said:")
    for test, _, verdict, _, note in _harness:
        w(f"  {test}: {note[:300]}")
    passed = sum(1 for r in _harness if r[2] == "PASS")
    w(f"harness: {passed} passed, {len(_harness) - passed} failed")


def _frameworks(w):
    if not _rows:
        return
    w("")
    w(f"{'case':20} {'setting':17} {'mode':13} {'runs':>5} {'wrong':>5} {'broke':>5}"
      f"   {'ctl-w':>5} {'ctl-b':>5}   verdict")
    for r in _rows:
        w(f"{r[0]:20} {r[1]:17} {r[2]:13} {r[3]:5} {r[4]:5} {r[5]:5}   {r[6]:5} {r[7]:5}   {r[8]}")
    w("")
    w("controls (without dlsync), first line of what went wrong:")
    for r in _rows:
        if r[10]:
            w(f"  {r[0]} [{r[2]}]: {r[10]}")
    passed = sum(1 for r in _rows if r[8] == "PASS")
    w(f"{passed} passed, {len(_rows) - passed} failed")
