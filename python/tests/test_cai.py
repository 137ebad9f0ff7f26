# SPDX-License-Identifier: Apache-2.0
"""The CUDA Array Interface in and out of dlsync, without a GPU.

Producers that expose only ``__cuda_array_interface__`` (what a Numba device
array exposes) given to dlsync.exchange, its many-producer form and
dlsync.wrap; dlsync.wrap(x, consumer=stream).__cuda_array_interface__ for a
CAI consumer; every malformed dict refused by name with nothing queued. The
exchanges are recorded by a fake backend (test_producers._Log); the last
class runs them through the library on the fake CUDA driver (fake_cuda.py),
a capture included. Plain unittest; ctest runs it with DLSYNC_LIBRARY and
DLSYNC_TEST_FAKE_LIBCUDA set."""
import os
import sys
import types
import unittest
from unittest import mock

import fake_cuda  # before dlsync asks for a context

FAKE, WHY = fake_cuda.load()
if os.environ.get("DLSYNC_TEST_PKG"):  # a copy with the compiled backend built into it
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from test_producers import _Log, _producer_class  # noqa: E402

PTR = 0x7F0000000000


class CaiArray:
    """An object with only __cuda_array_interface__ (as a Numba device array)."""

    def __init__(self, desc):
        self.desc = desc

    @property
    def __cuda_array_interface__(self):
        return self.desc


def cai(stream="absent", readonly=False, **changes):
    """A valid CAI v3 dict of a float32 [4, 8] array, with `changes` applied
    (a value of `...` removes that key)."""
    desc = {"shape": (4, 8), "typestr": "<f4", "data": (PTR, readonly), "strides": None,
            "version": 3}
    if stream != "absent":
        desc["stream"] = stream
    for k, v in changes.items():
        if v is ...:
            desc.pop(k, None)
        else:
            desc[k] = v
    return CaiArray(desc)


class _Logged(unittest.TestCase):
    def setUp(self):
        self.log = _Log()
        self.log.patch(self)
        p = mock.patch.dict(sys.modules, {"torch": None, "cupy": None})
        p.start()
        self.addCleanup(p.stop)

    def tearDown(self):
        self.assertEqual(self.log.open, {}, "exchanges begun and never ended")


class ProducersIn(_Logged):
    def test_exchange_orders_after_the_stream_the_dict_names(self):
        with dlsync.exchange(cai(stream=0x5A), 0xC0):
            self.assertEqual(self.log.calls, [("begin", 0x5A, 0xC0, 0)])
        self.assertEqual(self.log.calls[1:], [("end", 0x5A, 0xC0)])

    def test_no_stream_key_or_none_means_nothing_to_order(self):
        for producer in (cai(), cai(stream=None), cai(version=2)):
            with dlsync.exchange(producer, 0xC0):
                pass
        self.assertEqual(self.log.calls, [])

    def test_legacy_and_per_thread_values_are_those_streams(self):
        for value in (dlsync.LEGACY, dlsync.PER_THREAD):
            with dlsync.exchange(cai(stream=value), 0xC0):
                pass
        self.assertEqual(self.log.calls, [("begin", 1, 0xC0, 0), ("end", 1, 0xC0),
                                          ("begin", 2, 0xC0, 0), ("end", 2, 0xC0)])

    def test_the_many_form_takes_cai_producers_beside_streams(self):
        producers = [cai(stream=0x51), 0x52, cai(stream=None), cai(stream=0x51), cai()]
        with dlsync.exchange(producers, 0xC0, capture_stable=True):
            self.assertEqual(self.log.calls, [("begin_many", (0x51, 0x52), 0xC0, 1)])
        self.assertEqual(self.log.calls[1:], [("end", (0x51, 0x52), 0xC0)])

    def test_a_tuple_of_cai_producers_with_no_stream_orders_nothing(self):
        with dlsync.exchange((cai(), cai(stream=None)), 0xC0):
            pass
        self.assertEqual(self.log.calls, [])


