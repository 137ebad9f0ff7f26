# SPDX-License-Identifier: Apache-2.0
"""dlsync.Fence (include/dlsync/fence.h), and other runtimes' events as
fences and fences as events (include/dlsync/foreign.h)."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Optional, Tuple, Union

from ._backend import active as _b
from ._errors import INVALID_ARGUMENT, Error

IMPORT_OWN = 0x1  # DLSYNC_IMPORT_OWN


class Provenance(enum.IntEnum):
    """Where another runtime's event was recorded (dlsync_provenance). The
    caller says it: the driver cannot tell all of it, and a wrong one
    orders nothing or breaks a capture (include/dlsync/foreign.h).

    - ``EAGER``: recorded by a plain record on a stream that was not
      capturing (``torch.cuda.Event.record()``, ``cupy.cuda.Event.record()``,
      ``cuEventRecord`` outside any capture).
    - ``COMPLETE``: as EAGER, and its work has completed (the import checks
      it: an event not done yet is refused).
    - ``EXTERNAL_RECORD``: recorded by an event-record node of a graph: a
      ``torch.cuda.Event(external=True)`` recorded inside ``torch.cuda.graph``,
      ``cudaEventRecordWithFlags(..., cudaEventRecordExternal)`` in a capture,
      ``cuGraphAddEventRecordNode``. Waits order after the record of the
      graph's most recent launch: launch (replay) it first, each time.
    - ``CAPTURED``: recorded by a plain record inside a capture that is still
      active (``capture_id``: that capture's id, :func:`dlsync.capture_id`):
      usable only from that same capture (a plain ``torch.cuda.Event``
      recorded inside ``torch.cuda.graph``, as PyTorch records between its
      streams).
    """

    EAGER = 1
    COMPLETE = 2
    EXTERNAL_RECORD = 3
    CAPTURED = 4


_PROVENANCE_NAMES = ", ".join(p.name for p in Provenance)


def provenance_value(value: object) -> Provenance:
    """A Provenance from a member, its name (any case: "external_record") or
    its int value; TypeError or ValueError naming the value otherwise."""
    if isinstance(value, Provenance):
        return value
    if isinstance(value, str):
        member = Provenance.__members__.get(value.upper())
        if member is None:
            raise ValueError(f"dlsync.Fence.from_event: unknown provenance {value!r} "
                             f"({_PROVENANCE_NAMES})")
        return member
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return Provenance(value)
        except ValueError:
            raise ValueError(f"dlsync.Fence.from_event: unknown provenance {value} "
                             f"({_PROVENANCE_NAMES})") from None
    raise TypeError("dlsync.Fence.from_event: provenance must be a dlsync.Provenance or its name, "
                    f"not {type(value).__name__} {value!r}")


def _not_recorded(what: str) -> Error:
    return Error(INVALID_ARGUMENT,
                 f"dlsync.Fence.from_event: the {what} has no CUDA event yet (it creates one at "
                 "its first record()): record it before importing it")


def event_handle(event: object) -> Tuple[Any, Optional[object]]:
    """(the CUevent handle, the Python object that owns the event or None
    for an int). Accepts an int CUevent / cudaEvent_t handle, a
    torch.cuda.Event (``cuda_event``) or torch.Event (``event_id``), a
    cupy.cuda.Event (``ptr``) and a cuda.core Event (``int(handle)``).
    The handle itself is checked by the backend (an int, 0 <= h < 2**64;
    0 is the library's "event is NULL")."""
    if isinstance(event, int) and not isinstance(event, bool):
        return event, None
    kind = type(event).__name__
    module = type(event).__module__ or ""
    for attr in ("cuda_event", "event_id"):  # torch.cuda.Event, torch.Event
        if module.startswith("torch") and hasattr(event, attr):
            value = getattr(event, attr)
            if value == 0:
                raise _not_recorded(f"{module}.{kind}")
            return value, event
    if module.startswith("cupy") and hasattr(event, "ptr"):
        return event.ptr, event
    if module.startswith("cuda.core") and hasattr(event, "handle"):
        if getattr(event, "is_closed", False):
            raise Error(INVALID_ARGUMENT, f"dlsync.Fence.from_event: the {module}.{kind} "
                        "was closed")
        return int(event.handle), event
    raise TypeError(f"dlsync.Fence.from_event: cannot find a CUDA event in {module}.{kind} "
                    "(an int CUevent / cudaEvent_t handle, a torch.cuda.Event, a "
                    "cupy.cuda.Event or a cuda.core Event)")


class Fence:
    """A point in a stream's work that other streams can wait for, now or
    later (include/dlsync/fence.h). ``Fence(stream)`` signals one on a
    stream; :meth:`from_event` makes one of another runtime's event."""

    def __init__(self, stream: object):
        self._source: Optional[object] = None
        # The library writes the fence into it (fence_signal's out): an
        # exception raised as the call returns leaves it for close/__del__.
        self._handle: Optional[ctypes.c_void_p] = ctypes.c_void_p()
        _b.fence_signal(stream, self._handle)

    @classmethod
    def from_event(cls, event: object, *, provenance: Union[Provenance, str],
                   capture_id: Optional[int] = None, own: bool = False) -> "Fence":
        """A fence for another runtime's event (dlsync_fence_import).

        ``event``: an int CUevent / cudaEvent_t, a ``torch.cuda.Event``
        (``external=True`` or not; recorded at least once: torch creates
        its CUDA event at the first record), a ``cupy.cuda.Event`` or a
        cuda.core ``Event``. ``provenance``: where it was recorded, as the
        caller knows it (:class:`Provenance`, or its name); ``capture_id``:
        the capture's id for CAPTURED (:func:`dlsync.capture_id` of the
        recording stream while it captures), None otherwise.

        The event is borrowed: the fence keeps the Python object given
        alive while it is open, and the event must not be recorded again
        while this fence or a graph that waited on it may still be used.
        ``own=True`` hands an int handle's event to dlsync, which destroys
        it once no fence or graph holds it; refused for an event object
        (its framework destroys the event with the object).

        Raises dlsync.Error (the library's status and message: an unknown
        provenance, a capture id missing for CAPTURED or given for another,
        an event the driver calls invalid, a provenance the driver's answer
        contradicts, an event 0), TypeError or ValueError for an argument
        that is not of the kind above. Nothing is queued then."""
        prov = provenance_value(provenance)
        handle, source = event_handle(event)
        if not isinstance(own, bool):
            raise TypeError(f"dlsync.Fence.from_event: own must be a bool, not "
                            f"{type(own).__name__} {own!r}")
        if own and source is not None:
            raise Error(INVALID_ARGUMENT,
                        f"dlsync.Fence.from_event: own=True for a "
                        f"{type(source).__module__}.{type(source).__name__}: its event is "
                        "that object's, destroyed with it; dlsync may own only an int handle "
                        "whose event is yours to give away")
        self = cls.__new__(cls)
        self._source = source
        self._handle = ctypes.c_void_p()
        _b.fence_import(handle, int(prov), 0 if capture_id is None else capture_id,
                        IMPORT_OWN if own else 0, self._handle)
        return self

    def _live(self) -> int:
        if self._handle is None or not self._handle.value:
            raise Error(INVALID_ARGUMENT, "the fence was closed")
        return self._handle.value

    def wait(self, stream: object) -> None:
        _b.fence_wait(self._live(), stream)

    def event(self) -> int:
        """The CUevent handle behind the fence (dlsync_fence_export_event),
        for another runtime to wait on: ``cudaStreamWaitEvent``,
        ``cupy.cuda.runtime.streamWaitEvent(stream.ptr, fence.event())``, an
        event-wait node. Valid while this fence is open; only wait on it
        (never record or destroy it). A fence signalled in a capture gives
        the event of its record node: wait only after launching that graph.
        Neither torch.cuda.Event nor cupy.cuda.Event can wrap a handle they
        did not create: on their streams use :meth:`wait`.
        Raises dlsync.Error (DLSYNC_ERROR_CAPTURE_ORDER) for a fence
        imported as CAPTURED: its event means something only inside that
        capture."""
        return _b.fence_export_event(self._live())

    @property
    def provenance(self) -> Optional[Provenance]:
        """The provenance the fence was imported with; None for a fence
        dlsync signalled (``Fence(stream)``)."""
        value = _b.fence_provenance(self._live())
        return None if value is None else Provenance(value)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and handle.value:
            _b.fence_release(handle.value)
        self._source = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report it to
            pass
