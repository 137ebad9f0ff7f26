# SPDX-License-Identifier: Apache-2.0
"""The backend, chosen once at import: dlsync._native (compiled, the stable
ABI) where it imports and initialises and ``DLSYNC_NO_NATIVE`` is not set,
the ctypes code (dlsync._ctypes_impl) otherwise. ``active`` is the one in use
and ``why`` says why ctypes is (None on the compiled one).

Both conform to :class:`dlsync._interface.Backend` (a ``typing.Protocol``
the type checker holds them to): the rest of the package calls that and
nothing else of either. Same values, same exception types and messages on
both, misuse included (python/tests/test_backends.py)."""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from typing import Any, Callable, Optional, Sequence, Tuple

from . import _loader
from ._ctypes_impl import CtypesBackend
from ._errors import Error
from ._interface import Backend, Ender, ExchangeContext, PythonExchange

NATIVE_ABI = 7  # the _init contract of _native.c (DLSYNC_PY_ABI)


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


class NativeBackend:
    """dlsync._native's calls over the library a CtypesBackend loaded (one
    library, one default context, one last error); fence_signal, fence_wait,
    fence_release, the library's version and path and the status words stay
    that CtypesBackend's calls (the imports of other runtimes' events,
    fence_import and its companions, are the module's).

    The compiled calls are the module's own functions, held as attributes
    (no Python frame between a caller and the C code); their types are the
    Backend protocol's."""

    name = "native"
    stream_handle: Callable[[Any], int]
    capture_state: Callable[[Any], str]
    capture_graph: Callable[[Any], Optional[int]]
    dlpack_stream: Callable[[int, Any], Optional[int]]
    begin: Callable[..., int]
    begin_many: Callable[..., int]
    end: Callable[[int], None]
    env_stream: Callable[[int, int, int, type], int]
    Exchange: Callable[..., ExchangeContext]
    graph_launch: Callable[[Optional[int], Optional[int], Any], None]
    body_add: Callable[[int], None]
    body_remove: Callable[[int], None]
    body_declared: Callable[[int], bool]
    fence_import: Callable[..., int]
    fence_export_event: Callable[[int], int]
    fence_provenance: Callable[[int], Optional[int]]
    capture_id: Callable[[Any], Optional[int]]
    # ---- graph compilers ----
    begin_fanout: Callable[..., int]
    order: Callable[[Any, Any], None]
    node_declare: Callable[[int, int, Sequence[int]], None]

    # the Arrow C Device data interface
    arrow_sync_event: Callable[[int, int, Any], None]
    arrow_sync_release: Callable[[int], None]
    arrow_wait: Callable[[int, Any, int], None]
    arrow_release: Callable[[int, Any], None]

    def __init__(self, lib: ctypes.CDLL, native: Any):
        abi = getattr(native, "ABI", None)
        if abi != NATIVE_ABI:
            raise ImportError(f"it is of ABI {abi}, this dlsync needs {NATIVE_ABI} "
                              "(a stale build?)")
        self._ctypes = CtypesBackend(lib)
        self.lib = lib
        self._python_exchange: Optional[PythonExchange] = None
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
        self.fence_import = native.fence_import
        self.fence_export_event = native.fence_export_event
        self.fence_provenance = native.fence_provenance
        self.capture_id = native.capture_id
        # ---- graph compilers ----
        self.begin_fanout = native.begin_fanout
        self.order = native.order
        self.node_declare = native.node_declare
        self.arrow_sync_event = native.arrow_sync_event
        self.arrow_sync_release = native.arrow_sync_release
        self.arrow_wait = native.arrow_wait
        self.arrow_release = native.arrow_release

    def set_python_exchange(self, fn: PythonExchange) -> None:
        self._python_exchange = fn

    def _python_begin(self, producer: Any, consumer: Any, flags: int) -> Ender:
        """What the compiled Exchange calls for lists and tensors."""
        if self._python_exchange is None:
            raise RuntimeError("dlsync: no Python exchange was installed (dlsync/__init__.py "
                               "installs dlsync._exchange.exchange_python)")
        return self._python_exchange(producer, consumer, flags)

    def version(self) -> str:
        return self._ctypes.version()

    def library_path(self) -> str:
        return self._ctypes.library_path()

    def error(self, status: int, prefix: str = "") -> Error:
        return self._ctypes.error(status, prefix)

    def fence_signal(self, stream: Any, out: Optional[ctypes.c_void_p] = None) -> int:
        return self._ctypes.fence_signal(stream, out)

    def fence_wait(self, fence: int, stream: Any) -> None:
        self._ctypes.fence_wait(fence, stream)

    def fence_release(self, fence: int) -> None:
        self._ctypes.fence_release(fence)


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


def choose(lib: ctypes.CDLL, package: str) -> Tuple[Backend, Optional[str]]:
    """(backend, why): the compiled one where it can be, else ctypes."""
    try:
        ct = CtypesBackend(lib)
    except AttributeError as e:  # a libdlsync of another version
        raise ImportError(f"dlsync: the library {lib._name} lacks a function this package "
                          f"calls ({e}): a libdlsync of another version?") from None
    native, why = load_native(lib, package)
    if native is not None:
        return native, None
    return ct, why


_package = __name__.rpartition(".")[0]
lib = _loader.load(sys.modules[_package].__path__)
active: Backend
why: Optional[str]
active, why = choose(lib, _package)