class ConsumersOut(_Logged):
    def test_reading_the_interface_orders_the_consumer_and_exports_no_stream(self):
        w = dlsync.wrap(cai(stream=0x5A, strides=(32, 4)), consumer=0xC0)
        self.assertFalse(hasattr(w, "__dlpack__"))  # only the CAI: nothing to export as DLPack
        desc = w.__cuda_array_interface__
        self.assertEqual(self.log.calls, [("begin", 0x5A, 0xC0, 0), ("end", 0x5A, 0xC0)])
        self.assertEqual(desc, {"shape": (4, 8), "typestr": "<f4", "data": (PTR, False),
                                "strides": (32, 4), "version": 3, "stream": None})
        self.assertNotIn("mask", desc)

    def test_read_only_stays_read_only_and_descr_is_kept(self):
        descr = [("", "<f4")]
        desc = dlsync.wrap(cai(readonly=True, descr=descr), consumer=0xC0).__cuda_array_interface__
        self.assertEqual(desc["data"], (PTR, True))
        self.assertEqual(desc["descr"], descr)
        self.assertEqual(self.log.calls, [])  # the dict names no stream: nothing to order

    def test_in_a_scope_the_scope_ends_the_exchange_and_reads_share_it(self):
        self.log.capturing.add(0x5A)
        w = dlsync.wrap(cai(stream=0x5A), consumer=0xC0)
        with dlsync.scope():
            w.__cuda_array_interface__
            w.__cuda_array_interface__  # Numba reads it more than once: one exchange
            self.assertEqual(self.log.calls, [("begin", 0x5A, 0xC0, 0)])
        self.assertEqual(self.log.calls[1:], [("end", 0x5A, 0xC0)])

    def test_a_capturing_producer_outside_a_scope_is_refused_untouched(self):
        self.log.capturing.add(0x5A)
        with self.assertRaises(dlsync.Error) as info:
            dlsync.wrap(cai(stream=0x5A), consumer=0xC0).__cuda_array_interface__
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_CAPTURE_ORDER")
        self.assertIn("dlsync.scope()", info.exception.message)
        self.assertEqual(self.log.calls, [])

    def test_producer_named_wins_over_the_dict(self):
        dlsync.wrap(cai(stream=0x5A), producer=0x99, consumer=0xC0).__cuda_array_interface__
        self.assertEqual(self.log.calls, [("begin", 0x99, 0xC0, 0), ("end", 0x99, 0xC0)])

    def test_a_stream_object_as_consumer(self):
        consumer = types.SimpleNamespace(__cuda_stream__=lambda: (0, 0xC7))
        dlsync.wrap(cai(stream=0x5A), consumer=consumer).__cuda_array_interface__
        self.assertEqual(self.log.calls, [("begin", 0x5A, 0xC7, 0), ("end", 0x5A, 0xC7)])

    def test_without_a_consumer_stream_reading_it_says_to_name_one(self):
        w = dlsync.wrap(cai(stream=0x5A))
        with self.assertRaises(TypeError) as info:
            w.__cuda_array_interface__
        self.assertIn("consumer=", str(info.exception))
        self.assertEqual(self.log.calls, [])


def _torch_like(cai_desc, module="torch"):
    """A DLPack producer of module `module` that also exposes `cai_desc`."""
    cls = _producer_class(module=module)
    cls.__cuda_array_interface__ = property(lambda self: cai_desc)
    return cls


