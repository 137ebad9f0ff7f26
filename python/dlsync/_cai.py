# SPDX-License-Identifier: Apache-2.0
"""The CUDA Array Interface (CAI, version 3) in and out of dlsync.

In: a producer that exposes only ``__cuda_array_interface__`` (a Numba device
array) names the stream its data is ready on in the dict's ``stream`` key.
:func:`producer_stream` reads it by the CAI's rules: absent or None, no
synchronisation needed (nothing to order); 1 the legacy default stream; 2 the
per-thread default stream; 0 disallowed; any other value a ``cudaStream_t``.
The lane it names goes to the library like any other producer stream, so its
rules apply (the legacy stream while a blocking stream captures is
``DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE``; streams of two devices are ordered
like any others). :func:`for_exchange` turns such producers into their streams
for :func:`dlsync.exchange` and its many-producer form.

An object with both ``__dlpack__`` and ``__cuda_array_interface__`` (PyTorch,
CuPy) is found by the DLPack rules (dlsync/_producers.py) first: its
``__dlpack__`` takes ``stream=-1`` once dlsync has ordered the consumer, and
PyTorch exports CAI version 2 without a ``stream`` key even while the tensor's
producer runs on a side stream, so its CAI would say "nothing to order" where
its current stream says otherwise. Its CAI is read only to export it
(:class:`WrappedCai`), and its ``stream`` key then only when the DLPack
rules find no stream; dlsync.exchange never reads it (the attribute is often
a property that may raise, as PyTorch's does for a tensor that requires grad).

Out: :class:`CaiExport` (what ``dlsync.wrap(x, consumer=stream)`` returns)
exposes ``__cuda_array_interface__`` version 3 for a consumer stream the
caller names (the stream a Numba kernel will launch on). Reading it orders
that stream after the producer, capture-aware, through the exchange the
DLPack path uses (inside :func:`dlsync.scope` the exchange ends when the
scope exits), and exports ``stream: None``: the order is made, so the
consumer (Numba's ``NUMBA_CUDA_ARRAY_INTERFACE_SYNC``) must not synchronise
the host on a stream, which inside a capture is
``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``.

Every check here is made before anything is queued; nothing here calls the
CUDA driver but the exchange and its capture query.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from . import _exchange, _producers, _scope
from ._backend import active as _b
from ._errors import CAPTURE_ORDER, Error

ATTR = "__cuda_array_interface__"
VERSION = 3
_KDLCUDA = 2
_HANDLE_LIMIT = 1 << 64
_REQUIRED = ("shape", "typestr", "data", "version")


def _key(name: str) -> str:
    return f"{ATTR}[{name!r}]"


class Interface(NamedTuple):
    """A checked CAI dict. ``stream``: the producer's stream handle, or None
    when the dict says no synchronisation is needed."""

    shape: Tuple[int, ...]
    typestr: str
    ptr: int
    readonly: bool
    strides: Optional[Tuple[int, ...]]
    descr: Any
    version: int
    stream: Optional[int]


def has_cai(obj: Any) -> bool:
    """Whether ``obj`` has ``__cuda_array_interface__``, without reading it:
    the attribute is often a property that may raise (PyTorch's, for a tensor
    that requires grad), which hasattr would pass on."""
    if hasattr(type(obj), ATTR):
        return True
    attrs = getattr(obj, "__dict__", None)
    return isinstance(attrs, dict) and ATTR in attrs


def only_cai(obj: Any) -> bool:
    """Whether ``obj`` exposes ``__cuda_array_interface__`` and not ``__dlpack__``."""
    return not isinstance(obj, int) and not hasattr(obj, "__dlpack__") and has_cai(obj)


def _ints(value: Any, key: str, what: str) -> Tuple[int, ...]:
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{_key(key)} must be a tuple of ints ({what}), "
                        f"not {type(value).__name__} {value!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{_key(key)} must be a tuple of ints ({what}), "
                            f"not one holding {type(v).__name__} {v!r}")
    return tuple(value)


def stream_value(value: Any) -> Optional[int]:
    """The producer stream a CAI ``stream`` value names: None (no
    synchronisation needed), 1 (legacy), 2 (per-thread) or a handle.
    TypeError / ValueError naming the key for anything else."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_key('stream')} must be None or an int (1: the legacy default "
                        "stream, 2: the per-thread default stream, else a cudaStream_t), "
                        f"not {type(value).__name__} {value!r}")
    if value == 0:
        raise ValueError(f"{_key('stream')} is 0, which the CUDA Array Interface disallows "
                         "(ambiguous between the legacy and the per-thread default stream): "
                         "the producer must say 1, 2, a stream handle, or None")
    if not 0 < value < _HANDLE_LIMIT:
        raise ValueError(f"{_key('stream')} is {value}: not a stream (1, 2 or a cudaStream_t "
                         "handle below 2**64)")
    return value


