# SPDX-License-Identifier: Apache-2.0
"""dlsync.exchange, and the exchange objects wrap and scope keep.

``_Exchange`` is one library exchange (one handle) between a producer stream
and a consumer stream; ``_Many`` the exchange of several producers with one
consumer (dlsync_exchange_begin_many: one handle per up to 1024 distinct
producer streams). Both are ended by ``end()``; ``end_all`` ends a list of
them, every one whatever an earlier end raised."""

from __future__ import annotations

import ctypes
import itertools
from typing import Any, Callable, List, Literal, NamedTuple, Optional, Sequence, Tuple

from . import _producers
from ._backend import active as _b
from ._ctypes_impl import CAPTURE_STABLE, KEEP_EDGE_DATA, LEGACY, MANY_MAX
from ._errors import ALREADY_ENTERED, EXCHANGE_SIGNATURE, EXIT_WITHOUT_ENTER, INVALID_ARGUMENT
from ._errors import Error
from ._interface import Ender, ExchangeContext

# Ticks order wraps and exchanges: an exchange begun after a wrap was made
# covers that wrap's producer work too (see dlsync._scope).
ticks = itertools.count()


def end_all(exchanges: Sequence[Any]) -> None:
    """Ends each of ``exchanges`` (objects with ``end()``), newest first, as
    contextlib.ExitStack runs its exits: whatever one end raises
    (BaseException included: KeyboardInterrupt, a TypeError), the others
    still end; then the first exception raised is raised again."""
    first: Optional[BaseException] = None
    for ex in reversed(exchanges):
        try:
            ex.end()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            if first is None:
                first = e
    if first is not None:
        raise first


class _StreamLane(NamedTuple):
    stream: int


class _Exchange:
    """One exchange between two streams, ended by :meth:`end` (wrap, scope,
    and dlsync.exchange for tensor producers)."""

    __slots__ = ("_handle", "_streams", "began")

    def __init__(self, producer: Any, consumer: Any, flags: int = 0,
                 into: Optional[List[Any]] = None):
        """Begins the exchange. ``into`` (a scope's list) gets it before the
        library is called, and the library writes the handle into it (begin's
        ``out``), so that an exception raised as the begin returns
        (KeyboardInterrupt) leaves it where the scope ends it; without
        ``into`` such an exchange is ended before the exception goes on."""
        p, c = _b.stream_handle(producer), _b.stream_handle(consumer)
        self.began = next(ticks)
        self._handle = ctypes.c_void_p()
        self._streams = (p, c)
        if into is not None:
            into.append(self)
        try:
            _b.begin(p, c, flags, self._handle)
        except BaseException:
            if into is None:
                _end_quietly(self)
            raise

    @property
    def _lanes(self) -> Tuple[_StreamLane, _StreamLane]:
        """The (producer, consumer) lanes, read as ``_lanes[i].stream``."""
        return (_StreamLane(self._streams[0]), _StreamLane(self._streams[1]))

    def end(self) -> None:
        handle, self._handle.value = self._handle.value, None
        if handle:
            _b.end(handle)


def _end_quietly(ex: Any) -> None:
    """Ends ``ex`` while another exception is on its way (that one is raised)."""
    try:
        ex.end()
    except BaseException:  # noqa: BLE001 - the exception being handled is the one to raise
        pass


class _Many:
    """Many producers, one consumer: the consumer ordered after each distinct
    producer stream once, with dlsync_exchange_begin_many (one handle for up
    to DLSYNC_EXCHANGE_MANY_MAX of them; none for an empty list). If a begin
    fails, the handles already begun are ended before its error is raised;
    :meth:`end` ends them all (newest first) and raises the first error."""

    __slots__ = ("_handles",)

    def __init__(self, producers: Sequence[int], consumer: int, flags: int = 0):
        # Each handle is written by the library into its slot, listed before
        # the call: an exception raised as a begin returns leaves it here.
        self._handles: List[ctypes.c_void_p] = []
        streams = _producers.distinct(producers)
        try:
            for i in range(0, len(streams), MANY_MAX):
                chunk = streams[i:i + MANY_MAX]
                out = ctypes.c_void_p()
                self._handles.append(out)
                if len(chunk) == 1:
                    _b.begin(chunk[0], consumer, flags, out)
                else:
                    _b.begin_many(chunk, consumer, flags, out)
        except BaseException:
            _end_quietly(self)
            raise

    def __len__(self) -> int:
        return len(self._handles)

    def end(self) -> None:
        handles, self._handles = self._handles, []
        end_all([_Handle(h.value) for h in handles if h.value])


class _Handle:
    __slots__ = ("handle",)

    def __init__(self, handle: int):
        self.handle = handle

    def end(self) -> None:
        _b.end(self.handle)


