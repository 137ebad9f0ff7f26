# SPDX-License-Identifier: Apache-2.0
"""dlsync.Fence (include/dlsync/fence.h)."""

from __future__ import annotations

from typing import Any

from ._backend import active as _b
from ._errors import INVALID_ARGUMENT, Error


class Fence:
    """A point in a stream's work that other streams can wait for, now or
    later (include/dlsync/fence.h)."""

    def __init__(self, stream: Any):
        self._handle = None
        self._handle = _b.fence_signal(stream)

    def wait(self, stream: Any) -> None:
        if self._handle is None:
            raise Error(INVALID_ARGUMENT, "the fence was closed")
        _b.fence_wait(self._handle, stream)

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            _b.fence_release(handle)

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to report it to
            pass
