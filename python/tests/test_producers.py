# SPDX-License-Identifier: Apache-2.0
"""Finding a producer's stream, without a GPU: fake producers, a fake DLPack
exchange API capsule (its current_work_stream a Python callback, asked
through the library's dlsync_env_stream_from_exchange_api, which makes no
driver call), and a fake exchange and capture query where the driver would
be needed. Plain unittest; ctest runs it with DLSYNC_LIBRARY set."""
import ctypes
import os
import sys
import types
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from dlsync import _backend, _exchange, _producers  # noqa: E402

KDLCUDA = 2

# ---- a DLPack 1.3 DLPackExchangeAPI, built in Python ----


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Header(ctypes.Structure):
    _fields_ = [("version", _Version), ("prev_api", ctypes.c_void_p)]


_CWS = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32,
                        ctypes.POINTER(ctypes.c_void_p))


class _Api(ctypes.Structure):
    _fields_ = [("header", _Header),
                ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
                ("current_work_stream", _CWS)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
_keep = []  # names, structs and callbacks must outlive their capsules


def _capsule(answer, name=b"dlpack_exchange_api", calls=None, major=1):
    """A capsule whose current_work_stream writes `answer` (an int handle,
    None for NULL) or fails (answer == "fail"); `calls` collects its
    (device_type, device_id) arguments."""

    def cws(device_type, device_id, out):
        if calls is not None:
            calls.append((device_type, device_id))
        if answer == "fail":
            return -1
        out[0] = answer
        return 0

    api = _Api()
    api.header.version.major, api.header.version.minor = major, 3
    api.current_work_stream = _CWS(cws)
    cname = ctypes.create_string_buffer(name)
    _keep.extend([api, cname, api.current_work_stream])
    return _capsule_new(ctypes.addressof(api), ctypes.addressof(cname), None)


def _producer_class(capsule=None, module="somelib", cuda_stream=None, stream_attr=None):
    """A DLPack producer type; its __dlpack__ records the stream it was asked for."""
    ns = {"__module__": module, "asked": None}
    if capsule is not None:
        ns["__dlpack_c_exchange_api__"] = capsule

    def __dlpack_device__(self):
        return (KDLCUDA, 1)

    def __dlpack__(self, stream=None, **kw):
        type(self).asked = stream
        return ("capsule", stream)

    ns["__dlpack_device__"] = __dlpack_device__
    ns["__dlpack__"] = __dlpack__
    if cuda_stream is not None:
        ns["__cuda_stream__"] = lambda self: (0, cuda_stream)
    if stream_attr is not None:
        ns["stream"] = types.SimpleNamespace(__cuda_stream__=lambda: (0, stream_attr))
    return type("Producer", (), ns)


# ---- fakes for the parts that need a driver ----


class _Log:
    """The backend's begin, begin_many, end and capture query, recorded (the
    interface of dlsync._backend: what the Python exchanges call)."""

    def __init__(self):
        self.calls = []
        self.capturing = set()
        self.fail_begin_on = None
        self.open = {}  # handle -> (producers, consumer)
        self._ids = iter(range(0x1000, 1 << 30))

    def _begun(self, producers, consumer):
        if self.fail_begin_on in producers:
            raise dlsync.Error("DLSYNC_ERROR_DRIVER", "injected")
        handle = next(self._ids)
        self.open[handle] = (producers, consumer)
        return handle

    def begin(self, producer, consumer, flags=0, out=None):
        p, c = dlsync.stream_handle(producer), dlsync.stream_handle(consumer)
        handle = self._begun((p,), c)
        self.calls.append(("begin", p, c, flags))
        if out is not None:
            out.value = handle
        return handle

    def begin_many(self, producers, consumer, flags=0, out=None):
        ps = tuple(dlsync.stream_handle(p) for p in producers)
        c = dlsync.stream_handle(consumer)
        handle = self._begun(ps, c)
        self.calls.append(("begin_many", ps, c, flags))
        if out is not None:
            out.value = handle
        return handle

    def end(self, handle):
        ps, c = self.open.pop(handle)
        self.calls.append(("end", ps[0] if len(ps) == 1 else ps, c))

    def capture_state(self, stream):
        return "capturing" if dlsync.stream_handle(stream) in self.capturing else "eager"

    def patch(self, test):
        """Puts the fakes in the backend for the test's duration."""
        for name in ("begin", "begin_many", "end", "capture_state"):
            p = mock.patch.object(_backend.active, name, getattr(self, name))
            p.start()
            test.addCleanup(p.stop)


class _Faked(unittest.TestCase):
    def setUp(self):
        self.log = _Log()
        self.log.patch(self)
        # No framework in sys.modules unless a test puts a fake one there.
        p = mock.patch.dict(sys.modules, {"torch": None, "cupy": None})
        p.start()
        self.addCleanup(p.stop)

    def tearDown(self):
        self.assertEqual(self.log.open, {}, "exchanges begun and never ended")


class Find(unittest.TestCase):
    def test_exchange_api_answers_with_the_producers_current_stream(self):
        calls = []
        cls = _producer_class(_capsule(0xA110, calls=calls))
        found = _producers.find(cls(), KDLCUDA, 1)
        self.assertEqual(found, _producers.Found(0xA110, _producers.EXCHANGE_API, True))
        self.assertEqual(calls, [(KDLCUDA, 1)])

    def test_null_from_the_exchange_api_is_the_legacy_stream(self):
        cls = _producer_class(_capsule(None))
        self.assertEqual(_producers.find(cls(), KDLCUDA, 0).stream, dlsync.LEGACY)

    def test_the_api_is_asked_at_each_find_but_looked_up_once_per_type(self):
        lookups = []
        capsule = _capsule(0xBEE)

        class Meta(type):
            @property
            def __dlpack_c_exchange_api__(cls):
                lookups.append(cls)
                return capsule

        cls = Meta("Counted", (), {"__module__": "somelib"})
        for _ in range(3):
            self.assertEqual(_producers.find(cls(), KDLCUDA, 0).stream, 0xBEE)
        self.assertEqual(len(lookups), 1)

    def test_explicit_producer_wins_over_the_exchange_api(self):
        calls = []
        cls = _producer_class(_capsule(0xA110, calls=calls))
        found = _producers.find(cls(), KDLCUDA, 0, explicit=0x5151)
        self.assertEqual(found, _producers.Found(0x5151, _producers.EXPLICIT, True))
        self.assertEqual(calls, [])

    def test_a_capsule_of_another_name_is_refused(self):
        cls = _producer_class(_capsule(0x1, name=b"not_the_api"))
        with self.assertRaises(TypeError) as info:
            _producers.find(cls(), KDLCUDA, 0)
        self.assertIn("dlpack_exchange_api", str(info.exception))

    def test_a_failing_current_work_stream_is_an_error_naming_the_type(self):
        cls = _producer_class(_capsule("fail"))
        with self.assertRaises(dlsync.Error) as info:
            _producers.find(cls(), KDLCUDA, 0)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        self.assertIn("Producer.__dlpack_c_exchange_api__", info.exception.message)
        self.assertIn("failed", info.exception.message)

    def test_an_api_of_another_major_version_is_an_error(self):
        cls = _producer_class(_capsule(0x1, major=2))
        with self.assertRaises(dlsync.Error) as info:
            _producers.find(cls(), KDLCUDA, 0)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")

    def test_cuda_stream_of_the_object_or_of_its_stream_attribute(self):
        self.assertEqual(_producers.find(_producer_class(cuda_stream=0xC5)(), KDLCUDA, 0),
                         _producers.Found(0xC5, _producers.CUDA_STREAM, True))
        self.assertEqual(_producers.find(_producer_class(stream_attr=0xC6)(), KDLCUDA, 0).stream,
                         0xC6)

    def test_exchange_api_comes_before_cuda_stream(self):
        cls = _producer_class(_capsule(0xA1), cuda_stream=0xC5)
        self.assertEqual(_producers.find(cls(), KDLCUDA, 0).how, _producers.EXCHANGE_API)

    def test_torch_and_cupy_fallbacks_ask_their_current_stream(self):
        asked = []
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            current_stream=lambda d: asked.append(d) or types.SimpleNamespace(cuda_stream=0x70)))

        class _Dev:
            def __init__(self, d):
                asked.append(("cupy", d))

            def __enter__(self):
                return self

            def __exit__(self, *a):
                return False

        cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
            Device=_Dev, get_current_stream=lambda: types.SimpleNamespace(ptr=0xC0)))
        with mock.patch.dict(sys.modules, {"torch": torch, "cupy": cupy}):
            self.assertEqual(_producers.find(_producer_class(module="torch")(), KDLCUDA, 3),
                             _producers.Found(0x70, _producers.TORCH, True))
            self.assertEqual(_producers.find(_producer_class(module="cupy._core")(), KDLCUDA, 2),
                             _producers.Found(0xC0, _producers.CUPY, True))
        self.assertEqual(asked, [3, ("cupy", 2)])

    def test_a_producer_with_only_dlpack_exposes_no_stream(self):
        self.assertEqual(_producers.find(_producer_class(module="jaxlib.xla")(), KDLCUDA, 0),
                         _producers.Found(None, _producers.NONE, False))
        found = _producers.find(_producer_class(module="jaxlib")(), KDLCUDA, 0, explicit=0x99)
        self.assertEqual(found, _producers.Found(0x99, _producers.EXPLICIT, False))

    def test_distinct_keeps_first_seen_order(self):
        self.assertEqual(_producers.distinct([3, 1, 3, 2, 1]), [3, 1, 2])