def _producer_handle(producer: Any) -> int:
    """A stream, or a tensor / array whose stream dlsync can find."""
    if producer is None or isinstance(producer, int) or not hasattr(producer, "__dlpack__"):
        return _b.stream_handle(producer)
    device_type, device_id = producer.__dlpack_device__()
    found = _producers.find(producer, int(device_type), int(device_id))
    if found.stream is None:
        raise Error(
            INVALID_ARGUMENT,
            f"dlsync.exchange: {type(producer).__name__} exposes no stream to order after; "
            "hand it to the consumer as dlsync.wrap(x) (its __dlpack__ is then given the "
            "consumer's stream) or name its stream",
        )
    return found.stream


def exchange_python(producer: Any, consumer: Any, flags: int) -> Ender:
    """The exchanges of dlsync.exchange made in Python: for a list or tuple of
    producers and for tensors (both backends' Exchange hand those here). An
    object with ``end()``."""
    if isinstance(producer, (list, tuple)):
        from . import _cai

        if not producer and not isinstance(producer, _cai.NothingToOrder):
            raise ValueError(
                f"dlsync.exchange: the producers are an empty {type(producer).__name__}: nothing "
                "to order the consumer after (enter no exchange for no producer)")
        handles = [_producer_handle(p) for p in producer]
        return _Many(handles, _b.stream_handle(consumer), flags)
    return _Exchange(_producer_handle(producer), consumer, flags)


# ---- graph compilers: one producer, many consumers ----


class _Fanout:
    """One producer, many consumers (dlsync_exchange_begin_fanout): each
    consumer stream ordered after the producer's work so far, one handle;
    :meth:`end` is the join (the producer's later work after each
    consumer's). ``into`` as in :class:`_Exchange`."""

    __slots__ = ("_handle",)

    def __init__(self, producer: int, consumers: Sequence[int], flags: int,
                 into: Optional[List[Any]] = None):
        self._handle = ctypes.c_void_p()
        if into is not None:
            into.append(self)
        try:
            _b.begin_fanout(producer, consumers, flags, self._handle)
        except BaseException:
            if into is None:
                _end_quietly(self)
            raise

    def end(self) -> None:
        handle, self._handle.value = self._handle.value, None
        if handle:
            _b.end(handle)


def _consumer_handles(consumers: Sequence[Any]) -> List[int]:
    """The consumers' stream handles. A None among them is refused (an
    unset optional stream, most likely; the legacy stream is named
    dlsync.LEGACY); duplicates, an empty list and more than 1024 are the
    library's to refuse."""
    out = []
    for i, c in enumerate(consumers):
        if c is None:
            raise Error(INVALID_ARGUMENT,
                        f"dlsync.exchange: consumers[{i}] is None: name each consumer's stream "
                        "(the legacy default stream is dlsync.LEGACY); nothing was queued")
        out.append(_b.stream_handle(c))
    return out


class _Ordered:
    """dlsync.exchange's object for consumers= (a fan-out) and for
    keep_edge_data (a single consumer is a fan-out of one, which
    dlsync_exchange_begin_fanout makes dlsync_exchange_begin_flags; many
    producers, the Python exchange with the flags). ``begin(into)`` begins
    and appends what it began to ``into`` (objects with ``end()``). Entered
    once at a time, as the backend's Exchange."""

    __slots__ = ("_begin", "_entered", "_active")

    def __init__(self, begin: Callable[[List[Any]], None]):
        self._begin = begin
        self._entered: List[Any] = []
        self._active = False

    def __enter__(self) -> None:
        if self._active:
            raise RuntimeError(ALREADY_ENTERED)
        into: List[Any] = []
        try:
            self._begin(into)
        except BaseException:
            end_all_quietly(into)
            raise
        self._entered, self._active = into, True

    def __exit__(self, *exc: Any) -> Literal[False]:
        if not self._active:
            raise RuntimeError(EXIT_WITHOUT_ENTER)
        entered, self._entered, self._active = self._entered, [], False
        end_all(entered)
        return False

    def __del__(self) -> None:
        # Entered and never exited: ended as it goes, as the backends'
        # Exchange are (an error then is reported as unraisable).
        entered = getattr(self, "_entered", None)
        if entered:
            self._entered, self._active = [], False
            end_all(entered)


def end_all_quietly(exchanges: Sequence[Any]) -> None:
    """end_all while another exception is on its way (that one is raised)."""
    for ex in reversed(exchanges):
        _end_quietly(ex)


def order(first: Any, then: Any) -> None:
    """Orders the work ``then`` queues from now on after the work ``first``
    queued so far, one way (dlsync_order): no join back. ``first`` is a
    stream or a tensor whose stream dlsync can find, ``then`` a stream. The
    one-way order an eager producer into a capture needs (a conditional
    body's too, declared with :func:`dlsync.conditional_node`: the wait
    goes into the parent): an exchange's exit there raises
    DLSYNC_ERROR_CAPTURE_ORDER, for an eager stream cannot wait for a graph
    not launched yet. Errors: :class:`Error` with the library's status
    (nothing queued)."""
    if first is not None and not isinstance(first, int) and hasattr(first, "__dlpack__"):
        first = _producer_handle(first)
    _b.order(first, then)