def read(obj: Any, writable: bool = False) -> Interface:
    """``obj.__cuda_array_interface__``, checked: the keys version 3 requires
    (shape, typestr, data, version), ``data`` a (pointer, readonly) pair,
    ``strides`` None or one int per dimension, no ``mask`` (dlsync exports
    none and cannot order a mask's reads), a ``stream`` only with version 3,
    and (``writable=True``) not read-only. TypeError / ValueError naming the
    key otherwise."""
    desc = getattr(obj, ATTR)
    if not isinstance(desc, dict):
        raise TypeError(f"{type(obj).__name__}.{ATTR} must be a dict, "
                        f"not {type(desc).__name__}")
    for k in _REQUIRED:
        if k not in desc:
            raise ValueError(f"{_key(k)} is missing ({type(obj).__name__}.{ATTR} must have "
                             f"{', '.join(_REQUIRED)})")
    version = desc["version"]
    if isinstance(version, bool) or not isinstance(version, int) or not 0 <= version <= VERSION:
        raise ValueError(f"{_key('version')} is {version!r}: dlsync reads versions 0 to "
                         f"{VERSION} of the CUDA Array Interface")
    if "stream" in desc and version < 3:
        raise ValueError(f"{_key('stream')} is given with {_key('version')} {version}: the "
                         "stream key is defined by version 3 only, so what it means here is "
                         "unknown; the producer must say version 3")
    stream = stream_value(desc.get("stream"))
    if desc.get("mask") is not None:
        raise ValueError(f"{_key('mask')} is set: masked arrays are not supported (dlsync "
                         "exports no mask and does not order a mask's reads)")
    shape = _ints(desc["shape"], "shape", "one extent per dimension")
    if any(n < 0 for n in shape):
        raise ValueError(f"{_key('shape')} has a negative extent: {shape!r}")
    typestr = desc["typestr"]
    if not isinstance(typestr, str):
        raise TypeError(f"{_key('typestr')} must be a str, not {type(typestr).__name__}")
    data = desc["data"]
    if (not isinstance(data, (tuple, list)) or len(data) != 2 or isinstance(data[0], bool) or
            not isinstance(data[0], int) or not isinstance(data[1], bool)):
        raise TypeError(f"{_key('data')} must be a (pointer: int, readonly: bool) pair, "
                        f"not {data!r}")
    ptr, readonly = data
    if not 0 <= ptr < _HANDLE_LIMIT:
        raise ValueError(f"{_key('data')} pointer {ptr} is out of range")
    if writable and readonly:
        raise ValueError(f"{_key('data')} is read-only (readonly=True) and it was offered "
                         "for writing (writable=True)")
    strides = desc.get("strides")
    if strides is not None:
        strides = _ints(strides, "strides", "bytes per step of each dimension")
        if len(strides) != len(shape):
            raise ValueError(f"{_key('strides')} has {len(strides)} entries for "
                             f"{len(shape)} dimensions")
    return Interface(shape, typestr, ptr, readonly, strides, desc.get("descr"), version, stream)


def producer_stream(obj: Any) -> Optional[int]:
    """The stream a CAI-only producer's data is ready on (None: none needed)."""
    return read(obj).stream


# ---- in: dlsync.exchange ----


class NothingToOrder(list):  # type: ignore[type-arg]
    """The producers left when every one was a CAI producer whose dict names
    no stream: an exchange with nothing to order after (unlike an empty list
    the caller wrote, which dlsync.exchange refuses as a mistake)."""


def for_exchange(producer: Any) -> Any:
    """``producer`` as dlsync.exchange takes it, with producers that expose
    only the CAI turned into the stream their dict names: as a one-stream
    list (dlsync's Python exchange, on both backends, as for tensors), or an
    empty list when it names none (an exchange with nothing to order after);
    in a list or tuple such a producer is left out. Everything else, objects
    with ``__dlpack__`` too included (the DLPack rules), is returned as it is."""
    if isinstance(producer, (list, tuple)):
        if not any(only_cai(p) for p in producer):
            return producer
        out: List[Any] = NothingToOrder()
        for p in producer:
            if not only_cai(p):
                out.append(p)
                continue
            s = producer_stream(p)
            if s is not None:
                out.append(s)
        return out if not out else list(out)
    if not only_cai(producer):
        return producer
    s = producer_stream(producer)
    return NothingToOrder() if s is None else [s]


# ---- out: __cuda_array_interface__ for a named consumer stream ----


def _stream_device(stream: Any) -> Optional[int]:
    """The device a stream object says it belongs to, without a driver call
    (``torch.cuda.Stream.device.index``, CuPy's ``device_id``); None for a
    bare handle or an object that does not say."""
    dev = getattr(stream, "device_id", None)
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    dev = getattr(getattr(stream, "device", None), "index", None)
    if isinstance(dev, int) and not isinstance(dev, bool):
        return dev
    return None


