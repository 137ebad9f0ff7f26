# SPDX-License-Identifier: Apache-2.0
"""Framework-suite rows for dlsync.arrow, the Arrow C Device data interface
(``__arrow_c_device_array__``), on a GPU.

Each case runs with dlsync and as a negative control without it (conftest.py
asserts both and prints the rows beside the others):

- ``arrow torch -> CuPy``, graph -> eager: a captured graph's slow producer
  (``torch.cuda._sleep`` then a copy) writes a buffer and exports it in the
  capture (dlsync's sync_event: an event-record node); after each of RUNS
  launches a CuPy kernel on its own stream reads it, the import (the first
  launch) or ``DeviceArray.wait`` (the others) ordering it after that
  launch. The control reads after each launch with no wait: stale data.
- ``arrow torch -> torch``, eager -> graph: a slow eager producer on a side
  stream exports the buffer; a graph captured on another stream imports it
  (a wait node) and reads it, replayed twice; RUNS rounds with new data.
  The producer's release is handed over in the capture: it must not run
  before the graph is gone. The control captures the read with no wait.
- ``arrow release``, eager: the consumer's slow kernel records an event; the
  array's release (dlsync_arrow_release) must find that event complete
  (cuEventQuery) when the producer's release callback runs. The control
  calls the producer's release itself before the consumer's kernel is done:
  the same check catches it.

A real producer (pyarrow built with CUDA) is tried last, skipped with the
reason where it cannot be imported. Skips without torch or a GPU; the first
row without CuPy.

Run: DLSYNC_LIBRARY=.../libdlsync.so python3 -m pytest -q python/tests/gpu/test_arrow.py
"""
import ctypes
import gc
import os
import sys
import threading
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import dlsync  # noqa: E402
from dlsync import _arrow, _backend  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

N = 1 << 23  # 8 Mi floats (32 MiB)
RUNS = 20
SLEEP = 50_000_000  # GPU cycles (torch.cuda._sleep): tens of ms, the control reads too early
MODES = ["global", "thread_local", "relaxed"]
CUDA_ERROR_NOT_READY = 600


def _flush():
    """dlsync_release_flush on the default context (ctypes lets the GIL go:
    the releases it waits for run Python callbacks)."""
    lib = _backend.lib
    ctx = ctypes.c_void_p()
    assert lib.dlsync_context_default(ctypes.byref(ctx)) == 0
    assert lib.dlsync_release_flush(ctx) == 0


def _wait_for(cond, seconds=10.0):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        _flush()
        time.sleep(0.005)
    return cond()


def _note(e):
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:140]}"


def _broken(e):
    note = _note(e)
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the capture's error may surface once more here
        pass
    return 0, 0, 1, note


# ---- a captured producer, an eager CuPy consumer after each launch ----


def _graph_to_cupy(mode, use):
    cupy = pytest.importorskip("cupy")
    x = torch.zeros(N, device="cuda")
    src = torch.zeros(N, device="cuda")
    res = cupy.zeros(N, dtype=cupy.float32)
    cs = cupy.cuda.Stream(non_blocking=True)
    released = []
    with cs:  # CuPy's kernel compiled outside
        cupy.multiply(cupy.zeros(N, dtype=cupy.float32), 3, out=res)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    pair = None
    try:
        with torch.cuda.graph(g, capture_error_mode=mode):
            torch.cuda._sleep(SLEEP)
            x.copy_(src)
            if use:  # the sync_event: an event-record node of this graph (the capture's stream)
                pair = dlsync.arrow.export_device_array(
                    x, N, "f", torch.cuda.current_stream(),
                    release=lambda: released.append(1)).__arrow_c_device_array__()
    except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
        return _broken(e)
    arr = None
    view = None
    wrong = 0
    for i in range(RUNS):
        src.fill_(float(i + 1))
        g.replay()
        if use:
            if arr is None:
                arr = dlsync.arrow.import_device_array(pair, cs, provenance="external_record")
                assert arr.length == N and arr.format == "f" and arr.buffers[1] == x.data_ptr()
            else:
                arr.wait(cs)  # the record node is armed again by each launch
        if view is None:
            ptr = arr.buffers[1] if use else x.data_ptr()
            mem = cupy.cuda.UnownedMemory(ptr, N * 4, x)
            view = cupy.ndarray((N,), cupy.float32, cupy.cuda.MemoryPointer(mem, 0))
        with cs:
            cupy.multiply(view, 3, out=res)
        cs.synchronize()
        wrong += float(res[-1].get()) != 3.0 * (i + 1)
    torch.cuda.synchronize()
    note = f"stale data in {wrong}/{RUNS} launches" if wrong else ""
    broken = 0
    if use:
        arr.release(cs)
        if not _wait_for(lambda: released == [1]):
            broken, note = 1, f"the producer's release ran {len(released)} times, not once"
    del g
    return RUNS, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_arrow_from_a_captured_producer_to_eager_cupy(mode, record):
    record("arrow torch -> CuPy", "graph -> eager", mode, _graph_to_cupy(mode, True),
           _graph_to_cupy(mode, False))


