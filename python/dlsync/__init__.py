"""dlsync for Python: capture-aware ordering of GPU work between frameworks.

A thin ctypes layer over libdlsync; no framework is needed to import it.
Streams may be given as integers (CUstream / cudaStream_t handles), as
``torch.cuda.Stream``, CuPy streams, or any object with ``__cuda_stream__``.

    with dlsync.exchange(producer_stream, consumer_stream):
        ...  # consumer work, ordered after the producer's earlier work

    with torch.cuda.graph(g), dlsync.scope(), side_stream:
        y = producer(x)
        z = cupy.from_dlpack(dlsync.wrap(y))   # ordered, capture-aware
        ...
    # leaving the scope joins the consumer back into the capture

Errors raise :class:`dlsync.Error` carrying the library's status and message.
The shared library: ``DLSYNC_LIBRARY`` (a path) when set, and then only it, so
that an override never silently falls back; otherwise the libdlsync.so that
``pip install`` put inside this package; otherwise, run from a source tree,
the repository's build folders; last, the loader's path.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import threading
from typing import Any, Iterator, List, Optional

__all__ = [
    "Error",
    "version",
    "exchange",
    "wrap",
    "scope",
    "Fence",
    "stream_handle",
    "capture_state",
    "LEGACY",
    "PER_THREAD",
]

LEGACY = 1
PER_THREAD = 2

_LANE_STREAM = 1
_SUCCESS = 0
_ERROR_CAPTURE_ORDER_NAME = "DLSYNC_ERROR_CAPTURE_ORDER"
_KDLCUDA = 2


class Error(RuntimeError):
    """A dlsync call failed. ``status`` is the status name, ``message`` the
    library's words for what went wrong."""

    def __init__(self, status: str, message: str):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class _Lane(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("stream", ctypes.c_void_p),
        ("graph", ctypes.c_void_p),
        ("deps", ctypes.POINTER(ctypes.c_void_p)),
        ("ndeps", ctypes.c_size_t),
        ("capacity", ctypes.c_size_t),
    ]


class _LaneState(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("capture_id", ctypes.c_uint64),
        ("graph", ctypes.c_void_p),
    ]


def _candidates() -> List[str]:
    """Where libdlsync is looked for, in order (see the module docstring)."""
    env = os.environ.get("DLSYNC_LIBRARY")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    names = [os.path.join(here, "libdlsync.so")]
    root = os.path.dirname(os.path.dirname(here))
    if os.path.isfile(os.path.join(root, "include", "dlsync", "version.h")):
        for build in ("build/release", "build", "build/asan"):
            names.append(os.path.join(root, build, "libdlsync.so"))
    found = ctypes.util.find_library("dlsync")
    if found:
        names.append(found)
    return names


def _load() -> ctypes.CDLL:
    tried = []
    for name in _candidates():
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            tried.append(f"{name}: {e}")
    hint = (
        "DLSYNC_LIBRARY is set and could not be loaded"
        if os.environ.get("DLSYNC_LIBRARY")
        else "libdlsync.so not found; reinstall the package or set DLSYNC_LIBRARY to its path"
    )
    raise ImportError(hint + ". Tried:\n  " + "\n  ".join(tried))


_lib = _load()
_vp = ctypes.c_void_p
_P = ctypes.POINTER


