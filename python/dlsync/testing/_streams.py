# SPDX-License-Identifier: Apache-2.0
"""The streams a captured graph's work runs on at replay, for the report of
dlsync.testing: counted with CUPTI's activity records (each memset's and
kernel's streamId) by libdlsync_cupti_streams.so, built from
tools/cupti_streams.c where the CUDA toolkit's cupti.h is found (the same
code bench/replay_streams.c counts with). It links nothing: libcupti is
dlopened by it (DLSYNC_CUPTI_LIB, else libcupti.so from the loader's path
or the toolkit's usual folders), and it is loaded here with ctypes.

Where it cannot count (the shared object not built, libcupti not found,
CUPTI refusing: another profiler attached) the count is None with the
reason, and nothing fails. ``counter()`` is the one the harness uses; a
test replaces it with ``set_counter``."""

from __future__ import annotations

import ctypes
import os
from typing import Callable, List, Optional, Protocol, Tuple

LIBRARY = "libdlsync_cupti_streams.so"
_WHY_SIZE = 512


class StreamCounter(Protocol):
    """Counts the distinct streams the GPU work of ``run`` ran on."""

    def count(self, run: Callable[[], None]) -> Tuple[Optional[int], str]:
        """(streams, "") or (None, why not). ``run`` is called only where
        the counter can count; it must synchronise its work before it
        returns; an exception it raises goes on."""


def _candidates() -> List[str]:
    """Where the shared object may be: DLSYNC_CUPTI_STREAMS (a path), beside
    the libdlsync dlsync loaded (a build folder, an installed package)."""
    named = os.environ.get("DLSYNC_CUPTI_STREAMS", "")
    if named:
        return [named]
    out = []
    try:
        import dlsync  # noqa: PLC0415 - loads libdlsync; only when a count is asked for

        out.append(os.path.join(os.path.dirname(os.path.abspath(dlsync.library_path())),
                                LIBRARY))
        out.append(os.path.join(os.path.dirname(os.path.abspath(dlsync.__file__)), LIBRARY))
    except (ImportError, OSError):
        pass
    return out


class CuptiCounter:
    """The counter of tools/cupti_streams.c, loaded at the first count."""

    def __init__(self, path: Optional[str] = None):
        self._path = path
        self._lib: Optional[ctypes.CDLL] = None
        self._why = ""  # why it cannot count, once known

    def _load(self) -> Optional[ctypes.CDLL]:
        if self._lib is not None or self._why:
            return self._lib
        paths = [self._path] if self._path else _candidates()
        for p in paths:
            if not os.path.isfile(p):
                continue
            try:
                lib = ctypes.CDLL(p)
            except OSError as e:
                self._why = f"{p} does not load: {e}"
                return None
            for name in ("dlsync_cupti_streams_open", "dlsync_cupti_streams_start"):
                getattr(lib, name).restype = ctypes.c_int
                getattr(lib, name).argtypes = [ctypes.c_char_p, ctypes.c_size_t]
            stop = lib.dlsync_cupti_streams_stop
            stop.restype = ctypes.c_int
            stop.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int),
                             ctypes.c_char_p, ctypes.c_size_t]
            self._lib = lib
            return lib
        self._why = (f"{LIBRARY} not found (built from tools/cupti_streams.c where cupti.h "
                     "is found; DLSYNC_CUPTI_STREAMS names it)")
        return None

    def count(self, run: Callable[[], None]) -> Tuple[Optional[int], str]:
        lib = self._load()
        if lib is None:
            return None, self._why
        why = ctypes.create_string_buffer(_WHY_SIZE)
        if lib.dlsync_cupti_streams_start(why, _WHY_SIZE) != 0:
            return None, why.value.decode(errors="replace")
        streams, records = ctypes.c_int(0), ctypes.c_int(0)
        try:
            run()
        finally:
            stopped = lib.dlsync_cupti_streams_stop(ctypes.byref(streams), ctypes.byref(records),
                                                     why, _WHY_SIZE)
        if stopped != 0:
            return None, why.value.decode(errors="replace")
        if records.value == 0:
            return None, "CUPTI saw no memset and no kernel at the replay"
        return streams.value, ""


_counter: Optional[StreamCounter] = None


def counter() -> StreamCounter:
    """The counter the harness uses (a CuptiCounter unless set)."""
    global _counter
    if _counter is None:
        _counter = CuptiCounter()
    return _counter


def set_counter(c: Optional[StreamCounter]) -> Optional[StreamCounter]:
    """Replaces the counter (None: the CUPTI one again); returns the old."""
    global _counter
    old, _counter = _counter, c
    return old
