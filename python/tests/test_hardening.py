# SPDX-License-Identifier: Apache-2.0
"""Hardening of the Python binding, without a GPU:
every stream value is checked before ctypes sees it, and __dlpack__ applies
the library's DLPack rules (dlsync_dlpack_stream) rather than a copy.

Plain unittest; ctest runs it with DLSYNC_LIBRARY set."""
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402


class _CudaProducer:
    """A CUDA DLPack producer that records what it was asked."""

    def __init__(self):
        self.asked = []

    def __dlpack_device__(self):
        return (2, 0)  # kDLCUDA, device 0

    def __dlpack__(self, *, stream=None, **kwargs):
        self.asked.append(stream)
        return "capsule"


class _Proto:
    def __init__(self, value):
        self.value = value

    def __cuda_stream__(self):
        return (0, self.value)


class _Attr:
    def __init__(self, value):
        self.cuda_stream = value


class StreamValues(unittest.TestCase):
    def test_stream_handle_out_of_range_is_a_value_error_not_a_truncation(self):
        for bad in (2**64, 2**64 + 2, -1, -2, -(2**63)):
            with self.assertRaises(ValueError, msg=bad) as info:
                dlsync.stream_handle(bad)
            self.assertIn(str(bad), str(info.exception))

    def test_stream_handle_takes_ints_only(self):
        for bad in (1.5, 1.0, "1", True, False, b"\x01"):
            with self.assertRaises(TypeError, msg=repr(bad)):
                dlsync.stream_handle(bad)

    def test_stream_handle_limits_are_those_of_an_unsigned_pointer(self):
        self.assertEqual(dlsync.stream_handle(0), 0)
        self.assertEqual(dlsync.stream_handle(2**64 - 1), 2**64 - 1)

    def test_stream_objects_are_checked_like_ints(self):
        for bad in (2**64, -5):
            with self.assertRaises(ValueError):
                dlsync.stream_handle(_Proto(bad))
            with self.assertRaises(ValueError):
                dlsync.stream_handle(_Attr(bad))
        with self.assertRaises(TypeError):
            dlsync.stream_handle(_Proto(1.5))
        with self.assertRaises(TypeError):
            dlsync.stream_handle(_Attr(True))

    def test_exchange_of_out_of_range_streams_fails_before_the_library(self):
        # Before: 2**64 went out as the legacy stream, 2**64 + 2 as the
        # per-thread stream, 1.5 as the legacy stream.
        for producer, consumer in ((2**64, 0x10), (0x10, 2**64 + 2), (-7, 0x10)):
            with self.assertRaises(ValueError):
                with dlsync.exchange(producer, consumer):
                    pass
        with self.assertRaises(TypeError):
            with dlsync.exchange(1.5, 0x10):
                pass

    def test_fence_streams_are_checked(self):
        with self.assertRaises(ValueError):
            dlsync.Fence(2**64)


class DlpackValues(unittest.TestCase):
    def test_dlpack_minus_one_passes_through_without_the_driver(self):
        # A producer that exposes no stream is never handed -1 (JAX refuses it):
        # it is asked with no stream at all, and no driver call is made.
        p = _CudaProducer()
        self.assertEqual(dlsync.wrap(p, producer=0x10).__dlpack__(stream=-1), "capsule")
        self.assertEqual(p.asked, [None])

    def test_dlpack_zero_is_refused_by_the_library_rule(self):
        with self.assertRaises(dlsync.Error) as info:
            dlsync.wrap(_CudaProducer(), producer=0x10).__dlpack__(stream=0)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        self.assertIn("0", info.exception.message)

    def test_dlpack_below_minus_one_is_refused_by_the_library_rule(self):
        with self.assertRaises(dlsync.Error) as info:
            dlsync.wrap(_CudaProducer(), producer=0x10).__dlpack__(stream=-2)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")

    def test_dlpack_out_of_range_values_never_reach_ctypes(self):
        # Before: stream=2**64 slipped past the stream=0 check (ctypes: 0).
        for bad in (2**64, 2**63, -(2**63) - 1):
            with self.assertRaises(ValueError, msg=bad):
                dlsync.wrap(_CudaProducer(), producer=0x10).__dlpack__(stream=bad)

    def test_dlpack_takes_ints_only(self):
        for bad in (1.5, True, "2"):
            with self.assertRaises(TypeError, msg=repr(bad)):
                dlsync.wrap(_CudaProducer(), producer=0x10).__dlpack__(stream=bad)

    def test_dlpack_rules_come_from_the_library(self):
        # The binding no longer carries its own copy of the rules.
        import inspect

        src = inspect.getsource(dlsync._Wrapped.__dlpack__)
        self.assertIn("dlpack_stream", src)
        self.assertNotIn("PER_THREAD", src)


if __name__ == "__main__":
    unittest.main()
