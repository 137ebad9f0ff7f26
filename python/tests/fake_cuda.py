# SPDX-License-Identifier: Apache-2.0
"""The fake CUDA driver (tests/fake/fake_libcuda.c, built as libcuda.so.1)
for the Python tests, without a GPU.

``DLSYNC_TEST_FAKE_LIBCUDA`` names it (ctest sets it); ``load()`` opens it
with RTLD_GLOBAL before dlsync creates its default context, so that the
library's dlopen("libcuda.so.1") finds it by its soname. It must run before
anything in the process asked dlsync for a context (import this module
first). The driver calls a test needs (a context current, streams, a
capture, work on a stream) are reached through the fake's
cuGetProcAddress_v2, its controls (fake_libcuda_fail_nth, ...) by name."""

import ctypes
import os

CUDA_SUCCESS = 0
CUDA_ERROR_UNKNOWN = 999
CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904
_vp = ctypes.c_void_p
_P = ctypes.POINTER


class FakeCuda:
    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        gpa = self.lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, _P(_vp), ctypes.c_int, ctypes.c_uint64, _vp]
        self._gpa = gpa
        self.lib.fake_libcuda_fail_nth.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_int]
        self.lib.fake_libcuda_call_count.argtypes = [ctypes.c_char_p]
        self.lib.fake_libcuda_call_count.restype = ctypes.c_uint
        self._check(self._fn("cuInit", ctypes.c_uint)(0), "cuInit")
        ctx = _vp()
        self._check(self._fn("cuDevicePrimaryCtxRetain", _P(_vp), ctypes.c_int)(
            ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self._check(self._fn("cuCtxPushCurrent", _vp)(ctx), "cuCtxPushCurrent")
        self._stream_create = self._fn("cuStreamCreate", _P(_vp), ctypes.c_uint)
        self._begin_capture = self._fn("cuStreamBeginCapture", _vp, ctypes.c_int)
        self._end_capture = self._fn("cuStreamEndCapture", _vp, _P(_vp))
        self._memset = self._fn("cuMemsetD32Async", ctypes.c_uint64, ctypes.c_uint,
                                ctypes.c_size_t, _vp)
        mem = ctypes.c_uint64()
        self._check(self._fn("cuMemAlloc", _P(ctypes.c_uint64), ctypes.c_size_t)(
            ctypes.byref(mem), 256), "cuMemAlloc")
        self._mem = mem.value

    def _fn(self, name, *argtypes):
        p = _vp()
        self._gpa(name.encode(), ctypes.byref(p), 12080, 0, None)
        if not p.value:
            raise RuntimeError(f"the fake driver has no {name}")
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)

    @staticmethod
    def _check(result, what):
        if result != CUDA_SUCCESS:
            raise RuntimeError(f"{what} on the fake driver: CUresult {result}")

    def stream(self):
        """A new non-blocking stream's handle."""
        s = _vp()
        self._check(self._stream_create(ctypes.byref(s), 1), "cuStreamCreate")
        return s.value

    def begin_capture(self, stream):
        self._check(self._begin_capture(stream, 0), "cuStreamBeginCapture")  # global mode

    def end_capture(self, stream):
        """cuStreamEndCapture's CUresult (904: a joined stream left unjoined)."""
        graph = _vp()
        return self._end_capture(stream, ctypes.byref(graph))

    def work(self, stream):
        """Some work queued on the stream (a memset)."""
        self._check(self._memset(self._mem, 0, 4, stream), "cuMemsetD32Async")

    def fail_nth(self, symbol, nth, result=CUDA_ERROR_UNKNOWN):
        """The nth call of `symbol` from now fails with `result` (one shot)."""
        self.lib.fake_libcuda_fail_nth(symbol.encode(), nth, result)

    def calls(self, symbol):
        return self.lib.fake_libcuda_call_count(symbol.encode())


_fake = None


def load():
    """(FakeCuda, None) or (None, why it is not there)."""
    global _fake
    if _fake is not None:
        return _fake, None
    path = os.environ.get("DLSYNC_TEST_FAKE_LIBCUDA")
    if not path:
        return None, "DLSYNC_TEST_FAKE_LIBCUDA is not set (ctest sets it)"
    _fake = FakeCuda(path)
    return _fake, None
