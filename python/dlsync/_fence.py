# SPDX-License-Identifier: Apache-2.0
"""dlsync.Fence (include/dlsync/fence.h)."""

from __future__ import annotations

import ctypes
from typing import Any, Optional

from ._backend import active as _b
from ._errors import INVALID_ARGUMENT, Error


class Fence:
    """A point in a stream's work that other streams can wait for, now or
    later (include/dlsync/fence.h)."""

    def __init__(self, stream: Any):
        # The library writes the fence into it (fence_signal's out): an
        # exception raised as the call returns leaves it for close/__del__.
        self._handle: Optional[ctypes.c_void_p] = ctypes.c_void_p()
        _b.fence_signal(stream, self._handle)

    def wait(self, stream: Any) -> None:
        if self._handle is None or not self._handle.value:
            raise Error(INVALID_ARGUMENT, "the fence was closed")
        _b.fence_wait(self._handle.value, stream)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None and handle.value:
            _b.fence_release(handle.value)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report it to
            pass
