# SPDX-License-Identifier: Apache-2.0
"""The ctypes backend: every call of the binding through ctypes.

It is the fallback where dlsync._native cannot be used, and the part the
compiled backend shares (fence_signal, fence_wait and fence_release, the
library's version and path).
``CtypesBackend(lib)`` conforms to dlsync._interface.Backend."""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Dict, Literal, Optional, Sequence, Tuple

from . import _errors
from ._errors import Error
from ._interface import Ender, ExchangeContext, PythonExchange

LEGACY = 1
PER_THREAD = 2
CAPTURE_STABLE = 1  # DLSYNC_EXCHANGE_CAPTURE_STABLE
MANY_MAX = 1024  # DLSYNC_EXCHANGE_MANY_MAX
# ---- graph compilers: fan-out and conditional nodes ----
KEEP_EDGE_DATA = 2  # DLSYNC_EXCHANGE_KEEP_EDGE_DATA
CONDITIONAL_BODIES = 64  # DLSYNC_CONDITIONAL_BODIES
# ---- end graph compilers ----

_LANE_STREAM = 1
_LANE_CAPTURING = 1
_FENCE_IMPORTED = 3  # DLSYNC_FENCE_IMPORTED
_vp = ctypes.c_void_p
_P = ctypes.POINTER
_POINTER_BITS = 8 * ctypes.sizeof(_vp)
_HANDLE_LIMIT = 1 << _POINTER_BITS


class _Lane(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("stream", _vp),
        ("graph", _vp),
        ("deps", _P(_vp)),
        ("ndeps", ctypes.c_size_t),
        ("capacity", ctypes.c_size_t),
    ]


class _LaneState(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("capture_id", ctypes.c_uint64),
        ("graph", _vp),
    ]


# ---- stream handles (the same checks and words as _native.c) ----


def checked_handle(value: Any, what: str) -> int:
    """A stream handle as the library takes it: an int (not a bool, not a
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
            f"0 <= handle < 2**{_POINTER_BITS} (0 and 1: the legacy "
            "default stream, 2: the per-thread default stream)"
        )
    return value


def checked_graph_handle(value: Any, what: str, kind: str, none_ok: bool) -> Optional[int]:
    """A CUgraph / CUgraphExec handle as the library takes it: an int (not a
    bool), 0 <= value < 2**64; None (NULL) where ``none_ok``. TypeError or
    ValueError naming the value otherwise (_native.c: the same words)."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(_errors.not_a_handle(what, kind, value))
    if not 0 <= value < _HANDLE_LIMIT:
        raise ValueError(_errors.handle_out_of_range(what, kind, value, _POINTER_BITS))
    return value


def stream_handle(stream: Any) -> int:
    """The CUstream handle of a stream object or integer.

    Accepts ints, objects with ``__cuda_stream__`` (returning ``(version,
    handle)``), ``torch.cuda.Stream`` (``cuda_stream``), CuPy streams
    (``ptr``) and objects with a ``handle`` attribute. ``None`` is the legacy
    default stream."""
    if stream is None:
        return LEGACY
    if isinstance(stream, int):
        return checked_handle(stream, "the stream")
    proto = getattr(stream, "__cuda_stream__", None)
    if proto is not None:
        value = proto() if callable(proto) else proto
        what = f"{type(stream).__name__}.__cuda_stream__()"
        if isinstance(value, tuple):
            if len(value) != 2:
                raise TypeError(f"{what} must return (version, handle), not a {len(value)}-tuple "
                                f"{value!r}")
            value = value[1]
        return checked_handle(value, what)
    for attr in ("cuda_stream", "ptr", "handle"):
        value = getattr(stream, attr, None)
        if value is not None:
            return checked_handle(value, f"{type(stream).__name__}.{attr}")
    raise TypeError(f"cannot find a CUDA stream handle in {type(stream).__name__}")


def needs_python(producer: Any) -> bool:
    """Whether dlsync.exchange hands the producer to the Python exchange
    (dlsync._exchange): a list or tuple of producers, or a tensor or array
    (anything with ``__dlpack__`` that is not a stream handle)."""
    if isinstance(producer, (list, tuple)):
        return True
    if producer is None or isinstance(producer, int):
        return False
    return hasattr(producer, "__dlpack__")


