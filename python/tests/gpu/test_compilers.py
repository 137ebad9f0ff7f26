# SPDX-License-Identifier: Apache-2.0
"""What graph compilers call from Python, on a GPU, each case with dlsync and
a control without it (conftest.py's table):

- cuda.core conditional builders (if_then / if_cond, while_loop) with the
  node declared with its parent (dlsync.conditional_node(parent builder,
  None, body builder): the node read from the parent builder's capture
  dependencies right after it was added) and a slow EAGER producer (torch,
  ``SLOW`` cycles of sleep, then y = 2x + 1) ordered into the body's capture
  with dlsync.order: the wait node goes into the parent, ahead of the
  conditional node. The body reads y: IF, res = 3y once; WHILE, res += y on
  each of LOOPS turns, counted down by a kernel that sets the condition
  (cudaGraphSetConditional, NVRTC through CuPy; the condition's default 1).
  A fresh graph per trial (an eager producer is ordered before one launch:
  its event is recorded once), TRIALS trials, each reading fresh data. The
  control makes the same order without the declaration: the wait node lands
  in the body, and the parent fails to instantiate.
- fan-out: one slow producer, three consumers (dlsync.exchange(producer,
  consumers=[...])): eagerly, TRIALS rounds each read the fresh value (the
  control, no order, reads stale); captured (torch.cuda.graph, the producer
  the capturing stream, the consumers eager: they join the capture and are
  joined back on exit), REPLAYS replays with new input each read right (the
  control forks the consumers with events and never joins them back: the
  capture cannot end).
- dlsync.testing's streams at replay: bench/replay_streams' layer as an op
  (the main stream's work, a side stream's, joined back), issued main first:
  counted (or the report says why not), not growing with the calls; issued
  side first: two calls replay on more streams than one, and the report and
  a ReplayStreamsWarning say so.

Import-safe without a GPU (the module skips)."""
import contextlib
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dlsync  # noqa: E402
from dlsync.testing import _restore  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

M = 1 << 22  # 4 Mi floats
TRIALS = 20
REPLAYS = 20
LOOPS = 3  # the WHILE body's turns
SLOW = 200_000_000  # torch.cuda._sleep cycles: about 100 ms, longer than building a graph


