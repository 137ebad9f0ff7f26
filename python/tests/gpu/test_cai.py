# SPDX-License-Identifier: Apache-2.0
"""Framework-suite rows for the CUDA Array Interface (CAI), on a GPU: Numba
(numba-cuda) kernels reading PyTorch tensors and CuPy arrays, Numba device
arrays read by PyTorch and CuPy, and one capture chaining all three.

Each case runs with dlsync and as a negative control without it (conftest.py
asserts both and prints the rows beside the DLPack ones). A control fails by
wrong data, a broken capture, or a host stall: a consumer that synchronises
the host on the producer's CAI stream gets the right data eagerly but waits
for the slow producer, which is what dlsync's ordering avoids; such a wait
(over half the slow producer's time) counts as broken on both sides.

Skips without torch, a GPU, numba-cuda or CuPy. numba-cuda 0.30.4 fails to
compile any kernel under numpy 2.5 (no ``numpy.row_stack``): the alias is
restored here before ``numba.cuda`` is imported (see docs/python.md).

Run: DLSYNC_LIBRARY=.../libdlsync.so python3 -m pytest -q python/tests/gpu/test_cai.py
"""
import os
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "examples", "numba_kernels"))
import dlsync  # noqa: E402
from dlsync.testing import report  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)
numpy = pytest.importorskip("numpy")
if not hasattr(numpy, "row_stack"):  # numba-cuda 0.30.4 under numpy >= 2.5
    numpy.row_stack = numpy.vstack
cuda = pytest.importorskip("numba.cuda")

N = 1 << 23  # 8 Mi floats (32 MiB) per array
RUNS = 20
SLEEP = 50_000_000  # GPU cycles (torch.cuda._sleep) of the slow producer, tens of ms
MODES = ["global", "thread_local", "relaxed"]
THREADS = 256
BLOCKS = (N + THREADS - 1) // THREADS


@cuda.jit
def _affine(x, out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + b


_stall_s = None


def _stall_limit():
    """Half the slow producer's time on this GPU (measured once): a consumer
    call that blocks the host longer than that waited for the producer."""
    global _stall_s
    if _stall_s is None:
        times = []
        torch.cuda._sleep(1000)  # a first launch's costs are not the producer's time
        for _ in range(3):  # the shortest of three: a busy host only lengthens one
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            torch.cuda._sleep(SLEEP)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        _stall_s = min(times) / 2
    return _stall_s


def _handle(numba_stream):
    return int(numba_stream)  # a Numba stream's int is its CUstream handle


def _note(e):
    """What went wrong, first line, Numba's or CUDA's own words first where the
    chain of exceptions has them, with dlsync.testing's diagnosis."""
    chain, seen = [], set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        chain.append(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}")
        e = e.__cause__ or e.__context__
    kind = report.classify_error(chain)
    said = next((m for m in chain if "results in" in m), chain[0])
    return f"[{kind.category if kind else 'unclassified'}] {said}"


def _broken(e):
    note = _note(e)
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the capture's error may surface once more here
        pass
    return 0, 0, 1, note


def _replay(g, fill, check):
    """RUNS replays: fill(i) before each, check(i) after; (runs, wrong)."""
    wrong = 0
    for i in range(RUNS):
        fill(i)
        g.replay()
        torch.cuda.synchronize()
        wrong += not check(i)
    return RUNS, wrong


# ---- a Numba kernel reads a torch tensor produced on a side stream ----


def _torch_side_to_numba(mode, use):
    """x = src on a side stream behind a slow kernel; a Numba kernel on the
    current stream computes out = 2 x + 1. torch's CAI is version 2 with no
    stream: without dlsync nothing orders the read after the side stream."""
    x = torch.zeros(N, device="cuda")
    src = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    side, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    oa = cuda.as_cuda_array(out)
    _affine[BLOCKS, THREADS](cuda.as_cuda_array(x), oa, 2.0, 1.0)  # compile outside
    torch.cuda.synchronize()
    stall = _stall_limit()
    stalls = []

    def step():
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP)
            x.copy_(src)
        ns = cuda.external_stream(cur.cuda_stream)
        t0 = time.perf_counter()
        if use:
            with dlsync.scope():
                xa = cuda.as_cuda_array(dlsync.wrap(x, producer=side, consumer=cur))
                _affine[BLOCKS, THREADS, ns](xa, oa, 2.0, 1.0)
        else:
            xa = cuda.as_cuda_array(x)
            _affine[BLOCKS, THREADS, ns](xa, oa, 2.0, 1.0)
        stalls.append(time.perf_counter() - t0)
        cur.wait_stream(side)  # side joined back (under capture)

    def check(i):
        return float(out[-1].item()) == 2.0 * (i + 1) + 1

    note = ""
    if mode == "eager":
        wrong = 0
        with torch.cuda.stream(consumer):
            step()  # warm-up: first calls' costs are no stall
            torch.cuda.synchronize()
            stalls.clear()
            for i in range(RUNS):
                src.fill_(float(i + 1))
                step()
                torch.cuda.synchronize()
                wrong += not check(i)
        runs = RUNS
    else:
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, capture_error_mode=mode):
                step()
        except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
            return _broken(e)
        runs, wrong = _replay(g, lambda i: src.fill_(float(i + 1)), check)
    broken = sum(s > stall for s in stalls)
    if broken:
        note = f"host waited {max(stalls) * 1e3:.1f} ms in the consumer's call"
    elif wrong:
        note = f"stale data in {wrong}/{runs} runs"
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", ["eager"] + MODES)
def test_torch_side_stream_to_numba(mode, record):
    setting = "eager" if mode == "eager" else "torch.cuda.graph"
    record("torch side -> Numba", setting, mode, _torch_side_to_numba(mode, True),
           _torch_side_to_numba(mode, False))