class NoStreamProducer(_Faked):
    """JAX's case: the consumer's stream is handed to the producer's own __dlpack__."""

    def test_eager_it_is_handed_the_consumers_stream_never_minus_one(self):
        cls = _producer_class(module="jaxlib")
        self.assertEqual(dlsync.wrap(cls()).__dlpack__(stream=0xC0), ("capsule", 0xC0))
        self.assertEqual(cls.asked, 0xC0)
        self.assertEqual(self.log.calls, [])  # no exchange: the producer ordered itself

    def test_the_legacy_stream_is_handed_as_one(self):
        cls = _producer_class(module="jaxlib")
        dlsync.wrap(cls()).__dlpack__(stream=None)
        self.assertEqual(cls.asked, dlsync.LEGACY)

    def test_under_a_capturing_consumer_a_clear_error_and_the_producer_untouched(self):
        self.log.capturing.add(0xC0)
        cls = _producer_class(module="jaxlib")
        with dlsync.scope():
            with self.assertRaises(dlsync.Error) as info:
                dlsync.wrap(cls()).__dlpack__(stream=0xC0)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_CAPTURE_ORDER")
        for words in ("exposes no stream", "is capturing", "capture is intact",
                      "before the capture"):
            self.assertIn(words, info.exception.message)
        self.assertIsNone(cls.asked)
        self.assertEqual(self.log.calls, [])

    def test_while_torchs_current_stream_captures_the_same_error(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            is_initialized=lambda: True,
            current_stream=lambda: types.SimpleNamespace(cuda_stream=0x7C)))
        self.log.capturing.add(0x7C)
        cls = _producer_class(module="jaxlib")
        with mock.patch.dict(sys.modules, {"torch": torch}):
            with self.assertRaises(dlsync.Error) as info:
                dlsync.wrap(cls()).__dlpack__(stream=0xC0)
        self.assertIn("the current PyTorch stream 0x7c", info.exception.message)
        self.assertIsNone(cls.asked)

    def test_with_producer_named_that_stream_is_ordered_first_then_the_consumer_handed(self):
        cls = _producer_class(module="jaxlib")
        dlsync.wrap(cls(), producer=0x51).__dlpack__(stream=0xC0)
        self.assertEqual(self.log.calls, [("begin", 0x51, 0xC0, 0), ("end", 0x51, 0xC0)])
        self.assertEqual(cls.asked, 0xC0)

    def test_a_consumer_asking_for_minus_one_never_passes_it_on(self):
        # JAX 0.11 answers stream=-1 with CUDA_ERROR_INVALID_HANDLE: such a
        # producer exports with no stream argument, with or without producer=.
        for producer in (None, 0x51):
            cls = _producer_class(module="jaxlib")
            cls.asked = "not asked"
            self.assertEqual(dlsync.wrap(cls(), producer=producer).__dlpack__(stream=-1),
                             ("capsule", None))
            self.assertIsNone(cls.asked)
            self.assertEqual(self.log.calls, [])

    def test_minus_one_while_torch_captures_is_refused_untouched(self):
        torch = types.SimpleNamespace(cuda=types.SimpleNamespace(
            is_initialized=lambda: True,
            current_stream=lambda: types.SimpleNamespace(cuda_stream=0x7C)))
        self.log.capturing.add(0x7C)
        cls = _producer_class(module="jaxlib")
        cls.asked = "not asked"
        with mock.patch.dict(sys.modules, {"torch": torch}):
            with self.assertRaises(dlsync.Error) as info:
                dlsync.wrap(cls()).__dlpack__(stream=-1)
        self.assertEqual(info.exception.status, "DLSYNC_ERROR_CAPTURE_ORDER")
        self.assertIn("the current PyTorch stream 0x7c", info.exception.message)
        self.assertEqual(cls.asked, "not asked")

    def test_a_producer_with_a_stream_gets_minus_one_as_asked(self):
        cls = _producer_class(_capsule(0xA3))
        dlsync.wrap(cls()).__dlpack__(stream=-1)
        self.assertEqual(cls.asked, -1)
        self.assertEqual(self.log.calls, [])

    def test_exchange_with_such_a_producer_says_to_use_wrap(self):
        with self.assertRaises(dlsync.Error) as info:
            with dlsync.exchange(_producer_class(module="jaxlib")(), 0xC0):
                pass
        self.assertIn("dlsync.wrap", info.exception.message)


