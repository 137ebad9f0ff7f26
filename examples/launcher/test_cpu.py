# SPDX-License-Identifier: Apache-2.0
"""The launcher (launcher.py) without a GPU: the fake driver (tests/fake, as
libcuda.so.1 on LD_LIBRARY_PATH) and the stub kernel library (stub_kernel.c,
counting launches). Tensors are DLPack 1.x capsules made here, whose deleters
note how many launches had happened when they ran.

  after   both deleters run once, after the launch (released on the stream)
  before  the control: both ran before the launch
  no deleter: launched, nothing queued
  bad input: a TypeError / ValueError / the producer's exception with a
  message, nothing queued, and a tensor the launcher had taken handed back.

    LD_LIBRARY_PATH=<build>/tests/fake_libcuda PYTHONPATH=python DLSYNC_LIBRARY=<build>/libdlsync.so \\
      python3 examples/launcher/test_cpu.py <stub kernel .so>
"""
import ctypes
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dlsync  # noqa: E402
from launcher import Launcher, ManagedTensorVersioned  # noqa: E402

STUB = None
_F = ctypes.CFUNCTYPE


def _fake_stream() -> int:
    """A stream of the fake driver, made through its cuGetProcAddress_v2."""
    cuda = ctypes.CDLL("libcuda.so.1")  # the fake: LD_LIBRARY_PATH

    def proc(name):
        pfn, st = ctypes.c_void_p(), ctypes.c_int()
        rc = cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(pfn), 12080, ctypes.c_uint64(0),
                                      ctypes.byref(st))
        assert rc == 0 and pfn.value, f"the fake driver has no {name}"
        return pfn.value

    assert _F(ctypes.c_int, ctypes.c_uint)(proc("cuInit"))(0) == 0
    ctx = ctypes.c_void_p()
    assert _F(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int)(
        proc("cuDevicePrimaryCtxRetain"))(ctypes.byref(ctx), 0) == 0
    assert _F(ctypes.c_int, ctypes.c_void_p)(proc("cuCtxPushCurrent"))(ctx) == 0
    s = ctypes.c_void_p()
    assert _F(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint)(
        proc("cuStreamCreate"))(ctypes.byref(s), 1) == 0
    return s.value


_DELETER = _F(None, ctypes.c_void_p)
_pyapi = ctypes.pythonapi
_pyapi.PyCapsule_New.restype = ctypes.py_object
_pyapi.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Producer:
    """A CUDA tensor of n floats, exported as a DLPack capsule; records what
    __dlpack__ was asked and, per deleter call, the launches seen then."""

    def __init__(self, n=16, bits=32, versioned=True, deleter=True, device=(2, 0), error=None):
        self.n, self.bits, self.versioned, self.with_deleter = n, bits, versioned, deleter
        self.device, self.error = device, error
        self.asked, self.deleted = [], []
        self._keep = []

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, *, stream=None, max_version=None, **kw):
        self.asked.append((stream, max_version))
        if self.error is not None:
            raise self.error
        m = ManagedTensorVersioned()
        m.version.major, m.version.minor = 1, 0
        shape = (ctypes.c_int64 * 1)(self.n)
        m.dl_tensor.data = 0x1000  # never read: the stub kernel does not touch memory
        m.dl_tensor.device.device_type, m.dl_tensor.device.device_id = self.device
        m.dl_tensor.ndim = 1
        m.dl_tensor.dtype.code, m.dl_tensor.dtype.bits, m.dl_tensor.dtype.lanes = 2, self.bits, 1
        m.dl_tensor.shape = shape
        if self.with_deleter:
            cb = _DELETER(lambda _p: self.deleted.append(STUB.ln_launches()))
            m.deleter = ctypes.cast(cb, ctypes.c_void_p).value
            self._keep.append(cb)
        self._keep += [m, shape]
        name = b"dltensor_versioned" if self.versioned else b"dltensor"
        return _pyapi.PyCapsule_New(ctypes.addressof(m), name, None)


