# SPDX-License-Identifier: Apache-2.0
"""Reach, on a GPU: producers that expose no stream (JAX), the DLPack
C exchange API (PyTorch's), a C++ kernel library as a torch custom op (eager,
torch.cuda.graph in the three modes, torch.compile with CUDA graphs), the
many-input exchange, cuda.core's GraphBuilder as producer, and two GPUs with
NCCL. Same style as test_frameworks.py: each case runs with dlsync and as a
negative control without it; conftest.py asserts and prints the table.

Run: python3 -m pytest -q python/tests/gpu/test_reach.py  (DLSYNC_LIBRARY set;
the torch extension is built from examples/torch_extension next to it).
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import traceback

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The source tree (examples/); DLSYNC_SOURCE_ROOT when the tests were copied out
# of it to run against an installed package.
ROOT = os.environ.get("DLSYNC_SOURCE_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import dlsync  # noqa: E402
from dlsync import _producers  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

N = 1 << 27  # 128 Mi floats (512 MiB)
REPLAYS = 30
MODES = ["global", "thread_local", "relaxed"]
SPIN = 20_000_000  # torch.cuda._sleep cycles: about 10 ms, so an unordered read is early


def _note(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


class _NoSync:
    """A torch tensor's export without any ordering (stream=-1)."""

    def __init__(self, t):
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        with torch.cuda.device(self._t.device):
            return self._t.__dlpack__(stream=-1, **kw)


# ---- JAX as producer: it exposes no stream ----


def _jax():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.skip("JAX has no GPU backend")
    return jax, jnp


def _slow_jax(jax, jnp):
    """x + 0 after five 8192^3 matmuls (tens of ms on an H200): a producer
    still busy when an unordered consumer reads. Ones times ones over 8192
    stays exactly one, so the result is exact. The matrix is an argument, not
    a constant, so that XLA cannot fold the loop away at compile time."""
    ones = jnp.ones((8192, 8192), jnp.float32)

    @jax.jit
    def produce(x, m0):
        m = jax.lax.fori_loop(0, 5, lambda i, a: (a @ a) / 8192.0, m0)
        return x + (m[0, 0] - 1.0)

    return lambda x: produce(x, ones)