class ExchangeApiProducer(_Faked):
    def test_wrap_orders_after_the_api_stream_and_exports_without_a_sync(self):
        cls = _producer_class(_capsule(0xA1))
        dlsync.wrap(cls()).__dlpack__(stream=0xC0)
        self.assertEqual(self.log.calls, [("begin", 0xA1, 0xC0, 0), ("end", 0xA1, 0xC0)])
        self.assertEqual(cls.asked, -1)

    def test_exchange_takes_a_tensor_and_finds_its_stream(self):
        with dlsync.exchange(_producer_class(_capsule(0xA2))(), 0xC0):
            pass
        self.assertEqual(self.log.calls, [("begin", 0xA2, 0xC0, 0), ("end", 0xA2, 0xC0)])


class ManyProducers(_Faked):
    def test_one_begin_many_over_the_distinct_streams_one_end(self):
        a = _producer_class(_capsule(0xA3))()
        with dlsync.exchange([0x51, a, 0x52, 0x51, 0xA3], 0xC0, capture_stable=True):
            self.assertEqual(self.log.calls, [("begin_many", (0x51, 0xA3, 0x52), 0xC0, 1)])
        self.assertEqual(self.log.calls[1:], [("end", (0x51, 0xA3, 0x52), 0xC0)])

    def test_one_distinct_stream_is_one_plain_begin_and_an_empty_list_refused(self):
        with dlsync.exchange([0x51, 0x51], 0xC0):
            pass
        for empty in ([], ()):
            with self.subTest(empty=empty):
                with self.assertRaises(ValueError) as info:
                    with dlsync.exchange(empty, 0xC0):
                        self.fail("the block of an exchange of no producers ran")
                self.assertIn(f"the producers are an empty {type(empty).__name__}: nothing to "
                              "order the consumer after", str(info.exception))
        self.assertEqual(self.log.calls, [("begin", 0x51, 0xC0, 0), ("end", 0x51, 0xC0)])

    def test_more_than_the_library_takes_at_once_are_begun_in_chunks(self):
        with mock.patch.object(_exchange, "MANY_MAX", 2):
            with dlsync.exchange((0x51, 0x52, 0x53, 0x54, 0x55), 0xC0):
                pass
        self.assertEqual(self.log.calls, [
            ("begin_many", (0x51, 0x52), 0xC0, 0), ("begin_many", (0x53, 0x54), 0xC0, 0),
            ("begin", 0x55, 0xC0, 0), ("end", 0x55, 0xC0), ("end", (0x53, 0x54), 0xC0),
            ("end", (0x51, 0x52), 0xC0)])

    def test_a_failed_begin_ends_those_begun_and_raises(self):
        self.log.fail_begin_on = 0x53
        with mock.patch.object(_exchange, "MANY_MAX", 2):
            with self.assertRaises(dlsync.Error):
                with dlsync.exchange((0x51, 0x52, 0x53), 0xC0):
                    self.fail("the block must not run")
        self.assertEqual(self.log.calls, [("begin_many", (0x51, 0x52), 0xC0, 0),
                                          ("end", (0x51, 0x52), 0xC0)])

    def test_a_failed_begin_many_begins_nothing(self):
        self.log.fail_begin_on = 0x52
        with self.assertRaises(dlsync.Error):
            with dlsync.exchange((0x51, 0x52, 0x53), 0xC0):
                self.fail("the block must not run")
        self.assertEqual(self.log.calls, [])

    def test_an_error_in_the_block_still_ends_every_exchange(self):
        with self.assertRaises(KeyError):
            with dlsync.exchange([0x51, 0x52], 0xC0):
                raise KeyError("user")
        self.assertEqual([c[0] for c in self.log.calls], ["begin_many", "end"])


