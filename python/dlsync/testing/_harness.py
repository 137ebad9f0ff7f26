# SPDX-License-Identifier: Apache-2.0
"""The cases of a check: the op eager, captured in each mode (beside a
neighbour), compiled; each after a slow producer rewrote the inputs, each
output compared with the reference, and the process put back after each
(_restore). ``_check`` runs a whole check in this process."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _restore, _streams
from ._neighbour import _Neighbour
from ._options import _WAIT_S, _flatten, _messages, _mismatch_summary, _require_outputs, _where
from .report import CaptureReport, CaseResult, WrongOutput

_Fn = Callable[..., Any]  # the op, its reference, new_inputs


class _Harness:
    def __init__(self, torch: Any, fn: _Fn, inputs: Tuple[Any, ...], *, reference: _Fn,
                 new_inputs: Optional[_Fn], rtol: Any, atol: Any, slow_producer_ms: float,
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
        if not case.errors:
            self.count_streams(case, g, mode, neighbour)
        del g
        return case

    # ---- the streams at replay (_streams: CUPTI) ----

    def count_streams(self, case: CaseResult, g: Any, mode: str,
                      neighbour: Optional[str]) -> None:
        """The streams one replay of the op's graph runs on; without a
        neighbour also those of a graph holding two calls of the op, so
        that an op taking a stream of its own at each call shows (its
        graph's streams grow with the calls a model makes). Never fails the
        case: what cannot be counted is said."""
        torch = self.torch
        counter = _streams.counter()

        def replay(graph: Any) -> Callable[[], None]:
            def run() -> None:
                graph.replay()
                torch.cuda.synchronize()
            return run

        try:
            torch.cuda.synchronize()
            case.replay_streams, case.replay_streams_why = counter.count(replay(g))
        except Exception as e:  # noqa: BLE001
            case.replay_streams = None
            case.replay_streams_why = f"the counted replay raised {_messages(e)[-1]}"
            _settle(torch)
            return
        if case.replay_streams is None or neighbour is not None:
            return
        g2 = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream(self.device)
        self.streams.append(s)
        try:
            s.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(s):
                self.fn(*self.args)  # warm-up on the new stream, as for the case's capture
            torch.cuda.synchronize()
            with torch.cuda.stream(s):
                g2.capture_begin(capture_error_mode=mode)
                try:
                    self.fn(*self.args)
                    self.fn(*self.args)
                finally:
                    g2.capture_end()
            torch.cuda.synchronize()
            case.replay_streams_two_calls, why = counter.count(replay(g2))
        except Exception as e:  # noqa: BLE001
            case.replay_streams_two_calls, why = None, _messages(e)[-1]
            _settle(torch)
        if case.replay_streams_two_calls is None:
            case.replay_streams_note = why
        del g2

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
        from torch._dynamo.utils import counters  # type: ignore[import-not-found, unused-ignore]

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


def _device_index(device: Any) -> int:
    index = getattr(device, "index", None)
    if not isinstance(index, int):
        text = str(device)
        index = int(text.split(":", 1)[1]) if ":" in text else 0
    return int(index)


def _check(torch: Any, fn: _Fn, inputs: Tuple[Any, ...], options: Dict[str, Any],
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
