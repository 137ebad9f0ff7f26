# SPDX-License-Identifier: Apache-2.0
"""A kernel launcher that takes any ``__dlpack__`` object, holds its tensor
only for the launch, and releases it ordered after the launch.

    from launcher import Launcher
    ln = Launcher("build/release/libdlsync_launcher_kernel.so")
    ln.scale(x, out, 2.0)          # out = 2 x on torch's current stream (or stream=)

Each tensor is imported with ``__dlpack__(stream=<the launch stream>,
max_version=(1, 0))``: the producer orders its pending work before that
stream. The launcher then owns the DLPack 1.x tensor (the capsule renamed
``used_dltensor_versioned``, as the protocol has it) and hands it to
``dlsync_dlpack_release`` after the launch: its deleter runs once the work
queued on the stream so far (the kernel) is done, on dlsync's reclaimer
thread, or, when the stream is being captured, when the graph is destroyed.
The producer (PyTorch's caching allocator, say) cannot reuse the memory
while the kernel may still read it.

``release="before"`` is the control: the deleter runs before the launch,
the way a launcher that drops its reference when the call returns does.

Bad input raises with a message and leaves nothing queued: an object without
``__dlpack__`` / ``__dlpack_device__`` (TypeError), a device that is not CUDA
(ValueError), a capsule that is not DLPack 1.x (TypeError), a tensor that is
not a contiguous float32 one (TypeError; its deleter is called), the
producer's own exception. A tensor without a deleter (DLPack allows NULL) is
launched and not released: there is nothing to run after it.
"""
import ctypes
from typing import Any, Optional

import dlsync

_KDLCUDA = 2
_KDLFLOAT = 2


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class ManagedTensorVersioned(ctypes.Structure):
    """DLPack 1.x's DLManagedTensorVersioned (dlpack.h 1.x ABI)."""

    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", _DLTensor)]


class _Lane(ctypes.Structure):  # include/dlsync/lane.h
    _fields_ = [("kind", ctypes.c_int), ("stream", ctypes.c_void_p), ("graph", ctypes.c_void_p),
                ("deps", ctypes.c_void_p), ("ndeps", ctypes.c_size_t),
                ("capacity", ctypes.c_size_t)]


class ReleaseStats(ctypes.Structure):  # include/dlsync/release.h
    _fields_ = [("size", ctypes.c_size_t), ("version", ctypes.c_uint32),
                ("pending_eager", ctypes.c_size_t), ("pending_graph", ctypes.c_size_t),
                ("done", ctypes.c_size_t), ("sync_failures", ctypes.c_size_t),
                ("mode_failures", ctypes.c_size_t), ("blocked", ctypes.c_size_t)]


_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_USED = ctypes.c_char_p(b"used_dltensor_versioned")  # kept alive: the capsule keeps the pointer


