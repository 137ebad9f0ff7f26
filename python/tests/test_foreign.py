# SPDX-License-Identifier: Apache-2.0
"""dlsync.Fence.from_event, Fence.event() and Fence.provenance
(include/dlsync/foreign.h) on the fake CUDA driver (fake_cuda.py), on the
backend in use (test_backends.py runs this file on the compiled one too).

Each provenance is imported and waited on from an eager stream and from a
capture, as foreign.h's table says: a plain wait, an external wait node, a
wait node, edges only, or a refusal. Each bad input raises its exception
with its status and message and queues nothing (the fake counts every
record, wait and event node). Framework events are stood in for by objects
whose types claim the frameworks' modules, with the attributes dlsync reads
(torch.cuda.Event.cuda_event, torch.Event.event_id, cupy.cuda.Event.ptr,
cuda.core's Event.handle). Plain unittest; ctest runs it with
DLSYNC_LIBRARY and DLSYNC_TEST_FAKE_LIBCUDA set."""
import gc
import os
import re
import sys
import unittest
import weakref

import fake_cuda  # before dlsync asks for a context

FAKE, WHY = fake_cuda.load()
HERE = os.path.dirname(os.path.abspath(__file__))
if os.environ.get("DLSYNC_TEST_PKG"):
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(HERE, ".."))
import dlsync  # noqa: E402
from dlsync import _backend  # noqa: E402

needs_fake = unittest.skipIf(FAKE is None, f"no fake driver: {WHY}")
P = dlsync.Provenance
WAIT_NODE = fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT
RECORD_NODE = fake_cuda.CU_GRAPH_NODE_TYPE_EVENT_RECORD


def _typed(module, name, **attrs):
    """An object whose type claims ``module.name`` with the given attributes."""
    return type(name, (), dict(attrs, __module__=module))()


class _CUevent:
    """cuda.bindings.driver.CUevent as cuda.core hands it out: int() is the address."""

    def __init__(self, value):
        self.value = value

    def __int__(self):
        return self.value


def torch_event(handle):
    return _typed("torch.cuda.streams", "Event", cuda_event=handle)


def torch_generic_event(handle):
    return _typed("torch", "Event", event_id=handle)


def cupy_event(handle):
    return _typed("cupy.cuda.stream", "Event", ptr=handle)


def core_event(handle, closed=False):
    return _typed("cuda.core._event", "Event", handle=_CUevent(handle), is_closed=closed)


class _Base(unittest.TestCase):
    def setUp(self):
        self.p, self.c, self.x = FAKE.stream(), FAKE.stream(), FAKE.stream()
        self.events = []

    def tearDown(self):
        gc.collect()
        for e in self.events:
            FAKE.event_destroy(e)

    def event(self):
        e = FAKE.event()
        self.events.append(e)
        return e

    def recorded(self):
        """An event recorded on the eager producer stream, after its work."""
        e = self.event()
        FAKE.work(self.p)
        FAKE.record(e, self.p)
        return e

    def end_clean(self, stream):
        r, g = FAKE.end_capture_graph(stream)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS, "the capture did not end cleanly")
        return g

    def assert_refused(self, fn, exc, status, *words):
        """fn raises exc (with status when given) whose message has every
        word, and queues nothing."""
        before = FAKE.queued()
        with self.assertRaises(exc) as cm:
            fn()
        if status is not None:
            self.assertEqual(cm.exception.status, status)
        for w in words:
            self.assertIn(w, str(cm.exception))
        self.assertEqual(FAKE.queued(), before, "a refusal queued something")
        return cm.exception


