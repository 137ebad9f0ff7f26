# SPDX-License-Identifier: Apache-2.0
"""dlsync.scope() and dlsync.exchange with every kind of exception raised at
every point, on the fake CUDA driver (fake_cuda.py), on the backend in use.

Each case: a producer stream capturing, three consumer streams that each
read one wrap (so each joins the capture and must be joined back by its own
exchange's end), work queued on each consumer; one exception (or two) raised
at one point: in the block after k exports, in an export (the producer's own
__dlpack__, after its exchange was begun), in a begin (before the library is
called), in the jth end (after the library ended it: KeyboardInterrupt,
TypeError, SystemExit), or the library's own end failing (the fake driver
fails the call: dlsync.Error). Asserted for every case: the exception raised
is the one expected (the first an end raised, else the block's), every
exchange begun was ended (ending its handle again is the library's "ended
already"), the scope stack is empty, and the capture ends cleanly (a
consumer left joined would fail it with CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
except where the library's end failed. Plain unittest; ctest runs it with
DLSYNC_LIBRARY and DLSYNC_TEST_FAKE_LIBCUDA set."""
import ctypes
import itertools
import os
import sys
import unittest
from unittest import mock

import fake_cuda  # before dlsync asks for a context

FAKE, WHY = fake_cuda.load()
if os.environ.get("DLSYNC_TEST_PKG"):
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from dlsync import _backend, _exchange, _scope  # noqa: E402

needs_fake = unittest.skipIf(FAKE is None, f"no fake driver: {WHY}")
N = 3
KINDS = (KeyboardInterrupt, TypeError, SystemExit)
LIBRARY = "library"  # the kind: the fake driver fails the library's own end


class _Producer:
    """A CUDA DLPack producer on a stream (its __cuda_stream__) whose export
    may raise."""

    def __init__(self, stream, raises=None):
        self.stream, self.raises = stream, raises

    def __cuda_stream__(self):
        return (0, self.stream)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        if self.raises is not None:
            raise self.raises
        return "capsule"


class _Recorder:
    """The backend's begin and end, wrapped: the handles begun, and an
    exception raised at a chosen begin (before the library is called) or
    end (after the library ended it)."""

    def __init__(self, test):
        self.begun, self.ended = [], []
        self.begin_raises = {}  # nth begin (1-based) -> exception
        self.end_raises = {}  # nth end -> exception
        self.end_fails = set()  # nth end: the library's call fails (the fake driver)
        real_begin, real_end = _backend.active.begin, _backend.active.end

        def begin(p, c, flags=0, out=None):
            n = len(self.begun) + 1
            if n in self.begin_raises:
                self.begun.append(None)
                raise self.begin_raises[n]
            h = real_begin(p, c, flags, out)
            self.begun.append(h)
            return h

        def end(h):
            n = len(self.ended) + 1
            self.ended.append(h)
            if n in self.end_fails:
                FAKE.fail_nth("cuStreamUpdateCaptureDependencies", 1)
            real_end(h)
            if n in self.end_raises:
                raise self.end_raises[n]

        for name, fn in (("begin", begin), ("end", end)):
            p = mock.patch.object(_backend.active, name, fn)
            p.start()
            test.addCleanup(p.stop)


def _raw_end(handle):
    """dlsync_exchange_end straight from the library: its status."""
    fn = _backend.lib.dlsync_exchange_end
    fn.argtypes, fn.restype = [ctypes.c_void_p], ctypes.c_int
    return fn(handle)


def _kind_instance(kind, where):
    if kind is LIBRARY:
        return None
    return kind(f"injected {where}")


class Backend(unittest.TestCase):
    @unittest.skipUnless(os.environ.get("DLSYNC_EXPECT_NATIVE") == "1",
                         "not a run that expects the compiled backend")
    def test_the_compiled_backend_is_the_one_walked(self):
        self.assertEqual(_backend.active.name, "native", _backend.why)


