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
"""

from __future__ import annotations

import ctypes
import threading
import time
import traceback
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from . import _restore
from .report import (
    ERROR_TABLE,
    CaptureReport,
    CaseResult,
    Diagnosis,
    ErrorKind,
    WrongOutput,
    classify_error,
    diagnose,
    user_frame,
)

__all__ = [
    "check_capture",
    "MODES",
    "NEIGHBOURS",
    "CaptureReport",
    "CaseResult",
    "Diagnosis",
    "ErrorKind",
    "WrongOutput",
    "ERROR_TABLE",
    "classify_error",
    "diagnose",
    "gpu_unavailable_reason",
]

MODES = ("global", "thread_local", "relaxed")
NEIGHBOURS = (None, "eager", "capture")
_WAIT_S = 60.0  # the longest a thread waits for the other; past it the case fails


# ---- argument checks and plain helpers (no framework needed) ----


def _check_args(modes: Sequence[str], replays: int, neighbour: Any, rtol: Any, atol: Any,
                slow_producer_ms: float) -> Tuple[Tuple[str, ...], Tuple[Optional[str], ...]]:
    """Validates check_capture's options; returns (modes, neighbours)."""
    if isinstance(modes, str):
        modes = (modes,)
    modes = tuple(modes)
    for m in modes:
        if m not in MODES:
            raise ValueError(f"capture mode {m!r}: expected one of {', '.join(MODES)}")
    if isinstance(replays, bool) or not isinstance(replays, int) or replays < 1:
        raise ValueError(f"replays must be an int >= 1, not {replays!r}")
    if neighbour is None or isinstance(neighbour, str):
        neighbours: Tuple[Optional[str], ...] = (neighbour,)
    else:
        neighbours = tuple(neighbour)
    for n in neighbours:
        if n not in NEIGHBOURS:
            raise ValueError(f"neighbour {n!r}: expected None, 'eager' or 'capture'")
    if (rtol is None) != (atol is None):
        raise ValueError("rtol and atol go together (as torch.testing.assert_close takes them)")
    if not slow_producer_ms >= 0:
        raise ValueError(f"slow_producer_ms must be >= 0, not {slow_producer_ms!r}")
    return modes, neighbours


def _flatten(obj: Any, path: str = "out") -> Iterator[Tuple[str, Any]]:
    """(path, leaf) for every leaf of nested tuples, lists and dicts."""
    if isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{path}[{i}]")
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{path}[{k!r}]")
    else:
        yield path, obj


def _require_outputs(out: Any) -> None:
    if all(leaf is None for _, leaf in _flatten(out)):
        raise ValueError("the op returned no outputs to compare (None): return them, e.g. "
                         "`return out` for an op that writes into `out`")


def _mismatch_summary(text: str) -> str:
    """The lines of an assert_close message that say how much differs."""
    keep = [line.strip() for line in text.splitlines()
            if line.strip().startswith(("Mismatched elements", "Greatest absolute",
                                        "Greatest relative"))]
    if keep:
        return "; ".join(keep)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines[:2])[:300]


def _chain(exc: BaseException) -> List[BaseException]:
    """exc and the exceptions it was raised from or during, root cause first."""
    out: List[BaseException] = []
    seen = set()
    cur: Optional[BaseException] = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    out.reverse()
    return out


def _messages(exc: BaseException) -> List[str]:
    return [f"{type(e).__name__}: {e}" for e in _chain(exc)]


def _where(exc: BaseException) -> str:
    """The op's own frame nearest the error: the innermost exception's
    traceback first; where that one holds no frame of the op (raised in
    dlsync or a framework called back from C code, e.g. a __dlpack__ that
    torch.from_dlpack calls), the next exception of the chain, whose
    traceback reaches the op's line."""
    for e in _chain(exc):
        frames = [(f.filename, f.lineno, f.name, f.line) for f in
                  traceback.extract_tb(e.__traceback__)]
        where = user_frame(frames)
        if where:
            return where
    return ""


