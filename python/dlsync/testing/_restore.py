# SPDX-License-Identifier: Apache-2.0
"""Leaving the process as a check found it.

A capture that fails half-way leaves state behind in PyTorch (2.11's
``CUDAGraph::capture_begin`` / ``capture_end``) and in CUDA:

- ``capture_begin`` registers the device's default CUDA generator with the
  graph and calls its ``capture_prologue`` (the generator's state is then "in
  capture mode"); only a ``capture_end`` that gets past
  ``cudaStreamEndCapture`` calls ``capture_epilogue``. After a failed end
  every later draw outside a capture raises "Offset increment outside graph
  capture encountered unexpectedly". Restored by a capture of our own that
  succeeds (prologue and epilogue on the same state object, so graphs already
  captured by the process keep sharing it), then checked by a draw.
- ``capture_begin`` routes the caching allocator's allocations on the
  capture to a private pool (``beginAllocateToPool``); a failed end never
  calls ``endAllocateToPool`` nor, later, ``releasePool``: with the pool
  still "underway" the allocator stops processing its end-of-life events
  (cross-stream frees are deferred for good) and the pool is never freed.
  Restored with ``torch._C._cuda_endAllocateToPool`` and
  ``torch._C._cuda_releasePool`` on the pool's id, which the harness knows
  because every capture made during a case is given a pool of its own
  (``torch.cuda.graph_pool_handle()``) when its caller gave none.
- The graph object of a capture that failed before its pool was ended is
  kept alive: the pinned host allocator's pool routing (PyTorch versions that
  have one) and the map of graphs being captured hold pointers to it, and no
  Python binding ends them.
- A stream whose capture was begun and never ended (an op that changed the
  current stream, so ``capture_end`` refused to run) keeps capturing: in
  GLOBAL mode every unsafe call of every thread then fails. Ended with
  ``cuStreamEndCapture`` and the graph destroyed.
- The thread's capture interaction mode (``cuThreadExchangeStreamCaptureMode``),
  PyTorch's current device and current streams, CuPy's current stream and
  the default generators' seeds and offsets are saved before a check and put
  back after each case.

Everything here takes the framework and the driver as arguments, so that
tests/test_testing_cpu.py runs it on fakes.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

THREAD_PREFIX = "dlsync-testing-"
RELAXED = 2  # CU_STREAM_CAPTURE_MODE_RELAXED
_GEN_STUCK = "offset increment outside graph capture"

# Graphs whose capture failed, kept alive for the rest of the process (see
# above). Each is one small host object.
_KEPT: List[Any] = []

# What could not be restored in this process (a neighbour thread still
# running, a capture that could not be ended, a generator still stuck): once
# non-empty, later checks should run in a child process.
UNCLEAN: List[str] = []


class Driver:
    """The few CUDA driver calls the restore needs, through ctypes;
    ``available`` is False where libcuda cannot be loaded (then nothing of
    CUDA's own state is touched)."""

    def __init__(self, lib: Any = None):
        if lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError:
                lib = None
        self.lib = lib

    @property
    def available(self) -> bool:
        return self.lib is not None

    def exchange_mode(self, mode: int) -> int:
        """Sets this thread's capture interaction mode; returns the old one."""
        m = ctypes.c_int(mode)
        rc = self.lib.cuThreadExchangeStreamCaptureMode(ctypes.byref(m))
        if rc != 0:
            raise RuntimeError(f"cuThreadExchangeStreamCaptureMode failed ({rc})")
        return m.value

    def capture_status(self, handle: int) -> int:
        """0 none, 1 active, 2 invalidated."""
        st = ctypes.c_int(0)
        rc = self.lib.cuStreamIsCapturing(ctypes.c_void_p(handle), ctypes.byref(st))
        if rc != 0:
            raise RuntimeError(f"cuStreamIsCapturing failed ({rc})")
        return st.value

    def end_capture(self, handle: int) -> None:
        """Ends the stream's capture and destroys whatever graph it made."""
        graph = ctypes.c_void_p(0)
        rc = self.lib.cuStreamEndCapture(ctypes.c_void_p(handle), ctypes.byref(graph))
        if graph.value:
            self.lib.cuGraphDestroy(graph)
        if rc != 0 and self.capture_status(handle) != 0:
            raise RuntimeError(f"cuStreamEndCapture failed ({rc}) and the stream still captures")


@dataclass
class Tracked:
    """One capture begun during a case (the harness's, the neighbour's, or
    one the op made through torch.cuda.CUDAGraph)."""

    graph: Any
    pool: Any
    device: int
    stream: int  # the capturing stream's handle
    ended: bool = False
    thread: Any = None  # the thread that began it


@dataclass
class Snapshot:
    device: Optional[int] = None
    streams: Dict[int, Any] = field(default_factory=dict)  # device -> torch stream
    rng: Dict[int, Any] = field(default_factory=dict)  # device -> default generator's state
    mode: Optional[int] = None  # the thread's capture interaction mode
    cupy_stream: Any = None


def _devices(torch: Any, devices: List[int]) -> List[int]:
    out: List[int] = []
    for d in devices:
        if d is not None and d not in out:
            out.append(int(d))
    return out


def take(torch: Any, driver: Driver, devices: List[int]) -> Snapshot:
    """The state a check must give back (call outside any capture)."""
    snap = Snapshot()
    snap.device = torch.cuda.current_device()
    for d in _devices(torch, [snap.device, *devices]):
        snap.streams[d] = torch.cuda.current_stream(d)
        gens = getattr(torch.cuda, "default_generators", ())
        if d < len(gens):
            try:
                snap.rng[d] = gens[d].get_state()
            except Exception:  # noqa: BLE001 - a generator already stuck: nothing to save
                pass
    if driver.available:
        try:
            snap.mode = driver.exchange_mode(RELAXED)
            driver.exchange_mode(snap.mode)
        except RuntimeError:
            snap.mode = None
    cupy = sys.modules.get("cupy")  # only when the process uses CuPy already
    if cupy is not None:
        try:
            snap.cupy_stream = cupy.cuda.get_current_stream()
        except Exception:  # noqa: BLE001 - no device for CuPy: nothing to save
            snap.cupy_stream = None
    return snap


class Watch:
    """While active, every ``torch.cuda.CUDAGraph.capture_begin`` in the
    process is recorded (and given a pool of its own when its caller gave
    none), so that a capture the op began and failed to end is found too."""

    def __init__(self, torch: Any):
        self.torch = torch
        self.tracked: List[Tracked] = []
        self._lock = threading.Lock()
        self._saved: Optional[Tuple[Any, Any, bool, bool]] = None

    def track(self, graph: Any, pool: Any, device: int, stream: int) -> Tracked:
        t = Tracked(graph, pool, device, stream, thread=threading.current_thread())
        with self._lock:
            self.tracked.append(t)
        return t

    def ended(self, graph: Any) -> None:
        with self._lock:
            for t in self.tracked:
                if t.graph is graph:
                    t.ended = True

    def __enter__(self) -> "Watch":
        torch, watch = self.torch, self
        cls = getattr(torch.cuda, "CUDAGraph", None)
        begin = getattr(cls, "capture_begin", None)
        end = getattr(cls, "capture_end", None)
        if cls is None or begin is None or end is None:
            return self

        def capture_begin(graph: Any, pool: Any = None, *args: Any, **kwargs: Any) -> Any:
            if pool is None or tuple(pool) == (0, 0):
                pool = torch.cuda.graph_pool_handle()
            dev = torch.cuda.current_device()
            stream = int(torch.cuda.current_stream(dev).cuda_stream)
            watch.track(graph, pool, dev, stream)
            return begin(graph, pool, *args, **kwargs)

        def capture_end(graph: Any, *args: Any, **kwargs: Any) -> Any:
            out = end(graph, *args, **kwargs)
            watch.ended(graph)
            return out

        self._saved = (begin, end, "capture_begin" in vars(cls), "capture_end" in vars(cls))
        cls.capture_begin, cls.capture_end = capture_begin, capture_end
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._saved is not None:
            cls = self.torch.cuda.CUDAGraph
            begin, end, own_begin, own_end = self._saved
            for name, f, own in (("capture_begin", begin, own_begin),
                                 ("capture_end", end, own_end)):
                if own:
                    setattr(cls, name, f)
                else:  # inherited: the class gets no attribute of its own
                    delattr(cls, name)
            self._saved = None


def _private(torch: Any, *names: str) -> Optional[Callable[..., Any]]:
    for n in names:
        f: Optional[Callable[..., Any]] = getattr(torch._C, n, None)
        if f is not None:
            return f
    return None


def end_failed_captures(torch: Any, driver: Driver, tracked: List[Tracked],
                        done: List[str], left: List[str]) -> List[int]:
    """For each capture that did not end: its stream's capture ended (when
    still open), its allocator pool ended and released, its graph kept
    alive. Returns the devices whose generator may be stuck."""
    end_pool = _private(torch, "_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool")
    release = _private(torch, "_cuda_releasePool")
    devices: List[int] = []
    me = threading.current_thread()
    for t in tracked:
        if t.ended:
            continue
        if t.thread is not None and t.thread is not me and t.thread.is_alive():
            continue  # another thread's capture may still be going on: not ours to end
        if t.device not in devices:
            devices.append(t.device)
        if driver.available:
            try:
                if driver.capture_status(t.stream) != 0:
                    driver.end_capture(t.stream)
                    done.append(f"ended the capture left open on stream {t.stream:#x}")
            except RuntimeError as e:
                left.append(f"stream {t.stream:#x} still captures: {e}")
        pool = tuple(t.pool) if t.pool is not None else None
        keep = True
        if pool is not None and end_pool is not None:
            try:
                end_pool(t.device, pool)
            except Exception:  # noqa: BLE001 - "not currently recording": the end got there
                # cudaStreamEndCapture ran (or the capture never began): nothing
                # points at the graph, and its own reset releases the pool.
                keep = False
            else:
                done.append(f"ended the allocator's routing to pool {pool}")
                if release is not None:
                    try:
                        release(t.device, pool)
                        done.append(f"released pool {pool}")
                    except Exception as e:  # noqa: BLE001
                        left.append(f"pool {pool} not released: {e}")
        elif pool is not None:
            left.append(f"pool {pool}: this PyTorch has no _cuda_endAllocateToPool")
        if keep:
            _KEPT.append(t.graph)
    return devices


def generator_stuck(torch: Any, device: int) -> Optional[str]:
    """The error of a draw from the device's default generator (its state
    saved and put back), or None when it draws."""
    gens = getattr(torch.cuda, "default_generators", ())
    if device >= len(gens):
        return None
    gen = gens[device]
    state = gen.get_state()
    try:
        torch.empty(4, device=f"cuda:{device}").uniform_(generator=gen)
        return None
    except RuntimeError as e:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    finally:
        gen.set_state(state)


def repair_generator(torch: Any, device: int) -> None:
    """A capture of one tiny kernel that succeeds: capture_begin's prologue
    and capture_end's epilogue on the device's default generator state take
    it out of capture mode."""
    with torch.cuda.device(device):
        s = torch.cuda.Stream(device)
        t = torch.zeros(1, device=f"cuda:{device}")
        s.wait_stream(torch.cuda.current_stream(device))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            g.capture_begin(capture_error_mode="relaxed")
            try:
                t.add_(1)
            finally:
                g.capture_end()
        del g
        torch.cuda.current_stream(device).wait_stream(s)


def end_open_streams(driver: Driver, handles: List[int], done: List[str],
                     left: List[str]) -> None:
    """Streams the harness made that still capture: their captures ended."""
    if not driver.available:
        return
    for h in handles:
        try:
            if driver.capture_status(h) != 0:
                driver.end_capture(h)
                done.append(f"ended the capture left open on the harness's stream {h:#x}")
        except RuntimeError as e:
            left.append(f"the harness's stream {h:#x} still captures: {e}")


def harness_threads() -> List[str]:
    return [t.name for t in threading.enumerate()
            if t.name.startswith(THREAD_PREFIX) and t.is_alive()]


def put_back(torch: Any, driver: Driver, snap: Snapshot, done: List[str], left: List[str],
             rng: bool = True) -> None:
    """The snapshot's device, streams, capture mode, CuPy stream and (with
    ``rng``) generator states, each put back where it differs."""
    if driver.available and snap.mode is not None:
        try:
            now = driver.exchange_mode(snap.mode)
            if now != snap.mode:
                done.append(f"thread capture mode {now} -> {snap.mode}")
        except RuntimeError as e:
            left.append(f"thread capture mode: {e}")
    for d, s in snap.streams.items():
        try:
            cur = torch.cuda.current_stream(d)
            if cur != s:
                torch.cuda.set_stream(s)
                done.append(f"current stream of cuda:{d}")
        except Exception as e:  # noqa: BLE001
            left.append(f"current stream of cuda:{d}: {e}")
    if snap.device is not None and torch.cuda.current_device() != snap.device:
        torch.cuda.set_device(snap.device)
        done.append(f"current device -> {snap.device}")
    if snap.cupy_stream is not None:
        cupy = sys.modules.get("cupy")
        try:
            if cupy is not None and cupy.cuda.get_current_stream() != snap.cupy_stream:
                snap.cupy_stream.use()
                done.append("CuPy's current stream")
        except Exception as e:  # noqa: BLE001
            left.append(f"CuPy's current stream: {e}")
    if rng:
        gens = getattr(torch.cuda, "default_generators", ())
        for d, state in snap.rng.items():
            try:
                if not torch.equal(gens[d].get_state(), state):
                    gens[d].set_state(state)
                    done.append(f"seed and offset of cuda:{d}'s default generator")
            except Exception as e:  # noqa: BLE001
                left.append(f"cuda:{d}'s default generator state: {e}")


def after_case(torch: Any, driver: Driver, snap: Snapshot, watch: Watch,
               own_streams: List[int], threads_before: List[str]) -> Tuple[List[str], List[str]]:
    """Everything a case may have left, restored; returns (what was
    restored, what could not be). Safe to call after a passing case (then
    both lists are normally empty)."""
    done: List[str] = []
    left: List[str] = []
    # The current stream first: ending a capture or a repair capture needs it.
    put_back(torch, driver, snap, done, left, rng=False)
    end_open_streams(driver, own_streams, done, left)
    stuck_devices = end_failed_captures(torch, driver, watch.tracked, done, left)
    for d in stuck_devices:
        try:
            said = generator_stuck(torch, d)
        except Exception as e:  # noqa: BLE001
            said = str(e)
        if said is None:
            continue
        try:
            repair_generator(torch, d)
        except Exception as e:  # noqa: BLE001
            left.append(f"cuda:{d}'s default generator stays in capture mode ({said}); the "
                        f"repair capture failed: {e}")
            continue
        again = generator_stuck(torch, d)
        if again is None:
            done.append(f"cuda:{d}'s default generator out of capture mode (it said: {said})")
        else:
            left.append(f"cuda:{d}'s default generator stays in capture mode: {again}")
    threads = [t for t in harness_threads() if t not in threads_before]
    if threads:
        left.append(f"harness thread(s) still running: {', '.join(threads)}")
    UNCLEAN.extend(left)
    return done, left