@needs_fake
class ScopeWalk(unittest.TestCase):
    def run_case(self, block_after=None, block_kind=None, export_raises=None, begin_raises=None,
                 end_raises=None, end_fails=()):
        """One scope of N wraps; returns (what was raised, recorder, capture
        result)."""
        rec = _Recorder(self)
        rec.begin_raises = dict(begin_raises or {})
        rec.end_raises = dict(end_raises or {})
        rec.end_fails = set(end_fails)
        producer = FAKE.stream()
        consumers = [FAKE.stream() for _ in range(N)]
        FAKE.begin_capture(producer)
        raised = None
        try:
            with dlsync.scope():
                for k in range(N):
                    if block_after == k:
                        raise block_kind
                    x = _Producer(producer, export_raises.get(k) if export_raises else None)
                    dlsync.wrap(x).__dlpack__(stream=consumers[k])
                    FAKE.work(consumers[k])
                if block_after == N:
                    raise block_kind
        except BaseException as e:  # noqa: BLE001 - what the scope let out is the point
            raised = e
        self.assertEqual(_scope._scopes(), [], "the scope stack is left empty")
        begun = [h for h in rec.begun if h is not None]
        self.assertEqual(sorted(rec.ended), sorted(begun), "each exchange begun is ended once")
        for h in begun:
            self.assertEqual(_raw_end(h), 1, f"handle {h:#x} was not ended")  # INVALID_ARGUMENT
        return raised, rec, FAKE.end_capture(producer)

    def test_nothing_raised(self):
        raised, rec, capture = self.run_case()
        self.assertIsNone(raised)
        self.assertEqual(len(rec.begun), N)
        self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_raised_in_the_block_after_each_export(self):
        for kind, k in itertools.product(KINDS + (dlsync.Error,), range(N + 1)):
            with self.subTest(kind=kind.__name__, after=k):
                e = (dlsync.Error("X", "block") if kind is dlsync.Error else kind("block"))
                raised, rec, capture = self.run_case(block_after=k, block_kind=e)
                self.assertIs(raised, e)
                self.assertEqual(len(rec.begun), k)
                self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_raised_by_an_export_after_its_exchange_began(self):
        for kind, k in itertools.product(KINDS, range(N)):
            with self.subTest(kind=kind.__name__, export=k):
                e = kind("export")
                raised, rec, capture = self.run_case(export_raises={k: e})
                self.assertIs(raised, e)
                self.assertEqual(len(rec.begun), k + 1)
                self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_raised_by_a_begin(self):
        for kind, k in itertools.product(KINDS + (dlsync.Error,), range(1, N + 1)):
            with self.subTest(kind=kind.__name__, begin=k):
                e = (dlsync.Error("X", "begin") if kind is dlsync.Error else kind("begin"))
                raised, rec, capture = self.run_case(begin_raises={k: e})
                self.assertIs(raised, e)
                self.assertEqual(len(rec.ended), k - 1)
                self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_raised_by_each_end(self):
        for kind, j in itertools.product(KINDS + (LIBRARY,), range(1, N + 1)):
            with self.subTest(kind=getattr(kind, "__name__", kind), end=j):
                e = _kind_instance(kind, "end")
                raised, rec, capture = self.run_case(
                    end_raises={} if e is None else {j: e}, end_fails={j} if e is None else ())
                self.assertEqual(len(rec.ended), N, "every end ran")
                if e is None:
                    self.assertIsInstance(raised, dlsync.Error)
                    self.assertIn("cuStreamUpdateCaptureDependencies", raised.message)
                    self.assertEqual(capture, fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
                else:
                    self.assertIs(raised, e)
                    self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_the_block_and_an_end_raise_the_ends_exception_with_the_blocks_as_context(self):
        for kind, j in itertools.product(KINDS, range(1, N + 1)):
            with self.subTest(kind=kind.__name__, end=j):
                block, e = KeyError("block"), kind("end")
                raised, rec, capture = self.run_case(block_after=N, block_kind=block,
                                                     end_raises={j: e})
                self.assertIs(raised, e)
                self.assertIs(raised.__context__, block)
                self.assertEqual(capture, fake_cuda.CUDA_SUCCESS)

    def test_two_ends_raise_the_first_is_raised(self):
        for first, second in itertools.product(KINDS + (LIBRARY,), repeat=2):
            with self.subTest(first=getattr(first, "__name__", first),
                              second=getattr(second, "__name__", second)):
                e1, e2 = _kind_instance(first, "end 1"), _kind_instance(second, "end 2")
                raising = {n: e for n, e in ((1, e1), (2, e2)) if e is not None}
                fails = {n for n, e in ((1, e1), (2, e2)) if e is None}
                raised, rec, capture = self.run_case(end_raises=raising, end_fails=fails)
                self.assertEqual(len(rec.ended), N)
                if e1 is None:
                    self.assertIsInstance(raised, dlsync.Error)
                else:
                    self.assertIs(raised, e1)


@needs_fake
class ExchangeWalk(unittest.TestCase):
    """dlsync.exchange: one stream producer (the backend's Exchange), and a
    list of producers (the Python exchange, one handle per producer with the
    library's batch size made 1 here)."""

    def streams(self, n):
        producer = FAKE.stream()
        FAKE.begin_capture(producer)
        return producer, [FAKE.stream() for _ in range(n)]

    def test_a_stream_exchange_ends_whatever_the_block_raises(self):
        for kind in KINDS + (dlsync.Error,):
            with self.subTest(kind=kind.__name__):
                producer, (consumer,) = self.streams(1)
                e = dlsync.Error("X", "block") if kind is dlsync.Error else kind("block")
                with self.assertRaises(kind) as info:
                    with dlsync.exchange(producer, consumer):
                        FAKE.work(consumer)
                        raise e
                self.assertIs(info.exception, e)
                self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_a_stream_exchange_whose_end_fails_raises_the_library_error(self):
        for block in (None, KeyboardInterrupt("block")):
            with self.subTest(block=block):
                producer, (consumer,) = self.streams(1)
                with self.assertRaises(dlsync.Error) as info:
                    with dlsync.exchange(producer, consumer):
                        FAKE.work(consumer)
                        FAKE.fail_nth("cuStreamUpdateCaptureDependencies", 1)
                        if block is not None:
                            raise block
                self.assertIn("cuStreamUpdateCaptureDependencies", info.exception.message)
                self.assertIs(info.exception.__context__, block)
                self.assertEqual(FAKE.end_capture(producer),
                                 fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)

    def test_an_exchange_entered_again_after_a_failed_enter(self):
        producer, (consumer,) = self.streams(1)
        ex = dlsync.exchange(producer, consumer)
        FAKE.fail_nth("cuEventRecord", 1)
        with self.assertRaises(dlsync.Error):
            ex.__enter__()
        with ex:
            FAKE.work(consumer)
        self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_many_producers_are_one_begin_many_one_wait_each(self):
        producers = [FAKE.stream() for _ in range(20)]  # past _native.c's stack array
        consumer = FAKE.stream()
        calls = []
        real = _backend.active.begin_many

        def begin_many(ps, c, flags=0, out=None):
            calls.append(len(ps))
            return real(ps, c, flags, out)

        waits = FAKE.calls("cuStreamWaitEvent")
        with mock.patch.object(_backend.active, "begin_many", begin_many):
            with dlsync.exchange(producers + producers[:7], consumer):
                self.assertEqual(FAKE.calls("cuStreamWaitEvent") - waits, 20)
                FAKE.work(consumer)
        self.assertEqual(calls, [20])

    def list_case(self, begin_raises=None, end_raises=None, block=None):
        producers = [FAKE.stream() for _ in range(N)]
        consumer = FAKE.stream()
        rec = _Recorder(self)
        rec.begin_raises = dict(begin_raises or {})
        rec.end_raises = dict(end_raises or {})
        raised = None
        with mock.patch.object(_exchange, "MANY_MAX", 1):
            try:
                with dlsync.exchange(producers, consumer):
                    FAKE.work(consumer)
                    if block is not None:
                        raise block
            except BaseException as e:  # noqa: BLE001
                raised = e
        begun = [h for h in rec.begun if h is not None]
        self.assertEqual(sorted(rec.ended), sorted(begun), "each exchange begun is ended once")
        for h in begun:
            self.assertEqual(_raw_end(h), 1, f"handle {h:#x} was not ended")
        return raised, rec

    def test_a_list_exchange_at_every_point(self):
        for kind in KINDS:
            for k in range(1, N + 1):
                with self.subTest(kind=kind.__name__, begin=k):
                    e = kind("begin")
                    raised, rec = self.list_case(begin_raises={k: e})
                    self.assertIs(raised, e)
                    self.assertEqual(len(rec.ended), k - 1)
                with self.subTest(kind=kind.__name__, end=k):
                    e = kind("end")
                    raised, rec = self.list_case(end_raises={k: e})
                    self.assertIs(raised, e)
                    self.assertEqual(len(rec.ended), N)
            with self.subTest(kind=kind.__name__, block=True):
                e = kind("block")
                raised, rec = self.list_case(block=e)
                self.assertIs(raised, e)
                self.assertEqual(len(rec.ended), N)


class _AsItReturns:
    """A KeyboardInterrupt raised as one call of the backend into the library
    returns, before any Python code of dlsync runs after it: where a signal
    handler's exception would surface. ``call`` is begin, begin_many (the
    compiled module's function, through a profile hook on its return, on the
    compiled backend; the ctypes function object otherwise) or fence_signal
    (ctypes on both)."""

    def __init__(self, test, call):
        self.fired = 0
        b = _backend.active
        native = getattr(b, "module", None)
        if native is not None and call in ("begin", "begin_many"):
            target = getattr(native, call)

            def profile(frame, event, arg):
                if event == "c_return" and arg is target and not self.fired:
                    self.fired += 1
                    sys.setprofile(None)
                    raise KeyboardInterrupt(f"as {call} returned")

            sys.setprofile(profile)
            test.addCleanup(sys.setprofile, None)
            return
        ct = getattr(b, "_ctypes", b)
        name = "_" + call
        real = getattr(ct, name)

        def interrupted(*args):
            status = real(*args)
            if not self.fired:
                self.fired += 1
                raise KeyboardInterrupt(f"as {call} returned")
            return status

        p = mock.patch.object(ct, name, interrupted)
        p.start()
        test.addCleanup(p.stop)


@needs_fake
class InterruptedAsBeginReturns(unittest.TestCase):
    """The handle a begin returns is where its exchange is ended, whatever
    exception comes as the begin returns: the consumer joined back (the
    capture ends cleanly), the fence released."""

    def capturing(self):
        producer, consumer = FAKE.stream(), FAKE.stream()
        FAKE.begin_capture(producer)
        return producer, consumer

    def assert_interrupted(self, hook, fn, consumer):
        """fn raises the interrupt, and the exchange it began is ended once
        (the backend's end called with its handle)."""
        ended = []
        real = _backend.active.end

        def end(handle):
            ended.append(handle)
            return real(handle)

        with mock.patch.object(_backend.active, "end", end):
            with self.assertRaises(KeyboardInterrupt):
                fn()
        self.assertEqual(hook.fired, 1, "the interrupt came")
        self.assertEqual(len(ended), 1, "the exchange begun was ended once")
        self.assertTrue(ended[0])

    def test_a_scope_and_wrap(self):
        producer, consumer = self.capturing()
        hook = _AsItReturns(self, "begin")

        def run():
            with dlsync.scope():
                dlsync.wrap(_Producer(producer)).__dlpack__(stream=consumer)
                FAKE.work(consumer)

        self.assert_interrupted(hook, run, consumer)
        self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_a_list_exchange(self):
        producer, consumer = self.capturing()
        hook = _AsItReturns(self, "begin")

        def run():
            with dlsync.exchange([producer, producer], consumer):
                FAKE.work(consumer)

        self.assert_interrupted(hook, run, consumer)
        self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_a_list_exchange_of_several_streams(self):
        producer, consumer = self.capturing()
        other = FAKE.stream()
        FAKE.begin_capture(other)
        hook = _AsItReturns(self, "begin_many")

        def run():
            with dlsync.exchange([producer, other], consumer):
                FAKE.work(consumer)

        self.assert_interrupted(hook, run, consumer)
        # Joined back: neither capture is left with the consumer's work unjoined.
        self.assertNotEqual(FAKE.end_capture(producer),
                            fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        self.assertNotEqual(FAKE.end_capture(other), fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)

    def test_a_tensor_exchange(self):
        producer, consumer = self.capturing()
        hook = _AsItReturns(self, "begin")

        def run():
            with dlsync.exchange(_Producer(producer), consumer):
                FAKE.work(consumer)

        self.assert_interrupted(hook, run, consumer)
        self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_a_stream_exchange_of_the_ctypes_backend(self):
        # The compiled Exchange keeps the handle in C, with no Python between
        # the library's return and its store: the ctypes one is walked (on
        # the compiled backend, the ctypes backend it holds for the fences).
        ct = getattr(_backend.active, "_ctypes", _backend.active)
        producer, consumer = self.capturing()
        fired, ended = [], []
        real_begin, real_end = ct._begin, ct.end

        def begin(*args):
            real_begin(*args)
            fired.append(1)
            raise KeyboardInterrupt("as begin returned")

        def end(handle):
            ended.append(handle)
            return real_end(handle)

        with mock.patch.object(ct, "_begin", begin), mock.patch.object(ct, "end", end):
            with self.assertRaises(KeyboardInterrupt):
                with ct.Exchange(producer, consumer):
                    FAKE.work(consumer)
        self.assertEqual(len(fired), 1)
        self.assertEqual(len(ended), 1, "the exchange begun was ended once")
        self.assertEqual(FAKE.end_capture(producer), fake_cuda.CUDA_SUCCESS)

    def test_a_fence(self):
        import gc

        ct = getattr(_backend.active, "_ctypes", _backend.active)
        signalled, released = [], []
        real_signal, real_release = ct._fence_signal, ct._fence_release

        def signal(out, ctx, lane):
            status = real_signal(out, ctx, lane)
            signalled.append(out._obj.value)
            return status

        def release(fence):
            released.append(fence)
            return real_release(fence)

        for name, fn in (("_fence_signal", signal), ("_fence_release", release)):
            p = mock.patch.object(ct, name, fn)
            p.start()
            self.addCleanup(p.stop)
        hook = _AsItReturns(self, "fence_signal")
        stream = FAKE.stream()
        try:
            dlsync.Fence(stream)
        except KeyboardInterrupt:
            pass
        gc.collect()
        self.assertEqual(hook.fired, 1)
        self.assertEqual(len(signalled), 1)
        self.assertTrue(signalled[0])
        self.assertEqual(released, signalled, "the fence signalled was released")


@needs_fake
class SummaryOnTheFake(unittest.TestCase):
    def test_python_dash_m_summary_names_the_driver_and_each_gpu(self):
        from dlsync import __main__ as m

        lines = m.summary()
        self.assertEqual(lines[0], f"dlsync {dlsync.version()}")
        self.assertRegex(lines[2], r"^driver: CUDA \d+\.\d+$")
        self.assertRegex(lines[3], r"^GPU 0: Fake GPU 0, sm_\d+, [\d.]+ GiB, [0-9a-f:.]+$")


if __name__ == "__main__":
    unittest.main()
