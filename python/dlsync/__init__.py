# SPDX-License-Identifier: Apache-2.0
"""dlsync for Python: capture-aware ordering of GPU work between frameworks.

A thin layer over libdlsync; no framework is needed to import it. The library
is loaded with ctypes; the calls made at every exchange go through
``dlsync._native``, a compiled module on the stable ABI, when it is there
(the wheel has it) and ``DLSYNC_NO_NATIVE`` is not set, and through ctypes
otherwise (:func:`_native_active` says which).
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
import functools
import importlib
import itertools
import os
import sys
import threading
from typing import Any, Iterator, List, NamedTuple, Optional

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
_dlpack_stream = _fn(
    "dlsync_dlpack_stream", ctypes.c_int, _P(_Lane), _P(ctypes.c_bool), _vp, ctypes.c_int64,
    _P(_Lane)
)


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


def _stream_handle_py(stream: Any) -> int:
    """The CUstream handle of a stream object or integer.

    Accepts ints, objects with ``__cuda_stream__`` (returning ``(version,
    handle)``), ``torch.cuda.Stream`` (``cuda_stream``), CuPy streams
    (``ptr``) and objects with a ``handle`` attribute. ``None`` is the legacy
    default stream."""
    if stream is None:
        return LEGACY
    if isinstance(stream, int):
        return _checked_handle(stream, "the stream")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        if isinstance(value, tuple):
            value = value[1] if len(value) == 2 else None
        return _checked_handle(value, f"{type(stream).__name__}.__cuda_stream__()")
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            return _checked_handle(value, f"{type(stream).__name__}.{attr}")
    raise TypeError(f"cannot find a CUDA stream handle in {type(stream).__name__}")


# The public names are rebound to dlsync._native's functions at the end of
# this module when the compiled binding is in use (same checks, same errors).
stream_handle = _stream_handle_py

_HANDLE_LIMIT = 1 << (8 * ctypes.sizeof(ctypes.c_void_p))


def _checked_handle(value: Any, what: str) -> int:
    """A stream handle as ctypes will pass it: an int (not a bool, not a
    float: ctypes would truncate those), 0 <= value < 2**64 (an unsigned
    pointer; ctypes would wrap the rest). TypeError or ValueError naming
    the value otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{what} must be an int stream handle (CUstream / cudaStream_t), "
            f"not {type(value).__name__} {value!r}"
        )
    if not 0 <= value < _HANDLE_LIMIT:
        raise ValueError(
            f"{what} is {value}: a stream handle is an unsigned pointer, "
            f"0 <= handle < 2**{8 * ctypes.sizeof(ctypes.c_void_p)} (0 and 1: the legacy "
            "default stream, 2: the per-thread default stream)"
        )
    return value


def _dlpack_value(stream: Any) -> int:
    """The int a ``__dlpack__(stream=...)`` value stands for (None: 1, the
    legacy default stream, as DLPack says for CUDA); TypeError / ValueError
    before ctypes sees it. The DLPack rules (-1, 0, 1, 2) are the library's:
    see :func:`_dlpack_lane`."""
    if stream is None:
        return LEGACY
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError(
            f"__dlpack__(stream=...) takes an int (-1, 1, 2 or a stream handle), "
            f"not {type(stream).__name__} {stream!r}"
        )
    if not -(1 << 63) <= stream < (1 << 63):
        raise ValueError(
            f"__dlpack__(stream={stream}): out of range (a DLPack stream value is -1, 1, 2 or a "
            "CUDA stream handle below 2**63)"
        )
    return stream


def _dlpack_lane_py(value: int, producer: Optional[int]) -> Optional[int]:
    """dlsync_dlpack_stream: the consumer's stream handle for a DLPack value,
    or None for -1 (no ordering). With producer None only the value is checked
    (no driver call); with a producer handle the library also applies its rule
    for 1 (the legacy stream cannot wait for a capturing producer)."""
    out = _Lane()
    ordered = ctypes.c_bool(False)
    if producer is None:
        _check(_dlpack_stream(ctypes.byref(out), ctypes.byref(ordered), None, value, None))
    else:
        p = _lane(producer)
        _check(_dlpack_stream(ctypes.byref(out), ctypes.byref(ordered), _context(), value,
                              ctypes.byref(p)))
    if not ordered.value:
        return None
    return out.stream or 0