def _broken(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


def _structured():
    """test_structured's helpers: the cuda.core namespace, the condition, the
    IF builder, the WHILE loop's kernel, closing builders."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import test_structured  # noqa: PLC0415 - a sibling module of this suite

    return test_structured


def _produce(prod, x, y, cycles=SLOW):
    """The slow producer on prod: y = 2x + 1 after ``cycles`` of sleep."""
    with torch.cuda.stream(prod):
        torch.cuda._sleep(cycles)
        torch.mul(x, 2, out=y)
        y.add_(1)


# ---- cuda.core conditional bodies, an eager producer hoisted into the parent ----


def _hoisted(kind, use):
    ts = _structured()
    core = ts._core()
    cupy = pytest.importorskip("cupy")
    numpy = pytest.importorskip("numpy")
    dev = core.Device(0)
    dev.set_current()
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    cy = cupy.from_dlpack(y)
    res = cupy.zeros(M, dtype=cupy.float32)
    left = cupy.zeros(1, dtype=cupy.int32)
    loop = ts._loop_kernel(cupy) if kind == "while" else None
    prod = torch.cuda.Stream()
    cupy.multiply(cy, 3, out=res)  # warm-ups outside any capture
    cupy.add(res, cy, out=res)
    _produce(prod, x, y, 1000)
    torch.cuda.synchronize()
    launch = dev.create_stream()
    runs = wrong = broken = 0
    note = ""
    for t in range(TRIALS):
        gb = body = graph = None
        value = float(t + 1)
        try:
            x.fill_(value)
            y.zero_()
            res.fill(0)
            left.fill(LOOPS)
            torch.cuda.synchronize()
            cupy.cuda.Device().synchronize()
            gb = dev.create_graph_builder().begin_building("relaxed")
            h = ts._condition(gb)
            body = ts._if_builder(gb, h) if kind == "if" else gb.while_loop(h)
            declared = (dlsync.conditional_node(gb, None, body) if use
                        else contextlib.nullcontext())
            with declared:
                body.begin_building("relaxed")
                bs = dlsync.stream_handle(body)
                _produce(prod, x, y)  # eager: about 100 ms before y is written
                dlsync.order(prod, bs)  # EAGER_TO_CAPTURE: declared, its wait node in the parent
                with cupy.cuda.ExternalStream(bs):
                    if kind == "if":
                        cupy.multiply(cy, 3, out=res)
                    else:
                        cupy.add(res, cy, out=res)
                        loop((1,), (1,), (numpy.uint64(ts._condition_value(h)), left))
                body.end_building()
            gb.end_building()
            graph = gb.complete()  # the control fails here (a wait node in the body)
            graph.launch(launch)
            launch.sync()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - counted broken; the next trial goes on
            broken += 1
            note = note or _broken(e)
            torch.cuda.synchronize()
            continue
        finally:
            if graph is not None and hasattr(graph, "close"):
                graph.close()
            ts._end_captures(body, gb)  # captures left open ended; the builders closed
        runs += 1
        want = (2.0 * value + 1) * (3 if kind == "if" else LOOPS)
        got = float(res[-1].get())
        if got != want:
            wrong += 1
            note = note or f"trial {t}: read {got}, want {want}"
        if kind == "while" and int(left[0].get()) != 0:
            wrong += 1
            note = note or f"trial {t}: the WHILE body ran {LOOPS - int(left[0].get())} times"
    return runs, wrong, broken, note


@pytest.mark.parametrize("kind", ["if", "while"])
def test_eager_producer_hoisted_out_of_a_cuda_core_body(kind, record):
    record(f"hoist {kind.upper()} cuda.core", "conditional_node", "relaxed",
           _hoisted(kind, True), _hoisted(kind, False))


# ---- fan-out: one producer, three consumers ----


def _fanout_eager(use):
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    outs = [torch.zeros(M, device="cuda") for _ in range(3)]
    prod = torch.cuda.Stream()
    consumers = [torch.cuda.Stream() for _ in range(3)]
    _produce(prod, x, y, 1000)
    torch.cuda.synchronize()
    runs = wrong = broken = 0
    note = ""
    for t in range(TRIALS):
        value = float(t + 1)
        x.fill_(value)
        y.zero_()
        for o in outs:
            o.zero_()
        torch.cuda.synchronize()
        _produce(prod, x, y, SLOW // 10)
        try:
            ctx = (dlsync.exchange(prod, consumers=consumers) if use
                   else contextlib.nullcontext())
            with ctx:
                for k, (c, o) in enumerate(zip(consumers, outs)):
                    with torch.cuda.stream(c):
                        torch.mul(y, k + 1, out=o)
        except Exception as e:  # noqa: BLE001
            broken += 1
            note = note or _broken(e)
        torch.cuda.synchronize()
        runs += 1
        for k, o in enumerate(outs):
            want = (2.0 * value + 1) * (k + 1)
            if float(o[-1].item()) != want:
                wrong += 1
                note = note or f"trial {t}, consumer {k}: {float(o[-1].item())}, want {want}"
                break
    return runs, wrong, broken, note


def test_fanout_eager(record):
    record("fan-out eager", "consumers=[3]", "eager", _fanout_eager(True), _fanout_eager(False))


def _fanout_captured(mode, use):
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    outs = [torch.zeros(M, device="cuda") for _ in range(3)]
    consumers = [torch.cuda.Stream() for _ in range(3)]
    _produce(torch.cuda.current_stream(), x, y, 1000)
    for k, o in enumerate(outs):
        torch.mul(y, k + 1, out=o)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            main = torch.cuda.current_stream()
            _produce(main, x, y, SLOW // 10)
            if use:
                ctx = dlsync.exchange(main.cuda_stream, consumers=consumers)
            else:  # forked by plain events, never joined back
                ev = torch.cuda.Event()
                ev.record(main)
                for c in consumers:
                    c.wait_event(ev)
                ctx = contextlib.nullcontext()
            with ctx:
                for k, (c, o) in enumerate(zip(consumers, outs)):
                    with torch.cuda.stream(c):
                        torch.mul(y, k + 1, out=o)
    except Exception as e:  # noqa: BLE001
        torch.cuda.synchronize()
        # The failed capture leaves torch's default generator in capture mode
        # (its capture_end never ran): a later draw would fail.
        device = torch.cuda.current_device()
        if _restore.generator_stuck(torch, device):
            _restore.repair_generator(torch, device)
        return runs, wrong, broken + 1, _broken(e)
    note = ""
    for i in range(REPLAYS):
        value = float(i + 1)
        x.fill_(value)
        y.zero_()
        for o in outs:
            o.zero_()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        for k, o in enumerate(outs):
            want = (2.0 * value + 1) * (k + 1)
            if float(o[-1].item()) != want:
                wrong += 1
                note = note or f"replay {i}, consumer {k}: {float(o[-1].item())}, want {want}"
                break
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_fanout_into_a_capture(mode, record):
    record("fan-out captured", "consumers=[3]", mode, _fanout_captured(mode, True),
           _fanout_captured(mode, False))


# ---- dlsync.testing: the streams at replay ----


def _layer_op(side_first):
    """bench/replay_streams' layer as an op: the main stream's work, a side
    stream forked from it, the side's work and the main stream's second
    half (the side's queued first, or the main's), the side joined back."""
    side = torch.cuda.Stream()

    def op(a):
        cur = torch.cuda.current_stream()
        t = torch.mul(a, 2)  # the main stream's first half
        out_side = torch.empty_like(a)
        out_main = torch.empty_like(a)
        side.wait_stream(cur)
        if side_first:
            with torch.cuda.stream(side):
                torch.add(t, 1, out=out_side)
            torch.mul(t, 3, out=out_main)
        else:
            torch.mul(t, 3, out=out_main)
            with torch.cuda.stream(side):
                torch.add(t, 1, out=out_side)
        cur.wait_stream(side)
        return out_side, out_main

    return op


@pytest.mark.parametrize("side_first", [False, True], ids=["main first", "side first"])
def test_streams_at_replay_counted_and_growth_warned(side_first):
    """The report counts the streams one replay of the op's graph runs on
    (or says why not) and warns where a graph of two calls replays on more:
    bench/replay_streams saw 65 streams for 64 such layers issued side
    first on an H100, 2 main first."""
    from dlsync.testing import ReplayStreamsWarning, check_capture

    x = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        report = check_capture(_layer_op(side_first), x, modes=("global",),
                               raise_on_failure=False)
    assert report.ok, report.message()
    case = report.case("global")
    text = report.message()
    if case.replay_streams is None:
        assert case.replay_streams_why, "not counted and no reason given"
        assert f"streams at replay: n/a ({case.replay_streams_why})" in text, text
        pytest.skip(f"streams at replay not counted here: {case.replay_streams_why}")
    assert f"streams at replay: {case.replay_streams}" in text, text
    assert case.replay_streams_two_calls is not None, case.replay_streams_note
    warned = [w for w in seen if issubclass(w.category, ReplayStreamsWarning)]
    if side_first:
        assert case.streams_grow, text
        assert "(grows)" in text and "warning: the streams at replay grow" in text, text
        assert len(warned) == 1, [str(w.message) for w in seen]
    else:
        assert case.replay_streams >= 1, case.replay_streams
        assert not case.streams_grow, text
        assert not warned, [str(w.message) for w in warned]
