# SPDX-License-Identifier: Apache-2.0
# mypy: allow-untyped-decorators
# (pytest's decorators are untyped where pytest is not installed for the checker)
"""pytest plugin: capture conformance in a kernel library's tests.

Installed with dlsync, its entry point (``pytest11``, named as the module:
``dlsync.testing.pytest_plugin``) loads it in every pytest run; ``pytest -p
dlsync.testing.pytest_plugin`` loads it from a source tree, and is harmless
where it is installed (the entry point is then the same plugin, loaded
once); ``-p no:dlsync.testing.pytest_plugin`` keeps it out. It adds:

- the fixture ``capture_check``: ``capture_check(fn, *inputs, **options)``
  runs :func:`dlsync.testing.check_capture` (options as it takes them,
  defaults from the test's ``capture_modes`` marker) and returns the report;
- the marker ``@pytest.mark.capture_modes("global", "relaxed", replays=5,
  ...)``: on a test that uses ``capture_check`` it sets the modes and
  options; on a test that does not, the test body itself is the op: its
  CUDA tensor arguments (fixtures or parameters) are the inputs that each
  replay rewrites, and it returns the outputs to compare. A mode or option
  it does not know is a usage error, with or without a GPU;
- ``--dlsync-report=PATH``: every case of every check as JSON (test id,
  case, mode, verdict, category, first error line, where, what was
  restored);
- isolation: ``isolate=True`` in the marker, or ``--dlsync-isolate`` for
  every check, runs the test in a child pytest (a fresh interpreter) and
  prints its report here. After a case that left state the harness could
  not restore, every later check runs so, and the summary says why.

Without PyTorch or a GPU such tests are skipped with the reason; the
options a ``capture_check`` call is given are checked first (a misspelt mode
or option fails the test there too), and a body that fails before it calls
``capture_check`` (building CUDA inputs) is skipped. Loading the
plugin imports neither PyTorch nor any other framework.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable, Dict, Generator, List, Tuple

import pytest  # type: ignore[import-not-found, unused-ignore]

MARKER = "capture_modes"
_OPTIONS = ("replays", "compile", "neighbour", "rtol", "atol", "slow_producer_ms", "reference",
            "new_inputs", "seed", "eager", "name", "isolate")
_CHILD_ENV = "DLSYNC_TESTING_CHILD"
_REPORTS = pytest.StashKey[List[Tuple[str, Any]]]()  # (nodeid, CaptureReport) of this process
_RECORDS = pytest.StashKey[List[Dict[str, Any]]]()  # JSON rows, this process's and children's
_CHILDREN = pytest.StashKey[List[Tuple[str, bool, str]]]()  # (nodeid, passed, report text)
_UNCLEAN = pytest.StashKey[List[str]]()  # why later checks run in a child process
_NO_GPU = pytest.StashKey[str]()  # a capture_check test run without a GPU: why
_MISUSED = pytest.StashKey[bool]()  # its capture_check call was given bad options


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("dlsync", "dlsync capture conformance")
    group.addoption("--dlsync-report", metavar="PATH", default=None,
                    help="write every capture check's cases as JSON to PATH")
    group.addoption("--dlsync-isolate", action="store_true", default=False,
                    help="run every capture check in a child process")
    group.addoption("--dlsync-child-report", metavar="PATH", default=None,
                    help=_suppress())


def _suppress() -> str:
    import argparse

    return argparse.SUPPRESS


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*modes, replays=3, compile=False, neighbour=None, rtol=None, atol=None, "
        "slow_producer_ms=10.0, reference=None, new_inputs=None, seed=0, eager=True, name=None, "
        "isolate=False): check the test's op under CUDA graph capture in these modes "
        "(global, thread_local, relaxed) with dlsync.testing.check_capture; isolate=True runs "
        "it in a child process; skipped without a GPU")
    config.stash[_REPORTS] = []
    config.stash[_RECORDS] = []
    config.stash[_CHILDREN] = []
    config.stash[_UNCLEAN] = []


def pytest_runtest_logreport(report: Any) -> None:
    if report.skipped or report.failed:
        why = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else ""
        _outcomes.append(("skipped" if report.skipped else "failed", str(why)))


_outcomes: List[Tuple[str, str]] = []


def _options(item: pytest.Item) -> Dict[str, Any]:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return {}
    opts = dict(marker.kwargs)
    unknown = sorted(set(opts) - set(_OPTIONS))
    if unknown:
        raise pytest.UsageError(f"{item.nodeid}: unknown {MARKER} option(s) {', '.join(unknown)}"
                                f"; known: {', '.join(_OPTIONS)}")
    if marker.args:
        from dlsync.testing import MODES

        bad = [m for m in marker.args if m not in MODES]
        if bad:
            raise pytest.UsageError(f"{item.nodeid}: {MARKER}: unknown capture mode(s) "
                                    f"{', '.join(repr(m) for m in bad)}; known: "
                                    f"{', '.join(MODES)}")
        opts["modes"] = tuple(marker.args)
    return opts


def _skip_reason() -> str:
    from dlsync.testing import gpu_unavailable_reason

    return gpu_unavailable_reason()


def _run(config: pytest.Config, nodeid: str, fn: Any, inputs: Tuple[Any, ...],
         options: Dict[str, Any]) -> Any:
    from dlsync.testing import check_capture

    try:
        report = check_capture(fn, *inputs, **options)
    except AssertionError as e:
        failed = getattr(e, "report", None)
        if failed is not None:
            _keep(config, nodeid, failed)
        raise
    _keep(config, nodeid, report)
    return report


def _keep(config: pytest.Config, nodeid: str, report: Any) -> None:
    config.stash[_REPORTS].append((nodeid, report))
    config.stash[_RECORDS].extend(report.records(nodeid))
    if report.left:
        config.stash[_UNCLEAN].extend(f"{nodeid}: {x}" for x in report.left)


def _checks(item: pytest.Item) -> bool:
    return (item.get_closest_marker(MARKER) is not None
            or "capture_check" in getattr(item, "fixturenames", ()))


def _isolate_reason(item: pytest.Item) -> str:
    """Why this test runs in a child process ("" when it does not)."""
    if os.environ.get(_CHILD_ENV) or not _checks(item):
        return ""
    marker = item.get_closest_marker(MARKER)
    if marker is not None and marker.kwargs.get("isolate"):
        return "isolate=True"
    if item.config.getoption("--dlsync-isolate"):
        return "--dlsync-isolate"
    from dlsync.testing import _restore

    unclean = item.config.stash[_UNCLEAN] + list(_restore.UNCLEAN)
    if unclean:
        return "an earlier case left state that could not be restored: " + str(unclean[0])
    return ""


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None:
        _options(item)  # a misspelt mode or option fails before any fixture runs
        reason = _skip_reason()
        if reason:
            pytest.skip(f"dlsync capture check: {reason}")


def _check_options(fn: Any, inputs: Tuple[Any, ...], options: Dict[str, Any]) -> None:
    """What check_capture checks of its arguments before it needs a GPU: an
    option it does not take is TypeError, a mode, replay count, neighbour
    or tolerance it does not know is ValueError."""
    import inspect

    from dlsync.testing import check_capture
    from dlsync.testing._options import _check_args

    bound = inspect.signature(check_capture).bind(fn, *inputs, **options)
    bound.apply_defaults()
    a = bound.arguments
    _check_args(a["modes"], a["replays"], a["neighbour"], a["rtol"], a["atol"],
                a["slow_producer_ms"])


@pytest.fixture
def capture_check(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """``capture_check(fn, *inputs, **options)``: dlsync.testing.check_capture
    with the defaults of the test's capture_modes marker. Without a GPU the
    call checks its options (an error names a bad one) and skips the test."""
    defaults = _options(request.node)
    defaults.pop("isolate", None)  # the plugin isolates the whole test
    reason = _skip_reason()
    if reason:
        request.node.stash[_NO_GPU] = reason

    def check(fn: Any, *inputs: Any, **options: Any) -> Any:
        merged = {**defaults, **options}
        if reason:
            try:
                _check_options(fn, inputs, merged)
            except (TypeError, ValueError) as e:
                request.node.stash[_MISUSED] = True
                raise type(e)(f"capture_check: {e}") from None
            pytest.skip(f"dlsync capture check: {reason}")
        return _run(request.config, request.node.nodeid, fn, inputs, merged)

    return check


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    """Without a GPU, a capture_check test whose body failed before its
    capture_check call (most build CUDA inputs first) is skipped with the
    reason, as if the fixture had skipped it; bad options stay a failure."""
    outcome = yield
    report = outcome.get_result()
    reason = item.stash.get(_NO_GPU, "")
    if (reason and call.when == "call" and report.failed
            and not item.stash.get(_MISUSED, False) and call.excinfo is not None):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1,
                           f"Skipped: dlsync capture check: {reason} (the test raised "
                           f"{call.excinfo.typename} before calling capture_check)")


def _plugin_args(config: pytest.Config) -> List[str]:
    """-p for the child: loading the plugin by its module name is the entry
    point's plugin too (one name), so it is given whether or not dlsync is
    installed there."""
    return ["-p", __name__]


def _run_in_child(item: pytest.Item, why: str) -> None:
    config = item.config
    fd, path = tempfile.mkstemp(prefix="dlsync-child-", suffix=".json")
    os.close(fd)
    package_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env[_CHILD_ENV] = "1"
    env["PYTHONPATH"] = package_dir + os.pathsep + env.get("PYTHONPATH", "")
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
            str(config.rootpath), *_plugin_args(config), "--dlsync-child-report", path]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    args.append(item.nodeid)
    try:
        run = subprocess.run(args, cwd=str(config.rootpath), env=env, capture_output=True,
                             text=True)
        output = run.stdout + run.stderr
        try:
            with open(path) as f:
                child = json.load(f)
        except (OSError, ValueError):
            child = {"records": [], "reports": []}
    finally:
        os.unlink(path)
    for r in child["records"]:
        r["isolated"] = True
    config.stash[_RECORDS].extend(child["records"])
    for rep in child["reports"]:
        config.stash[_CHILDREN].append((item.nodeid, rep["ok"], rep["message"]))
    print(f"dlsync capture check in a child process ({why}):")
    print(output)
    skipped = [o for o in child.get("outcomes", []) if o[0] == "skipped"]
    if run.returncode == 0 and skipped:
        pytest.skip(f"in a child process: {skipped[0][1]}")
    if run.returncode != 0:
        pytest.fail(f"in a child process ({why}), exit code {run.returncode}:\n"
                    + output[-6000:], pytrace=False)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    why = _isolate_reason(pyfuncitem)
    if why:
        _run_in_child(pyfuncitem, why)
        return True
    if pyfuncitem.get_closest_marker(MARKER) is None or "capture_check" in pyfuncitem.fixturenames:
        return None
    import torch  # type: ignore[import-not-found, unused-ignore]

    names = list(pyfuncitem._fixtureinfo.argnames)
    kwargs: Dict[str, Any] = {n: pyfuncitem.funcargs[n] for n in names}
    tensors = [n for n in names if isinstance(kwargs[n], torch.Tensor) and kwargs[n].is_cuda]
    if not tensors:
        pytest.fail(f"{pyfuncitem.name} is marked {MARKER} but takes no CUDA tensor: its "
                    "CUDA tensor arguments are the inputs that each replay rewrites",
                    pytrace=False)
    others = {n: v for n, v in kwargs.items() if n not in tensors}
    body = pyfuncitem.obj

    def op(*values: Any) -> Any:
        out = body(**others, **dict(zip(tensors, values)))
        if out is None:
            raise ValueError(f"{pyfuncitem.name} returned None: a test marked {MARKER} is the "
                             "op itself and returns the outputs to compare")
        return out

    op.__qualname__ = pyfuncitem.name
    options = _options(pyfuncitem)
    options.pop("isolate", None)
    _run(pyfuncitem.config, pyfuncitem.nodeid, op, tuple(kwargs[n] for n in tensors), options)
    return True


def pytest_sessionfinish(session: pytest.Session) -> None:
    config = session.config
    records = config.stash.get(_RECORDS, [])
    child = config.getoption("--dlsync-child-report")
    if child:
        reports = [{"nodeid": n, "ok": r.ok, "message": r.message()}
                   for n, r in config.stash.get(_REPORTS, [])]
        with open(child, "w") as f:
            json.dump({"records": records, "reports": reports, "outcomes": _outcomes}, f)
    path = config.getoption("--dlsync-report")
    if path:
        with open(path, "w") as f:
            json.dump({"records": records}, f, indent=1)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reports = config.stash.get(_REPORTS, [])
    children = config.stash.get(_CHILDREN, [])
    if not reports and not children:
        return
    terminalreporter.section("dlsync capture conformance")
    for nodeid, report in reports:
        terminalreporter.write_line(f"{nodeid}: {'passed' if report.ok else 'FAILED'}")
        for line in report.table().splitlines():
            terminalreporter.write_line("  " + line)
        for line in report.left:
            terminalreporter.write_line("  left in the process: " + line)
    for nodeid, ok, message in children:
        terminalreporter.write_line(f"{nodeid}: {'passed' if ok else 'FAILED'} (in a child "
                                    "process)")
        lines = message.splitlines()
        for line in lines[1:]:
            if not line.strip():
                break
            terminalreporter.write_line("  " + line)
    unclean = config.stash.get(_UNCLEAN, [])
    if unclean:
        terminalreporter.write_line("checks after this ran in child processes, because it "
                                    "could not be restored: " + unclean[0])