# ---- end graph compilers ----


_MISSING: Any = object()  # exchange(producer, consumers=[...]) names no consumer


def exchange(producer: Any, consumer: Any = _MISSING, capture_stable: bool = False, *,
             consumers: Optional[Sequence[object]] = None,
             keep_edge_data: bool = False) -> ExchangeContext:
    """Orders ``consumer`` after ``producer`` on entry, and the producer's
    later work after the consumer's work inside the block on exit. Under
    stream capture an eager consumer joins the producer's capture and is
    joined back on exit.

    ``producer`` is a stream, a tensor or array whose stream dlsync can find
    (as :func:`wrap` does), or a list or tuple of those: the consumer is then
    ordered after each distinct producer stream once
    (dlsync_exchange_begin_many).

    ``capture_stable=True`` (DLSYNC_EXCHANGE_CAPTURE_STABLE) promises that no
    capture begins or ends on either stream inside the block, so the exit
    asks the driver nothing; a broken promise costs a capture (exchange.h).

    A context manager (the backend's ``Exchange``: its ``__enter__`` begins,
    its ``__exit__`` ends), entered once at a time; entering it while it is
    entered, or exiting it when it is not, is RuntimeError.

    A producer that exposes only ``__cuda_array_interface__`` is ordered
    after the stream its dict names (none: nothing to order); see
    dlsync/_cai.py.

    ``consumers=[s1, s2, ...]`` (instead of ``consumer``): one producer,
    many consumers, and the join back on exit, as a graph compiler forks and
    joins (dlsync_exchange_begin_fanout): eager streams get one event
    recorded on the producer and one wait per consumer; consumers in the
    producer's capture get edges only; an eager consumer joins a capturing
    producer's capture. The producer is one stream or tensor. A None
    consumer, a consumer given twice or that is the producer, an empty list
    and more than 1024 raise :class:`Error` (DLSYNC_ERROR_INVALID_ARGUMENT)
    with nothing queued.

    ``keep_edge_data=True`` (DLSYNC_EXCHANGE_KEEP_EDGE_DATA): where both
    streams are in one capture, the consumer's first node depends on the
    producer's last nodes through edges of the type the producer's stream
    would give (a programmatic, PDL, edge stays one); only for a consumer
    whose first kernel waits for its grid dependency (exchange.h)."""
    if consumers is None and consumer is _MISSING:
        raise TypeError(f"{EXCHANGE_SIGNATURE}: consumer is missing")
    if consumers is not None and consumer is not _MISSING:
        raise TypeError("dlsync.exchange: give consumer or consumers=, not both")
    if consumers is not None and not isinstance(consumers, (list, tuple)):
        raise TypeError("dlsync.exchange: consumers= is a list or tuple of streams, not "
                        f"{type(consumers).__name__}")
    if producer is not None and not isinstance(producer, int):
        from . import _cai

        producer = _cai.for_exchange(producer)
    if consumers is None and not keep_edge_data:
        return _b.Exchange(producer, consumer, capture_stable)
    flags = (CAPTURE_STABLE if capture_stable else 0) | (KEEP_EDGE_DATA if keep_edge_data else 0)
    if consumers is None:  # keep_edge_data, one consumer
        if isinstance(producer, (list, tuple)):  # many producers: the Python exchange
            many, one = producer, consumer
            return _Ordered(lambda into: into.append(exchange_python(many, one, flags)))
        consumers = [LEGACY if consumer is None else consumer]  # None: the legacy stream
    if isinstance(producer, (list, tuple)):
        if len(producer) > 1:
            raise Error(INVALID_ARGUMENT,
                        "dlsync.exchange: many producers with consumers=: order each consumer "
                        "after the producers (dlsync.exchange(producers, consumer)) or fan out "
                        "from one producer; nothing was queued")
        if not producer:
            from . import _cai

            if not isinstance(producer, _cai.NothingToOrder):
                raise ValueError("dlsync.exchange: the producer is an empty "
                                 f"{type(producer).__name__}: nothing to order the consumers "
                                 "after")
            return _Ordered(lambda into: None)  # a CAI producer naming no stream
        producer = producer[0]
    fan_from, fan_to = producer, list(consumers)

    def fanout(into: List[Any]) -> None:
        _Fanout(_producer_handle(fan_from), _consumer_handles(fan_to), flags, into)

    return _Ordered(fanout)


__all__ = ["exchange", "order", "CAPTURE_STABLE", "KEEP_EDGE_DATA"]