# ---- a Numba kernel reads a CuPy array produced on a CuPy stream, captured ----


def _cupy_to_numba(mode, use):
    """CuPy's stream joins torch's capture (dlsync.exchange) and computes
    a = 2 src; a Numba kernel on the capturing stream computes out = a + 1.
    CuPy's CAI (v3) names its stream: Numba's default synchronises the host on
    it, which a capturing stream refuses."""
    cupy = pytest.importorskip("cupy")
    src = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    csrc = cupy.from_dlpack(src)
    a = cupy.zeros(N, dtype=cupy.float32)
    cs = cupy.cuda.Stream(non_blocking=True)
    oa = cuda.as_cuda_array(out)
    with cs:  # warm-up: CuPy's kernel and Numba's, outside the capture
        cupy.multiply(csrc, 2, out=a)
        cs.synchronize()
    _affine[BLOCKS, THREADS](cuda.as_cuda_array(a), oa, 1.0, 1.0)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            cur = torch.cuda.current_stream()
            ns = cuda.external_stream(cur.cuda_stream)
            with dlsync.exchange(cur, cs), cs:
                cupy.multiply(csrc, 2, out=a)
                if use:
                    with dlsync.scope():
                        aa = cuda.as_cuda_array(dlsync.wrap(a, consumer=cur))
                        _affine[BLOCKS, THREADS, ns](aa, oa, 1.0, 1.0)
                else:  # Numba synchronises on CuPy's stream (NUMBA_CUDA_ARRAY_INTERFACE_SYNC)
                    aa = cuda.as_cuda_array(a)
                    _affine[BLOCKS, THREADS, ns](aa, oa, 1.0, 1.0)
    except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
        return _broken(e)
    runs, wrong = _replay(g, lambda i: src.fill_(float(i + 1)),
                          lambda i: float(out[-1].item()) == 2.0 * (i + 1) + 1)
    return runs, wrong, 0, f"stale data in {wrong}/{runs} runs" if wrong else ""


@pytest.mark.parametrize("mode", MODES)
def test_cupy_stream_to_numba_under_torch_graph(mode, record):
    record("CuPy -> Numba", "torch.cuda.graph", mode, _cupy_to_numba(mode, True),
           _cupy_to_numba(mode, False))


# ---- a Numba device array read by PyTorch and by CuPy ----


