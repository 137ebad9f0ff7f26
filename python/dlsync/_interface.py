# SPDX-License-Identifier: Apache-2.0
"""The interface of a backend: what the rest of the package calls of the
compiled one (dlsync._backend.NativeBackend) and of the ctypes one
(dlsync._ctypes_impl.CtypesBackend), and nothing else of either.

A ``typing.Protocol``: the type checker holds both to it (``mypy --strict``
on the package), and ``isinstance(b, Backend)`` checks that every member is
there. Handles are ints (the library's pointers); a ``begin`` or
``fence_signal`` given ``out`` (a ``ctypes.c_void_p``) has the handle written
there before control returns to Python, so that an exception raised as the
call returns (KeyboardInterrupt) leaves it where the caller ends it."""

from __future__ import annotations

import ctypes
from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

from ._errors import Error


@runtime_checkable
class Ender(Protocol):
    """An exchange made in Python (dlsync._exchange): ended by end()."""

    def end(self) -> None: ...


@runtime_checkable
class ExchangeContext(Protocol):
    """dlsync.exchange's object: __enter__ begins, __exit__ ends."""

    def __enter__(self) -> None: ...

    def __exit__(self, *exc: Any) -> bool: ...


# dlsync._exchange.exchange_python(producer, consumer, flags): the exchange of
# list and tensor producers, which both backends' Exchange hand to Python.
PythonExchange = Callable[[Any, Any, int], Ender]


@runtime_checkable
class Backend(Protocol):
    """The calls of one backend (see the module docstring)."""

    name: str
    lib: ctypes.CDLL

    def stream_handle(self, stream: Any) -> int:
        """The CUstream handle of a stream object or int (checked)."""

    def capture_state(self, stream: Any) -> str:
        """'eager' or 'capturing'."""

    def capture_graph(self, stream: Any) -> Optional[int]:
        """The graph the stream's capture builds, or None."""

    def dlpack_stream(self, value: int, producer: Any) -> Optional[int]:
        """dlsync_dlpack_stream: the consumer's stream handle, or None (-1)."""

    def begin(self, producer: Any, consumer: Any, flags: int = 0,
              out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_flags: the exchange's handle."""

    def begin_many(self, producers: Sequence[Any], consumer: Any, flags: int = 0,
                   out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_many: one handle."""

    def end(self, handle: int) -> None:
        """dlsync_exchange_end."""

    def env_stream(self, api: int, device_type: int, device_id: int, cls: type) -> int:
        """The producer's DLPack exchange API current work stream."""

    @property
    def Exchange(self) -> Callable[..., ExchangeContext]:  # noqa: N802 - the type's name
        """The type of dlsync.exchange's object."""

    def set_python_exchange(self, fn: PythonExchange) -> None:
        """Installs the exchange of list and tensor producers (dlsync/__init__.py
        installs dlsync._exchange.exchange_python)."""

    def fence_signal(self, stream: Any, out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_fence_signal: the fence's handle."""

    def fence_wait(self, fence: int, stream: Any) -> None:
        """dlsync_fence_wait."""

    def fence_release(self, fence: int) -> None:
        """dlsync_fence_release."""

    # Other runtimes' events (include/dlsync/foreign.h).

    def fence_import(self, event: int, provenance: int, capture_id: int, flags: int,
                     out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_fence_import of a CUevent handle: the fence's handle."""

    def capture_id(self, stream: Any) -> Optional[int]:
        """The id of the stream's capture, or None for an eager stream."""

    def fence_export_event(self, fence: int) -> int:
        """dlsync_fence_export_event: the CUevent handle behind a fence."""

    def fence_provenance(self, fence: int) -> Optional[int]:
        """dlsync_fence_get_provenance; None for a fence that was not imported."""

    def graph_launch(self, graph: Optional[int], exec_: Optional[int], stream: Any) -> None:
        """dlsync_graph_launch."""

    def body_add(self, graph: int) -> None:
        """dlsync_conditional_body_add."""

    def body_remove(self, graph: int) -> None:
        """dlsync_conditional_body_remove."""

    def body_declared(self, graph: int) -> bool:
        """dlsync_conditional_body_is_declared."""

    # ---- graph compilers: fan-out and conditional nodes ----

    def begin_fanout(self, producer: Any, consumers: Sequence[Any], flags: int = 0,
                     out: Optional[ctypes.c_void_p] = None) -> int:
        """dlsync_exchange_begin_fanout: one handle."""

    def order(self, first: Any, then: Any) -> None:
        """dlsync_order on two streams."""

    def node_declare(self, parent: int, node: int, bodies: Sequence[int]) -> None:
        """dlsync_conditional_node_declare."""

    # ---- end graph compilers ----

    # ---- the Arrow C Device data interface (include/dlsync/arrow.h) ----
    # Arguments are addresses (ints) of the interface's structures, which
    # dlsync._arrow owns; the stream is checked as every stream is.

    def arrow_sync_event(self, array: int, sync: int, stream: Any) -> None:
        """dlsync_arrow_sync_event(array, sync, ctx, the stream's lane)."""

    def arrow_sync_release(self, sync: int) -> None:
        """dlsync_arrow_sync_release(sync)."""

    def arrow_wait(self, array: int, stream: Any, provenance: int) -> None:
        """dlsync_arrow_wait(ctx, the stream's lane, array, provenance, 0)."""

    def arrow_release(self, array: int, stream: Any) -> None:
        """dlsync_arrow_release(ctx, the stream's lane, array)."""

    def version(self) -> str:
        """The library's version string."""

    def library_path(self) -> str:
        """The path the library was loaded from."""

    def error(self, status: int, prefix: str = "") -> Error:
        """dlsync.Error for a failed call: the status name and the last error."""
