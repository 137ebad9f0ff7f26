# SPDX-License-Identifier: Apache-2.0
"""Structured graphs in the framework suite, on a GPU: conditional nodes'
bodies (dlsync.conditional_body) and a library's own graph run inside a
capture (dlsync.launch).

Cases, each with dlsync and a control without it (conftest.py's table):

- cuda.core conditional builders (GraphBuilder.if_then / if_cond and
  while_loop): a slow producer (torch, about 10 ms of sleep, then y = 2x + 1)
  on a stream joined to the parent's capture; the body (CuPy) reads y. With
  dlsync the ordering is done on the parent before the conditional node
  (dlsync.exchange: the producer joins the parent's capture and is joined
  back before the node is added); inside the declared body, the rows that
  would add an event node (an eager stream into the body, the parent's
  capture into the body) are refused by name with DLSYNC_ERROR_CONDITIONAL_BODY
  and an edge-only exchange (an eager stream joins the body's capture)
  works. The control joins the producer back only after the conditional
  node (with plain events): the body reads y too early.
- torch's own IF body (CUDAGraph.begin_capture_to_if_node, what torch.cond's
  capture uses), the body declared through dlsync.capture_graph: the same
  checks.
- torch.cond captured into conditional nodes (torch's dispatch mode), the
  producer ordered on the parent before it (skipped where torch cannot
  capture torch.cond at all: checked first without dlsync).
- a CuPy-captured graph (cuStreamBeginCapture on a CuPy stream: CuPy's own
  Graph exposes no handle) run with dlsync.launch inside torch.cuda.graph
  after a slow producer, as a child node; the caller's graph destroyed
  before the replays. The control launches it on CuPy's stream instead
  (cuGraphLaunch): it runs once, at capture time, not in the replays.

Every captured graph is replayed REPLAYS times with new input, each result
checked. Import-safe without a GPU (the module skips)."""
import contextlib
import ctypes
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dlsync  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

M = 1 << 22  # 4 Mi floats
REPLAYS = 20
SLEEP = 20_000_000  # torch.cuda._sleep cycles: about 10 ms, the control must read too early
MODES = ["global", "thread_local", "relaxed"]
CU_STREAM_CAPTURE_MODE_RELAXED = 2


def _broken(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}" if str(e) else type(e).__name__


def _core():
    core = pytest.importorskip("cuda.core")
    if getattr(core, "Device", None) is None:
        core = pytest.importorskip("cuda.core.experimental")
    return core


def _condition(gb):
    """A condition for the conditional nodes of gb: create_condition
    (cuda.core 1.x) or create_conditional_handle (0.x)."""
    fn = getattr(gb, "create_condition", None) or getattr(gb, "create_conditional_handle")
    return fn(default_value=1)


def _condition_value(h) -> int:
    """The CUgraphConditionalHandle of a condition, for a kernel argument."""
    return int(h.handle) if hasattr(h, "handle") else int(h)


def _end_captures(*builders):
    """Ends the captures these cuda.core builders still have open (the body
    before its parent), whatever state the failure left them in."""
    for b in builders:
        if b is None:
            continue
        try:
            if b.is_building:
                b.end_building()
        except Exception:  # noqa: BLE001 - best effort; close() below ends it otherwise
            pass
        try:
            b.close()
        except Exception:  # noqa: BLE001
            pass


def _if_builder(gb, handle):
    """cuda.core's IF builder: if_then where it has it, else if_cond."""
    fn = getattr(gb, "if_then", None) or getattr(gb, "if_cond", None)
    if fn is None:
        pytest.skip("this cuda.core GraphBuilder has neither if_then nor if_cond")
    return fn(handle)


def _libcuda():
    cu = ctypes.CDLL("libcuda.so.1")
    vp = ctypes.c_void_p
    for name, args in (("cuStreamBeginCapture_v2", [vp, ctypes.c_int]),
                       ("cuStreamEndCapture", [vp, ctypes.POINTER(vp)]),
                       ("cuGraphInstantiateWithFlags", [ctypes.POINTER(vp), vp, ctypes.c_uint64]),
                       ("cuGraphLaunch", [vp, vp]),
                       ("cuGraphDestroy", [vp]),
                       ("cuGraphExecDestroy", [vp])):
        f = getattr(cu, name)
        f.restype, f.argtypes = ctypes.c_int, args
    return cu


_LOOP_SOURCES = (
    "#include <cuda_runtime.h>\n",
    "typedef unsigned long long cudaGraphConditionalHandle;\n"
    "extern \"C\" __device__ void cudaGraphSetConditional(cudaGraphConditionalHandle, unsigned);\n",
)
_LOOP_BODY = (
    "extern \"C\" __global__ void dlsync_test_loop(unsigned long long h, int *left) {\n"
    "  if (threadIdx.x == 0 && blockIdx.x == 0) {\n"
    "    int n = --left[0];\n"
    "    cudaGraphSetConditional((cudaGraphConditionalHandle)h, n > 0 ? 1u : 0u);\n"
    "  }\n"
    "}\n"
)