def gpu_unavailable_reason() -> str:
    """Why check_capture cannot run here ("" when it can): PyTorch missing,
    or no CUDA GPU."""
    try:
        import torch
    except ImportError as e:
        return f"PyTorch is not installed ({e})"
    try:
        if not torch.cuda.is_available():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
    except Exception as e:  # noqa: BLE001 - a broken driver install says so here
        return f"CUDA is not usable: {e}"
    return ""


# ---- the GPU side ----


def _relax_this_thread() -> None:
    """Sets this thread's capture interaction mode to RELAXED, so that the
    harness's own neighbour thread is never the one that breaks a capture."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED
        cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    except (OSError, AttributeError):
        pass


class _Neighbour(threading.Thread):
    """Another thread beside the op's capture: ``eager`` makes eager
    dlsync exchanges (with a kernel each) until the op has run; ``capture``
    holds a GLOBAL-mode capture of its own open while the op is captured."""

    def __init__(self, torch: Any, kind: str, device: Any):
        super().__init__(name=f"dlsync-testing-{kind}-neighbour", daemon=True)
        self.torch, self.kind, self.device = torch, kind, device
        self.a = torch.full((1 << 16,), 3.0, device=device)
        self.b = torch.zeros_like(self.a)
        self.s1, self.s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)
        self.graph: Any = None
        self.count = 0
        self.ready, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        torch = self.torch
        try:
            torch.cuda.set_device(self.device)
            if self.kind == "capture":
                self._capture(torch)
            else:
                self._exchange(torch)
        except BaseException as e:  # noqa: BLE001 - reported in the case
            self.error = e
        finally:
            self.ready.set()
            self.done.set()

    def _capture(self, torch: Any) -> None:
        _relax_this_thread()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.s2):
            g.capture_begin(capture_error_mode="global")
            try:
                self.ready.set()
                self.go.wait(_WAIT_S)
                torch.mul(self.a, 2, out=self.b)
            finally:
                g.capture_end()
        self.graph = g

    def _exchange(self, torch: Any) -> None:
        import dlsync

        def one() -> None:
            with dlsync.exchange(self.s1, self.s2), torch.cuda.stream(self.s2):
                torch.add(self.a, 1, out=self.b)
            self.count += 1

        one()  # warm: the context, the pool, this thread's state
        self.s2.synchronize()
        self.ready.set()
        while not self.go.is_set() and self.count < 20000:
            one()
            time.sleep(0)

    def stop(self) -> None:
        self.go.set()
        if not self.done.wait(_WAIT_S):
            self.error = self.error or TimeoutError("the neighbour thread did not finish")

    def problems(self) -> List[str]:
        """After the op's capture ended: the neighbour's errors, or a check
        of what it computed."""
        torch = self.torch
        if self.error is not None:
            return _messages(self.error)
        try:
            if self.kind == "capture":
                self.graph.replay()
                torch.cuda.synchronize()
                expect = 2 * self.a
            else:
                torch.cuda.synchronize()
                expect = self.a + 1
            if not torch.equal(self.b, expect):
                return [f"the {self.kind} neighbour read wrong data (its own check)"]
        except Exception as e:  # noqa: BLE001
            return _messages(e)
        return []


class _Harness:
    def __init__(self, torch: Any, fn: Callable, inputs: Tuple[Any, ...], *, reference: Callable,
                 new_inputs: Optional[Callable], rtol: Any, atol: Any, slow_producer_ms: float,
                 seed: int):
        self.torch, self.fn, self.args = torch, fn, list(inputs)
        self.static = [i for i, a in enumerate(self.args)
                       if isinstance(a, torch.Tensor) and a.is_cuda]
        if not self.static:
            raise ValueError("check_capture needs at least one CUDA tensor among the inputs: "
                             "they are the static inputs that each replay rewrites")
        self.device = self.args[self.static[0]].device
        self.reference, self.new_inputs = reference, new_inputs
        self.rtol, self.atol = rtol, atol
        self.producer = torch.cuda.Stream(self.device)
        self.streams: List[Any] = [self.producer]  # every stream the harness made
        self.reset: List[str] = []  # what the harness itself set back during the case
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)
        self.cycles = int(slow_producer_ms * _cycles_per_ms(torch, self.device))
        self.calls = 0
        self.fresh: List[Any] = []  # the values of the last rewrite, for the reference

    # inputs

    def _random_like(self, t: Any) -> Any:
        torch = self.torch
        if t.dtype.is_complex:
            return torch.randn(t.shape, dtype=torch.complex64, device=t.device,
                               generator=self.gen).to(t.dtype)
        if t.dtype.is_floating_point:
            return torch.randn(t.shape, device=t.device, generator=self.gen).to(t.dtype)
        if t.dtype == torch.bool:
            return torch.randint(0, 2, t.shape, device=t.device, generator=self.gen).bool()
        info = torch.iinfo(t.dtype)
        return torch.randint(max(info.min, -100), min(info.max, 100) + 1, t.shape,
                             device=t.device, generator=self.gen).to(t.dtype)

    def write_inputs(self) -> None:
        """New values into the static inputs, by a slow producer: a spin on
        the producer stream ahead of the write; the current stream waits."""
        torch = self.torch
        self.calls += 1
        with torch.cuda.stream(self.producer):
            if self.new_inputs is not None:
                fresh = list(self.new_inputs(self.calls))
                if len(fresh) != len(self.static):
                    raise ValueError(f"new_inputs returned {len(fresh)} values for "
                                     f"{len(self.static)} CUDA tensor inputs")
            else:
                fresh = [self._random_like(self.args[i]) for i in self.static]
            if self.cycles > 0:
                torch.cuda._sleep(self.cycles)
            for i, value in zip(self.static, fresh):
                self.args[i].copy_(value)
        self.fresh = fresh
        torch.cuda.current_stream(self.device).wait_stream(self.producer)

    # outputs

    def snapshot(self, out: Any) -> List[Tuple[str, Any]]:
        """The outputs' values now (call after a synchronisation)."""
        torch = self.torch
        leaves = []
        for path, leaf in _flatten(out):
            if isinstance(leaf, torch.Tensor):
                leaf = leaf.detach().clone()
            elif hasattr(leaf, "__dlpack__"):
                leaf = torch.from_dlpack(leaf).clone()
            leaves.append((path, leaf))
        return leaves

    def expected(self) -> List[Tuple[str, Any]]:
        torch = self.torch
        torch.cuda.synchronize()
        # From the values written, not from the inputs now: an op may work in place.
        args = [a.clone() if isinstance(a, torch.Tensor) else a for a in self.args]
        for i, value in zip(self.static, self.fresh):
            args[i] = torch.empty_like(self.args[i]).copy_(value)
        ref = self.reference(*args)
        torch.cuda.synchronize()
        return self.snapshot(ref)

    def compare(self, got: List[Tuple[str, Any]], ref: List[Tuple[str, Any]],
                before: Optional[List[Tuple[str, Any]]], run: int) -> List[WrongOutput]:
        torch = self.torch
        if [p for p, _ in got] != [p for p, _ in ref]:
            return [WrongOutput(run, "outputs", f"the op returned {[p for p, _ in got]}, the "
                                f"reference {[p for p, _ in ref]}")]
        wrong = []
        for k, ((path, a), (_, b)) in enumerate(zip(got, ref)):
            detail = ""
            if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
                try:
                    torch.testing.assert_close(a, b, rtol=self.rtol, atol=self.atol,
                                               equal_nan=True, check_device=False)
                except AssertionError as e:
                    detail = _mismatch_summary(str(e))
            elif a is not b and a != b:
                detail = f"{a!r} != {b!r}"
            if detail:
                unchanged = False
                if before is not None and isinstance(a, torch.Tensor):
                    prev = before[k][1]
                    unchanged = (isinstance(prev, torch.Tensor) and prev.shape == a.shape
                                 and bool(torch.equal(prev.to(a.device), a)))
                wrong.append(WrongOutput(run, path, detail, unchanged))
        return wrong

    # cases

    def eager(self, replays: int) -> CaseResult:
        torch = self.torch
        case = CaseResult("eager", "eager")
        try:
            torch.cuda.synchronize()
            out = self.fn(*self.args)  # warm-up: lazy initialisation, kernel caches, pools
            torch.cuda.synchronize()
            _require_outputs(out)
            for run in range(1, replays + 1):
                self.write_inputs()
                out = self.fn(*self.args)
                torch.cuda.synchronize()
                got = self.snapshot(out)
                case.wrong += self.compare(got, self.expected(), None, run)
                case.runs += 1
        except Exception as e:  # noqa: BLE001 - the report says what it was
            case.errors, case.where = _messages(e), _where(e)
            _settle(torch)
        return case

    def captured(self, mode: str, replays: int, neighbour: Optional[str]) -> CaseResult:
        torch = self.torch
        name = mode if neighbour is None else f"{mode}+{neighbour}"
        case = CaseResult(name, mode, neighbour or "-")
        g = torch.cuda.CUDAGraph()
        capture_stream = torch.cuda.Stream(self.device)
        nb = _Neighbour(torch, neighbour, self.device) if neighbour else None
        self.streams.append(capture_stream)
        if nb is not None:
            self.streams += [nb.s1, nb.s2]
        out = None
        try:
            # One eager call on the capture stream first, as PyTorch's CUDA
            # graph notes advise: per-stream lazy state (library handles,
            # workspaces) must not be created during the capture.
            capture_stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(capture_stream):
                self.fn(*self.args)
            torch.cuda.synchronize()  # as torch.cuda.graph does before it captures
            if nb is not None:
                nb.start()
                if not nb.ready.wait(_WAIT_S):
                    raise TimeoutError("the neighbour thread did not start")
            try:
                with torch.cuda.stream(capture_stream):
                    g.capture_begin(capture_error_mode=mode)
                    try:
                        out = self.fn(*self.args)
                    finally:
                        if nb is not None:
                            nb.stop()  # the neighbour ends its capture before the op's
                        if torch.cuda.current_stream(self.device) != capture_stream:
                            # capture_end must run on the stream the capture began on
                            torch.cuda.set_stream(capture_stream)
                            self.reset.append("the op left another current stream; set back "
                                              "before capture_end")
                        g.capture_end()
            finally:
                if nb is not None:
                    nb.stop()
            case.captured = True
        except Exception as e:  # noqa: BLE001
            case.captured = False
            case.errors, case.where = _messages(e), _where(e)
        _settle(torch)
        if nb is not None:
            case.neighbour_errors = nb.problems()
            nb.join(_WAIT_S)
            if nb.is_alive():
                case.left.append(f"{nb.name} did not finish in {_WAIT_S:.0f} s")
        if not case.captured:
            return case
        try:
            for run in range(1, replays + 1):
                torch.cuda.synchronize()
                before = self.snapshot(out)
                self.write_inputs()
                g.replay()
                torch.cuda.synchronize()
                got = self.snapshot(out)
                case.wrong += self.compare(got, self.expected(), before, run)
                case.runs += 1
        except Exception as e:  # noqa: BLE001
            case.errors, case.where = _messages(e), _where(e)
            _settle(torch)
        del g
        return case

    def compiled(self, replays: int) -> CaseResult:
        torch = self.torch
        case = CaseResult("compile", "reduce-overhead")
        skips_before = _cudagraph_skips(torch)
        try:
            cfn = torch.compile(self.fn, mode="reduce-overhead")
            mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
            # PyTorch's CUDA graph trees warm up, record, then replay: two
            # calls more than the replays asked for, each one checked.
            for run in range(1, replays + 3):
                if mark is not None:
                    mark()
                self.write_inputs()
                out = cfn(*self.args)
                torch.cuda.synchronize()
                got = self.snapshot(out)
                case.wrong += self.compare(got, self.expected(), None, run)
                case.runs += 1
            case.captured = True
        except Exception as e:  # noqa: BLE001
            case.captured = False
            case.errors, case.where = _messages(e), _where(e)
            _settle(torch)
        skipped = _cudagraph_skips(torch) - skips_before
        if skipped > 0:
            case.note = "torch.compile skipped CUDA graphs for this op (nothing was captured)"
        return case