@needs_fake
class EachProvenance(_Base):
    def test_the_enum_is_the_header_s(self):
        with open(os.path.join(HERE, "..", "..", "include", "dlsync", "foreign.h")) as f:
            header = dict(re.findall(r"DLSYNC_PROVENANCE_(\w+) = (\d+)", f.read()))
        self.assertEqual({p.name: p.value for p in P}, {k: int(v) for k, v in header.items()})

    def test_eager_waited_eagerly_is_one_plain_wait(self):
        e = self.recorded()
        f = dlsync.Fence.from_event(e, provenance=P.EAGER)
        self.assertIs(f.provenance, P.EAGER)
        self.assertEqual(f.event(), e)
        before = FAKE.queued()
        f.wait(self.c)
        after = FAKE.queued()
        self.assertEqual(after["cuStreamWaitEvent"], before["cuStreamWaitEvent"] + 1)
        self.assertEqual(after["cuGraphAddEventWaitNode"], before["cuGraphAddEventWaitNode"])
        f.close()

    def test_eager_waited_in_a_capture_is_an_external_wait_node(self):
        e = self.recorded()
        FAKE.begin_capture(self.c)  # global mode: the import's query is legal still (R40)
        f = dlsync.Fence.from_event(e, provenance="eager")
        f.wait(self.c)
        FAKE.work(self.c)
        f.close()  # the capture's graph holds the event
        g = self.end_clean(self.c)
        self.assertEqual(FAKE.node_types(g).count(WAIT_NODE), 1)
        FAKE.graph_destroy(g)

    def test_complete_checked_and_waited(self):
        e = self.recorded()  # the fake's work completes at once
        f = dlsync.Fence.from_event(e, provenance="COMPLETE")
        self.assertIs(f.provenance, P.COMPLETE)
        FAKE.begin_capture(self.c)
        f.wait(self.c)
        FAKE.work(self.c)
        g = self.end_clean(self.c)
        self.assertEqual(FAKE.node_types(g).count(WAIT_NODE), 1)
        FAKE.graph_destroy(g)
        f.close()
        # Not complete: the library's refusal reaches Python.
        FAKE.fail_nth("cuEventQuery", 1, fake_cuda.CUDA_ERROR_NOT_READY)
        self.assert_refused(lambda: dlsync.Fence.from_event(e, provenance=P.COMPLETE),
                            dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT",
                            "provenance COMPLETE contradicts the driver")

    def _recording_graph(self, e):
        """A graph of work then an event-record node of e (an external
        record in a capture), instantiated: its executable."""
        s = FAKE.stream()
        FAKE.begin_capture(s)
        FAKE.work(s)
        FAKE.record_external(e, s)
        g = self.end_clean(s)
        self.assertIn(RECORD_NODE, FAKE.node_types(g))
        r, x = FAKE.instantiate(g)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        FAKE.graph_destroy(g)
        return x

    def test_external_record_waited_eagerly_and_in_a_capture(self):
        e = self.event()
        x = self._recording_graph(e)
        f = dlsync.Fence.from_event(e, provenance=P.EXTERNAL_RECORD)
        self.assertIs(f.provenance, P.EXTERNAL_RECORD)
        self.assertEqual(f.event(), e)
        FAKE.launch(x, self.p)
        before = FAKE.queued()
        f.wait(self.c)  # eager, after the launch: a plain wait
        mid = FAKE.queued()
        self.assertEqual(mid["cuStreamWaitEvent"], before["cuStreamWaitEvent"] + 1)
        FAKE.begin_capture(self.x)
        f.wait(self.x)  # another capture: a wait node added by hand
        self.assertEqual(FAKE.queued()["cuGraphAddEventWaitNode"],
                         mid["cuGraphAddEventWaitNode"] + 1)
        FAKE.work(self.x)
        g = self.end_clean(self.x)
        self.assertEqual(FAKE.node_types(g).count(WAIT_NODE), 1)
        f.close()
        FAKE.graph_destroy(g)
        FAKE.exec_destroy(x)

    def _captured(self):
        """A capture on p joined by c, with a plain record of an event after
        its work: (the event, its capture's id)."""
        fork, e = self.event(), self.event()
        FAKE.begin_capture(self.p)
        FAKE.record(fork, self.p)
        FAKE.wait_event(self.c, fork)  # c joins the capture
        FAKE.work(self.p)
        FAKE.record(e, self.p)  # the other runtime's plain record
        cid = dlsync.capture_id(self.p)
        self.assertEqual(cid, FAKE.capture_id(self.p))
        self.assertNotEqual(cid, 0)
        return e, cid

    def test_captured_waited_in_its_capture_is_edges_only(self):
        e, cid = self._captured()
        f = dlsync.Fence.from_event(e, provenance=P.CAPTURED, capture_id=cid)
        self.assertIs(f.provenance, P.CAPTURED)
        before = FAKE.queued()
        f.wait(self.c)
        self.assertEqual(FAKE.queued()["cuGraphAddEventWaitNode"],
                         before["cuGraphAddEventWaitNode"])
        FAKE.work(self.c)
        join = self.event()
        FAKE.record(join, self.c)
        FAKE.wait_event(self.p, join)
        g = self.end_clean(self.p)
        self.assertNotIn(WAIT_NODE, FAKE.node_types(g))
        FAKE.graph_destroy(g)
        f.close()

    def test_captured_waited_elsewhere_is_refused_with_the_library_s_message(self):
        e, cid = self._captured()
        f = dlsync.Fence.from_event(e, provenance=P.CAPTURED, capture_id=cid)
        eager = FAKE.stream()
        self.assert_refused(lambda: f.wait(eager), dlsync.Error, "DLSYNC_ERROR_CAPTURE_ORDER",
                            "only from that capture")
        FAKE.begin_capture(self.x)
        self.assert_refused(lambda: f.wait(self.x), dlsync.Error, "DLSYNC_ERROR_CAPTURE_ORDER")
        self.end_clean(self.x)  # that capture unharmed
        self.assert_refused(f.event, dlsync.Error, "DLSYNC_ERROR_CAPTURE_ORDER",
                            f"capture {cid}")
        f.close()
        join = self.event()
        FAKE.record(join, self.c)
        FAKE.wait_event(self.p, join)
        self.end_clean(self.p)  # the recording capture unharmed

    def test_a_signalled_fence_has_no_provenance_and_exports_its_event(self):
        FAKE.work(self.p)
        f = dlsync.Fence(self.p)
        self.assertIsNone(f.provenance)
        e = f.event()
        self.assertNotEqual(e, 0)
        before = FAKE.queued()
        FAKE.wait_event(self.c, e)  # another runtime's wait on it
        self.assertEqual(FAKE.queued()["cuStreamWaitEvent"], before["cuStreamWaitEvent"] + 1)
        f.close()

    def test_capture_id_of_an_eager_stream_is_none(self):
        self.assertIsNone(dlsync.capture_id(self.c))
        FAKE.begin_capture(self.c)
        self.assertEqual(dlsync.capture_id(self.c), FAKE.capture_id(self.c))
        self.end_clean(self.c)


