# SPDX-License-Identifier: Apache-2.0
"""dlsync.testing: capture conformance for a kernel library's own test suite.

    from dlsync.testing import check_capture

    def test_my_op_survives_capture():
        x = torch.randn(1 << 20, device="cuda")
        check_capture(my_lib.op, x)            # raises AssertionError with a report

:func:`check_capture` runs the op eagerly, then captured by PyTorch
(``torch.cuda.CUDAGraph`` in GLOBAL, THREAD_LOCAL and RELAXED modes) and
replayed with new inputs, each written by a deliberately slow producer (a GPU
spin ahead of the write) so that a missing dependency reads stale data instead
of passing by luck. Optionally it also runs the op under
``torch.compile(mode="reduce-overhead")`` and beside another thread that makes
eager exchanges or captures in GLOBAL mode. Every output is compared with an
eager reference, as ``torch.testing.assert_close`` compares.

Importing this module needs neither PyTorch nor a GPU: PyTorch is imported
when :func:`check_capture` runs. The pytest plugin is
``dlsync.testing.pytest_plugin`` (fixture ``capture_check``, marker
``capture_modes``). docs/testing.md shows a report.

The harness, one module per part: ``_options`` (the option checks and plain
helpers), ``_neighbour`` (the thread beside a capture), ``_harness`` (the
cases and the whole check), ``_restore`` (putting the process back after
each case), ``_child`` (a check in a child process), ``report`` (results,
the diagnosis table, the report) and ``pytest_plugin``. This file holds
:func:`check_capture` and re-exports the rest.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from . import _restore
from ._harness import _check, _device_index  # noqa: F401 - _device_index: dlsync.testing._child
from ._options import (  # noqa: F401 - the helpers stay importable from dlsync.testing
    MODES,
    NEIGHBOURS,
    _chain,
    _check_args,
    _flatten,
    _messages,
    _mismatch_summary,
    _require_outputs,
    _where,
    gpu_unavailable_reason,
)
from .report import (
    ERROR_TABLE,
    STREAMS_GROW,
    CaptureReport,
    CaseResult,
    Diagnosis,
    ErrorKind,
    ReplayStreamsWarning,
    WrongOutput,
    classify_error,
    diagnose,
    user_frame,
)

_Fn = Callable[..., Any]  # the op, its reference, new_inputs

__all__ = [
    "check_capture",
    "MODES",
    "NEIGHBOURS",
    "CaptureReport",
    "CaseResult",
    "Diagnosis",
    "ErrorKind",
    "WrongOutput",
    "ReplayStreamsWarning",
    "ERROR_TABLE",
    "classify_error",
    "diagnose",
    "gpu_unavailable_reason",
]


def check_capture(fn: _Fn, *inputs: Any, modes: Sequence[str] = MODES, replays: int = 3,
                  compile: bool = False, neighbour: Any = None, rtol: Optional[float] = None,
                  atol: Optional[float] = None, slow_producer_ms: float = 10.0,
                  reference: Optional[_Fn] = None, new_inputs: Optional[_Fn] = None,
                  seed: int = 0, name: Optional[str] = None, eager: bool = True,
                  raise_on_failure: bool = True, isolate: bool = False) -> CaptureReport:
    """Checks that ``fn(*inputs)`` gives the eager result when PyTorch
    captures it and replays the graph with new inputs.

    Cases: ``eager`` (the op itself, each call after a slow producer), one
    per capture mode in ``modes`` (captured with ``torch.cuda.CUDAGraph``,
    as ``torch.cuda.graph(g, capture_error_mode=mode)`` captures, then
    ``replays`` replays, each after new values were written into the CUDA
    tensors among ``inputs`` by a producer that spins ``slow_producer_ms``
    on the GPU first) and, with ``compile=True``, ``compile``
    (``torch.compile(fn, mode="reduce-overhead")``). ``neighbour="eager"``
    runs another thread making eager dlsync exchanges while the op is
    captured, ``"capture"`` one that holds a GLOBAL-mode capture of its own
    open meanwhile; a sequence such as ``(None, "capture")`` runs each.

    ``fn`` returns its outputs (a tensor, an object with ``__dlpack__``, or
    tuples, lists and dicts of them); every output is compared with
    ``reference(*inputs)`` (by default ``fn`` itself, run eagerly after a
    device synchronisation) as ``torch.testing.assert_close`` compares, with
    ``rtol``/``atol`` when given. ``new_inputs(n)``, when given, returns the
    values for the n-th rewrite (one per CUDA tensor input); by default they
    are random (normal for floating types, -100..100 for integers) from a
    generator seeded with ``seed``.

    After every case the process is put back as the check found it: the
    default CUDA generators (out of capture mode, same seeds and offsets),
    the thread's capture mode, the current device and streams, CuPy's
    current stream, the allocator pools of captures that failed, and no
    stream of the harness left capturing (docs/testing.md). What could not
    be put back is listed in the report; ``isolate=True`` runs the whole
    check in a child process (spawned, not forked: ``fn``, ``reference`` and
    ``new_inputs`` must be importable by name) and returns its report.

    Returns the :class:`CaptureReport`; if a case failed and
    ``raise_on_failure`` is true, raises ``AssertionError`` with the report
    (the exception's ``report`` attribute). Needs PyTorch and a CUDA GPU."""
    mode_list, neighbours = _check_args(modes, replays, neighbour, rtol, atol, slow_producer_ms)
    options = dict(modes=mode_list, replays=replays, compile=compile, neighbour=neighbours,
                   rtol=rtol, atol=atol, slow_producer_ms=slow_producer_ms, reference=reference,
                   new_inputs=new_inputs, seed=seed, name=name, eager=eager)
    if isolate:
        from ._child import run_isolated

        report: CaptureReport = run_isolated(fn, inputs, options)
        warn_streams(report)
        return report.raise_if_failed() if raise_on_failure else report
    reason = gpu_unavailable_reason()
    if reason:
        raise RuntimeError(f"dlsync.testing.check_capture cannot run: {reason}")
    import torch  # type: ignore[import-not-found, unused-ignore]

    report = _check(torch, fn, inputs, options, _restore.Driver())
    warn_streams(report)
    return report.raise_if_failed() if raise_on_failure else report


def warn_streams(report: CaptureReport) -> None:
    """A ReplayStreamsWarning when the op's graph replays on more streams
    with two calls than with one (the report says it too)."""
    grow = report.streams_grow
    if grow:
        import warnings

        c = grow[0]
        warnings.warn(f"dlsync.testing: {report.name}: {STREAMS_GROW} (one call: "
                      f"{c.replay_streams}, two calls in one capture: "
                      f"{c.replay_streams_two_calls}; cases {', '.join(x.name for x in grow)})",
                      ReplayStreamsWarning, stacklevel=3)
