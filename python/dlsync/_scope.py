# SPDX-License-Identifier: Apache-2.0
"""dlsync.wrap and dlsync.scope: DLPack producers that order the consumer's
stream after theirs, and the block that ends the exchanges they begin."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Iterator, List, Optional, cast

from . import _exchange, _producers
from ._backend import active as _b
from ._ctypes_impl import LEGACY
from ._errors import CAPTURE_ORDER, Error

KDLCUDA = 2

# ---- scopes: exchanges made by wrap() are ended when the scope exits ----

_tls = threading.local()


def _scopes() -> List[List[Any]]:
    stack = getattr(_tls, "scopes", None)
    if stack is None:
        stack = _tls.scopes = []
    return stack


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """Exchanges begun by :func:`wrap` inside this block are ended (the
    consumer joined back into its capture) when it exits, newest first.

    Every one is ended whatever the block or an end raises (BaseException
    included: KeyboardInterrupt, a TypeError), as contextlib.ExitStack does;
    then the first exception an end raised is raised (its ``__context__`` the
    block's, if the block raised too), else the block's own."""
    stack = _scopes()
    mine: List[Any] = []
    stack.append(mine)
    try:
        yield
    finally:
        for i in range(len(stack) - 1, -1, -1):  # the last, unless left out of order
            if stack[i] is mine:
                del stack[i]
                break
        _exchange.end_all(mine)


def _dlpack_value(stream: Any) -> int:
    """The int a ``__dlpack__(stream=...)`` value stands for (None: 1, the
    legacy default stream, as DLPack says for CUDA); TypeError / ValueError
    before ctypes sees it. The DLPack rules (-1, 0, 1, 2) are the library's:
    see dlsync_dlpack_stream."""
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


def _export_no_sync(obj: Any, device_id: int, kwargs: Dict[str, Any]) -> Any:
    """``obj.__dlpack__(stream=-1)`` with the producer's device current:
    PyTorch refuses to export a tensor of another device than the current
    one, and consumers (JAX) may have changed it."""
    if type(obj).__module__.partition(".")[0] == "torch":
        import torch  # type: ignore[import-not-found, unused-ignore]

        if torch.cuda.current_device() != device_id:
            with torch.cuda.device(device_id):
                return obj.__dlpack__(stream=-1, **kwargs)
    return obj.__dlpack__(stream=-1, **kwargs)


def covered_since(born: int, mine: List[Any], producer: int, consumer: int) -> bool:
    """Whether a scope's exchanges ``mine`` hold one from ``producer`` to
    ``consumer`` begun after tick ``born`` (a wrap's making), and so after the
    work that produced it: wraps made together share one exchange."""
    return any(ex.began > born and ex._lanes[0].stream == producer and
               ex._lanes[1].stream == consumer for ex in mine)


class _Wrapped:
    """What :func:`wrap` returns: a DLPack producer that orders the
    consumer's stream after the real producer's, the capture-aware way."""

    def __init__(self, obj: Any, producer: Any):
        self._obj = obj
        self._producer = producer
        self._born = next(_exchange.ticks)

    def __dlpack_device__(self) -> Any:
        return self._obj.__dlpack_device__()

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, dl_device: Any = None,
                   copy: Any = None) -> Any:
        device_type, device_id = self._obj.__dlpack_device__()
        kwargs: Dict[str, Any] = {}
        if max_version is not None:
            kwargs["max_version"] = max_version
        if dl_device is not None:
            kwargs["dl_device"] = dl_device
        if copy is not None:
            kwargs["copy"] = copy
        if int(device_type) != KDLCUDA:
            return self._obj.__dlpack__(stream=stream, **kwargs)
        # The DLPack value rules are the library's (dlsync_dlpack_stream):
        # checked first without the driver, then against the producer.
        value = _dlpack_value(stream)
        consumer = _b.dlpack_stream(value, None)
        found = _producers.find(self._obj, KDLCUDA, int(device_id), self._producer)
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
        producer = cast(int, found.stream)  # a stream the producer exposes: never None
        stack = _scopes()
        if not stack and _b.capture_state(producer) == "capturing":
            raise Error(
                CAPTURE_ORDER,
                "the producer's stream is capturing: use dlsync.wrap inside "
                "`with dlsync.scope():` so that the consumer is joined back "
                "into the capture before it ends",
            )
        # With the producer, the library's rule for 1 (the legacy stream cannot
        # wait for a capturing producer); any other value reads the same
        # without it (the answer above, no driver call). Outside a scope the
        # producer was just found eager, which the rule accepts: not asked again.
        if value == LEGACY and stack:
            consumer = cast(int, _b.dlpack_stream(value, producer))  # 1 is never "no order"
        if stack and self._covered(stack[-1], producer, consumer):
            pass  # an exchange begun after this wrap was made already orders its work
        elif stack:
            _exchange._Exchange(producer, consumer, into=stack[-1])
        else:
            ex = _exchange._Exchange(producer, consumer)
            ex.end()  # eager, no scope: the consumer is ordered; nothing to join
        # The producer must not synchronise on its own: dlsync did.
        return _export_no_sync(self._obj, int(device_id), kwargs)

    def _covered(self, mine: List[Any], producer: int, consumer: int) -> bool:
        return covered_since(self._born, mine, producer, consumer)

    def _refuse_in_capture(self, streams: List[Any]) -> None:
        """dlsync.Error (DLSYNC_ERROR_CAPTURE_ORDER) when any of ``streams``
        ((what, handle) pairs) or an imported framework's current stream is
        capturing: a producer that exposes no stream would break that
        capture."""
        streams = list(streams) + [("the current PyTorch stream", t)
                                   for t in _producers.capturing_framework_streams()]
        for what, s in streams:
            if _b.capture_state(s) == "capturing":
                raise Error(CAPTURE_ORDER,
                            _producers.no_stream_in_capture_message(type(self._obj), s, what))

    def _export_to(self, consumer: int, producer: Optional[int], kwargs: Dict[str, Any]) -> Any:
        """A producer that exposes no stream (JAX): its own __dlpack__ is
        handed the consumer's stream, never -1. Refused, before the producer
        is touched, while the consumer (or an imported framework's current
        stream) is capturing: the producer would break that capture."""
        streams = [("the consumer's stream", consumer)]
        if producer is not None:
            streams.append(("the producer= stream", producer))
        self._refuse_in_capture(streams)
        if producer is not None:  # producer= names another stream too: order it first
            _exchange._Exchange(producer, consumer).end()
        return self._obj.__dlpack__(stream=consumer, **kwargs)


def wrap(obj: Any, producer: Any = None, consumer: Any = None, writable: bool = False) -> object:
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
    exported share one exchange per (producer, consumer) stream pair.

    With ``consumer=`` (a stream), or for an object that exposes only
    ``__cuda_array_interface__``, the result also exposes
    ``__cuda_array_interface__`` version 3 for that consumer stream, with
    ``stream: None``: reading it orders the consumer after the producer
    (``writable=True``, a promise that the consumer writes, makes that read
    refuse a read-only array). See dlsync/_cai.py.

    Otherwise ``obj`` must be a DLPack producer (``__dlpack__`` and
    ``__dlpack_device__``): TypeError otherwise."""
    if consumer is not None or writable or _cai_only(obj):
        from . import _cai

        return _cai.wrap(obj, producer, consumer, writable)
    missing = [m for m in ("__dlpack__", "__dlpack_device__") if not hasattr(obj, m)]
    if missing:
        raise TypeError(f"dlsync.wrap: {type(obj).__name__} {obj!r:.80} is not a DLPack producer "
                        f"(it has no {' and no '.join(missing)} and no __cuda_array_interface__)")
    return _Wrapped(obj, producer)


def _cai_only(obj: Any) -> bool:
    # __dlpack__ first: a tensor's __cuda_array_interface__ is a property that may raise.
    return not hasattr(obj, "__dlpack__") and hasattr(obj, "__cuda_array_interface__")