@needs_fake
class FrameworkEvents(_Base):
    def test_each_framework_s_event_gives_its_handle(self):
        for make in (torch_event, torch_generic_event, cupy_event, core_event):
            e = self.recorded()
            obj = make(e)
            f = dlsync.Fence.from_event(obj, provenance=P.EAGER)
            self.assertEqual(f.event(), e, make.__name__)
            f.wait(self.c)
            f.close()

    def test_the_fence_keeps_the_framework_s_event_alive_while_open(self):
        e = self.recorded()
        obj = torch_event(e)
        ref = weakref.ref(obj)
        f = dlsync.Fence.from_event(obj, provenance=P.EAGER)
        del obj
        gc.collect()
        self.assertIsNotNone(ref(), "the event's object went while the fence was open")
        f.close()
        gc.collect()
        self.assertIsNone(ref())

    def test_own_int_handle_is_destroyed_by_dlsync(self):
        e = FAKE.event()  # not in self.events: dlsync destroys it
        FAKE.work(self.p)
        FAKE.record(e, self.p)
        f = dlsync.Fence.from_event(e, provenance=P.EAGER, own=True)
        f.wait(self.c)
        destroyed = FAKE.calls("cuEventDestroy")
        f.close()
        # Destroyed at dlsync's next collection: the next import.
        g = dlsync.Fence.from_event(self.recorded(), provenance=P.EAGER)
        self.assertEqual(FAKE.calls("cuEventDestroy"), destroyed + 1)
        g.close()
        self.assert_refused(lambda: dlsync.Fence.from_event(e, provenance=P.EAGER), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT", "not a live event")


@needs_fake
class BadInput(_Base):
    def test_own_true_for_an_event_python_owns_is_refused(self):
        for make in (torch_event, torch_generic_event, cupy_event, core_event):
            e = self.recorded()
            queries = FAKE.calls("cuEventQuery")
            self.assert_refused(lambda: dlsync.Fence.from_event(make(e), provenance=P.EAGER,
                                                                own=True),
                                dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT", "own=True",
                                "Event")
            self.assertEqual(FAKE.calls("cuEventQuery"), queries)
        e = self.recorded()
        self.assert_refused(lambda: dlsync.Fence.from_event(e, provenance=P.EAGER, own=1),
                            TypeError, None, "own must be a bool")

    def test_an_object_that_is_no_event(self):
        for bad in (object(), 1.5, "e", None, True, _typed("numpy", "Event", ptr=5)):
            self.assert_refused(lambda: dlsync.Fence.from_event(bad, provenance=P.EAGER),
                                TypeError, None, "cannot find a CUDA event")

    def test_null_and_out_of_range_handles(self):
        self.assert_refused(lambda: dlsync.Fence.from_event(0, provenance=P.EAGER), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT", "event is NULL")
        for bad in (-1, 2**64):
            self.assert_refused(lambda: dlsync.Fence.from_event(bad, provenance=P.EAGER),
                                ValueError, None, "CUevent handle")
        # A framework object whose handle is 0: never recorded (torch makes
        # its CUDA event at the first record).
        for make in (torch_event, torch_generic_event):
            self.assert_refused(lambda: dlsync.Fence.from_event(make(0), provenance=P.EAGER),
                                dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT",
                                "no CUDA event yet", "record it before importing it")
        self.assert_refused(lambda: dlsync.Fence.from_event(cupy_event(0), provenance=P.EAGER),
                            dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT", "event is NULL")
        closed = core_event(self.recorded(), closed=True)
        self.assert_refused(lambda: dlsync.Fence.from_event(closed, provenance=P.EAGER),
                            dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT", "was closed")

    def test_a_destroyed_event(self):
        e = FAKE.event()
        FAKE.event_destroy(e)
        self.assert_refused(lambda: dlsync.Fence.from_event(e, provenance=P.EAGER), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT", "not a live event",
                            "CUDA_ERROR_INVALID_HANDLE")

    def test_provenance_and_capture_id(self):
        e = self.recorded()
        imp = dlsync.Fence.from_event
        self.assert_refused(lambda: imp(e, provenance="bogus"), ValueError, None,
                            "unknown provenance 'bogus'", "EXTERNAL_RECORD")
        self.assert_refused(lambda: imp(e, provenance=7), ValueError, None,
                            "unknown provenance 7")
        self.assert_refused(lambda: imp(e, provenance=None), TypeError, None,
                            "provenance must be a dlsync.Provenance")
        self.assert_refused(lambda: imp(e, provenance=P.CAPTURED), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT",
                            "capture_id 0 with provenance CAPTURED")
        self.assert_refused(lambda: imp(e, provenance=P.EAGER, capture_id=7), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT", "capture_id 7 with provenance EAGER")
        self.assert_refused(lambda: imp(e, provenance=P.CAPTURED, capture_id=1.5), TypeError,
                            None, "capture_id must be an int")
        self.assert_refused(lambda: imp(e, provenance=P.CAPTURED, capture_id=-1), ValueError,
                            None, "capture_id is -1")
        with self.assertRaises(TypeError):
            imp(e, P.EAGER)  # provenance is keyword-only

    def test_eager_declared_for_a_record_in_a_capture(self):
        e = self.event()
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        FAKE.record(e, self.p)
        self.assert_refused(lambda: dlsync.Fence.from_event(e, provenance=P.EAGER), dlsync.Error,
                            "DLSYNC_ERROR_INVALID_ARGUMENT", "provenance EAGER contradicts",
                            "declare it CAPTURED")
        r, _ = FAKE.end_capture_graph(self.p)
        self.assertNotEqual(r, fake_cuda.CUDA_SUCCESS)  # the driver invalidated it (R41)

    def test_a_closed_fence(self):
        f = dlsync.Fence.from_event(self.recorded(), provenance=P.EAGER)
        f.close()
        f.close()  # twice: nothing
        for fn in (f.event, lambda: f.provenance, lambda: f.wait(self.c)):
            self.assert_refused(fn, dlsync.Error, "DLSYNC_ERROR_INVALID_ARGUMENT",
                                "the fence was closed")


@needs_fake
class OnTheBackendInUse(unittest.TestCase):
    def test_expected_backend(self):
        if os.environ.get("DLSYNC_EXPECT_NATIVE"):
            self.assertEqual(_backend.active.name, "native")


if __name__ == "__main__":
    unittest.main()