def _fn(name: str, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_status_name = _fn("dlsync_status_name", ctypes.c_char_p, ctypes.c_int)
_last_error = _fn("dlsync_last_error", ctypes.c_char_p)
_version_string = _fn("dlsync_version_string", ctypes.c_char_p)
_context_default = _fn("dlsync_context_default", ctypes.c_int, _P(_vp))
# dlsync_exchange_flag
CAPTURE_STABLE = 1

_exchange_begin = _fn(
    "dlsync_exchange_begin_flags", ctypes.c_int, _P(_vp), _vp, _P(_Lane), _P(_Lane), ctypes.c_uint32
)
_exchange_end = _fn("dlsync_exchange_end", ctypes.c_int, _vp)
_lane_query = _fn("dlsync_lane_query", ctypes.c_int, _P(_LaneState), _vp, _P(_Lane))
_fence_signal = _fn("dlsync_fence_signal", ctypes.c_int, _P(_vp), _vp, _P(_Lane))
_fence_wait = _fn("dlsync_fence_wait", ctypes.c_int, _vp, _P(_Lane))
_fence_release = _fn("dlsync_fence_release", None, _vp)


def _check(status: int) -> None:
    if status != _SUCCESS:
        name = _status_name(status).decode()
        raise Error(name, _last_error().decode(errors="replace"))


def version() -> str:
    """The version of the loaded libdlsync."""
    return _version_string().decode()


def library_path() -> str:
    """The path of the libdlsync this module loaded."""
    return str(_lib._name)


try:  # written by CMake from include/dlsync/version.h when the wheel is built
    from ._version import __version__
except ImportError:  # a source tree: the same header, through the library built from it
    __version__ = version()


_ctx_lock = threading.Lock()
_ctx: Optional[int] = None


def _context() -> int:
    global _ctx
    with _ctx_lock:
        if _ctx is None:
            out = _vp()
            _check(_context_default(ctypes.byref(out)))
            _ctx = out.value
        return _ctx


def stream_handle(stream: Any) -> int:
    """The CUstream handle of a stream object or integer.

    Accepts ints, objects with ``__cuda_stream__`` (returning ``(version,
    handle)``), ``torch.cuda.Stream`` (``cuda_stream``), CuPy streams
    (``ptr``) and objects with a ``handle`` attribute. ``None`` is the legacy
    default stream."""
    if stream is None:
        return LEGACY
    if isinstance(stream, bool):
        raise TypeError("a stream, not a bool")
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple):
            return int(value[1])
        return int(value)
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            return int(value)
    raise TypeError(f"cannot find a CUDA stream handle in {type(stream).__name__}")


def _lane(stream: Any) -> _Lane:
    return _Lane(_LANE_STREAM, stream_handle(stream), None, None, 0, 0)


def capture_state(stream: Any) -> str:
    """'eager' or 'capturing' (the driver asked now)."""
    lane = _lane(stream)
    st = _LaneState()
    _check(_lane_query(ctypes.byref(st), _context(), ctypes.byref(lane)))
    return "capturing" if st.kind == 1 else "eager"