def _jax_eager(use):
    jax, jnp = _jax()
    cupy = pytest.importorskip("cupy")
    produce = _slow_jax(jax, jnp)
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    produce(jnp.zeros((N,), jnp.float32)).block_until_ready()  # compile outside the loop
    runs = wrong = 0
    note = ""
    for i in range(10):
        x = jnp.full((N,), float(i + 1), jnp.float32)
        x.block_until_ready()
        y = produce(x)  # queued; JAX returns at once
        with cs:
            if use:
                cy = cupy.from_dlpack(dlsync.wrap(y))  # JAX is handed cs
            else:  # the buffer read with no ordering at all (JAX refuses stream=-1)
                mem = cupy.cuda.UnownedMemory(y.unsafe_buffer_pointer(), N * 4, y)
                cy = cupy.ndarray((N,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
            cupy.multiply(cy[-8:], 1, out=res)
        cs.synchronize()
        got = float(res[-1].get())
        runs += 1
        if got != float(i + 1):
            wrong += 1
            note = note or f"replay {i}: read {got}, want {float(i + 1)}"
        y.block_until_ready()
    return runs, wrong, 0, note


def test_jax_producer_eager(record):
    _jax()  # skips here when there is no JAX with a GPU
    used, control = _fresh("_jax_eager", "JAX -> CuPy eager")
    record("JAX -> CuPy", "eager", "-", used, control)


def _jax_in_capture(mode, use):
    """Inside torch.cuda.graph, JAX (eager, no stream) cannot be ordered before
    the capture without a host sync: with dlsync a clear error, the capture
    intact and usable; without, JAX's own ordering breaks the capture."""
    jax, jnp = _jax()
    j = jnp.full((N,), 7.0, jnp.float32)
    j.block_until_ready()
    x = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    error = None
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            try:
                t = torch.from_dlpack(dlsync.wrap(j) if use else j)
                out.copy_(t)
            except dlsync.Error as e:
                error = e
            out.copy_(x * 3)
    except Exception as e:  # noqa: BLE001 - the control's broken capture
        broken += 1
        note = _note(e)
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    if use:
        ok = (error is not None and error.status == "DLSYNC_ERROR_CAPTURE_ORDER" and
              "exposes no stream" in error.message and "capture is intact" in error.message)
        if not ok:
            wrong += 1
            note = f"expected DLSYNC_ERROR_CAPTURE_ORDER, got {error!r}"
        else:
            note = f"raised as expected: {error.message[:100]}..."
    elif error is not None:
        wrong += 1
        note = f"dlsync error without dlsync?? {error}"
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += float(out[-1].item()) != 3.0 * (i + 1)
    return runs, wrong, broken, note


def _fresh(fn, what, *args):
    """``fn(*args, True)`` (with dlsync) and ``fn(*args, False)`` (the
    control) of this module in a process of their own. A control that breaks
    JAX's own stream (here or in an earlier test of this session) may leave
    JAX unable to recover in that process (seen on the H200: the next JAX
    call failed with "Callback registry is closed", before dlsync was
    called), so each JAX case starts from a JAX of its own."""
    code = ("import json, sys; sys.path.insert(0, %r); import test_reach as t; "
            "r = [t.%s(*%r, True), t.%s(*%r, False)]; "
            "print('RESULT ' + json.dumps(r))") % (HERE, fn, args, fn, args)
    env = dict(os.environ)
    # This process's JAX holds its default share of the GPU's memory already.
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       cwd=HERE, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            used, control = json.loads(line[len("RESULT "):])
            return tuple(used), tuple(control)
    raise AssertionError(f"{what}: the process gave no result (rc {p.returncode})"
                         f"\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}")


def _jax_in_capture_fresh(mode):
    """Both runs of one mode in a process of their own (_fresh)."""
    return _fresh("_jax_in_capture", f"JAX in capture [{mode}]", mode)


@pytest.mark.parametrize("mode", MODES)
def test_jax_producer_under_torch_graph_is_a_clear_error(mode, record):
    _jax()  # skips here when there is no JAX with a GPU
    used, control = _jax_in_capture_fresh(mode)
    record("JAX in capture", "torch.cuda.graph", mode, used, control)


# ---- PyTorch through its DLPack C exchange API ----


def _exchange_api(use):
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this PyTorch publishes no __dlpack_c_exchange_api__")
    cupy = pytest.importorskip("cupy")
    s = torch.cuda.Stream()
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    runs = wrong = 0
    note = ""
    for i in range(10):
        x = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):  # the producer's current stream: only the API says so
            torch.cuda._sleep(SPIN)
            y = x * 2 + 1
            found = _producers.find(y, 2, 0)
            if found.how != _producers.EXCHANGE_API or found.stream != s.cuda_stream:
                wrong += 1
                note = f"found {found}, want the API's answer {s.cuda_stream:#x}"
            with cs:
                cy = cupy.from_dlpack(dlsync.wrap(y) if use else _NoSync(y))
                cupy.multiply(cy[-8:], 1, out=res)
        cs.synchronize()
        runs += 1
        got, want = float(res[-1].get()), 2.0 * (i + 1) + 1
        if got != want:
            wrong += 1
            note = note or f"run {i}: read {got}, want {want}"
        torch.cuda.synchronize()
    return runs, wrong, 0, note


def test_torch_through_its_exchange_api(record):
    record("torch API -> CuPy", "eager", "-", _exchange_api(True), _exchange_api(False))


# ---- the C++ torch extension (examples/torch_extension) ----

_ext_error = None
_ext_loaded = False


def _ext():
    global _ext_error, _ext_loaded
    if not _ext_loaded and _ext_error is None:
        lib = os.environ.get("DLSYNC_LIBRARY") or dlsync.library_path()  # the one imported
        try:  # by path: "build" is also the name of a PyPI package
            spec = importlib.util.spec_from_file_location(
                "dlsync_torch_example_build",
                os.path.join(ROOT, "examples", "torch_extension", "build.py"))
            ext_build = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(ext_build)
            ext_build.load(os.path.dirname(os.path.abspath(lib)))
            _ext_loaded = True
        except Exception as e:  # noqa: BLE001
            _ext_error = f"{_note(e)}\n{traceback.format_exc()[-3000:]}"
    if _ext_error is not None:
        pytest.fail(f"the example torch extension did not build or load:\n{_ext_error}")
    return torch.ops.dlsync_example.scale


def _ext_eager(use):
    scale = _ext()
    runs = wrong = 0
    note = ""
    for i in range(10):
        x = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(SPIN)
        y = x * 2 + 1
        out = scale(y, 3.0, use)
        got, want = float(out[-1].item()), (2.0 * (i + 1) + 1) * 3
        runs += 1
        if got != want:
            wrong += 1
            note = note or f"run {i}: read {got}, want {want}"
        torch.cuda.synchronize()
    return runs, wrong, 0, note


def test_torch_extension_eager(record):
    record("C++ ext (custom op)", "eager", "-", _ext_eager(True), _ext_eager(False))


def _ext_graph(mode, use):
    scale = _ext()
    x = torch.zeros(N, device="cuda")
    scale(x, 1.0, use)  # its stream is made on first use: outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = x * 2 + 1
            out = scale(y, 3.0, use)
    except Exception as e:  # noqa: BLE001
        broken += 1
        note = _note(e)
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        got, want = float(out[-1].item()), (2.0 * (i + 1) + 1) * 3
        if got != want:
            wrong += 1
            note = note or f"replay {i}: read {got}, want {want}"
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_torch_extension_under_torch_graph(mode, record):
    record("C++ ext (custom op)", "torch.cuda.graph", mode, _ext_graph(mode, True),
           _ext_graph(mode, False))


def _ext_compiled(use):
    scale = _ext()
    torch._dynamo.reset()

    def f(x):
        return scale(x * 2 + 1, 3.0, use)

    cf = torch.compile(f, mode="reduce-overhead", fullgraph=True)
    counters = torch._dynamo.utils.counters
    counters.clear()
    runs = wrong = broken = 0
    note = ""
    try:
        for i in range(12):  # a warm-up run, the recording, then replays
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.full((N,), float(i + 1), device="cuda")
            out = cf(x)
            got, want = float(out[-1].item()), (2.0 * (i + 1) + 1) * 3
            runs += 1
            if got != want:
                wrong += 1
                note = note or f"call {i}: read {got}, want {want}"
    except Exception as e:  # noqa: BLE001
        broken += 1
        note = _note(e)
    skips = dict(counters.get("inductor", {})).get("cudagraph_skips", 0)
    if skips:  # the case is about CUDA graphs: with a skip it is another case
        wrong += 1 if use else 0  # (and a control does not fail by a skip)
        note = f"CUDA graphs skipped {skips} time(s); " + note
    torch.cuda.synchronize()
    return runs, wrong, broken, note


def test_torch_extension_under_torch_compile(record):
    record("C++ ext (custom op)", "torch.compile", "reduce-overhead", _ext_compiled(True),
           _ext_compiled(False))


# ---- many inputs, one exchange (the Python list form) ----


def _many(use):
    cupy = pytest.importorskip("cupy")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    runs = wrong = 0
    note = ""
    for i in range(10):
        x = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s1):
            torch.cuda._sleep(SPIN)
            y1 = x * 2
        with torch.cuda.stream(s2):
            torch.cuda._sleep(2 * SPIN)  # the later of the two
            y2 = x * 3
        a, b = cupy.from_dlpack(_NoSync(y1)), cupy.from_dlpack(_NoSync(y2))
        if use:
            with dlsync.exchange([s1, s2, s1], cs), cs:  # s1 twice: one exchange for it
                cupy.add(a[-8:], b[-8:], out=res)
        else:
            with cs:
                cupy.add(a[-8:], b[-8:], out=res)
        cs.synchronize()
        runs += 1
        got, want = float(res[-1].get()), 5.0 * (i + 1)
        if got != want:
            wrong += 1
            note = note or f"run {i}: read {got}, want {want}"
        torch.cuda.synchronize()
    return runs, wrong, 0, note


