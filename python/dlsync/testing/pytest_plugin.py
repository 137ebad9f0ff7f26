# SPDX-License-Identifier: Apache-2.0
"""pytest plugin: capture conformance in a kernel library's tests.

Installed with dlsync (entry point ``pytest11: dlsync =
dlsync.testing.pytest_plugin``); before installation, ``pytest -p
dlsync.testing.pytest_plugin``. It adds:

- the fixture ``capture_check``: ``capture_check(fn, *inputs, **options)``
  runs :func:`dlsync.testing.check_capture` (options as it takes them,
  defaults from the test's ``capture_modes`` marker) and returns the report;
- the marker ``@pytest.mark.capture_modes("global", "relaxed", replays=5,
  ...)``: on a test that uses ``capture_check`` it sets the modes and
  options; on a test that does not, the test body itself is the op: its
  CUDA tensor arguments (fixtures or parameters) are the inputs that each
  replay rewrites, and it returns the outputs to compare.

Without PyTorch or a GPU such tests are skipped with the reason. Loading the
plugin imports neither PyTorch nor any other framework.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import pytest

MARKER = "capture_modes"
_OPTIONS = ("replays", "compile", "neighbour", "rtol", "atol", "slow_producer_ms", "reference",
            "new_inputs", "seed", "eager", "name")
_REPORTS = pytest.StashKey[List[Tuple[str, Any]]]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*modes, replays=3, compile=False, neighbour=None, rtol=None, atol=None, "
        "slow_producer_ms=10.0): check the test's op under CUDA graph capture in these modes "
        "(global, thread_local, relaxed) with dlsync.testing.check_capture; skipped without a GPU")
    config.stash[_REPORTS] = []


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
        report = getattr(e, "report", None)
        if report is not None:
            config.stash[_REPORTS].append((nodeid, report))
        raise
    config.stash[_REPORTS].append((nodeid, report))
    return report


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker(MARKER) is not None:
        _options(item)  # a misspelt option fails before any fixture runs
        reason = _skip_reason()
        if reason:
            pytest.skip(f"dlsync capture check: {reason}")


@pytest.fixture
def capture_check(request: pytest.FixtureRequest):
    """``capture_check(fn, *inputs, **options)``: dlsync.testing.check_capture
    with the defaults of the test's capture_modes marker; skips the test
    without a GPU."""
    reason = _skip_reason()
    if reason:
        pytest.skip(f"dlsync capture check: {reason}")
    defaults = _options(request.node)

    def check(fn: Any, *inputs: Any, **options: Any) -> Any:
        return _run(request.config, request.node.nodeid, fn, inputs, {**defaults, **options})

    return check


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Any:
    if pyfuncitem.get_closest_marker(MARKER) is None or "capture_check" in pyfuncitem.fixturenames:
        return None
    import torch

    names = list(pyfuncitem._fixtureinfo.argnames)
    kwargs = {n: pyfuncitem.funcargs[n] for n in names}
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
    _run(pyfuncitem.config, pyfuncitem.nodeid, op, tuple(kwargs[n] for n in tensors),
         _options(pyfuncitem))
    return True


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reports = config.stash.get(_REPORTS, [])
    if not reports:
        return
    terminalreporter.section("dlsync capture conformance")
    for nodeid, report in reports:
        terminalreporter.write_line(f"{nodeid}: {'passed' if report.ok else 'FAILED'}")
        for line in report.table().splitlines():
            terminalreporter.write_line("  " + line)