def exchange_args(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Any, Any]:
    """(producer, consumer, capture_stable) of Exchange(...), with the
    TypeError _native.c raises for the same call."""
    names = ("producer", "consumer", "capture_stable")
    if len(args) > 3:
        raise TypeError(f"{_errors.EXCHANGE_SIGNATURE}: at most 3 arguments, {len(args)} given")
    values = list(args) + [None] * (3 - len(args))
    given = [True] * len(args) + [False] * (3 - len(args))
    for key, value in kwargs.items():
        if key not in names:
            raise TypeError(f"{_errors.EXCHANGE_SIGNATURE}: no argument named {key!r}")
        i = names.index(key)
        if given[i]:
            raise TypeError(f"{_errors.EXCHANGE_SIGNATURE}: {key} given twice")
        values[i], given[i] = value, True
    for i in (0, 1):
        if not given[i]:
            raise TypeError(f"{_errors.EXCHANGE_SIGNATURE}: {names[i]} is missing")
    return values[0], values[1], values[2] if given[2] else False


_IDLE, _BUSY, _ACTIVE = 0, 1, 2


class CtypesBackend:
    """Every call through ctypes (dlsync._interface.Backend)."""

    name = "ctypes"

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self._python_exchange: Optional[PythonExchange] = None  # set_python_exchange
        fn = self._fn
        self._status_name = fn("dlsync_status_name", ctypes.c_char_p, ctypes.c_int)
        self._last_error = fn("dlsync_last_error", ctypes.c_char_p)
        self._version_string = fn("dlsync_version_string", ctypes.c_char_p)
        self._context_default = fn("dlsync_context_default", ctypes.c_int, _P(_vp))
        self._begin = fn("dlsync_exchange_begin_flags", ctypes.c_int, _P(_vp), _vp, _P(_Lane),
                         _P(_Lane), ctypes.c_uint32)
        self._begin_many = fn("dlsync_exchange_begin_many", ctypes.c_int, _P(_vp), _vp,
                              _P(_Lane), ctypes.c_size_t, _P(_Lane), ctypes.c_uint32)
        self._end = fn("dlsync_exchange_end", ctypes.c_int, _vp)
        self._lane_query = fn("dlsync_lane_query", ctypes.c_int, _P(_LaneState), _vp, _P(_Lane))
        self._fence_signal = fn("dlsync_fence_signal", ctypes.c_int, _P(_vp), _vp, _P(_Lane))
        self._fence_wait = fn("dlsync_fence_wait", ctypes.c_int, _vp, _P(_Lane))
        self._fence_release = fn("dlsync_fence_release", None, _vp)
        # Other runtimes' events (include/dlsync/foreign.h).
        self._fence_import = fn("dlsync_fence_import", ctypes.c_int, _P(_vp), _vp, _vp,
                                ctypes.c_int, ctypes.c_uint64, ctypes.c_uint)
        self._fence_export_event = fn("dlsync_fence_export_event", ctypes.c_int, _P(_vp), _vp)
        self._fence_get_provenance = fn("dlsync_fence_get_provenance", ctypes.c_int,
                                        _P(ctypes.c_int), _vp)
        self._fence_get_kind = fn("dlsync_fence_get_kind", ctypes.c_int, _P(ctypes.c_int), _vp)
        self._graph_launch = fn("dlsync_graph_launch", ctypes.c_int, _vp, _vp, _vp, _P(_Lane))
        self._body_add = fn("dlsync_conditional_body_add", ctypes.c_int, _vp, _vp)
        self._body_remove = fn("dlsync_conditional_body_remove", ctypes.c_int, _vp, _vp)
        self._body_declared = fn("dlsync_conditional_body_is_declared", ctypes.c_int, _vp, _vp)
        # ---- graph compilers: fan-out and conditional nodes ----
        self._begin_fanout = fn("dlsync_exchange_begin_fanout", ctypes.c_int, _P(_vp), _vp,
                                _P(_Lane), _P(_Lane), ctypes.c_size_t, ctypes.c_uint32)
        self._order = fn("dlsync_order", ctypes.c_int, _vp, _P(_Lane), _P(_Lane))
        self._node_declare = fn("dlsync_conditional_node_declare", ctypes.c_int, _vp, _vp, _vp,
                                _P(_vp), ctypes.c_size_t)
        # ---- end graph compilers ----
        self._dlpack_stream = fn("dlsync_dlpack_stream", ctypes.c_int, _P(_Lane),
                                 _P(ctypes.c_bool), _vp, ctypes.c_int64, _P(_Lane))
        # With the GIL held (a PyDLL handle): the producer's current_work_stream
        # may be Python code, and an exception it sets is raised here.
        api = ctypes.PyDLL(lib._name, handle=lib._handle).dlsync_env_stream_from_exchange_api
        api.restype = ctypes.c_int
        api.argtypes = [_P(_vp), _vp, ctypes.c_int32, ctypes.c_int32]
        self._env_api = api
        self._ctx_lock = threading.Lock()
        self._ctx: Optional[int] = None
        self.stream_handle: Callable[[Any], int] = stream_handle
        self.Exchange: Callable[..., ExchangeContext] = self._exchange_type()
        self._bind_arrow()

    def set_python_exchange(self, fn: PythonExchange) -> None:
        """The exchange of list and tensor producers (dlsync._exchange's)."""
        self._python_exchange = fn

    def _python_begin(self, producer: Any, consumer: Any, flags: int) -> Ender:
        if self._python_exchange is None:
            raise RuntimeError("dlsync: no Python exchange was installed (dlsync/__init__.py "
                               "installs dlsync._exchange.exchange_python)")
        return self._python_exchange(producer, consumer, flags)

    def _fn(self, name: str, restype: Any, *argtypes: Any) -> Any:
        f = getattr(self.lib, name)
        f.restype = restype
        f.argtypes = list(argtypes)
        return f

    # ---- the library ----

    def version(self) -> str:
        return str(self._version_string().decode())

    def library_path(self) -> str:
        return str(self.lib._name)

    def error(self, status: int, prefix: str = "") -> Error:
        """dlsync.Error for a failed call: the status name and the last error."""
        return Error(self._status_name(status).decode(),
                     prefix + self._last_error().decode(errors="replace"))

    def _check(self, status: int) -> None:
        if status != _errors.SUCCESS:
            raise self.error(status)

    def context(self) -> int:
        with self._ctx_lock:
            if self._ctx is None:
                out = _vp()
                self._check(self._context_default(ctypes.byref(out)))
                self._ctx = int(out.value or 0)
            return self._ctx

    @staticmethod
    def _lane(handle: int) -> _Lane:
        return _Lane(_LANE_STREAM, handle, None, None, 0, 0)

    # ---- the interface ----

    def capture_state(self, stream: Any) -> str:
        """'eager' or 'capturing' (the driver asked now)."""
        lane = self._lane(stream_handle(stream))
        st = _LaneState()
        self._check(self._lane_query(ctypes.byref(st), self.context(), ctypes.byref(lane)))
        return "capturing" if st.kind == _LANE_CAPTURING else "eager"

    def capture_graph(self, stream: Any) -> Optional[int]:
        """The graph the stream's capture builds (a conditional body's for a
        capture into one), or None for an eager stream."""
        lane = self._lane(stream_handle(stream))
        st = _LaneState()
        self._check(self._lane_query(ctypes.byref(st), self.context(), ctypes.byref(lane)))
        return int(st.graph or 0) if st.kind == _LANE_CAPTURING else None

    def dlpack_stream(self, value: int, producer: Any) -> Optional[int]:
        """dlsync_dlpack_stream: the consumer's stream handle for a DLPack
        value, or None for -1 (no ordering). With producer None only the
        value is checked (no driver call)."""
        out = _Lane()
        ordered = ctypes.c_bool(False)
        if producer is None:
            status = self._dlpack_stream(ctypes.byref(out), ctypes.byref(ordered), None, value,
                                         None)
        else:
            p = self._lane(stream_handle(producer))
            status = self._dlpack_stream(ctypes.byref(out), ctypes.byref(ordered), self.context(),
                                         value, ctypes.byref(p))
        self._check(status)
        if not ordered.value:
            return None
        return int(out.stream or 0)

    def begin(self, producer: Any, consumer: Any, flags: int = 0,
              out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_flags on two streams: the exchange's handle,
        written by the library into ``out`` when given (dlsync._interface)."""
        p, c = self._lane(stream_handle(producer)), self._lane(stream_handle(consumer))
        if out is None:
            out = _vp()
        self._check(self._begin(ctypes.byref(out), self.context(), ctypes.byref(p),
                                ctypes.byref(c), flags))
        return int(out.value or 0)

    def begin_many(self, producers: Sequence[Any], consumer: Any, flags: int = 0,
                   out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_many: the consumer after each producer
        stream, one handle (written into ``out`` when given)."""
        if not isinstance(producers, (list, tuple)):
            raise TypeError(_errors.MANY_TAKES_A_LIST)
        lanes = (_Lane * max(len(producers), 1))()
        for i, p in enumerate(producers):
            lanes[i] = self._lane(stream_handle(p))
        c = self._lane(stream_handle(consumer))
        if out is None:
            out = _vp()
        self._check(self._begin_many(ctypes.byref(out), self.context(), lanes, len(producers),
                                     ctypes.byref(c), flags))
        return int(out.value or 0)

    def end(self, handle: int) -> None:
        """dlsync_exchange_end."""
        if isinstance(handle, bool) or not isinstance(handle, int):
            raise TypeError(_errors.END_TAKES_A_HANDLE)
        self._check(self._end(handle))

    def env_stream(self, api: int, device_type: int, device_id: int, cls: type) -> int:
        """dlsync_env_stream_from_exchange_api: the producer's current work
        stream (1, the legacy stream, for NULL)."""
        out = _vp()
        status = self._env_api(ctypes.byref(out), api, device_type, device_id)
        if status != _errors.SUCCESS:
            raise self.error(status, f"{cls.__name__}.__dlpack_c_exchange_api__: ")
        return int(out.value) if out.value is not None else LEGACY

    def fence_signal(self, stream: Any, out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_fence_signal: the fence (written into ``out`` when given)."""
        lane = self._lane(stream_handle(stream))
        if out is None:
            out = _vp()
        self._check(self._fence_signal(ctypes.byref(out), self.context(), ctypes.byref(lane)))
        return int(out.value or 0)

    def fence_wait(self, fence: int, stream: Any) -> None:
        lane = self._lane(stream_handle(stream))
        self._check(self._fence_wait(fence, ctypes.byref(lane)))

    def fence_release(self, fence: int) -> None:
        self._fence_release(fence)

    # ---- other runtimes' events (include/dlsync/foreign.h) ----

    def fence_import(self, event: int, provenance: int, capture_id: int, flags: int,
                     out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_fence_import of a CUevent handle: the fence (written into
        ``out`` when given). The handle and capture id are checked ints (a
        TypeError or ValueError naming them); provenance and flags go to the
        library as given, which refuses what it does not know."""
        e = checked_graph_handle(event, "the event", _errors.EVENT_KIND, False)
        if isinstance(capture_id, bool) or not isinstance(capture_id, int):
            raise TypeError(_errors.not_a_capture_id(capture_id))
        if not 0 <= capture_id < 1 << 64:
            raise ValueError(_errors.capture_id_out_of_range(capture_id))
        if out is None:
            out = _vp()
        self._check(self._fence_import(ctypes.byref(out), self.context(), e, provenance,
                                       capture_id, flags))
        return int(out.value or 0)

    def capture_id(self, stream: Any) -> Optional[int]:
        """The id of the stream's capture (cuStreamGetCaptureInfo's, as
        dlsync_lane_query reports it), or None for an eager stream."""
        lane = self._lane(stream_handle(stream))
        st = _LaneState()
        self._check(self._lane_query(ctypes.byref(st), self.context(), ctypes.byref(lane)))
        return int(st.capture_id) if st.kind == _LANE_CAPTURING else None

    def fence_export_event(self, fence: int) -> int:
        """dlsync_fence_export_event: the CUevent handle behind the fence."""
        out = _vp()
        self._check(self._fence_export_event(ctypes.byref(out), fence))
        return int(out.value or 0)

    def fence_provenance(self, fence: int) -> Optional[int]:
        """dlsync_fence_get_provenance of an imported fence; None for a fence
        dlsync signalled (dlsync_fence_get_kind says which it is)."""
        kind = ctypes.c_int()
        self._check(self._fence_get_kind(ctypes.byref(kind), fence))
        if kind.value != _FENCE_IMPORTED:
            return None
        prov = ctypes.c_int()
        self._check(self._fence_get_provenance(ctypes.byref(prov), fence))
        return int(prov.value)

    # ---- structured graphs (include/dlsync/graph.h, conditional.h) ----

    def graph_launch(self, graph: Optional[int], exec_: Optional[int], stream: Any) -> None:
        """dlsync_graph_launch(ctx, graph, exec, the stream's lane): graph
        and exec are int handles or None (NULL)."""
        g = checked_graph_handle(graph, "the graph", _errors.GRAPH_KIND, True)
        x = checked_graph_handle(exec_, "the exec", _errors.EXEC_KIND, True)
        lane = self._lane(stream_handle(stream))
        self._check(self._graph_launch(self.context(), g, x, ctypes.byref(lane)))

    def body_add(self, graph: int) -> None:
        """dlsync_conditional_body_add."""
        g = checked_graph_handle(graph, "the body", _errors.GRAPH_KIND, False)
        self._check(self._body_add(self.context(), g))

    def body_remove(self, graph: int) -> None:
        """dlsync_conditional_body_remove."""
        g = checked_graph_handle(graph, "the body", _errors.GRAPH_KIND, False)
        self._check(self._body_remove(self.context(), g))

    def body_declared(self, graph: int) -> bool:
        """dlsync_conditional_body_is_declared."""
        g = checked_graph_handle(graph, "the body", _errors.GRAPH_KIND, False)
        return bool(self._body_declared(self.context(), g))

    # ---- graph compilers: fan-out and conditional nodes ----

    def begin_fanout(self, producer: Any, consumers: Sequence[Any], flags: int = 0,
                     out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_fanout: each consumer stream after the
        producer's work, one handle (written into ``out`` when given)."""
        if not isinstance(consumers, (list, tuple)):
            raise TypeError(_errors.FANOUT_TAKES_A_LIST)
        p = self._lane(stream_handle(producer))
        lanes = (_Lane * max(len(consumers), 1))()
        for i, c in enumerate(consumers):
            lanes[i] = self._lane(stream_handle(c))
        if out is None:
            out = _vp()
        self._check(self._begin_fanout(ctypes.byref(out), self.context(), ctypes.byref(p),
                                       lanes, len(consumers), flags))
        return int(out.value or 0)

    def order(self, first: Any, then: Any) -> None:
        """dlsync_order on two streams: ``then``'s later work after
        ``first``'s work so far."""
        f, t = self._lane(stream_handle(first)), self._lane(stream_handle(then))
        self._check(self._order(self.context(), ctypes.byref(f), ctypes.byref(t)))

    def node_declare(self, parent: int, node: int, bodies: Sequence[int]) -> None:
        """dlsync_conditional_node_declare(ctx, parent, node, bodies)."""
        g = checked_graph_handle(parent, "the parent", _errors.GRAPH_KIND, False)
        n = checked_graph_handle(node, "the node", _errors.NODE_KIND, False)
        if not isinstance(bodies, (list, tuple)):
            raise TypeError(_errors.DECLARE_TAKES_A_LIST)
        array = (_vp * max(len(bodies), 1))()
        for i, b in enumerate(bodies):
            array[i] = checked_graph_handle(b, f"bodies[{i}]", _errors.GRAPH_KIND, False)
        self._check(self._node_declare(self.context(), g, n, array, len(bodies)))

    # ---- end graph compilers ----

    # ---- the Arrow C Device data interface (include/dlsync/arrow.h) ----

    def _bind_arrow(self) -> None:
        fn = self._fn
        self._arrow_sync_event = fn("dlsync_arrow_sync_event", ctypes.c_int, _vp, _vp, _vp,
                                    _P(_Lane))
        self._arrow_sync_release = fn("dlsync_arrow_sync_release", None, _vp)
        self._arrow_wait = fn("dlsync_arrow_wait", ctypes.c_int, _vp, _P(_Lane), _vp,
                              ctypes.c_int, ctypes.c_uint64)
        self._arrow_release = fn("dlsync_arrow_release", ctypes.c_int, _vp, _P(_Lane), _vp)

    def arrow_sync_event(self, array: int, sync: int, stream: Any) -> None:
        """dlsync_arrow_sync_event: array->sync_event set to &sync->event, an
        event marking the work queued so far on the stream."""
        lane = self._lane(stream_handle(stream))
        self._check(self._arrow_sync_event(array, sync, self.context(), ctypes.byref(lane)))

    def arrow_sync_release(self, sync: int) -> None:
        """dlsync_arrow_sync_release: the fence behind the event dropped."""
        self._arrow_sync_release(sync)

    def arrow_wait(self, array: int, stream: Any, provenance: int) -> None:
        """dlsync_arrow_wait: the stream's later work after the array's
        sync_event (recorded as ``provenance`` says)."""
        lane = self._lane(stream_handle(stream))
        self._check(self._arrow_wait(self.context(), ctypes.byref(lane), array, provenance, 0))

    def arrow_release(self, array: int, stream: Any) -> None:
        """dlsync_arrow_release: the array moved out, its release run after
        the work queued so far on the stream."""
        lane = self._lane(stream_handle(stream))
        self._check(self._arrow_release(self.context(), ctypes.byref(lane), array))

    def _exchange_type(self) -> Callable[..., ExchangeContext]:
        backend = self

        class Exchange:
            """The context manager of dlsync.exchange: __enter__ orders the
            consumer after the producer, __exit__ the producer's later work
            after the consumer's. Lists and tensors as producers are handed
            to the Python exchange of dlsync."""

            __slots__ = ("_producer", "_consumer", "_stable", "_python", "_handle", "_state")

            def __init__(self, *args: Any, **kwargs: Any):
                self._state = _IDLE
                self._python: Optional[Ender] = None
                # The handle, written by the library itself (begin's out), so
                # that an exception raised as begin returns leaves it here.
                self._handle = _vp()
                self._producer, self._consumer, self._stable = exchange_args(args, kwargs)

            def __enter__(self) -> None:
                if self._state != _IDLE:
                    raise RuntimeError(_errors.ALREADY_ENTERED)
                flags = CAPTURE_STABLE if self._stable else 0  # its truth at entry
                python = needs_python(self._producer)
                self._state = _BUSY
                try:
                    if python:
                        self._python = backend._python_begin(self._producer, self._consumer,
                                                             flags)
                    else:
                        backend.begin(self._producer, self._consumer, flags, self._handle)
                except BaseException:
                    self._state = _IDLE
                    if self._handle.value:  # begun, and an exception came as it returned
                        try:
                            self._finish()
                        except BaseException:  # noqa: BLE001 - the begin's is the one raised
                            pass
                    raise
                self._state = _ACTIVE

            def _finish(self) -> None:
                self._state = _BUSY
                python, handle = self._python, self._handle.value
                self._python, self._handle.value = None, None
                try:
                    if python is not None:
                        python.end()
                    elif handle:
                        backend.end(handle)
                finally:
                    self._state = _IDLE

            def __exit__(self, *exc: Any) -> Literal[False]:
                if self._state != _ACTIVE:
                    raise RuntimeError(_errors.EXIT_WITHOUT_ENTER)
                self._finish()
                return False

            def __del__(self) -> None:
                # Entered and never exited: ended as it goes (as _native.c's
                # dealloc does); an error then is reported as unraisable.
                if getattr(self, "_state", _IDLE) == _ACTIVE:
                    self._finish()

        Exchange.__module__ = "dlsync._ctypes_impl"
        return Exchange
