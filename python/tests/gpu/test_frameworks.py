# SPDX-License-Identifier: Apache-2.0
"""The framework regression suite, on a GPU: PyTorch, CuPy, JAX, cuda.core and
an example kernel library, under torch.cuda.graph where a graph is involved.

Each case runs with dlsync and as a negative control without it. With dlsync
every read must be right and every capture must end; the control must show
wrong data or a broken capture, so the case is known to be able to fail.
Captured graphs are replayed many times with new input and the consumer's
result is checked after each replay. conftest.py prints the table.

Run: python3 -m pytest -q python/tests/gpu  (DLSYNC_LIBRARY=.../libdlsync.so,
KERNEL_LIB=.../libkernel_lib.so for the example library case).
"""
import ctypes
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dlsync  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

N = 1 << 27  # 128 Mi floats (512 MiB): the producer runs long enough to race
REPLAYS = 30
MODES = ["global", "thread_local", "relaxed"]


def _last(t):
    return float(t[-1].item())


# ---- torch producer, CuPy consumer, inside torch.cuda.graph ----


def _torch_to_cupy(mode, use):
    cupy = pytest.importorskip("cupy")
    x = torch.zeros(N, device="cuda")
    res = cupy.zeros(N, dtype=cupy.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    # Warm up: compile CuPy's kernel and fill its pools outside the capture.
    cupy.multiply(cupy.from_dlpack(x), 3, out=res)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            if use:
                with dlsync.scope():
                    y = x * 2 + 1
                    with side:
                        cy = cupy.from_dlpack(dlsync.wrap(y))
                        cupy.multiply(cy, 3, out=res)
            else:
                y = x * 2 + 1
                with side:
                    cy = cupy.from_dlpack(y)
                    cupy.multiply(cy, 3, out=res)
    except Exception as e:  # the control's broken capture
        broken += 1
        note = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += float(res[-1].get()) != (2.0 * (i + 1) + 1) * 3
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_torch_to_cupy_under_torch_graph(mode, record):
    record("torch -> CuPy", "torch.cuda.graph", mode, _torch_to_cupy(mode, True),
           _torch_to_cupy(mode, False))


# ---- the same with an explicit exchange, capture_stable=True ----


def _torch_to_cupy_stable(mode, use):
    cupy = pytest.importorskip("cupy")
    x = torch.zeros(N, device="cuda")
    res = cupy.zeros(N, dtype=cupy.float32)
    side = cupy.cuda.Stream(non_blocking=True)
    cupy.multiply(cupy.from_dlpack(x), 3, out=res)
    torch.cuda.synchronize()
    if use:  # warm this thread's fast path for the two streams
        with dlsync.exchange(torch.cuda.current_stream(), side, capture_stable=True):
            pass
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = x * 2 + 1
            cy = cupy.from_dlpack(_NoSync(y))  # no ordering but dlsync's
            if use:
                with dlsync.exchange(torch.cuda.current_stream(), side, capture_stable=True):
                    with side:
                        cupy.multiply(cy, 3, out=res)
            else:
                with side:
                    cupy.multiply(cy, 3, out=res)
    except Exception as e:  # the control's broken capture
        broken += 1
        note = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += float(res[-1].get()) != (2.0 * (i + 1) + 1) * 3
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_torch_to_cupy_exchange_capture_stable(mode, record):
    record("torch -> CuPy STABLE", "torch.cuda.graph", mode, _torch_to_cupy_stable(mode, True),
           _torch_to_cupy_stable(mode, False))


# ---- CuPy producer (joined into the capture), torch consumer ----


def _cupy_to_torch(mode, use):
    cupy = pytest.importorskip("cupy")
    src = cupy.zeros(N, dtype=cupy.float32)
    ps = cupy.cuda.Stream(non_blocking=True)
    out = torch.zeros(N, device="cuda")
    cupy.multiply(src, 2, out=src)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    a = cupy.zeros(N, dtype=cupy.float32)
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            cap = torch.cuda.current_stream()
            if use:
                with dlsync.scope():
                    # CuPy's stream joins torch's capture to produce.
                    with dlsync.exchange(cap, ps.ptr), ps:
                        cupy.multiply(src, 2, out=a)
                    t = torch.from_dlpack(dlsync.wrap(a, producer=ps.ptr))
                    out.copy_(t)
            else:
                with ps:
                    cupy.multiply(src, 2, out=a)
                t = torch.from_dlpack(a)
                out.copy_(t)
    except Exception as e:
        broken += 1
        note = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        src.fill(float(i + 1))
        cupy.cuda.Device().synchronize()
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += _last(out) != 2.0 * (i + 1)
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_cupy_to_torch_under_torch_graph(mode, record):
    record("CuPy -> torch", "torch.cuda.graph", mode, _cupy_to_torch(mode, True),
           _cupy_to_torch(mode, False))


# ---- torch producer, JAX consumer, eagerly ----


def _torch_to_jax(use):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    runs = wrong = 0
    s = torch.cuda.Stream()
    for i in range(10):
        x = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            # A long producer on a side stream: a spin of about 10 ms first,
            # so that a consumer not ordered after it reads too early every
            # time (the multiply alone raced JAX's read in 0 to 6 of 10).
            torch.cuda._sleep(20_000_000)
            y = x * 2 + 1
            if use:
                j = jax.dlpack.from_dlpack(dlsync.wrap(y, producer=s))
            else:
                j = jax.dlpack.from_dlpack(_NoSync(y))
        v = float(jnp.sum(j[-8:]) / 8)
        runs += 1
        wrong += v != 2.0 * (i + 1) + 1
        torch.cuda.synchronize()
    return runs, wrong, 0, ""


class _NoSync:
    """The producer without ordering: what stream=-1 (no sync) gives."""

    def __init__(self, t):
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        with torch.cuda.device(self._t.device):
            return self._t.__dlpack__(stream=-1, **kw)


def test_torch_to_jax_eager(record):
    record("torch -> JAX", "eager", "-", _torch_to_jax(True), _torch_to_jax(False))


# ---- cuda.core streams ----


def _cuda_core(use):
    core = pytest.importorskip("cuda.core")
    cupy = pytest.importorskip("cupy")
    Device = getattr(core, "Device", None)
    if Device is None:
        Device = pytest.importorskip("cuda.core.experimental").Device
    dev = Device(0)
    dev.set_current()
    consumer = dev.create_stream()
    producer = torch.cuda.Stream()
    res = cupy.zeros(8, dtype=cupy.float32)
    runs = wrong = 0
    for i in range(10):
        x = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(producer):
            torch.cuda._sleep(20_000_000)  # about 10 ms: the control must read too early
            y = x * 2 + 1
        cy = cupy.from_dlpack(_NoSync(y))
        ext = cupy.cuda.ExternalStream(dlsync.stream_handle(consumer))
        if use:
            with dlsync.exchange(producer, consumer), ext:
                cupy.multiply(cy[-8:], 1, out=res)
        else:
            with ext:
                cupy.multiply(cy[-8:], 1, out=res)
        ext.synchronize()
        runs += 1
        wrong += float(res[-1].get()) != 2.0 * (i + 1) + 1
        torch.cuda.synchronize()
    consumer.close()
    return runs, wrong, 0, ""


def test_cuda_core_streams(record):
    record("torch -> cuda.core", "eager", "-", _cuda_core(True), _cuda_core(False))


# ---- the example kernel library (C, dlsync inside) under torch.cuda.graph ----


def _kernel_lib():
    path = os.environ.get("KERNEL_LIB")
    if not path or not os.path.exists(path):
        pytest.skip("KERNEL_LIB not built")
    lib = ctypes.CDLL(path)
    lib.kl_scale.restype = ctypes.c_int
    lib.kl_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_float,
                             ctypes.c_void_p, ctypes.c_int]
    lib.kl_last_error.restype = ctypes.c_char_p
    assert lib.kl_init() == 0
    return lib


def _library_under_graph(mode, use):
    lib = _kernel_lib()
    x = torch.zeros(N, device="cuda")
    out = torch.zeros(N, device="cuda")
    g = torch.cuda.CUDAGraph()
    runs = wrong = broken = 0
    note = ""
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            y = x * 2 + 1
            rc = lib.kl_scale(out.data_ptr(), y.data_ptr(), N, 3.0,
                              torch.cuda.current_stream().cuda_stream, 1 if use else 0)
            if rc != 0:
                raise RuntimeError(lib.kl_last_error().decode())
    except Exception as e:
        broken += 1
        note = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        torch.cuda.synchronize()
        return runs, wrong, broken, note
    for i in range(REPLAYS):
        x.fill_(float(i + 1))
        g.replay()
        torch.cuda.synchronize()
        runs += 1
        wrong += _last(out) != (2.0 * (i + 1) + 1) * 3
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_kernel_library_under_torch_graph(mode, record):
    record("kernel lib (C)", "torch.cuda.graph", mode, _library_under_graph(mode, True),
           _library_under_graph(mode, False))