# ---- an eager producer, a consumer captured and replayed ----


def _eager_to_graph(mode, use):
    x = torch.zeros(N, device="cuda")
    res = torch.zeros(N, device="cuda")
    producer, capturer = torch.cuda.Stream(), torch.cuda.Stream()
    torch.mul(x, 3, out=res)  # torch's kernel loaded outside the capture
    torch.cuda.synchronize()
    wrong = broken = runs = 0
    note = ""
    for i in range(RUNS):
        released = []
        with torch.cuda.stream(producer):
            torch.cuda._sleep(SLEEP)
            x.fill_(float(i + 1))
        exp = dlsync.arrow.export_device_array(x, N, "f", producer,
                                               release=lambda r=released: r.append(1))
        # Exported now, eagerly (sync_event recorded on the producer's stream);
        # never consumed in the control (the capsules' destructors release it).
        pair = exp.__arrow_c_device_array__()
        g = torch.cuda.CUDAGraph()
        try:
            # capture_begin, not torch.cuda.graph: that one synchronises the
            # device first, which would wait for the slow producer.
            with torch.cuda.stream(capturer):
                g.capture_begin(capture_error_mode=mode)
                try:
                    if use:
                        arr = dlsync.arrow.import_device_array(pair, capturer)  # a wait node
                    torch.mul(x, 3, out=res)
                    if use:
                        arr.release()  # the graph owns it now
                finally:
                    g.capture_end()
        except Exception as e:  # noqa: BLE001 - a broken capture is the outcome
            return _broken(e)
        for _ in range(2):
            with torch.cuda.stream(capturer):  # a non-blocking stream, as the producer's
                g.replay()
            torch.cuda.synchronize()
            runs += 1
            wrong += float(res[-1].item()) != 3.0 * (i + 1)
        if use:
            _flush()
            if released:
                broken += 1
                note = "the producer's release ran while the graph that read it was alive"
            g.reset()  # the graph and its executable destroyed
            del g
            gc.collect()
            if not _wait_for(lambda: released == [1]):
                broken += 1
                note = f"the producer's release ran {len(released)} times once the graph was gone"
        torch.cuda.synchronize()
    if wrong and not note:
        note = f"stale data in {wrong}/{runs} replays"
    return runs, wrong, broken, note


@pytest.mark.parametrize("mode", MODES)
def test_arrow_from_an_eager_producer_to_a_captured_consumer(mode, record):
    record("arrow torch -> torch", "eager -> graph", mode, _eager_to_graph(mode, True),
           _eager_to_graph(mode, False))


# ---- the producer's release after the consumer's kernel ----