class BothProtocols(_Logged):
    def test_the_dlpack_rules_win_over_a_cai_without_a_stream(self):
        # PyTorch: CAI v2, no stream key, while its current (side) stream still runs the producer.
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            current_device=lambda: 1,
            current_stream=lambda d: types.SimpleNamespace(cuda_stream=0x70)))
        cls = _torch_like({"shape": (4,), "typestr": "<f4", "data": (PTR, False),
                           "version": 2})
        with mock.patch.dict(sys.modules, {"torch": torch}):
            w = dlsync.wrap(cls(), consumer=0xC0)
            desc = w.__cuda_array_interface__
            self.assertEqual(self.log.calls, [("begin", 0x70, 0xC0, 0), ("end", 0x70, 0xC0)])
            self.assertEqual((desc["version"], desc["stream"], desc["strides"]), (3, None, None))
            # It is still a DLPack producer, ordered the DLPack way.
            w.__dlpack__(stream=0xC1)
        self.assertEqual(self.log.calls[2:], [("begin", 0x70, 0xC1, 0), ("end", 0x70, 0xC1)])
        self.assertEqual(cls.asked, -1)

    def test_a_dlpack_producer_with_no_stream_falls_back_to_the_cai_stream(self):
        cls = _torch_like({"shape": (4,), "typestr": "<f4", "data": (PTR, False),
                           "version": 3, "stream": 0x77}, module="somelib")
        dlsync.wrap(cls(), consumer=0xC0).__cuda_array_interface__
        self.assertEqual(self.log.calls, [("begin", 0x77, 0xC0, 0), ("end", 0x77, 0xC0)])

    def test_exchange_keeps_the_dlpack_rules_for_such_objects(self):
        cls = _torch_like({"shape": (4,), "typestr": "<f4", "data": (PTR, False),
                           "version": 3, "stream": 0x77}, module="somelib")
        cls.__cuda_stream__ = lambda self: (0, 0x55)
        with dlsync.exchange(cls(), 0xC0):
            pass
        self.assertEqual(self.log.calls, [("begin", 0x55, 0xC0, 0), ("end", 0x55, 0xC0)])

    def test_exchange_leaves_such_objects_to_the_dlpack_rules_alone(self):
        # The CAI of an object with __dlpack__ is never read by exchange (a
        # property that may raise or block): one that exposes no stream to the
        # DLPack rules is still told to go through wrap.
        reads = []
        cls = _producer_class(module="somelib")
        cls.__cuda_array_interface__ = property(
            lambda self: reads.append(1) or {"shape": (4,), "typestr": "<f4",
                                             "data": (PTR, False), "version": 3,
                                             "stream": 0x77})
        for producer in (cls(), [cls(), 0x51]):
            with self.assertRaises(dlsync.Error) as info:
                with dlsync.exchange(producer, 0xC0):
                    pass
            self.assertIn("dlsync.wrap", info.exception.message)
        self.assertEqual(reads, [])
        self.assertEqual(self.log.calls, [])

    def test_a_cai_property_that_raises_is_not_touched_by_wrap_or_exchange(self):
        # PyTorch raises from __cuda_array_interface__ for a tensor that
        # requires grad; its DLPack path must not notice.
        def raising(self):
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires grad")

        cls = _producer_class(cuda_stream=0x55)
        cls.__cuda_array_interface__ = property(raising)
        with dlsync.exchange(cls(), 0xC0):
            pass
        dlsync.wrap(cls()).__dlpack__(stream=0xC1)
        self.assertEqual(self.log.calls, [("begin", 0x55, 0xC0, 0), ("end", 0x55, 0xC0),
                                          ("begin", 0x55, 0xC1, 0), ("end", 0x55, 0xC1)])

    def test_an_attribute_error_inside_is_not_read_as_no_interface(self):
        # Numba asks hasattr(x, "__cuda_array_interface__") first: an
        # AttributeError raised while exporting would read as "not an array".
        cls = _torch_like({"shape": (4,), "typestr": "<f4", "data": (PTR, False),
                           "version": 3}, module="somelib")
        del cls.__dlpack_device__
        w = dlsync.wrap(cls(), consumer=0xC0)
        with self.assertRaises(TypeError) as info:
            hasattr(w, "__cuda_array_interface__")
        self.assertIn("__dlpack_device__", str(info.exception))
        self.assertEqual(self.log.calls, [])

    def test_a_dlpack_only_object_has_no_interface_to_export(self):
        w = dlsync.wrap(_producer_class(module="somelib")(), consumer=0xC0)
        with self.assertRaises(TypeError) as info:
            w.__cuda_array_interface__
        self.assertIn("__cuda_array_interface__", str(info.exception))
        self.assertEqual(self.log.calls, [])