def _data_device(obj: Any) -> Optional[int]:
    get = getattr(obj, "__dlpack_device__", None)
    if get is None:
        return None
    device_type, device_id = get()
    return int(device_id) if int(device_type) == _KDLCUDA else None


class CaiExport:
    """``__cuda_array_interface__`` (version 3, ``stream: None``) of ``obj``
    for the consumer stream ``consumer``; reading it orders that stream after
    the producer (see the module's docstring). What ``dlsync.wrap(obj,
    consumer=...)`` returns for an object that exposes only the CAI; for one
    with ``__dlpack__`` too, :class:`WrappedCai` (also a DLPack producer)."""

    def __init__(self, obj: Any, producer: Any, consumer: Any, writable: bool = False):
        self._obj = obj
        self._producer = producer
        self._consumer = consumer
        self._writable = bool(writable)
        self._born = next(_exchange.ticks)

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        # hasattr(x, "__cuda_array_interface__") (Numba's is_cuda_array) would
        # read an AttributeError raised inside as "no interface": say it.
        try:
            return self._export()
        except AttributeError as e:
            raise TypeError(f"dlsync.wrap(..., consumer=...).{ATTR}: {e}") from e

    def _export(self) -> Dict[str, Any]:
        obj = self._obj
        if not has_cai(obj):
            raise TypeError(f"dlsync.wrap(..., consumer=...): {type(obj).__name__} exposes no "
                            f"{ATTR} to export (read it through __dlpack__ instead)")
        desc = read(obj, self._writable)
        if self._consumer is None:
            raise TypeError(f"dlsync.wrap: {ATTR} is exported for a consumer stream dlsync "
                            "orders, and none was named: pass consumer= (the stream the "
                            "consumer's kernels will run on)")
        consumer = _b.stream_handle(self._consumer)
        data_dev, stream_dev = _data_device(obj), _stream_device(self._consumer)
        if data_dev is not None and stream_dev is not None and data_dev != stream_dev:
            raise ValueError(f"dlsync.wrap(..., consumer=...): the consumer stream "
                             f"{consumer:#x} is of device {stream_dev} and the array's data "
                             f"(__dlpack_device__) of device {data_dev}")
        producer = self._producer_stream(desc)
        if producer is not None:
            self._order(producer, consumer)
        out = {
            "shape": desc.shape,
            "typestr": desc.typestr,
            "data": (desc.ptr, desc.readonly),
            "strides": desc.strides,
            "version": VERSION,
            "stream": None,  # ordered already: the consumer must not synchronise
        }
        if desc.descr is not None:
            out["descr"] = desc.descr
        return out

    def _producer_stream(self, desc: Interface) -> Optional[int]:
        """producer=, else (an object with __dlpack__) the DLPack rules,
        else the CAI's stream key."""
        if self._producer is not None:
            return _b.stream_handle(self._producer)
        if hasattr(self._obj, "__dlpack__"):
            device_type, device_id = self._obj.__dlpack_device__()
            if int(device_type) == _KDLCUDA:
                found = _producers.find(self._obj, _KDLCUDA, int(device_id))
                if found.stream is not None:
                    return found.stream
        return desc.stream

    def _order(self, producer: int, consumer: int) -> None:
        """The consumer after the producer, as the DLPack path orders it:
        inside a scope an exchange the scope ends (shared with one begun after
        this wrap was made), outside one begun and ended at once (refused
        while the producer captures: nothing would join the consumer back)."""
        stack = _scope._scopes()
        if not stack and _b.capture_state(producer) == "capturing":
            raise Error(
                CAPTURE_ORDER,
                f"the producer's stream is capturing: read {ATTR} of dlsync.wrap inside "
                "`with dlsync.scope():` so that the consumer is joined back into the capture "
                "before it ends",
            )
        if stack and _scope.covered_since(self._born, stack[-1], producer, consumer):
            return
        if stack:
            _exchange._Exchange(producer, consumer, into=stack[-1])
        else:
            _exchange._Exchange(producer, consumer).end()


class WrappedCai(_scope._Wrapped, CaiExport):
    """A DLPack producer (:class:`dlsync._scope._Wrapped`) that also exposes
    ``__cuda_array_interface__`` for a named consumer stream."""

    def __init__(self, obj: Any, producer: Any, consumer: Any, writable: bool = False):
        CaiExport.__init__(self, obj, producer, consumer, writable)


def wrap(obj: Any, producer: Any, consumer: Any, writable: bool) -> Any:
    """dlsync.wrap's CAI forms (see dlsync.wrap)."""
    if only_cai(obj):
        return CaiExport(obj, producer, consumer, writable)
    return WrappedCai(obj, producer, consumer, writable)
