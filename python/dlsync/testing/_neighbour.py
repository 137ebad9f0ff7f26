# SPDX-License-Identifier: Apache-2.0
"""The thread beside the op's capture (check_capture's ``neighbour=``)."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any, List, Optional

from ._options import _WAIT_S, _messages

def _relax_this_thread() -> None:
    """Sets this thread's capture interaction mode to RELAXED, so that the
    harness's own neighbour thread is never the one that breaks a capture."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(2)  # CU_STREAM_CAPTURE_MODE_RELAXED
        cuda.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))
    except (OSError, AttributeError):
        pass


class _Neighbour(threading.Thread):
    """Another thread beside the op's capture: ``eager`` makes eager
    dlsync exchanges (with a kernel each) until the op has run; ``capture``
    holds a GLOBAL-mode capture of its own open while the op is captured."""

    def __init__(self, torch: Any, kind: str, device: Any):
        super().__init__(name=f"dlsync-testing-{kind}-neighbour", daemon=True)
        self.torch, self.kind, self.device = torch, kind, device
        self.a = torch.full((1 << 16,), 3.0, device=device)
        self.b = torch.zeros_like(self.a)
        self.s1, self.s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)
        self.graph: Any = None
        self.count = 0
        self.ready, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        torch = self.torch
        try:
            torch.cuda.set_device(self.device)
            if self.kind == "capture":
                self._capture(torch)
            else:
                self._exchange(torch)
        except BaseException as e:  # noqa: BLE001 - reported in the case
            self.error = e
        finally:
            self.ready.set()
            self.done.set()

    def _capture(self, torch: Any) -> None:
        _relax_this_thread()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(self.s2):
            g.capture_begin(capture_error_mode="global")
            try:
                self.ready.set()
                self.go.wait(_WAIT_S)
                torch.mul(self.a, 2, out=self.b)
            finally:
                g.capture_end()
        self.graph = g

    def _exchange(self, torch: Any) -> None:
        import dlsync

        def one() -> None:
            with dlsync.exchange(self.s1, self.s2), torch.cuda.stream(self.s2):
                torch.add(self.a, 1, out=self.b)
            self.count += 1

        one()  # warm: the context, the pool, this thread's state
        self.s2.synchronize()
        self.ready.set()
        while not self.go.is_set() and self.count < 20000:
            one()
            time.sleep(0)

    def stop(self) -> None:
        self.go.set()
        if not self.done.wait(_WAIT_S):
            self.error = self.error or TimeoutError("the neighbour thread did not finish")

    def problems(self) -> List[str]:
        """After the op's capture ended: the neighbour's errors, or a check
        of what it computed."""
        torch = self.torch
        if self.error is not None:
            return _messages(self.error)
        try:
            if self.kind == "capture":
                self.graph.replay()
                torch.cuda.synchronize()
                expect = 2 * self.a
            else:
                torch.cuda.synchronize()
                expect = self.a + 1
            if not torch.equal(self.b, expect):
                return [f"the {self.kind} neighbour read wrong data (its own check)"]
        except Exception as e:  # noqa: BLE001
            return _messages(e)
        return []
