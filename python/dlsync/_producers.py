# SPDX-License-Identifier: Apache-2.0
"""Finding a producer's stream, for :func:`dlsync.wrap` and :func:`dlsync.exchange`.

The order (first that answers wins):

1. an explicit ``producer=`` (a stream object or handle);
2. the producer type's ``__dlpack_c_exchange_api__``: a PyCapsule named
   ``dlpack_exchange_api`` holding a DLPack 1.x ``DLPackExchangeAPI``, whose
   ``current_work_stream`` the library asks
   (``dlsync_env_stream_from_exchange_api``, through the backend); the capsule is looked up once
   per type;
3. the object's own ``__cuda_stream__`` (or that of its ``stream`` attribute);
4. PyTorch's / CuPy's current stream, for their tensors and arrays.

A producer for which none answers (JAX, anything with only ``__dlpack__``)
exposes no stream: :func:`find` says so with ``stream=None``, and the wrapper
hands it the consumer's stream through its own ``__dlpack__(stream=...)``, as
the DLPack contract has it order its pending work before that stream. Such a
producer is never handed ``stream=-1`` (JAX 0.11 answers it with
``CUDA_ERROR_INVALID_HANDLE``).

Nothing here calls the CUDA driver, so it is safe during capture; the
producer's ``current_work_stream`` runs on the calling thread with the GIL held.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._backend import active as _b

_CAPSULE_NAME = b"dlpack_exchange_api"
_LEGACY = 1

# How a stream was found (Found.how).
EXPLICIT = "producer="
EXCHANGE_API = "__dlpack_c_exchange_api__"
CUDA_STREAM = "__cuda_stream__"
TORCH = "torch current stream"
CUPY = "cupy current stream"
NONE = "none"


class Found(NamedTuple):
    """What :func:`find` learnt about a producer.

    ``stream``: the CUstream handle its pending work is on, or None when the
    producer exposes none. ``how``: which rule answered. ``no_sync_export``:
    whether its ``__dlpack__`` may be asked for ``stream=-1`` (no sync of its
    own) once dlsync has ordered the consumer; False for producers that expose
    no stream (JAX refuses -1)."""

    stream: Optional[int]
    how: str
    no_sync_export: bool


# ---- the DLPack C exchange API, through the library ----

_api_lock = threading.Lock()
# type -> (capsule, pointer to its DLPackExchangeAPI) or None (the type has none)
_api_cache: Dict[type, Optional[Tuple[Any, int]]] = {}
_capsule_is_valid: Any = None  # ctypes functions, bound on first use
_capsule_pointer: Any = None


def _bind() -> None:
    """PyCapsule_IsValid and PyCapsule_GetPointer through ctypes.pythonapi."""
    global _capsule_is_valid, _capsule_pointer
    if _capsule_pointer is not None:
        return
    valid = ctypes.pythonapi.PyCapsule_IsValid
    valid.restype = ctypes.c_int
    valid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    pointer = ctypes.pythonapi.PyCapsule_GetPointer
    pointer.restype = ctypes.c_void_p
    pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    _capsule_is_valid, _capsule_pointer = valid, pointer


def exchange_api_of(cls: type) -> Optional[int]:
    """The address of ``cls.__dlpack_c_exchange_api__``'s DLPackExchangeAPI,
    or None when the type publishes none. Looked up once per type; a value
    that is not a capsule named ``dlpack_exchange_api`` raises TypeError."""
    try:
        entry = _api_cache[cls]
    except KeyError:
        entry = None
        capsule = getattr(cls, "__dlpack_c_exchange_api__", None)
        if capsule is not None:
            _bind()
            if not _capsule_is_valid(capsule, _CAPSULE_NAME):
                raise TypeError(
                    f"{cls.__name__}.__dlpack_c_exchange_api__ is not a PyCapsule named "
                    f"'{_CAPSULE_NAME.decode()}' ({type(capsule).__name__})")
            entry = (capsule, _capsule_pointer(capsule, _CAPSULE_NAME))
        with _api_lock:
            _api_cache[cls] = entry
    return None if entry is None else entry[1]


# ---- the other rules ----


def _cuda_stream_attr(obj: Any) -> Optional[Any]:
    if hasattr(obj, "__cuda_stream__"):
        return obj
    inner = getattr(obj, "stream", None)
    if inner is not None and hasattr(inner, "__cuda_stream__"):
        return inner
    return None


def _framework(obj: Any) -> str:
    return type(obj).__module__.split(".")[0]


def find(obj: Any, device_type: int, device_id: int, explicit: Any = None) -> Found:
    """Where ``obj``'s pending work is (see the module's docstring)."""
    stream_handle = _b.stream_handle

    api = exchange_api_of(type(obj))
    module = _framework(obj)
    stream_obj = _cuda_stream_attr(obj)
    exposes = api is not None or stream_obj is not None or module in ("torch", "cupy")
    if explicit is not None:
        return Found(stream_handle(explicit), EXPLICIT, exposes)
    if api is not None:
        return Found(_b.env_stream(api, device_type, device_id, type(obj)), EXCHANGE_API, True)
    if stream_obj is not None:
        return Found(stream_handle(stream_obj), CUDA_STREAM, True)
    if module == "torch":
        import torch  # type: ignore[import-not-found, unused-ignore]

        return Found(torch.cuda.current_stream(device_id).cuda_stream or _LEGACY, TORCH, True)
    if module == "cupy":
        import cupy  # type: ignore[import-not-found, unused-ignore]

        with cupy.cuda.Device(device_id):
            return Found(cupy.cuda.get_current_stream().ptr or _LEGACY, CUPY, True)
    return Found(None, NONE, False)


def capturing_framework_streams() -> List[int]:
    """Streams of frameworks already imported that may be capturing now (the
    current PyTorch stream of the current device): checked, with the capture
    query, before a producer that exposes no stream is asked for anything."""
    out = []
    torch = sys.modules.get("torch")
    if torch is not None and getattr(torch, "cuda", None) is not None:
        try:
            if torch.cuda.is_initialized():
                out.append(torch.cuda.current_stream().cuda_stream or _LEGACY)  # 0: the NULL stream
        except Exception:  # noqa: BLE001 - a broken torch install is not ours to report
            pass
    return out


def no_stream_in_capture_message(cls: type, stream: int, what: str) -> str:
    return (
        f"dlsync.wrap: {cls.__name__} exposes no stream (no producer=, no "
        f"__dlpack_c_exchange_api__, no __cuda_stream__), so the only way to order it is to hand "
        f"it the consumer's stream through its own __dlpack__(stream=...); but {what} {stream:#x} "
        "is capturing, and such a producer makes it wait for an event recorded outside the "
        "capture (CUDA_ERROR_STREAM_CAPTURE_ISOLATION) or syncs the host, either of which breaks "
        "the capture. Nothing was asked of the producer and the capture is intact. Produce the "
        "array before the capture begins and copy it into a buffer the graph reads, or make the "
        "producer run on a stream it lets you name (producer=) and joins the capture.")


# ---- many producers, one consumer ----


def distinct(handles: Sequence[int]) -> List[int]:
    """The handles in first-seen order, each once."""
    seen = set()
    out = []
    for h in handles:
        if h not in seen:
            seen.add(h)
            out.append(h)
    return out