def _loop_kernel(cupy):
    """A kernel that counts a WHILE body's turns down and ends the loop at 0
    (cudaGraphSetConditional); skips when NVRTC cannot build it here."""
    include = os.path.join(cupy.cuda.get_cuda_path() or "/usr/local/cuda", "include")
    errors = []
    for head in _LOOP_SOURCES:
        try:
            k = cupy.RawKernel(head + _LOOP_BODY, "dlsync_test_loop",
                               options=(f"--include-path={include}",))
            k.compile()
            return k
        except Exception as e:  # noqa: BLE001 - try the next spelling
            errors.append(_broken(e))
    pytest.skip(f"cannot build the WHILE loop's kernel: {errors}")


def _refused(fn, row, body):
    """fn must raise dlsync.Error DLSYNC_ERROR_CONDITIONAL_BODY naming the row
    (None: any row) and the body; returns the row named."""
    try:
        fn()
    except dlsync.Error as e:
        assert e.status == "DLSYNC_ERROR_CONDITIONAL_BODY", f"{e.status}: {e.message}"
        assert f"graph {body:#x}" in e.message, e.message
        assert "before the conditional node" in e.message, e.message
        named = e.message.split(":", 1)[0]
        assert "_ROW_" in named or "dlsync_" in named, e.message
        if row is not None:
            assert row in named, e.message
        return named.replace("DLSYNC__ROW_", "")
    raise AssertionError(f"not refused in the declared body (expected {row or 'a row'})")


def _produce(prod, x, y):
    """The slow producer on prod: y = 2x + 1 after about 10 ms (no allocation,
    so any capture takes it)."""
    with torch.cuda.stream(prod):
        torch.cuda._sleep(SLEEP)
        torch.mul(x, 2, out=y)
        y.add_(1)


@contextlib.contextmanager
def _producer_ordered_before(parent, prod, use):
    """The producer's work (the block, on prod) in the parent's capture, and
    the parent's later work after it: with dlsync, an exchange (prod joins
    the parent's capture and is joined back on exit, edges only). Without,
    prod joins by a plain event and is joined back by the caller later
    (_join_back), after the conditional node."""
    if use:
        with dlsync.exchange(parent, prod):
            yield
    else:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.ExternalStream(parent))
        prod.wait_event(ev)
        yield


def _join_back(parent, prod):
    ev = torch.cuda.Event()
    ev.record(prod)
    torch.cuda.ExternalStream(parent).wait_event(ev)


# ---- cuda.core conditional builders ----


def _core_conditional(kind, use):
    core = _core()
    cupy = pytest.importorskip("cupy")
    dev = core.Device(0)
    dev.set_current()
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    cy = cupy.from_dlpack(y)
    res = cupy.zeros(M, dtype=cupy.float32)
    res2 = cupy.zeros(M, dtype=cupy.float32)
    left = cupy.zeros(1, dtype=cupy.int32)
    numpy = pytest.importorskip("numpy")
    loop = _loop_kernel(cupy) if kind == "while" else None
    prod = torch.cuda.Stream()
    side = cupy.cuda.Stream(non_blocking=True)
    eager = cupy.cuda.Stream(non_blocking=True)
    # Warm up every kernel outside any capture.
    cupy.multiply(cy, 3, out=res)
    cupy.add(res, cy, out=res)
    cupy.multiply(res, 1, out=res2)
    _produce(prod, x, y)
    torch.cuda.synchronize()
    runs = wrong = broken = 0
    rows = []
    gb = body = None
    try:
        gb = dev.create_graph_builder().begin_building("relaxed")
        parent = dlsync.stream_handle(gb)
        with _producer_ordered_before(parent, prod, use):
            _produce(prod, x, y)
        h = _condition(gb)
        body = _if_builder(gb, h) if kind == "if" else gb.while_loop(h)
        with dlsync.conditional_body(body) if use else contextlib.nullcontext() as declared:
            body.begin_building("relaxed")
            bs = dlsync.stream_handle(body)
            if use:
                assert dlsync.capture_graph(bs) == declared, "the body builder's graph"
            with cupy.cuda.ExternalStream(bs):
                if kind == "if":
                    cupy.multiply(cy, 3, out=res)
                else:
                    cupy.add(res, cy, out=res)
                    loop((1,), (1,), (numpy.uint64(_condition_value(h)), left))
            if use:
                rows.append(_refused(lambda: dlsync.exchange(eager, bs).__enter__(),
                                     "EAGER_TO_CAPTURE", declared))
                rows.append(_refused(lambda: dlsync.exchange(prod, bs).__enter__(), None,
                                     declared))
                rows.append(_refused(lambda: dlsync.Fence(bs), None, declared))
                assert dlsync.capture_state(bs) == "capturing", "the body's capture went on"
                with dlsync.exchange(bs, side), side:  # JOIN: edges only, admitted
                    cupy.multiply(res, 1, out=res2)
            body.end_building()
        if not use:
            _join_back(parent, prod)
        gb.end_building()
        graph = gb.complete()
    except Exception as e:  # noqa: BLE001 - with dlsync: counted broken, fails the case
        broken += 1
        _end_captures(body, gb)  # a capture left open would break every later test
        torch.cuda.synchronize()
        return runs, wrong, broken, _broken(e)
    launch = dev.create_stream()
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        y.zero_()
        res.fill(0)
        res2.fill(0)
        left.fill(3)
        torch.cuda.synchronize()
        cupy.cuda.Device().synchronize()
        graph.launch(launch)
        launch.sync()
        runs += 1
        want = (2.0 * (i + 1) + 1) * 3  # IF: 3y; WHILE: y added three times
        got = float(res[-1].get())
        wrong += got != want or (use and float(res2[-1].get()) != want)
    if hasattr(graph, "close"):
        graph.close()
    return runs, wrong, broken, "refused: " + ", ".join(rows) if rows else ""