class ScopeSharing(_Faked):
    def test_wraps_made_together_share_one_exchange(self):
        cls = _producer_class(_capsule(0xA4))
        with dlsync.scope():
            w1, w2, w3 = dlsync.wrap(cls()), dlsync.wrap(cls()), dlsync.wrap(cls())
            for w in (w1, w2, w3):
                w.__dlpack__(stream=0xC0)
            self.assertEqual(self.log.calls, [("begin", 0xA4, 0xC0, 0)])
        self.assertEqual(self.log.calls[1:], [("end", 0xA4, 0xC0)])

    def test_a_wrap_made_after_the_exchange_began_gets_its_own(self):
        # Its producer work may have been queued after the first exchange's
        # record: sharing would leave it unordered.
        cls = _producer_class(_capsule(0xA4))
        with dlsync.scope():
            dlsync.wrap(cls()).__dlpack__(stream=0xC0)
            dlsync.wrap(cls()).__dlpack__(stream=0xC0)
        self.assertEqual([c[0] for c in self.log.calls], ["begin", "begin", "end", "end"])

    def test_another_consumer_or_producer_stream_gets_its_own(self):
        with dlsync.scope():
            w1 = dlsync.wrap(_producer_class(_capsule(0xA5))())
            w2 = dlsync.wrap(_producer_class(_capsule(0xA5))())
            w3 = dlsync.wrap(_producer_class(_capsule(0xA6))())
            w1.__dlpack__(stream=0xC0)
            w2.__dlpack__(stream=0xC1)
            w3.__dlpack__(stream=0xC0)
        begins = [c[1:3] for c in self.log.calls if c[0] == "begin"]
        self.assertEqual(begins, [(0xA5, 0xC0), (0xA5, 0xC1), (0xA6, 0xC0)])

    def test_outside_a_scope_each_wrap_begins_and_ends_at_once(self):
        cls = _producer_class(_capsule(0xA7))
        w1, w2 = dlsync.wrap(cls()), dlsync.wrap(cls())
        w1.__dlpack__(stream=0xC0)
        w2.__dlpack__(stream=0xC0)
        self.assertEqual([c[0] for c in self.log.calls], ["begin", "end", "begin", "end"])


if __name__ == "__main__":
    unittest.main()