def _numba_to(consumer_kind, mode, use):
    """A Numba device array na allocated on a Numba stream (its CAI names
    that stream) and written there behind a slow kernel (na = src); the
    consumer (torch or CuPy) computes out = 2 na on its own stream."""
    cupy = pytest.importorskip("cupy") if consumer_kind == "CuPy" else None
    src = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    nstream = cuda.stream()
    nh = _handle(nstream)
    ext = torch.cuda.ExternalStream(nh)
    na = cuda.device_array(N, dtype=numpy.float32, stream=nstream)
    ssrc = cuda.as_cuda_array(src)
    _affine[BLOCKS, THREADS, nstream](ssrc, na, 1.0, 0.0)  # compile outside
    nstream.synchronize()
    if cupy is not None:
        cs = cupy.cuda.Stream(non_blocking=True)
        cout = cupy.from_dlpack(out)
        with cs:
            cupy.multiply(cupy.asarray(na), 2, out=cout)  # warm-up
            cs.synchronize()
    torch_consumer = torch.cuda.Stream()
    stall = _stall_limit()
    stalls = []

    def consume(cur):
        t0 = time.perf_counter()
        if consumer_kind == "torch":
            read = dlsync.wrap(na, consumer=cur) if use else na
            with dlsync.scope():  # ends the exchange (if any) after the consumer's work
                torch.mul(torch.as_tensor(read, device="cuda"), 2, out=out)
        else:
            with cs, dlsync.scope():
                read = dlsync.wrap(na, consumer=cs) if use else na
                cupy.multiply(cupy.asarray(read), 2, out=cout)
        stalls.append(time.perf_counter() - t0)

    def step():
        cur = torch.cuda.current_stream()
        ext.wait_stream(cur)  # the producer after src's fill (one way)
        with torch.cuda.stream(ext):
            torch.cuda._sleep(SLEEP)
        _affine[BLOCKS, THREADS, nstream](ssrc, na, 1.0, 0.0)
        consume(cur)
        if cupy is not None:  # CuPy's stream joined back (under capture)
            cur.wait_stream(torch.cuda.ExternalStream(cs.ptr))
        cur.wait_stream(ext)  # Numba's stream joined back (under capture)

    def check(i):
        return float(out[-1].item()) == 2.0 * (i + 1)

    if mode == "eager":
        wrong = 0
        with torch.cuda.stream(torch_consumer):
            try:
                step()  # warm-up: first calls' costs are no stall
            except Exception as e:  # noqa: BLE001
                return _broken(e)
            torch.cuda.synchronize()
            stalls.clear()
            for i in range(RUNS):
                src.fill_(float(i + 1))
                try:
                    step()
                except Exception as e:  # noqa: BLE001
                    return _broken(e)
                torch.cuda.synchronize()
                wrong += not check(i)
        runs = RUNS
    else:
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, capture_error_mode=mode):
                step()
        except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
            return _broken(e)
        runs, wrong = _replay(g, lambda i: src.fill_(float(i + 1)), check)
    broken = sum(s > stall for s in stalls)
    note = ""
    if broken:
        note = f"host waited {max(stalls) * 1e3:.1f} ms in the consumer's call"
    elif wrong:
        note = f"stale data in {wrong}/{runs} runs"
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", ["eager"] + MODES)
@pytest.mark.parametrize("consumer", ["torch", "CuPy"])
def test_numba_array_to_framework(consumer, mode, record):
    setting = "eager" if mode == "eager" else "torch.cuda.graph"
    record(f"Numba -> {consumer}", setting, mode, _numba_to(consumer, mode, True),
           _numba_to(consumer, mode, False))


# ---- the whole chain in one capture: torch -> Numba -> CuPy -> torch ----


def _chain(mode, use):
    """y = 2 x + 1 (torch); na = 3 y (the example Numba library, on its own
    stream); c = na + 1 (CuPy, on its stream); out = c (torch)."""
    cupy = pytest.importorskip("cupy")
    import numba_kernels

    kernels = numba_kernels.Kernels(own_stream=True)
    x = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    na = cuda.device_array(N, dtype=numpy.float32)  # its CAI names no stream
    cres = cupy.zeros(N, dtype=cupy.float32)
    cs = cupy.cuda.Stream(non_blocking=True)
    own = kernels.own
    # Warm-up outside the capture: the kernels compiled, CuPy's loaded.
    kernels.affine(x, na, 3.0, 0.0, stream=torch.cuda.current_stream())
    with cs:
        cupy.add(cupy.asarray(na), 1, out=cres)
        cs.synchronize()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            cur = torch.cuda.current_stream()
            y = x * 2 + 1
            if use:
                with dlsync.scope():
                    kernels.affine(y, na, 3.0, 0.0, stream=cur)
                    with cs:  # na is ready on cur (the library joined back into it)
                        c = cupy.asarray(dlsync.wrap(na, producer=cur, consumer=cs))
                        cupy.add(c, 1, out=cres)
                    out.copy_(torch.from_dlpack(dlsync.wrap(cres, producer=cs)))
            else:  # the same library without dlsync: plain imports, its own stream
                numba_kernels._affine[BLOCKS, THREADS, own](cuda.as_cuda_array(y), na, 3.0, 0.0)
                with cs:
                    cupy.add(cupy.asarray(na), 1, out=cres)
                out.copy_(torch.from_dlpack(cres))
    except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
        return _broken(e)
    runs, wrong = _replay(g, lambda i: x.fill_(float(i + 1)),
                          lambda i: float(out[-1].item()) == 3.0 * (2.0 * (i + 1) + 1) + 1)
    return runs, wrong, 0, f"stale data in {wrong}/{runs} runs" if wrong else ""


@pytest.mark.parametrize("mode", MODES)
def test_torch_numba_cupy_torch_in_one_capture(mode, record):
    record("torch>Numba>CuPy>tch", "torch.cuda.graph", mode, _chain(mode, True),
           _chain(mode, False))