class Launcher:
    """Launches the example kernel (kernel.cu) on tensors of any DLPack producer."""

    def __init__(self, kernel_lib: str, spin: int = 0):
        self._k = ctypes.CDLL(kernel_lib)
        self._k.ln_spin_scale.restype = ctypes.c_int
        self._k.ln_spin_scale.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                          ctypes.c_float, ctypes.c_longlong, ctypes.c_void_p]
        self._k.ln_stream_sync.restype = ctypes.c_int
        self._k.ln_stream_sync.argtypes = [ctypes.c_void_p]
        self._k.ln_error_string.restype = ctypes.c_char_p
        d = self._d = ctypes.CDLL(dlsync.library_path())
        d.dlsync_context_default.restype = ctypes.c_int
        d.dlsync_context_default.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        d.dlsync_dlpack_release.restype = ctypes.c_int
        d.dlsync_dlpack_release.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Lane), ctypes.c_void_p]
        d.dlsync_dlpack_call_deleter.restype = None
        d.dlsync_dlpack_call_deleter.argtypes = [ctypes.c_void_p]
        d.dlsync_release_flush.restype = ctypes.c_int
        d.dlsync_release_flush.argtypes = [ctypes.c_void_p]
        d.dlsync_release_get_stats.restype = ctypes.c_int
        d.dlsync_release_get_stats.argtypes = [ctypes.POINTER(ReleaseStats), ctypes.c_void_p]
        d.dlsync_status_name.restype = ctypes.c_char_p
        d.dlsync_status_name.argtypes = [ctypes.c_int]
        d.dlsync_last_error.restype = ctypes.c_char_p
        self._ctx = ctypes.c_void_p()
        self._check(d.dlsync_context_default(ctypes.byref(self._ctx)))
        self.spin = spin

    def _check(self, status: int) -> None:
        if status != 0:
            raise dlsync.Error(self._d.dlsync_status_name(status).decode(),
                               self._d.dlsync_last_error().decode())

    def flush(self) -> None:
        """Waits for the eager releases (dlsync_release_flush)."""
        self._check(self._d.dlsync_release_flush(self._ctx))

    def stats(self) -> ReleaseStats:
        out = ReleaseStats(ctypes.sizeof(ReleaseStats), 1)
        self._check(self._d.dlsync_release_get_stats(ctypes.byref(out), self._ctx))
        return out

    def _import(self, obj: Any, stream: int, what: str) -> int:
        """The DLManagedTensorVersioned * of obj's export to `stream`, now the
        launcher's (the capsule renamed)."""
        if not hasattr(obj, "__dlpack__") or not hasattr(obj, "__dlpack_device__"):
            raise TypeError(f"launcher: {what} ({type(obj).__name__}) has no __dlpack__ / "
                            "__dlpack_device__: not a DLPack tensor")
        device_type, _ = obj.__dlpack_device__()
        if int(device_type) != _KDLCUDA:
            raise ValueError(f"launcher: {what} is on DLPack device type {int(device_type)}, "
                             "not CUDA (2)")
        capsule = obj.__dlpack__(stream=stream, max_version=(1, 0))
        if not _api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
            raise TypeError(f"launcher: {what}'s __dlpack__ returned no DLPack 1.x capsule "
                            "(\"dltensor_versioned\"); the producer is too old")
        ptr = _api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        if _api.PyCapsule_SetName(capsule, _USED) != 0:
            raise RuntimeError("launcher: PyCapsule_SetName failed")
        m = ManagedTensorVersioned.from_address(ptr)
        t = m.dl_tensor
        ok = (m.version.major == 1 and t.dtype.code == _KDLFLOAT and t.dtype.bits == 32
              and t.dtype.lanes == 1 and (not t.strides or self._compact(t)))
        if not ok:
            self._d.dlsync_dlpack_call_deleter(ptr)
            raise TypeError(f"launcher: {what} is not a contiguous float32 DLPack 1.x tensor")
        return ptr

    @staticmethod
    def _compact(t: _DLTensor) -> bool:
        expect = 1
        for i in reversed(range(t.ndim)):
            if t.shape[i] != 1 and t.strides[i] != expect:
                return False
            expect *= t.shape[i]
        return True

    @staticmethod
    def _numel(ptr: int) -> int:
        t = ManagedTensorVersioned.from_address(ptr).dl_tensor
        n = 1
        for i in range(t.ndim):
            n *= t.shape[i]
        return n

    @staticmethod
    def _data(ptr: int) -> int:
        t = ManagedTensorVersioned.from_address(ptr).dl_tensor
        return (t.data or 0) + t.byte_offset

    def _release(self, ptrs, stream: int) -> None:
        """dlsync_dlpack_release of each tensor on `stream`; a tensor without
        a deleter is skipped. If a release fails, the stream is synchronised,
        the tensors not yet released are handed back, and the error raised."""
        lane = _Lane(1, stream, None, None, 0, 0)
        for i, ptr in enumerate(ptrs):
            if not ManagedTensorVersioned.from_address(ptr).deleter:
                continue
            st = self._d.dlsync_dlpack_release(self._ctx, ctypes.byref(lane), ptr)
            if st != 0:
                name = self._d.dlsync_status_name(st).decode()
                msg = self._d.dlsync_last_error().decode()
                self._k.ln_stream_sync(stream)  # no capture: a release only fails eagerly here
                for rest in ptrs[i:]:
                    self._d.dlsync_dlpack_call_deleter(rest)
                raise dlsync.Error(name, msg)

    def scale(self, x: Any, out: Any, a: float, stream: Optional[int] = None,
              release: str = "after") -> None:
        """out = a * x on `stream` (a CUDA stream handle; None: PyTorch's
        current stream). release: "after" (dlsync_dlpack_release after the
        launch) or "before" (the control: the deleters run before it)."""
        if release not in ("after", "before"):
            raise ValueError(f'launcher: release is "after" or "before", not {release!r}')
        if stream is None:
            import torch

            stream = torch.cuda.current_stream().cuda_stream
        if not isinstance(stream, int) or isinstance(stream, bool) or stream < 0:
            raise TypeError(f"launcher: stream is a CUDA stream handle (an int >= 0), not "
                            f"{stream!r}")
        value = stream if stream not in (0, None) else 1  # __dlpack__'s value for the NULL stream
        px = self._import(x, value, "x")
        try:
            po = self._import(out, value, "out")
        except BaseException:
            self._release([px], stream) if release == "after" else \
                self._d.dlsync_dlpack_call_deleter(px)
            raise
        if self._numel(px) != self._numel(po):
            self._release([px, po], stream)
            raise ValueError("launcher: x and out differ in size")
        n, dst, src = self._numel(px), self._data(po), self._data(px)
        if release == "before":  # the control: what a launcher without stream-ordered release does
            self._d.dlsync_dlpack_call_deleter(px)
            self._d.dlsync_dlpack_call_deleter(po)
        rc = self._k.ln_spin_scale(dst, src, n, float(a), self.spin, stream)
        if release == "after":
            self._release([px, po], stream)
        if rc != 0:
            raise RuntimeError(f"launcher: launch: {self._k.ln_error_string(rc).decode()}")
