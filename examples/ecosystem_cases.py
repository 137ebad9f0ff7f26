# SPDX-License-Identifier: Apache-2.0
"""What the ecosystem examples' run.py scripts share (jax_ffi, nanobind_ext,
tvm_ffi, launcher): each case runs in a process of its own (a broken capture
or a broken framework runtime leaves nothing behind for the next case), which
prints one line ``RESULT <json>``; the parent reads it, or makes a result
that says how the process ended; a control must fail for its own reason.

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import ecosystem_cases as ec
"""
import json
import subprocess
import sys

CASE_TIMEOUT = 120  # seconds for one case's process

# Errors that say the test broke, not the ordering: a control that fails so
# has not shown what it is there to show.
UNRELATED = ("ImportError", "ModuleNotFoundError", "AttributeError", "NameError", "SyntaxError",
             "exit ")


def framework_missing(error) -> bool:
    """A case needs a framework this machine lacks: a skip, not a failure
    (any other missing module is a failure)."""
    return bool(error) and any(f"No module named '{m}'" in error for m in ("torch", "cupy", "jax"))


def control_failed(res) -> bool:
    """A control's failure for its reason: wrong results, or an error of the
    capture or the import it breaks; not a crash or a broken test."""
    if res["error"] is None:
        return res["wrong"] > 0
    return not res["error"].startswith(UNRELATED)


def control_verdict(res) -> str:
    return ("control failed as expected" if control_failed(res) else
            "CONTROL FAILED FOR ANOTHER REASON" if res["error"] else "CONTROL DID NOT FAIL")


def error_line(e: BaseException) -> str:
    """An exception as one line: its type and the first line of its text."""
    msg = str(e).strip().splitlines()[0][:240] if str(e).strip() else ""
    return f"{type(e).__name__}: {msg}"


def child(fn, *args) -> int:
    """The case process: ``fn(*args)``'s dict with ``error`` None, or, when
    it raised, ``{"runs": 0, "wrong": 0, "error": ...}``; printed as the
    RESULT line."""
    try:
        res = fn(*args)
        res["error"] = None
    except Exception as e:  # noqa: BLE001 - the error is the case's result
        res = {"runs": 0, "wrong": 0, "error": error_line(e)}
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def run(script, args, *, flag="--case", timeout=CASE_TIMEOUT, wrap=None, env=None, empty=None):
    """Runs ``script flag args...`` (under ``wrap``, a command prefix such as
    compute-sanitizer's) with ``timeout`` seconds; returns (result, proc). A
    process that printed no RESULT line gives ``empty`` (default: 0 runs, 0
    wrong) with an error ``exit <rc>: <its last lines>``; one past its time,
    ``exit timeout: ...`` and a proc whose returncode is "timeout"."""
    cmd = (wrap or []) + [sys.executable, script, flag] + [str(a) for a in args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(cmd, "timeout", stdout="",
                                           stderr=f"no result in {timeout} s")
    res = None
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[len("RESULT "):])
    if res is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        res = dict(empty or {"runs": 0, "wrong": 0})
        res["error"] = f"exit {proc.returncode}: {' | '.join(tail)[:240]}"
    return res, proc