class BadInput(_Logged):
    """Each malformed dict: the exception names the key, nothing is queued,
    through exchange and through wrap(..., consumer=)."""

    def refused(self, producer, exc, *words, writable=False):
        for attempt in ("wrap",) if writable else ("exchange", "many", "wrap"):
            with self.subTest(attempt=attempt):
                with self.assertRaises(exc) as info:
                    if attempt == "exchange":
                        with dlsync.exchange(producer, 0xC0):
                            self.fail("the block must not run")
                    elif attempt == "many":
                        with dlsync.exchange([0x51, producer], 0xC0):
                            self.fail("the block must not run")
                    else:
                        dlsync.wrap(producer, consumer=0xC0,
                                    writable=writable).__cuda_array_interface__
                for w in words:
                    self.assertIn(w, str(info.exception))
                self.assertEqual(self.log.calls, [])  # writing is a wrap promise only

    def test_missing_keys(self):
        for key in ("shape", "typestr", "data", "version"):
            with self.subTest(key=key):
                self.refused(cai(stream=0x5A, **{key: ...}), ValueError, f"['{key}']",
                             "missing")

    def test_stream_zero_is_disallowed(self):
        self.refused(cai(stream=0), ValueError, "['stream']", "disallow")

    def test_negative_or_too_large_streams(self):
        for value in (-1, -0x5A, 1 << 64):
            with self.subTest(value=value):
                self.refused(cai(stream=value), ValueError, "['stream']", str(value))

    def test_streams_that_are_not_ints(self):
        for value in (1.0, "0x5a", True, object()):
            with self.subTest(value=value):
                self.refused(cai(stream=value), TypeError, "['stream']")

    def test_a_stream_key_before_version_3(self):
        for version in (0, 1, 2):
            with self.subTest(version=version):
                self.refused(cai(stream=0x5A, version=version), ValueError, "['stream']",
                             "['version']")

    def test_unknown_versions(self):
        for version in (4, -1, "3", None):
            with self.subTest(version=version):
                self.refused(cai(stream=0x5A, version=version), ValueError, "['version']")

    def test_masks(self):
        self.refused(cai(stream=0x5A, mask=cai()), ValueError, "['mask']")

    def test_a_read_only_array_offered_for_writing(self):
        self.refused(cai(stream=0x5A, readonly=True), ValueError, "['data']", "read-only",
                     writable=True)
        dlsync.wrap(cai(stream=0x5A), consumer=0xC0, writable=True).__cuda_array_interface__
        self.assertEqual([c[0] for c in self.log.calls], ["begin", "end"])

    def test_malformed_values(self):
        cases = [(dict(data=PTR), TypeError, "['data']"),
                 (dict(data=(PTR, 0)), TypeError, "['data']"),
                 (dict(data=(-1, False)), ValueError, "['data']"),
                 (dict(shape=4), TypeError, "['shape']"),
                 (dict(shape=(4, -1)), ValueError, "['shape']"),
                 (dict(typestr=4), TypeError, "['typestr']"),
                 (dict(strides=(4,)), ValueError, "['strides']"),
                 (dict(strides=(32.0, 4)), TypeError, "['strides']")]
        for changes, exc, word in cases:
            with self.subTest(changes=changes):
                self.refused(cai(stream=0x5A, **changes), exc, word)

    def test_not_a_dict(self):
        self.refused(CaiArray([("shape", (4,))]), TypeError, "__cuda_array_interface__",
                     "dict")

    def test_a_consumer_stream_of_another_device(self):
        # Detectable without a driver call only where both say their device:
        # the array's __dlpack_device__ and the stream object's device_id
        # (CuPy) or device.index (PyTorch).
        cls = _torch_like({"shape": (4,), "typestr": "<f4", "data": (PTR, False),
                           "version": 3, "stream": 0x77}, module="somelib")  # device 1
        for stream in (types.SimpleNamespace(ptr=0xC1, device_id=0),
                       types.SimpleNamespace(cuda_stream=0xC1,
                                             device=types.SimpleNamespace(index=2))):
            with self.subTest(stream=stream):
                with self.assertRaises(ValueError) as info:
                    dlsync.wrap(cls(), consumer=stream).__cuda_array_interface__
                self.assertIn("device", str(info.exception))
                self.assertIn("0xc1", str(info.exception))
        same = types.SimpleNamespace(ptr=0xC1, device_id=1)
        self.assertEqual(self.log.calls, [])
        dlsync.wrap(cls(), consumer=same).__cuda_array_interface__
        self.assertEqual(self.log.calls, [("begin", 0x77, 0xC1, 0), ("end", 0x77, 0xC1)])


@unittest.skipIf(FAKE is None, f"no fake driver: {WHY}")
class OnTheFakeDriver(unittest.TestCase):
    """The library's exchange with a CAI producer stream that captures: the
    consumer joins the capture on the read and the scope joins it back."""

    def test_a_capturing_cai_producer_joins_the_consumer_and_the_scope_joins_it_back(self):
        p, c = FAKE.stream(), FAKE.stream()
        FAKE.begin_capture(p)
        FAKE.work(p)
        arr = cai(stream=p)
        with dlsync.scope():
            dlsync.wrap(arr, consumer=c).__cuda_array_interface__
            self.assertEqual(dlsync.capture_state(c), "capturing")
            FAKE.work(c)  # the consumer's kernel, in the capture
        self.assertEqual(FAKE.end_capture(p), fake_cuda.CUDA_SUCCESS)
        self.assertEqual(dlsync.capture_state(c), "eager")

    def test_exchange_with_a_capturing_cai_producer(self):
        p, c = FAKE.stream(), FAKE.stream()
        FAKE.begin_capture(p)
        with dlsync.exchange(cai(stream=p), c):
            self.assertEqual(dlsync.capture_state(c), "capturing")
            FAKE.work(c)
        self.assertEqual(FAKE.end_capture(p), fake_cuda.CUDA_SUCCESS)

    def test_refused_outside_a_scope_and_the_capture_is_intact(self):
        p, c = FAKE.stream(), FAKE.stream()
        FAKE.begin_capture(p)
        with self.assertRaises(dlsync.Error):
            dlsync.wrap(cai(stream=p), consumer=c).__cuda_array_interface__
        self.assertEqual(dlsync.capture_state(c), "eager")
        self.assertEqual(FAKE.end_capture(p), fake_cuda.CUDA_SUCCESS)

    def test_a_read_left_unjoined_would_break_the_capture(self):
        # The control: the capture ended before the scope joins the consumer back.
        p, c = FAKE.stream(), FAKE.stream()
        FAKE.begin_capture(p)
        try:
            with dlsync.scope():
                dlsync.wrap(cai(stream=p), consumer=c).__cuda_array_interface__
                FAKE.work(c)
                self.assertEqual(FAKE.end_capture(p),
                                 fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        except dlsync.Error:
            pass  # the scope's end finds the capture gone

if __name__ == "__main__":
    unittest.main()