def test_many_producers_one_exchange(record):
    record("[s1, s2] -> CuPy", "eager", "-", _many(True), _many(False))


def _scope_shared(use):
    """Three tensors of one slow producer stream, wrapped together in one
    scope and read by one CuPy kernel: one exchange, counted."""
    cupy = pytest.importorskip("cupy")
    s = torch.cuda.Stream()
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    real = dlsync._exchange._Exchange
    begun = []

    class Counted(real):
        __slots__ = ()

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            begun.append(1)

    runs = wrong = 0
    note = ""
    dlsync._exchange._Exchange = Counted
    try:
        for i in range(10):
            x = torch.full((N,), float(i + 1), device="cuda")
            torch.cuda.synchronize()
            begun.clear()
            with torch.cuda.stream(s):
                torch.cuda._sleep(SPIN)
                y1, y2, y3 = x * 1, x * 2, x * 3
            with dlsync.scope(), cs:
                if use:
                    w = [dlsync.wrap(y, producer=s) for y in (y1, y2, y3)]
                else:
                    w = [_NoSync(y) for y in (y1, y2, y3)]
                a, b, c = (cupy.from_dlpack(v) for v in w)
                cupy.add(a[-8:], b[-8:], out=res)
                cupy.add(res, c[-8:], out=res)
            cs.synchronize()
            runs += 1
            got, want = float(res[-1].get()), 6.0 * (i + 1)
            if got != want:
                wrong += 1
                note = note or f"run {i}: read {got}, want {want}"
            if use and len(begun) != 1:
                wrong += 1
                note = note or f"run {i}: {len(begun)} exchanges, want 1"
            torch.cuda.synchronize()
    finally:
        dlsync._exchange._Exchange = real
    return runs, wrong, 0, note