class _Exchange:
    __slots__ = ("_handle", "_lanes")

    def __init__(self, producer: Any, consumer: Any, flags: int = 0):
        p, c = _lane(producer), _lane(consumer)
        out = _vp()
        _check(_exchange_begin(ctypes.byref(out), _context(), ctypes.byref(p), ctypes.byref(c),
                               flags))
        self._handle = out.value
        self._lanes = (p, c)

    def end(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            _check(_exchange_end(handle))


@contextlib.contextmanager
def exchange(producer: Any, consumer: Any, capture_stable: bool = False) -> Iterator[None]:
    """Orders ``consumer`` after ``producer`` on entry, and the producer's
    later work after the consumer's work inside the block on exit. Under
    stream capture an eager consumer joins the producer's capture and is
    joined back on exit.

    ``capture_stable=True`` (DLSYNC_EXCHANGE_CAPTURE_STABLE) promises that no
    capture begins or ends on either stream inside the block, so the exit
    asks the driver nothing; a broken promise costs a capture (exchange.h)."""
    ex = _Exchange(producer, consumer, CAPTURE_STABLE if capture_stable else 0)
    try:
        yield
    finally:
        ex.end()


# ---- scopes: exchanges made by wrap() are ended when the scope exits ----

_tls = threading.local()


def _scopes() -> List[List[_Exchange]]:
    stack = getattr(_tls, "scopes", None)
    if stack is None:
        stack = _tls.scopes = []
    return stack


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Exchanges begun by :func:`wrap` inside this block are ended (the
    consumer joined back into its capture) when it exits, newest first."""
    stack = _scopes()
    mine: List[_Exchange] = []
    stack.append(mine)
    try:
        yield
    finally:
        stack.pop()
        first: Optional[BaseException] = None
        for ex in reversed(mine):
            try:
                ex.end()
            except Error as e:
                first = first or e
        if first is not None:
            raise first


def _current_stream_of(obj: Any, device_id: int) -> int:
    """The producer framework's current stream for ``obj``'s device."""
    module = type(obj).__module__.split(".")[0]
    if module == "torch":
        import torch

        return torch.cuda.current_stream(device_id).cuda_stream
    if module == "cupy":
        import cupy

        with cupy.cuda.Device(device_id):
            return cupy.cuda.get_current_stream().ptr
    raise Error(
        "DLSYNC_ERROR_INVALID_ARGUMENT",
        f"dlsync.wrap: no producer stream given and {type(obj).__name__} "
        "has no known current stream; pass producer=",
    )


@contextlib.contextmanager
def _on_device(obj: Any, device_id: int) -> Iterator[None]:
    """Makes the producer's device current while it exports: PyTorch refuses
    to export a tensor of another device than the current one, and consumers
    (JAX) may have changed it."""
    if type(obj).__module__.split(".")[0] == "torch":
        import torch

        with torch.cuda.device(device_id):
            yield
    else:
        yield


class _Wrapped:
    """What :func:`wrap` returns: a DLPack producer that orders the
    consumer's stream after the real producer's, the capture-aware way."""

    def __init__(self, obj: Any, producer: Any):
        self._obj = obj
        self._producer = producer

    def __dlpack_device__(self):
        return self._obj.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version=None, dl_device=None, copy=None):
        device_type, device_id = self._obj.__dlpack_device__()
        kwargs = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if int(device_type) != _KDLCUDA:
            return self._obj.__dlpack__(stream=stream, **kwargs)
        if stream is None:
            stream = LEGACY  # the DLPack meaning of None for CUDA
        consumer = stream_handle(stream)
        if consumer == -1:
            return self._obj.__dlpack__(stream=-1, **kwargs)
        if consumer == 0:
            raise Error(
                "DLSYNC_ERROR_INVALID_ARGUMENT",
                "stream=0 is not allowed for CUDA by the DLPack specification: "
                "pass 1 (legacy default stream), 2 (per-thread) or a stream handle",
            )
        producer = (
            stream_handle(self._producer)
            if self._producer is not None
            else _current_stream_of(self._obj, int(device_id))
        )
        stack = _scopes()
        if not stack and capture_state(producer) == "capturing":
            raise Error(
                _ERROR_CAPTURE_ORDER_NAME,
                "the producer's stream is capturing: use dlsync.wrap inside "
                "`with dlsync.scope():` so that the consumer is joined back "
                "into the capture before it ends",
            )
        if consumer in (LEGACY, PER_THREAD) and capture_state(producer) == "capturing":
            raise Error(
                "DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE",
                "the consumer asked for the default stream while the producer is "
                "capturing: run the consumer on a stream of its own (e.g. `with "
                "cupy.cuda.Stream():`) so that it can join the capture",
            )
        ex = _Exchange(producer, consumer)
        if stack:
            stack[-1].append(ex)
        else:
            ex.end()  # eager, no scope: the consumer is ordered; nothing to join
        # The producer must not synchronise on its own: dlsync did.
        with _on_device(self._obj, int(device_id)):
            return self._obj.__dlpack__(stream=-1, **kwargs)


def wrap(obj: Any, producer: Any = None) -> _Wrapped:
    """A DLPack producer for ``from_dlpack`` consumers that orders the
    producer's stream (by default its framework's current stream) before
    the stream the consumer asks for, capture-aware, and asks the real
    producer for its capsule without a sync of its own."""
    return _Wrapped(obj, producer)


class Fence:
    """A point in a stream's work that other streams can wait for, now or
    later (include/dlsync/fence.h)."""

    def __init__(self, stream: Any):
        lane = _lane(stream)
        out = _vp()
        _check(_fence_signal(ctypes.byref(out), _context(), ctypes.byref(lane)))
        self._handle = out.value

    def wait(self, stream: Any) -> None:
        if self._handle is None:
            raise Error("DLSYNC_ERROR_INVALID_ARGUMENT", "the fence was closed")
        lane = _lane(stream)
        _check(_fence_wait(self._handle, ctypes.byref(lane)))

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            _fence_release(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