def _lane(stream: Any) -> _Lane:
    return _Lane(_LANE_STREAM, stream_handle(stream), None, None, 0, 0)


def _capture_state_py(stream: Any) -> str:
    """'eager' or 'capturing' (the driver asked now)."""
    lane = _lane(stream)
    st = _LaneState()
    _check(_lane_query(ctypes.byref(st), _context(), ctypes.byref(lane)))
    return "capturing" if st.kind == 1 else "eager"


_dlpack_lane = _dlpack_lane_py
capture_state = _capture_state_py

from . import _producers  # noqa: E402

# Ticks order wraps and exchanges: an exchange begun after a wrap was made
# covers that wrap's producer work too (see _Wrapped.__dlpack__).
_ticks = itertools.count()


def _begin_py(producer: int, consumer: int, flags: int) -> int:
    """dlsync_exchange_begin_flags on two stream handles (checked by
    stream_handle already): the exchange's handle."""
    p = _Lane(_LANE_STREAM, producer, None, None, 0, 0)
    c = _Lane(_LANE_STREAM, consumer, None, None, 0, 0)
    out = _vp()
    _check(_exchange_begin(ctypes.byref(out), _context(), ctypes.byref(p), ctypes.byref(c), flags))
    return out.value


def _end_py(handle: int) -> None:
    _check(_exchange_end(handle))


_begin, _end = _begin_py, _end_py


class _StreamLane(NamedTuple):
    stream: int


