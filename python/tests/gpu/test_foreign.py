# SPDX-License-Identifier: Apache-2.0
"""Other runtimes' events as fences on a GPU (dlsync.Fence.from_event,
include/dlsync/foreign.h): a PyTorch event recorded inside a
torch.cuda.graph, waited on by CuPy.

Each case runs with dlsync and as a negative control, as in
test_frameworks.py (conftest.py prints the rows): with dlsync every replay
must read the data that replay produced; the control must read stale data
or break its capture, so the case is known to be able to fail.

- torch ext. event -> CuPy: a ``torch.cuda.Event(external=True)`` recorded
  in a torch.cuda.graph after a slow producer (a spin, then y = x * 2 + 1),
  imported as EXTERNAL_RECORD; CuPy reads y on its own stream after each of
  20 replays, eagerly (control: no wait) or inside a second capture, CuPy's
  own (control: CuPy's plain ``streamWaitEvent`` of the torch event in that
  capture).
- NCCL x1 -> CuPy: torch.distributed's NCCL at world size 1 (a
  subprocess: foreign_nccl_worker.py) issues an async all-reduce in one
  capture, waits on its work there and records an external event after it;
  after the graph break CuPy consumes the sum in a second capture on its
  stream (control: no wait).

Run: python3 -m pytest -q python/tests/gpu/test_foreign.py (DLSYNC_LIBRARY=.../libdlsync.so).
"""
import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import dlsync  # noqa: E402

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

N = 1 << 24
SPIN = 20_000_000  # torch.cuda._sleep cycles: about 10 ms, long enough for a reader to race
REPLAYS = 20


class _NoSync:
    """The tensor without ordering (stream=-1): only the case's own orders it."""

    def __init__(self, t):
        self._t = t

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()

    def __dlpack__(self, stream=None, **kw):
        with torch.cuda.device(self._t.device):
            return self._t.__dlpack__(stream=-1, **kw)


def _external_event():
    try:
        return torch.cuda.Event(external=True)
    except TypeError:
        pytest.skip(f"torch {torch.__version__} has no torch.cuda.Event(external=True)")


def _producer_graph():
    """(x, y, the external event, the graph): y = x * 2 + 1 after a spin,
    then the event's record node, captured by torch.cuda.graph."""
    x = torch.zeros(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    ev = _external_event()
    ev.record()  # torch creates the CUDA event at its first record: outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.cuda._sleep(SPIN)
        torch.add(x * 2, 1, out=y)
        ev.record()  # external: an event-record node of g
    torch.cuda.synchronize()
    return x, y, ev, g


def _broken(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


# ---- (a) torch's external event, CuPy reads after each replay ----


def _ext_event_eager(use):
    cupy = pytest.importorskip("cupy")
    x, y, ev, g = _producer_graph()
    cy = cupy.from_dlpack(_NoSync(y))
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    with cs:
        cupy.multiply(cy[-8:], 1, out=res)  # warm up
    cs.synchronize()
    fence = dlsync.Fence.from_event(ev, provenance=dlsync.Provenance.EXTERNAL_RECORD)
    assert fence.provenance is dlsync.Provenance.EXTERNAL_RECORD
    assert fence.event() == ev.cuda_event
    runs = wrong = 0
    note = ""
    try:
        for i in range(REPLAYS):
            x.fill_(float(i + 1))
            g.replay()  # launched first: the wait orders after this launch's record
            with cs:
                if use:
                    fence.wait(cs)
                cupy.multiply(cy[-8:], 1, out=res)
            cs.synchronize()
            torch.cuda.synchronize()
            got, want = float(res[-1].get()), 2.0 * (i + 1) + 1
            runs += 1
            if got != want:
                wrong += 1
                note = note or f"replay {i}: read {got}, want {want}"
    finally:
        fence.close()
    return runs, wrong, 0, note


def test_torch_external_event_to_cupy_eager(record):
    record("torch ext.ev -> CuPy", "eager, replayed", "global", _ext_event_eager(True),
           _ext_event_eager(False))


def _ext_event_in_capture(use):
    cupy = pytest.importorskip("cupy")
    x, y, ev, g = _producer_graph()
    cy = cupy.from_dlpack(_NoSync(y))
    cs = cupy.cuda.Stream(non_blocking=True)
    res = cupy.zeros(8, dtype=cupy.float32)
    with cs:
        cupy.multiply(cy[-8:], 1, out=res)  # warm up: no compile or allocation in the capture
    cs.synchronize()
    fence = dlsync.Fence.from_event(ev, provenance="external_record")
    runs = wrong = broken = 0
    note = ""
    failed = None
    cs.begin_capture()
    try:
        with cs:
            if use:
                fence.wait(cs)  # a wait node, armed at each launch of the CuPy graph
            else:
                cupy.cuda.runtime.streamWaitEvent(cs.ptr, ev.cuda_event)
            cupy.multiply(cy[-8:], 1, out=res)
    except Exception as e:  # noqa: BLE001 - the control's broken capture
        failed = e
    try:
        g2 = cs.end_capture()  # ends the capture, broken or not
    except Exception as e:  # noqa: BLE001
        failed = failed or e
    if failed is not None:
        fence.close()
        torch.cuda.synchronize()
        return 0, 0, 1, _broken(failed)
    try:
        for i in range(REPLAYS):
            x.fill_(float(i + 1))
            g.replay()  # the recording graph first, each time
            g2.launch(stream=cs)
            cs.synchronize()
            torch.cuda.synchronize()
            got, want = float(res[-1].get()), 2.0 * (i + 1) + 1
            runs += 1
            if got != want:
                wrong += 1
                note = note or f"replay {i}: read {got}, want {want}"
    finally:
        fence.close()
    return runs, wrong, broken, note


def test_torch_external_event_to_cupy_capture(record):
    record("torch ext.ev -> CuPy", "CuPy capture", "relaxed", _ext_event_in_capture(True),
           _ext_event_in_capture(False))


# ---- (b) NCCL at world size 1: an async all-reduce, then a graph break ----


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _nccl_one(use):
    pytest.importorskip("cupy")
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_nccl_available():
        pytest.skip("torch.distributed without NCCL")
    worker = os.path.join(HERE, "foreign_nccl_worker.py")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        env = dict(os.environ, NCCL_NVLS_ENABLE="0", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(_free_port()), WORLD_SIZE="1", RANK="0",
                   PYTHONPATH=os.path.dirname(os.path.dirname(dlsync.__file__)))
        p = subprocess.Popen([sys.executable, worker, "1" if use else "0", out], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            log, _ = p.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            p.kill()
            log, _ = p.communicate()
            log += "\n(timed out after 300 s)"
        if not os.path.exists(out):
            pytest.fail("the worker wrote no result:\n" + log[-3000:])
        with open(out) as f:
            result = json.load(f)
    if result.get("skip"):
        pytest.skip(result["skip"])
    return result["runs"], result["wrong"], result["broken"], result["note"]


def test_nccl_collective_waited_after_a_graph_break(record):
    record("NCCL x1 -> CuPy", "two captures", "global", _nccl_one(True), _nccl_one(False))
