# SPDX-License-Identifier: Apache-2.0
"""dlsync for Python: capture-aware ordering of GPU work between frameworks.

A thin layer over libdlsync; no framework is needed to import it. Streams
may be given as integers (CUstream / cudaStream_t handles), as
``torch.cuda.Stream``, CuPy streams, or any object with ``__cuda_stream__``.

    with dlsync.exchange(producer_stream, consumer_stream):
        ...  # consumer work, ordered after the producer's earlier work

    with torch.cuda.graph(g), dlsync.scope(), side_stream:
        y = producer(x)
        z = cupy.from_dlpack(dlsync.wrap(y))   # ordered, capture-aware
        ...
    # leaving the scope joins the consumer back into the capture

Errors raise :class:`dlsync.Error` carrying the library's status and message.

The package, one module per concept: ``_loader`` finds the library
(``DLSYNC_LIBRARY`` first), ``_backend`` chooses once between the compiled
``dlsync._native`` and the ctypes code (``_ctypes_impl``), ``_exchange``,
``_scope`` (wrap and scope), ``_fence``, ``_graphs`` (launch,
conditional_body and conditional_node), ``_paths`` (what to build against),
``_producers`` (finding a producer's stream); ``python -m dlsync`` prints
what dlsync-info prints. This file only re-exports.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import _backend
from ._ctypes_impl import LEGACY, PER_THREAD
from ._errors import CONDITIONAL_BODY, Error
from ._exchange import CAPTURE_STABLE, KEEP_EDGE_DATA, exchange, order
from ._exchange import _Exchange  # noqa: F401 - the one-exchange object (tests count it)
from ._fence import Fence, Provenance
from ._graphs import capture_graph, conditional_body, conditional_node, is_conditional_body
from ._graphs import launch
from ._paths import get_cmake_dir, get_include, get_pkgconfig_dir
from ._scope import _Wrapped, scope, wrap  # noqa: F401
from . import _producers  # noqa: F401
from . import arrow  # noqa: F401 - dlsync.arrow: the Arrow C Device data interface
from . import _exchange as _exchange_module

# The compiled and the ctypes Exchange hand list and tensor producers to
# Python: the exchange they call is installed here.
_backend.active.set_python_exchange(_exchange_module.exchange_python)

__all__ = [
    "Error",
    "version",
    "exchange",
    "order",
    "wrap",
    "scope",
    "Fence",
    "Provenance",
    "capture_id",
    "launch",
    "conditional_body",
    "conditional_node",
    "is_conditional_body",
    "capture_graph",
    "arrow",
    "CONDITIONAL_BODY",
    "CAPTURE_STABLE",
    "KEEP_EDGE_DATA",
    "stream_handle",
    "capture_state",
    "LEGACY",
    "PER_THREAD",
    "get_include",
    "get_cmake_dir",
    "get_pkgconfig_dir",
    "library_path",
    "__version__",
]

# The backend's own calls (no Python frame of dlsync's between).
stream_handle: Callable[[Any], int] = _backend.active.stream_handle
capture_state: Callable[[Any], str] = _backend.active.capture_state
capture_id: Callable[[Any], Optional[int]] = _backend.active.capture_id
version: Callable[[], str] = _backend.active.version
library_path: Callable[[], str] = _backend.active.library_path

_lib = _backend.lib
_native: Optional[Any] = getattr(_backend.active, "module", None)
_native_error = _backend.why


def _native_active() -> bool:
    """Whether the calls of dlsync go through the compiled dlsync._native
    (True) or through ctypes (False; ``dlsync._native_error`` says why)."""
    return _native is not None


__version__: str
try:  # written by CMake from include/dlsync/version.h when the wheel is built
    from ._version import __version__  # type: ignore[import-not-found, no-redef, unused-ignore]
except ImportError:  # a source tree: the same header, through the library built from it
    __version__ = version()