@pytest.mark.parametrize("kind", ["if", "while"])
def test_cuda_core_conditional_body(kind, record):
    record(f"cuda.core {kind.upper()} body", "GraphBuilder", "relaxed",
           _core_conditional(kind, True), _core_conditional(kind, False))


# ---- torch's IF body (CUDAGraph.begin_capture_to_if_node) ----


def _torch_if(mode, use):
    if not hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
        pytest.skip(f"torch {torch.__version__} has no CUDAGraph.begin_capture_to_if_node")
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    res = torch.zeros(M, device="cuda")
    res2 = torch.zeros(M, device="cuda")
    pred = torch.ones((), dtype=torch.bool, device="cuda")
    prod = torch.cuda.Stream()
    side = torch.cuda.Stream()
    eager = torch.cuda.Stream()
    _produce(prod, x, y)
    torch.mul(y, 3, out=res)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    rows = []
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            parent = torch.cuda.current_stream().cuda_stream
            with _producer_ordered_before(parent, prod, use):
                _produce(prod, x, y)
            g.begin_capture_to_if_node(pred)
            bs = torch.cuda.current_stream().cuda_stream  # the body's capture
            body = dlsync.capture_graph(bs)
            assert body != dlsync.capture_graph(parent), \
                "torch's current stream after begin_capture_to_if_node is not the body's"
            with dlsync.conditional_body(body) if use else contextlib.nullcontext():
                torch.mul(y, 3, out=res)
                if use:
                    rows.append(_refused(lambda: dlsync.exchange(eager, bs).__enter__(),
                                         "EAGER_TO_CAPTURE", body))
                    rows.append(_refused(lambda: dlsync.exchange(prod, bs).__enter__(), None,
                                         body))
                    with dlsync.exchange(bs, side), torch.cuda.stream(side):  # JOIN
                        res2.copy_(res)
                g.end_capture_to_conditional_node()
            if not use:
                _join_back(parent, prod)
    except Exception as e:  # noqa: BLE001
        broken += 1
        torch.cuda.synchronize()
        return runs, wrong, broken, _broken(e)
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        y.zero_()
        res.zero_()
        res2.zero_()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        want = (2.0 * (i + 1) + 1) * 3
        wrong += float(res[-1].item()) != want or (use and float(res2[-1].item()) != want)
    return runs, wrong, broken, "refused: " + ", ".join(rows) if rows else ""


@pytest.mark.parametrize("mode", MODES)
def test_torch_if_body(mode, record):
    record("torch IF body", "torch.cuda.graph", mode, _torch_if(mode, True),
           _torch_if(mode, False))


# ---- a CuPy-captured graph run with dlsync.launch inside torch.cuda.graph ----