class _Exchange:
    """One exchange between two streams, ended by :meth:`end` (wrap, scope,
    and dlsync.exchange for tensor and list producers)."""

    __slots__ = ("_handle", "_streams", "began")

    def __init__(self, producer: Any, consumer: Any, flags: int = 0):
        p, c = stream_handle(producer), stream_handle(consumer)
        self.began = next(_ticks)
        self._handle = _begin(p, c, flags)
        self._streams = (p, c)

    @property
    def _lanes(self):
        """The (producer, consumer) lanes, read as ``_lanes[i].stream``."""
        return (_StreamLane(self._streams[0]), _StreamLane(self._streams[1]))

    def end(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            _end(handle)


# Many producers, one consumer: one exchange per distinct producer stream.
# Switching to the C dlsync_exchange_begin_many is this one line.
_begin_many = functools.partial(_producers.ExchangeEach, lambda p, c, f: _Exchange(p, c, f))


def _producer_handle(producer: Any) -> int:
    """A stream, or a tensor / array whose stream dlsync can find."""
    if producer is None or isinstance(producer, int) or not hasattr(producer, "__dlpack__"):
        return stream_handle(producer)
    device_type, device_id = producer.__dlpack_device__()
    found = _producers.find(producer, int(device_type), int(device_id))
    if found.stream is None:
        raise Error(
            "DLSYNC_ERROR_INVALID_ARGUMENT",
            f"dlsync.exchange: {type(producer).__name__} exposes no stream to order after; "
            "hand it to the consumer as dlsync.wrap(x) (its __dlpack__ is then given the "
            "consumer's stream) or name its stream",
        )
    return found.stream


def _exchange_python(producer: Any, consumer: Any, flags: int):
    """The exchanges of dlsync.exchange made in Python: for a list or tuple of
    producers and for tensors (dlsync._native hands those here), and for
    everything on the ctypes path. An object with ``end()``."""
    if isinstance(producer, (list, tuple)):
        return _begin_many([_producer_handle(p) for p in producer], stream_handle(consumer), flags)
    return _Exchange(_producer_handle(producer), consumer, flags)


@contextlib.contextmanager
def _exchange_py(producer: Any, consumer: Any, capture_stable: bool = False) -> Iterator[None]:
    """dlsync.exchange on the ctypes path."""
    ex = _exchange_python(producer, consumer, CAPTURE_STABLE if capture_stable else 0)
    try:
        yield
    finally:
        ex.end()


_exchange_impl = _exchange_py


def exchange(producer: Any, consumer: Any, capture_stable: bool = False):
    """Orders ``consumer`` after ``producer`` on entry, and the producer's
    later work after the consumer's work inside the block on exit. Under
    stream capture an eager consumer joins the producer's capture and is
    joined back on exit.

    ``producer`` is a stream, a tensor or array whose stream dlsync can find
    (as :func:`wrap` does), or a list or tuple of those: the consumer is then
    ordered after each distinct producer stream once.

    ``capture_stable=True`` (DLSYNC_EXCHANGE_CAPTURE_STABLE) promises that no
    capture begins or ends on either stream inside the block, so the exit
    asks the driver nothing; a broken promise costs a capture (exchange.h).

    A context manager: dlsync._native's ``Exchange`` object (its
    ``__enter__`` begins, its ``__exit__`` ends) where the compiled binding
    is in use, a :func:`contextlib.contextmanager` otherwise."""
    return _exchange_impl(producer, consumer, capture_stable)


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


def _export_no_sync(obj: Any, device_id: int, kwargs: dict):
    """``obj.__dlpack__(stream=-1)`` with the producer's device current:
    PyTorch refuses to export a tensor of another device than the current
    one, and consumers (JAX) may have changed it."""
    if type(obj).__module__.partition(".")[0] == "torch":
        import torch

        if torch.cuda.current_device() != device_id:
            with torch.cuda.device(device_id):
                return obj.__dlpack__(stream=-1, **kwargs)
    return obj.__dlpack__(stream=-1, **kwargs)


class _Wrapped:
    """What :func:`wrap` returns: a DLPack producer that orders the
    consumer's stream after the real producer's, the capture-aware way."""

    def __init__(self, obj: Any, producer: Any):
        self._obj = obj
        self._producer = producer
        self._born = next(_ticks)

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
        # The DLPack value rules are the library's (dlsync_dlpack_stream):
        # checked first without the driver, then against the producer.
        value = _dlpack_value(stream)
        consumer = _dlpack_lane(value, None)
        found = _producers.find(self._obj, _KDLCUDA, int(device_id), self._producer)
        if consumer is None:  # the consumer asks for no ordering
            if found.no_sync_export:
                return self._obj.__dlpack__(stream=-1, **kwargs)
            # A producer that exposes no stream (JAX) is never handed -1 (JAX
            # 0.11 answers it with CUDA_ERROR_INVALID_HANDLE): it exports on its
            # own terms (no stream given). Refused while an imported
            # framework's current stream captures, where its own sync would
            # break the capture; no other driver call (the consumer asked for
            # no ordering).
            self._refuse_in_capture([])
            return self._obj.__dlpack__(**kwargs)
        if not found.no_sync_export:
            return self._export_to(consumer, found.stream, kwargs)
        producer = found.stream
        stack = _scopes()
        if not stack and capture_state(producer) == "capturing":
            raise Error(
                _ERROR_CAPTURE_ORDER_NAME,
                "the producer's stream is capturing: use dlsync.wrap inside "
                "`with dlsync.scope():` so that the consumer is joined back "
                "into the capture before it ends",
            )
        # With the producer, the library's rule for 1 (the legacy stream cannot
        # wait for a capturing producer); any other value reads the same
        # without it (the answer above, no driver call). Outside a scope the
        # producer was just found eager, which the rule accepts: not asked again.
        if value == LEGACY and stack:
            consumer = _dlpack_lane(value, producer)
        if stack and self._covered(stack[-1], producer, consumer):
            pass  # an exchange begun after this wrap was made already orders its work
        elif stack:
            stack[-1].append(_Exchange(producer, consumer))
        else:
            ex = _Exchange(producer, consumer)
            ex.end()  # eager, no scope: the consumer is ordered; nothing to join
        # The producer must not synchronise on its own: dlsync did.
        return _export_no_sync(self._obj, int(device_id), kwargs)

    def _covered(self, mine: List[_Exchange], producer: int, consumer: int) -> bool:
        """Whether this scope already has an exchange from ``producer`` to
        ``consumer`` begun after this wrap was made, and so after the work
        that produced it: wraps made together share one exchange."""
        return any(ex.began > self._born and ex._lanes[0].stream == producer and
                   ex._lanes[1].stream == consumer for ex in mine)

    def _refuse_in_capture(self, streams: List[Any]) -> None:
        """dlsync.Error (DLSYNC_ERROR_CAPTURE_ORDER) when any of ``streams``
        ((what, handle) pairs) or an imported framework's current stream is
        capturing: a producer that exposes no stream would break that
        capture."""
        streams = list(streams) + [("the current PyTorch stream", t)
                                   for t in _producers.capturing_framework_streams()]
        for what, s in streams:
            if capture_state(s) == "capturing":
                raise Error(_ERROR_CAPTURE_ORDER_NAME,
                            _producers.no_stream_in_capture_message(type(self._obj), s, what))

    def _export_to(self, consumer: int, producer: Optional[int], kwargs: dict):
        """A producer that exposes no stream (JAX): its own __dlpack__ is
        handed the consumer's stream, never -1. Refused, before the producer
        is touched, while the consumer (or an imported framework's current
        stream) is capturing: the producer would break that capture."""
        streams = [("the consumer's stream", consumer)]
        if producer is not None:
            streams.append(("the producer= stream", producer))
        self._refuse_in_capture(streams)
        if producer is not None:  # producer= names another stream too: order it first
            _Exchange(producer, consumer).end()
        return self._obj.__dlpack__(stream=consumer, **kwargs)


def wrap(obj: Any, producer: Any = None) -> _Wrapped:
    """A DLPack producer for ``from_dlpack`` consumers that orders the
    producer's stream before the stream the consumer asks for,
    capture-aware, and asks the real producer for its capsule without a
    sync of its own.

    The producer's stream is ``producer=``, else its type's
    ``__dlpack_c_exchange_api__``, its ``__cuda_stream__``, or PyTorch's /
    CuPy's current stream (dlsync/_producers.py). A producer that exposes
    none (JAX) is handed the consumer's stream through its own
    ``__dlpack__``; while a capture is on, that is refused with
    :class:`Error` (DLSYNC_ERROR_CAPTURE_ORDER) before the producer is
    touched. Inside a :func:`scope`, wraps made before the first of them is
    exported share one exchange per (producer, consumer) stream pair."""
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


# ---- the compiled binding: dlsync._native, when it is there ----

_NATIVE_ABI = 1  # the _init contract of _native.c (DLSYNC_PY_ABI)
_native: Any = None
_native_error: Optional[str] = None  # why the ctypes path is in use


def _optional_getattr_address() -> Optional[int]:
    """PyObject_GetOptionalAttr (3.13 on) or _PyObject_LookupAttr (3.7 to
    3.12), a getattr that builds no AttributeError for a missing attribute;
    None where this interpreter does not export it (then the module uses
    PyObject_GetAttr)."""
    name = "PyObject_GetOptionalAttr" if sys.version_info >= (3, 13) else "_PyObject_LookupAttr"
    try:
        return ctypes.cast(getattr(ctypes.pythonapi, name), _vp).value
    except (AttributeError, ValueError, OSError):
        return None


def _load_native():
    """dlsync._native initialised with the library loaded above, or None and
    the reason. Never an error: the ctypes code is the fallback."""
    if os.environ.get("DLSYNC_NO_NATIVE", "") not in ("", "0"):
        return None, "DLSYNC_NO_NATIVE is set"
    try:  # not `from . import _native`: that would answer with the global below
        native = importlib.import_module(__name__ + "._native")
    except ImportError as e:
        return None, f"dlsync._native could not be imported: {e}"
    try:
        abi = getattr(native, "ABI", None)
        if abi != _NATIVE_ABI:
            raise ImportError(f"it is of ABI {abi}, this dlsync needs {_NATIVE_ABI} (a stale build?)")
        symbols = {name: ctypes.cast(getattr(_lib, name), _vp).value for name in native.SYMBOLS}
        native._init(symbols, Error, _exchange_python, _optional_getattr_address())
    except Exception as e:  # noqa: BLE001 - any failure here means: use ctypes
        return None, f"dlsync._native could not be initialised: {type(e).__name__}: {e}"
    return native, None


def _native_active() -> bool:
    """Whether the calls of dlsync go through the compiled dlsync._native
    (True) or through ctypes (False; ``dlsync._native_error`` says why)."""
    return _native is not None


_stream_from_api_py = _producers._stream_from_api
_native, _native_error = _load_native()
if _native is not None:
    stream_handle = _native.stream_handle  # noqa: F811 - same checks and messages
    capture_state = _native.capture_state  # noqa: F811
    _dlpack_lane = _native.dlpack_stream
    _begin, _end = _native.begin, _native.end
    _exchange_impl = _native.Exchange
    # The producer's current_work_stream (DLPack exchange API), asked as
    # _producers does through a PyDLL handle: same call, same errors.
    _producers._stream_from_api = _native.env_stream
