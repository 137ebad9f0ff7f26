# SPDX-License-Identifier: Apache-2.0
"""Bad input to dlsync::nanobind::tensor (include/dlsync/nanobind.h), without a
GPU: the example module built with NB_EXAMPLE_CUDA=OFF (a stand-in stream
handle that is no stream), the dlsync package from the source tree
(DLSYNC_LIBRARY set) and the fake driver (tests/fake, as libcuda.so.1 on
LD_LIBRARY_PATH). Each case raises with a message naming what was wrong and
leaves no dlsync scope open. ctest runs it as nanobind_cpu
(tests/nanobind_cpu.sh).

    LD_LIBRARY_PATH=<build>/tests/fake_libcuda PYTHONPATH=<stub module folder>:python \
      DLSYNC_LIBRARY=<build>/libdlsync.so python3 examples/nanobind_ext/test_cpu.py
"""
import unittest

import dlsync
import dlsync_nb_example as ext


class FakeTensor:
    """A __dlpack__ object that claims a device and never exports."""

    def __init__(self, device=(2, 0), dlpack_error=None, device_error=None):
        self._device, self._dlpack_error, self._device_error = device, dlpack_error, device_error

    def __dlpack_device__(self):
        if self._device_error is not None:
            raise self._device_error
        return self._device

    def __dlpack__(self, **kwargs):
        if self._dlpack_error is not None:
            raise self._dlpack_error
        raise AssertionError("exported")


class BadInput(unittest.TestCase):
    def tearDown(self):
        self.assertEqual(dlsync._scope._scopes(), [], "a dlsync scope was left open")

    def raises(self, exc, text, *args, **kwargs):
        with self.assertRaises(exc) as cm:
            ext.scale(*args, **kwargs)
        self.assertIn(text, str(cm.exception))
        return cm.exception

    def test_none(self):
        self.raises(TypeError, "the argument is None, not a tensor", None, FakeTensor(), 2.0)

    def test_not_a_tensor(self):
        self.raises(TypeError, "int has no __dlpack__ / __dlpack_device__", 3, FakeTensor(), 2.0)

    def test_bad_device_answer(self):
        self.raises(TypeError, "did not return a (device_type, device_id) pair of ints",
                    FakeTensor(device="cuda"), FakeTensor(), 2.0)
        self.raises(TypeError, "pair of ints", FakeTensor(device=(2, "0")), FakeTensor(), 2.0)

    def test_the_producers_exception_is_raised(self):
        self.raises(RuntimeError, "the producer failed",
                    FakeTensor(device_error=RuntimeError("the producer failed")), FakeTensor(), 2.0)

    def test_a_tensor_of_another_device(self):
        self.raises(ValueError, "FakeTensor is on cuda:1, the extension's stream on cuda:0",
                    FakeTensor(device=(2, 1)), FakeTensor(), 2.0, device=0)

    def test_a_cpu_tensor_does_not_match(self):
        # Not CUDA: nanobind's own import, which this one refuses (its __dlpack__ raises).
        self.raises(TypeError, "(DLPack device type 1) does not match the extension's ndarray",
                    FakeTensor(device=(1, 0), dlpack_error=BufferError("cpu")), FakeTensor(), 2.0)

    def test_a_failure_inside_the_scope_closes_it(self):
        # Device unchecked: dlsync is asked about the stand-in stream, which
        # the (fake) driver refuses; the scope the header opened is closed
        # (tearDown) and nothing was exported (FakeTensor would raise).
        e = self.raises(dlsync.Error, "CUDA_ERROR_INVALID_HANDLE", FakeTensor(device=(2, 0)),
                        FakeTensor(), 2.0, device=-1)
        self.assertTrue(str(e).startswith("DLSYNC_ERROR_DRIVER: "), str(e))

    def test_bad_mode(self):
        self.raises(ValueError, 'mode is "dlsync" or "plain", not "fast"', FakeTensor(),
                    FakeTensor(), 2.0, mode="fast")


if __name__ == "__main__":
    unittest.main(verbosity=2)