def _cupy_graph_in_torch(mode, use):
    cupy = pytest.importorskip("cupy")
    cu = _libcuda()
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    cy = cupy.from_dlpack(y)
    res = cupy.zeros(M, dtype=cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    cupy.multiply(cy, 3, out=res)  # warm up
    torch.mul(x, 2, out=y)
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    # CuPy's work captured into a graph of the caller's (the driver's capture:
    # cupy.cuda.Graph exposes no handle, dlsync.launch refuses it by name).
    raw = ctypes.c_void_p()
    assert cu.cuStreamBeginCapture_v2(s.ptr, CU_STREAM_CAPTURE_MODE_RELAXED) == 0
    with s:
        cupy.multiply(cy, 3, out=res)
    assert cu.cuStreamEndCapture(s.ptr, ctypes.byref(raw)) == 0
    exe = ctypes.c_void_p()
    assert cu.cuGraphInstantiateWithFlags(ctypes.byref(exe), raw, 0) == 0
    if use:  # CuPy's own Graph: its executable on an eager stream, else refused by name
        s.begin_capture()
        with s:
            cupy.multiply(cy, 1, out=res)
        cg = s.end_capture()
        if isinstance(getattr(cg, "graphExec", None), int) and cg.graphExec:
            # This CuPy exposes its cudaGraphExec_t (its cudaGraph_t is destroyed at
            # instantiate): an eager launch works; a capture needs the graph itself.
            dlsync.launch(cg, torch.cuda.current_stream())
            torch.cuda.synchronize()
        else:
            with pytest.raises(TypeError, match="exposes no handle"):
                dlsync.launch(cg, torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            torch.cuda._sleep(SLEEP)
            torch.mul(x, 2, out=y)
            y.add_(1)
            if use:  # a child node at the capture's dependencies
                dlsync.launch(raw.value, torch.cuda.current_stream())
            else:  # what a library does without dlsync: its graph on its own stream
                r = cu.cuGraphLaunch(exe, s.ptr)
                if r != 0:
                    raise RuntimeError(f"cuGraphLaunch: CUresult {r}")
    except Exception as e:  # noqa: BLE001
        broken += 1
        note = _broken(e)
    finally:
        torch.cuda.synchronize()
        cupy.cuda.Device().synchronize()
        assert cu.cuGraphExecDestroy(exe) == 0
        assert cu.cuGraphDestroy(raw) == 0  # dlsync's child node holds a copy
    if broken:
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        res.fill(0)
        torch.cuda.synchronize()
        cupy.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += float(res[-1].get()) != (2.0 * (i + 1) + 1) * 3
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_cupy_graph_launched_inside_torch_graph(mode, record):
    record("CuPy graph, dlsync.launch", "torch.cuda.graph", mode,
           _cupy_graph_in_torch(mode, True), _cupy_graph_in_torch(mode, False))


# ---- torch.cond captured into conditional nodes, the ordering on the parent ----


def _torch_cond_modes():
    try:
        from torch._higher_order_ops.cudagraph_conditional_nodes import (
            CUDAGraphCaptureControlFlowOpDispatchMode, ControlFlowOpWarmupDispatchMode)
    except ImportError as e:
        pytest.skip(f"torch {torch.__version__} cannot capture torch.cond into conditional "
                    f"nodes here ({e})")
    return ControlFlowOpWarmupDispatchMode, CUDAGraphCaptureControlFlowOpDispatchMode


def _true_fn(t):
    return t * 3


def _false_fn(t):
    return t * 0


def _torch_cond(use):
    warmup, capture = _torch_cond_modes()
    x = torch.zeros(M, device="cuda")
    y = torch.zeros(M, device="cuda")
    res = torch.zeros(M, device="cuda")
    pred = torch.tensor(True, device="cuda")
    prod = torch.cuda.Stream()
    _produce(prod, x, y)
    with warmup():
        torch.cond(pred, _true_fn, _false_fn, (y,))
    torch.cuda.synchronize()
    # The gate: torch.cond's capture itself, with nothing of dlsync's.
    g0 = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g0, capture_error_mode="relaxed"), capture():
            torch.cond(pred, _true_fn, _false_fn, (y,))
        g0.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - torch's own limit, not dlsync's
        torch.cuda.synchronize()
        pytest.skip(f"torch.cond capture does not work here: {_broken(e)}")
    del g0
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    try:
        with torch.cuda.graph(g, capture_error_mode="relaxed"):
            parent = torch.cuda.current_stream().cuda_stream
            with _producer_ordered_before(parent, prod, use):
                _produce(prod, x, y)
            with capture():
                out = torch.cond(pred, _true_fn, _false_fn, (y,))
            if not use:
                _join_back(parent, prod)
            res.copy_(out)
    except Exception as e:  # noqa: BLE001
        broken += 1
        torch.cuda.synchronize()
        return runs, wrong, broken, _broken(e)
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        y.zero_()
        res.zero_()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += float(res[-1].item()) != (2.0 * (i + 1) + 1) * 3
    return runs, wrong, broken, ""


def test_torch_cond_ordered_on_the_parent(record):
    record("torch.cond", "torch.cuda.graph", "relaxed", _torch_cond(True), _torch_cond(False))