def test_wraps_made_together_share_one_exchange(record):
    record("3 wraps, 1 exchange", "eager", "-", _scope_shared(True), _scope_shared(False))


# ---- cuda.core's GraphBuilder (stream capture) as producer ----


def _core():
    core = pytest.importorskip("cuda.core")
    dev_cls = getattr(core, "Device", None)
    if dev_cls is None:
        dev_cls = pytest.importorskip("cuda.core.experimental").Device
    return dev_cls


def _graph_builder(use):
    """CuPy work captured into a cuda.core GraphBuilder's stream (the producer);
    PyTorch copies the result on a stream of its own (the consumer). With
    dlsync PyTorch's stream joins the builder's capture and is joined back, so
    the copy replays with the graph; without, it runs once, eagerly, early."""
    cupy = pytest.importorskip("cupy")
    Device = _core()
    dev = Device(0)
    dev.set_current()
    launch_stream = dev.create_stream()
    src = cupy.zeros(N, dtype=cupy.float32)
    mid = cupy.zeros(N, dtype=cupy.float32)
    t_mid = torch.from_dlpack(mid)
    out = torch.zeros(N, device="cuda")
    ts = torch.cuda.Stream()
    cupy.multiply(src, 2, out=mid)  # warm CuPy's kernel up outside the capture
    cupy.cuda.Device().synchronize()
    runs = wrong = broken = 0
    note = ""
    build_stream = dev.create_stream()
    make = getattr(build_stream, "create_graph_builder", None)  # else the Device's
    gb = make() if make is not None else dev.create_graph_builder()
    producer = getattr(gb, "stream", gb)  # a cuda.core Stream (__cuda_stream__)
    try:
        gb.begin_building("relaxed")
        with cupy.cuda.ExternalStream(dlsync.stream_handle(producer)):
            cupy.multiply(src, 2, out=mid)
        if use:
            with dlsync.exchange(producer, ts), torch.cuda.stream(ts):
                out.copy_(t_mid)
        else:
            with torch.cuda.stream(ts):
                out.copy_(t_mid)
        gb.end_building()
        graph = gb.complete()
    except Exception as e:  # noqa: BLE001
        broken += 1
        note = _note(e)
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        src.fill(float(i + 1))
        cupy.cuda.Device().synchronize()
        graph.launch(launch_stream)
        launch_stream.sync()
        torch.cuda.synchronize()
        runs += 1
        got, want = float(out[-1].item()), 2.0 * (i + 1)
        if got != want:
            wrong += 1
            note = note or f"launch {i}: read {got}, want {want}"
    getattr(graph, "close", lambda: None)()
    return runs, wrong, broken, note


def test_cuda_core_graph_builder_as_producer(record):
    record("cuda.core GB -> torch", "GraphBuilder", "relaxed", _graph_builder(True),
           _graph_builder(False))


# ---- two GPUs: NCCL all_reduce (torch.distributed, two ranks) ----


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _nccl(setting, use):
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, found {torch.cuda.device_count()}")
    pytest.importorskip("cupy")
    worker = os.path.join(HERE, "nccl_worker.py")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()), WORLD_SIZE="2",
                   PYTHONPATH=os.path.dirname(os.path.dirname(dlsync.__file__)))
        procs = []
        for rank in range(2):
            out = os.path.join(tmp, f"rank{rank}.json")
            procs.append((out, subprocess.Popen(
                [sys.executable, worker, setting, "1" if use else "0", out],
                env=dict(env, RANK=str(rank)), stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True)))
        results, logs = [], []
        for out, p in procs:
            try:
                log, _ = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                log, _ = p.communicate()
                log += "\n(timed out after 300 s)"
            logs.append(log)
            if os.path.exists(out):
                with open(out) as f:
                    results.append(json.load(f))
        if len(results) != 2:
            pytest.fail("a rank wrote no result:\n" + "\n---\n".join(l[-3000:] for l in logs))
    runs = sum(r["runs"] for r in results)
    wrong = sum(r["wrong"] for r in results)
    broken = sum(r["broken"] for r in results)
    note = "; ".join(f"rank {i}: {r['note']}" for i, r in enumerate(results) if r["note"])
    return runs, wrong, broken, note


@pytest.mark.parametrize("setting", ["eager", "graph"])
def test_nccl_all_reduce_consumed_by_cupy(setting, record):
    record("NCCL x2 -> CuPy", "eager" if setting == "eager" else "torch.cuda.graph",
           "-" if setting == "eager" else "global", _nccl(setting, True), _nccl(setting, False))
