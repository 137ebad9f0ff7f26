# SPDX-License-Identifier: Apache-2.0
"""The Python binding without a GPU: loading, stream handles, errors.

Plain unittest (no pytest needed); ctest runs it with DLSYNC_LIBRARY set."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402


class _WithProtocol:
    def __cuda_stream__(self):
        return (0, 0x1234)


class _TorchLike:
    cuda_stream = 0x5678


class _CupyLike:
    ptr = 0x9ABC


def _has_driver():
    try:
        dlsync.capture_state(dlsync.LEGACY)  # a valid handle wherever a driver is
        return True
    except dlsync.Error as e:
        return e.status != "DLSYNC_ERROR_NO_DRIVER"


class Binding(unittest.TestCase):
    def test_version_is_the_library_version(self):
        # MAJOR.MINOR.PATCH, with ".devN" between releases (version.h)
        self.assertRegex(dlsync.version(), r"^\d+\.\d+\.\d+(\.dev\d+)?$")

    def test_stream_handles_from_every_kind_of_object(self):
        self.assertEqual(dlsync.stream_handle(None), dlsync.LEGACY)
        self.assertEqual(dlsync.stream_handle(42), 42)
        self.assertEqual(dlsync.stream_handle(_WithProtocol()), 0x1234)
        self.assertEqual(dlsync.stream_handle(_TorchLike()), 0x5678)
        self.assertEqual(dlsync.stream_handle(_CupyLike()), 0x9ABC)
        with self.assertRaises(TypeError):
            dlsync.stream_handle(object())
        with self.assertRaises(TypeError):
            dlsync.stream_handle(True)

    @unittest.skipIf(_has_driver(), "a CUDA driver is present")
    def test_without_a_driver_errors_carry_status_and_message(self):
        with self.assertRaises(dlsync.Error) as info:
            with dlsync.exchange(0x10, 0x20):
                pass
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_NO_DRIVER")
        self.assertIn("libcuda.so.1", info.exception.message)
        with self.assertRaises(dlsync.Error) as info:
            with dlsync.exchange(0x10, 0x20, capture_stable=True):
                pass
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_NO_DRIVER")

    def test_wrap_passes_non_cuda_producers_through(self):
        class Host:
            def __dlpack_device__(self):
                return (1, 0)  # kDLCPU

            def __dlpack__(self, stream=None, **kw):
                return ("capsule", stream, kw)

        self.assertEqual(dlsync.wrap(Host()).__dlpack__(stream=None), ("capsule", None, {}))
        self.assertEqual(dlsync.wrap(Host()).__dlpack_device__(), (1, 0))

    def test_wrap_refuses_stream_zero_for_cuda(self):
        class Cuda:
            def __dlpack_device__(self):
                return (2, 0)

            def __dlpack__(self, stream=None, **kw):
                raise AssertionError("must not be reached")

        with self.assertRaises(dlsync.Error) as info:
            dlsync.wrap(Cuda(), producer=0x10).__dlpack__(stream=0)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")

    def test_wrap_with_no_sync_never_hands_minus_one_to_a_producer_without_a_stream(self):
        class Cuda:  # only __dlpack__: no stream dlsync could order after (JAX's case)
            def __dlpack_device__(self):
                return (2, 0)

            def __dlpack__(self, stream="not given", **kw):
                return stream

        self.assertEqual(dlsync.wrap(Cuda()).__dlpack__(stream=-1), "not given")

    def test_wrap_with_no_sync_hands_minus_one_to_a_producer_with_a_stream(self):
        class Cuda:
            def __dlpack_device__(self):
                return (2, 0)

            def __cuda_stream__(self):
                return (0, 0x10)

            def __dlpack__(self, stream=None, **kw):
                return stream

        self.assertEqual(dlsync.wrap(Cuda()).__dlpack__(stream=-1), -1)

    def test_scopes_nest_and_end_cleanly_when_empty(self):
        with dlsync.scope():
            with dlsync.scope():
                pass


if __name__ == "__main__":
    unittest.main()