def _settle(torch: Any) -> None:
    """Waits for the device after a failure; a capture error is not sticky,
    so this normally succeeds and the next case starts clean."""
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the case has its error already
        pass


def _cudagraph_skips(torch: Any) -> int:
    try:
        from torch._dynamo.utils import counters

        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:  # noqa: BLE001 - an older or newer PyTorch: no count
        return 0


_CYCLES: Dict[Any, float] = {}


def _cycles_per_ms(torch: Any, device: Any) -> float:
    """GPU clock cycles of torch.cuda._sleep per millisecond, measured once."""
    key = str(device)
    if key not in _CYCLES:
        with torch.cuda.device(device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(1_000_000)  # warm
            start.record()
            torch.cuda._sleep(10_000_000)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        _CYCLES[key] = 10_000_000 / ms if ms > 0 else 2_000_000.0
    return _CYCLES[key]


def check_capture(fn: Callable, *inputs: Any, modes: Sequence[str] = MODES, replays: int = 3,
                  compile: bool = False, neighbour: Any = None, rtol: Optional[float] = None,
                  atol: Optional[float] = None, slow_producer_ms: float = 10.0,
                  reference: Optional[Callable] = None, new_inputs: Optional[Callable] = None,
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

        report = run_isolated(fn, inputs, options)
        return report.raise_if_failed() if raise_on_failure else report
    reason = gpu_unavailable_reason()
    if reason:
        raise RuntimeError(f"dlsync.testing.check_capture cannot run: {reason}")
    import torch

    report = _check(torch, fn, inputs, options, _restore.Driver())
    return report.raise_if_failed() if raise_on_failure else report


def _device_index(device: Any) -> int:
    index = getattr(device, "index", None)
    if not isinstance(index, int):
        text = str(device)
        index = int(text.split(":", 1)[1]) if ":" in text else 0
    return int(index)


def _check(torch: Any, fn: Callable, inputs: Tuple[Any, ...], options: Dict[str, Any],
           driver: Any) -> CaptureReport:
    """check_capture in this process, every case followed by a restore."""
    mode_list, neighbours = options["modes"], options["neighbour"]
    replays = options["replays"]
    h = _Harness(torch, fn, inputs, reference=options["reference"] or fn,
                 new_inputs=options["new_inputs"], rtol=options["rtol"], atol=options["atol"],
                 slow_producer_ms=options["slow_producer_ms"], seed=options["seed"])
    report = CaptureReport(options["name"] or getattr(fn, "__qualname__", None) or repr(fn))
    dev = _device_index(h.device)
    snap = _restore.take(torch, driver, [dev])
    threads_before = _restore.harness_threads()

    def run(case_fn: Callable[[], CaseResult]) -> CaseResult:
        h.reset = []
        watch = _restore.Watch(torch)
        try:
            with watch, torch.cuda.device(h.device):
                case = case_fn()
        finally:
            done, left = _restore.after_case(torch, driver, snap, watch,
                                             [int(s.cuda_stream) for s in h.streams],
                                             threads_before)
        case.restored = h.reset + done
        case.left += left
        return case

    try:
        if options["eager"]:
            first = run(lambda: h.eager(replays))
            report.cases.append(first)
            if first.errors:
                for mode in mode_list:
                    for n in neighbours:
                        report.cases.append(CaseResult(mode if n is None else f"{mode}+{n}", mode,
                                                       n or "-",
                                                       skipped="the op failed eagerly"))
                return report
        for mode in mode_list:
            for n in neighbours:
                report.cases.append(run(lambda: h.captured(mode, replays, n)))
        if options["compile"]:
            report.cases.append(run(lambda: h.compiled(replays)))
    finally:
        done: List[str] = []
        left: List[str] = []
        _restore.put_back(torch, driver, snap, done, left, rng=True)
        if report.cases:
            report.cases[-1].restored += done
            report.cases[-1].left += left
        _restore.UNCLEAN.extend(left)
    return report
