# SPDX-License-Identifier: Apache-2.0
"""The backend, chosen once at import: dlsync._native (compiled, the stable
ABI) where it imports and initialises and ``DLSYNC_NO_NATIVE`` is not set,
the ctypes code (dlsync._ctypes_impl) otherwise. ``active`` is the one in use
and ``why`` says why ctypes is (None on the compiled one).

Both have this interface, which the rest of the package calls (and nothing
else of either):

``name``                                  "native" or "ctypes"
``stream_handle(stream)``                 the CUstream handle (checked int)
``capture_state(stream)``                 "eager" or "capturing"
``capture_graph(stream)``                 the graph its capture builds, or None
``dlpack_stream(value, producer)``        dlsync_dlpack_stream: a handle or None
``begin(producer, consumer, flags)``      dlsync_exchange_begin_flags: a handle
``begin_many(producers, consumer, flags)`` dlsync_exchange_begin_many: a handle
``end(handle)``                           dlsync_exchange_end
``env_stream(api, type, id, cls)``        the producer's DLPack exchange API stream
``Exchange(producer, consumer, capture_stable=False)``  dlsync.exchange's object
``fence_signal/fence_wait/fence_release`` the fences (ctypes on both)
``graph_launch(graph, exec, stream)``     dlsync_graph_launch (int handles or None)
``body_add/body_remove/body_declared(g)`` the conditional bodies (conditional.h)
``version()``, ``library_path()``, ``lib`` the loaded library
``python_begin``                          set by dlsync._exchange: the exchange
                                          of list and tensor producers

Same values, same exception types and messages on both, misuse included
(python/tests/test_backends.py)."""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from typing import Any, Optional, Tuple

from . import _loader
from ._ctypes_impl import CtypesBackend
from ._errors import Error

NATIVE_ABI = 3  # the _init contract of _native.c (DLSYNC_PY_ABI)


def optional_getattr_address() -> Optional[int]:
    """PyObject_GetOptionalAttr (3.13 on) or _PyObject_LookupAttr (3.7 to
    3.12), a getattr that builds no AttributeError for a missing attribute;
    None where this interpreter does not export it (then the module uses
    PyObject_GetAttr)."""
    name = "PyObject_GetOptionalAttr" if sys.version_info >= (3, 13) else "_PyObject_LookupAttr"
    try:
        return ctypes.cast(getattr(ctypes.pythonapi, name), ctypes.c_void_p).value
    except (AttributeError, ValueError, OSError):
        return None


class NativeBackend(CtypesBackend):
    """dlsync._native's calls over the library the ctypes part loaded (one
    library, one default context, one last error); the fences and the
    library's version stay ctypes calls."""

    name = "native"

    def __init__(self, lib: ctypes.CDLL, native: Any):
        super().__init__(lib)
        abi = getattr(native, "ABI", None)
        if abi != NATIVE_ABI:
            raise ImportError(f"it is of ABI {abi}, this dlsync needs {NATIVE_ABI} (a stale build?)")
        symbols = {n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in native.SYMBOLS}
        native._init(symbols, Error, self._python_begin, optional_getattr_address())
        self.module = native
        self.stream_handle = native.stream_handle
        self.capture_state = native.capture_state
        self.capture_graph = native.capture_graph
        self.dlpack_stream = native.dlpack_stream
        self.begin = native.begin
        self.begin_many = native.begin_many
        self.end = native.end
        self.env_stream = native.env_stream
        self.Exchange = native.Exchange
        self.graph_launch = native.graph_launch
        self.body_add = native.body_add
        self.body_remove = native.body_remove
        self.body_declared = native.body_declared

    def _python_begin(self, producer: Any, consumer: Any, flags: int):
        return self.python_begin(producer, consumer, flags)


def load_native(lib: ctypes.CDLL, package: str) -> Tuple[Optional[NativeBackend], Optional[str]]:
    """The compiled backend, or None and the reason. Never an error: the
    ctypes code is the fallback."""
    if os.environ.get("DLSYNC_NO_NATIVE", "") not in ("", "0"):
        return None, "DLSYNC_NO_NATIVE is set"
    try:
        native = importlib.import_module(package + "._native")
    except ImportError as e:
        return None, f"dlsync._native could not be imported: {e}"
    try:
        return NativeBackend(lib, native), None
    except Exception as e:  # noqa: BLE001 - any failure here means: use ctypes
        return None, f"dlsync._native could not be initialised: {type(e).__name__}: {e}"


def choose(lib: ctypes.CDLL, package: str):
    """(backend, why): the compiled one where it can be, else ctypes."""
    native, why = load_native(lib, package)
    if native is not None:
        return native, None
    return CtypesBackend(lib), why


_package = __name__.rpartition(".")[0]
lib = _loader.load(sys.modules[_package].__path__)
active, why = choose(lib, _package)