def _release_after_consumer(use):
    cu = ctypes.CDLL("libcuda.so.1")
    for name, args in (("cuEventQuery", [ctypes.c_void_p]), ("cuCtxGetCurrent", [ctypes.c_void_p]),
                       ("cuCtxPushCurrent_v2", [ctypes.c_void_p]),
                       ("cuCtxPopCurrent_v2", [ctypes.c_void_p])):
        getattr(cu, name).argtypes = args
        getattr(cu, name).restype = ctypes.c_int
    torch.cuda.synchronize()  # torch's context current on this thread
    ctx = ctypes.c_void_p()
    assert cu.cuCtxGetCurrent(ctypes.byref(ctx)) == 0 and ctx.value

    def query(event):
        """cuEventQuery from whichever thread runs the release (dlsync's
        reclaimer has no context current), the thread left as it was."""
        if cu.cuCtxPushCurrent_v2(ctx) != 0:
            return -1
        try:
            return cu.cuEventQuery(event)
        finally:
            cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    x = torch.ones(N, device="cuda")
    res = torch.zeros(N, device="cuda")
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    wrong = broken = 0
    note = ""
    runs = 10
    for _ in range(runs):
        done = torch.cuda.Event()
        seen = []  # cuEventQuery of the consumer's event, from the release
        with torch.cuda.stream(producer):
            x.fill_(2.0)
        exp = dlsync.arrow.export_device_array(
            x, N, "f", producer,
            release=lambda done=done, seen=seen: seen.append((query(done.cuda_event),
                                                              threading.get_ident())))
        arr = dlsync.arrow.import_device_array(exp, consumer)
        with torch.cuda.stream(consumer):
            torch.cuda._sleep(SLEEP)  # a slow consumer
            torch.mul(x, 3, out=res)
            done.record(consumer)
        if use:
            arr.release(consumer)
        else:  # the producer's release called at once, as a consumer without dlsync may
            moved = _arrow.ArrowDeviceArray.from_address(arr.address)
            _arrow._ArrayRelease(moved.array.release)(ctypes.pointer(moved.array))
            arr._released = True  # noqa: SLF001 - released by hand above
        if not _wait_for(lambda: len(seen) == 1):
            broken += 1
            note = f"the producer's release ran {len(seen)} times"
        elif seen[0][0] == CUDA_ERROR_NOT_READY:
            wrong += 1
            note = "the producer's release ran before the consumer's kernel was done"
        elif seen[0][0] != 0:
            broken += 1
            note = f"cuEventQuery in the release returned {seen[0][0]}"
        torch.cuda.synchronize()
    return runs, wrong, broken, note


def test_arrow_release_after_the_consumer_s_kernel(record):
    record("arrow release", "eager", "-", _release_after_consumer(True),
           _release_after_consumer(False))


# ---- a real producer and consumer: pyarrow built with CUDA ----


def test_pyarrow_cuda_arrays_through_dlsync():
    pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed")
    try:
        from pyarrow import cuda as pa_cuda
    except ImportError as e:
        pytest.skip(f"pyarrow {pa.__version__} has no CUDA support (pyarrow.cuda: {e})")
    if not hasattr(pa.Array, "__arrow_c_device_array__"):
        pytest.skip(f"pyarrow {pa.__version__} has no __arrow_c_device_array__")
    ctx = pa_cuda.Context(0)
    host = pa.array([1.0, 2.0, 3.0, 4.0], type=pa.float32())
    dbuf = ctx.buffer_from_data(host.buffers()[1])
    parr = pa.Array.from_buffers(pa.float32(), 4, [None, dbuf])
    stream = torch.cuda.Stream()
    with dlsync.arrow.import_device_array(parr, stream) as arr:
        assert arr.device_type == dlsync.arrow.DEVICE_CUDA
        assert arr.format == "f" and arr.length == 4
        assert arr.buffers[1] == dbuf.address
    # dlsync's export read by pyarrow, where it can import device arrays.
    importer = getattr(pa.Array, "_import_from_c_device_capsule", None)
    if importer is None:
        pytest.skip(f"pyarrow {pa.__version__} cannot import a device capsule")
    x = torch.arange(4, dtype=torch.float32, device="cuda")
    out = importer(*dlsync.arrow.export_device_array(
        x, 4, "f", torch.cuda.current_stream()).__arrow_c_device_array__())
    assert out.type == pa.float32() and len(out) == 4
    assert out.buffers()[1].address == x.data_ptr()