class LauncherOnTheFakeDriver(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.stream = _fake_stream()
        cls.ln = Launcher(sys.argv[1])

    def setUp(self):
        self.ln.flush()
        self.before = self.ln.stats()

    def launches(self):
        return STUB.ln_launches()

    def queued(self):
        now = self.ln.stats()
        return (now.pending_eager + now.done) - (self.before.pending_eager + self.before.done)

    def test_after_the_deleters_run_once_after_the_launch(self):
        x, out = Producer(), Producer()
        n0 = self.launches()
        self.ln.scale(x, out, 2.0, stream=self.stream)
        self.ln.flush()
        self.assertEqual(self.launches(), n0 + 1)
        self.assertEqual(x.deleted, [n0 + 1])  # once, with the launch already made
        self.assertEqual(out.deleted, [n0 + 1])
        self.assertEqual(x.asked, [(self.stream, (1, 0))])  # the launch stream, DLPack 1.x
        self.assertEqual(self.queued(), 2)

    def test_before_the_control_runs_the_deleters_before_the_launch(self):
        x, out = Producer(), Producer()
        n0 = self.launches()
        self.ln.scale(x, out, 2.0, stream=self.stream, release="before")
        self.assertEqual(self.launches(), n0 + 1)
        self.assertEqual(x.deleted, [n0])  # the control can fail: the deleter saw no launch
        self.assertEqual(out.deleted, [n0])
        self.assertEqual(self.queued(), 0)

    def test_a_tensor_without_a_deleter_is_launched_and_not_released(self):
        x, out = Producer(deleter=False), Producer(deleter=False)
        n0 = self.launches()
        self.ln.scale(x, out, 2.0, stream=self.stream)
        self.ln.flush()
        self.assertEqual(self.launches(), n0 + 1)
        self.assertEqual(self.queued(), 0)

    def bad(self, exc, text, x, out, **kw):
        n0 = self.launches()
        with self.assertRaises(exc) as cm:
            self.ln.scale(x, out, 2.0, **{"stream": self.stream, **kw})
        self.assertIn(text, str(cm.exception))
        self.ln.flush()
        self.assertEqual(self.launches(), n0, "launched despite bad input")
        return cm.exception

    def test_not_a_tensor(self):
        self.bad(TypeError, "x (int) has no __dlpack__", 3, Producer())

    def test_not_cuda(self):
        self.bad(ValueError, "x is on DLPack device type 1, not CUDA", Producer(device=(1, 0)),
                 Producer())

    def test_the_producers_exception(self):
        out = Producer(error=RuntimeError("the producer failed"))
        x = Producer()
        self.bad(RuntimeError, "the producer failed", x, out)
        self.assertEqual(len(x.deleted), 1)  # x, already taken, handed back (released)
        self.assertEqual(self.queued(), 1)

    def test_an_unversioned_capsule(self):
        self.bad(TypeError, "no DLPack 1.x capsule", Producer(versioned=False), Producer())

    def test_a_float64_tensor_is_handed_back(self):
        x = Producer(bits=64)
        self.bad(TypeError, "x is not a contiguous float32 DLPack 1.x tensor", x, Producer())
        self.assertEqual(len(x.deleted), 1)
        self.assertEqual(self.queued(), 0)

    def test_sizes_differ(self):
        x, out = Producer(n=16), Producer(n=8)
        self.bad(ValueError, "x and out differ in size", x, out)
        self.assertEqual((len(x.deleted), len(out.deleted)), (1, 1))

    def test_bad_release_and_stream(self):
        self.bad(ValueError, 'release is "after" or "before", not \'soon\'', Producer(), Producer(),
                 release="soon")
        self.bad(TypeError, "stream is a CUDA stream handle (an int >= 0), not 'abc'", Producer(),
                 Producer(), stream="abc")


if __name__ == "__main__":
    STUB = ctypes.CDLL(sys.argv[1])
    STUB.ln_launches.restype = ctypes.c_int
    unittest.main(argv=sys.argv[:1], verbosity=2)
