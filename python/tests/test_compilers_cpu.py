# SPDX-License-Identifier: Apache-2.0
"""What graph compilers call from Python, on the fake CUDA driver
(fake_cuda.py), on the backend in use (test_backends.py runs this file on
the compiled one too): dlsync.exchange(producer, consumers=[...]) (one
producer, many consumers: dlsync_exchange_begin_fanout), keep_edge_data,
and dlsync.conditional_node (dlsync_conditional_node_declare: event nodes
hoisted out of a declared body into its parent).

The fake models conditional bodies as the H200 does (R28 of
tests/fake/fake_driver.h): an event node put in a body during a capture
into it is accepted, the capture ends cleanly, and the parent graph then
fails to instantiate. Each hoist test has that control. Plain unittest;
ctest runs it with DLSYNC_LIBRARY and DLSYNC_TEST_FAKE_LIBCUDA set."""
import os
import sys
import unittest

import fake_cuda  # before dlsync asks for a context

FAKE, WHY = fake_cuda.load()
if os.environ.get("DLSYNC_TEST_PKG"):
    sys.path.insert(0, os.environ["DLSYNC_TEST_PKG"])
else:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlsync  # noqa: E402
from dlsync import _backend  # noqa: E402

needs_fake = unittest.skipIf(FAKE is None, f"no fake driver: {WHY}")
WAIT = fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT
RECORD = fake_cuda.CU_GRAPH_NODE_TYPE_EVENT_RECORD
EVENT_NODES = (RECORD, WAIT)


def _records():
    return FAKE.calls("cuEventRecord") + FAKE.calls("cuEventRecordWithFlags")


def _waits():
    return FAKE.calls("cuStreamWaitEvent")


class _Tensor:
    """A CUDA DLPack producer on a stream (its __cuda_stream__)."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        return "capsule"


@needs_fake
class Fanout(unittest.TestCase):
    def setUp(self):
        self.p = FAKE.stream()
        self.cs = [FAKE.stream() for _ in range(3)]

    def test_eager_one_record_one_wait_per_consumer_then_the_join(self):
        r0, w0 = _records(), _waits()
        with dlsync.exchange(self.p, consumers=self.cs):
            self.assertEqual((_records() - r0, _waits() - w0), (1, 3))
            for c in self.cs:
                FAKE.work(c)
        # the join: one event per consumer stream recorded, the producer waits for each
        self.assertEqual((_records() - r0, _waits() - w0), (4, 6))

    def test_the_backend_call_matches_one_handle(self):
        r0, w0 = _records(), _waits()
        h = _backend.active.begin_fanout(self.p, self.cs, 0)
        self.assertIsInstance(h, int)
        self.assertEqual((_records() - r0, _waits() - w0), (1, 3))
        _backend.active.end(h)
        self.assertEqual((_records() - r0, _waits() - w0), (4, 6))

    def test_a_tensor_producer_and_stream_objects(self):
        w0 = _waits()
        with dlsync.exchange(_Tensor(self.p), consumers=tuple(_Tensor(c) for c in self.cs)):
            self.assertEqual(_waits() - w0, 3)

    def test_capturing_producer_eager_consumers_join_and_are_joined_back(self):
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        with dlsync.exchange(self.p, consumers=self.cs):
            for c in self.cs:
                self.assertEqual(dlsync.capture_state(c), "capturing")
                FAKE.work(c)
        self.assertEqual(FAKE.end_capture(self.p), fake_cuda.CUDA_SUCCESS)
        for c in self.cs:
            self.assertEqual(dlsync.capture_state(c), "eager")

    def test_control_without_the_join_the_capture_does_not_end(self):
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        h = _backend.active.begin_fanout(self.p, self.cs, 0)
        for c in self.cs:
            FAKE.work(c)
        self.assertEqual(FAKE.end_capture(self.p), fake_cuda.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)
        try:
            _backend.active.end(h)
        except dlsync.Error:
            pass

    def test_keep_edge_data_and_capture_stable_are_accepted(self):
        self.assertEqual((dlsync.CAPTURE_STABLE, dlsync.KEEP_EDGE_DATA), (1, 2))
        w0 = _waits()
        with dlsync.exchange(self.p, self.cs[0], keep_edge_data=True):
            self.assertEqual(_waits() - w0, 1)
        with dlsync.exchange(self.p, consumers=self.cs, capture_stable=True,
                             keep_edge_data=True):
            pass
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        with dlsync.exchange(self.p, consumers=self.cs[:2], keep_edge_data=True):
            FAKE.work(self.cs[0])
        self.assertEqual(FAKE.end_capture(self.p), fake_cuda.CUDA_SUCCESS)

    def test_producers_in_a_list(self):
        w0 = _waits()
        with dlsync.exchange([self.p], consumers=self.cs):  # one producer in a list
            self.assertEqual(_waits() - w0, 3)
        other = FAKE.stream()
        w0 = _waits()
        with dlsync.exchange([self.p, other], self.cs[0], keep_edge_data=True):  # many, one
            self.assertEqual(_waits() - w0, 2)
        with self.assertRaisesRegex(ValueError, "empty list"):
            dlsync.exchange([], consumers=self.cs)

    def test_entered_once_at_a_time(self):
        ex = dlsync.exchange(self.p, consumers=self.cs)
        with self.assertRaisesRegex(RuntimeError, "__exit__ without"):
            ex.__exit__(None, None, None)
        with ex:
            with self.assertRaisesRegex(RuntimeError, "already entered"):
                ex.__enter__()
        with ex:  # again, once exited
            pass

    def test_entered_and_dropped_is_ended_the_capture_ends_cleanly(self):
        FAKE.begin_capture(self.p)
        FAKE.work(self.p)
        ex = dlsync.exchange(self.p, consumers=self.cs)
        ex.__enter__()
        for c in self.cs:
            FAKE.work(c)
        del ex  # never exited: its join runs as it goes
        self.assertEqual(FAKE.end_capture(self.p), fake_cuda.CUDA_SUCCESS)

    def _refused(self, consumers, words, producer=None):
        r0, w0 = _records(), _waits()
        with self.assertRaises(dlsync.Error) as cm:
            with dlsync.exchange(self.p if producer is None else producer, consumers=consumers):
                self.fail("entered")
        self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        for w in words:
            self.assertIn(w, cm.exception.message)
        self.assertEqual((_records(), _waits()), (r0, w0), "something was queued")
        return cm.exception

    def test_bad_consumers_refused_nothing_queued(self):
        self._refused([self.cs[0], None], ["consumers[1] is None", "nothing was queued"])
        self._refused([self.cs[0], self.cs[1], self.cs[0]], ["same"])
        self._refused([self.cs[0], self.p], ["producer"])
        self._refused([], ["0 consumers"])
        too_many = [FAKE.stream() for _ in range(1025)]
        self._refused(too_many, ["1024"])
        self._refused([self.cs[0]], ["many producers", "nothing was queued"],
                      producer=[self.p, self.cs[1]])
        # a capture is left as it was by a refusal
        FAKE.begin_capture(self.p)
        self._refused([self.cs[0], self.cs[0]], ["same"])
        self.assertEqual(dlsync.capture_state(self.cs[0]), "eager")
        self.assertEqual(FAKE.end_capture(self.p), fake_cuda.CUDA_SUCCESS)

    def test_objects_that_are_not_streams(self):
        with self.assertRaises(TypeError):
            dlsync.exchange(self.p, consumers=[self.cs[0], 1.5]).__enter__()
        with self.assertRaisesRegex(TypeError, "list or tuple"):
            dlsync.exchange(self.p, consumers=set(self.cs)).__enter__()
        with self.assertRaisesRegex(TypeError, "not both"):
            dlsync.exchange(self.p, self.cs[0], consumers=self.cs)
        with self.assertRaisesRegex(TypeError, "consumer is missing"):
            dlsync.exchange(self.p)
        with self.assertRaisesRegex(TypeError, "list or tuple"):
            _backend.active.begin_fanout(self.p, "ab", 0)


@needs_fake
class ConditionalNode(unittest.TestCase):
    """A parent graph being captured on ``self.main`` holds a conditional
    node; ``self.s`` captures into its body; ``self.other`` is an eager
    producer."""

    def setUp(self):
        self.main = FAKE.stream()
        FAKE.begin_capture(self.main)
        FAKE.work(self.main)
        self.parent = dlsync.capture_graph(self.main)
        self.other, self.s = FAKE.stream(), FAKE.stream()

    def tearDown(self):
        r, g = FAKE.end_capture_graph(self.main)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        FAKE.graph_destroy(g)

    def _node(self, kind=fake_cuda.COND_IF):
        _, node, body = FAKE.conditional_node(kind, parent=self.parent)
        return node, body

    def _eager_producer_into_the_body(self, body):
        FAKE.begin_capture_to(self.s, body)
        FAKE.work(self.s)
        # one way: the eager producer cannot wait for the body's graph
        dlsync.order(self.other, self.s)
        FAKE.work(self.s)
        FAKE.work(self.s)
        r, _ = FAKE.end_capture_graph(self.s)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)

    def test_declared_the_wait_goes_into_the_parent(self):
        for kind in (fake_cuda.COND_IF, fake_cuda.COND_WHILE):
            node, body = self._node(kind)
            waits = FAKE.node_types(self.parent).count(WAIT)
            with dlsync.conditional_node(self.parent, node, body) as handles:
                self.assertEqual(handles, (body,))
                self.assertTrue(dlsync.is_conditional_body(body))
                self._eager_producer_into_the_body(body)
            self.assertFalse(dlsync.is_conditional_body(body))
            self.assertFalse(set(FAKE.node_types(body)) & set(EVENT_NODES), FAKE.node_types(body))
            self.assertEqual(FAKE.node_types(self.parent).count(WAIT), waits + 1)
        # the parent still instantiates: a copy of what the capture built so far
        r, g = FAKE.end_capture_graph(self.main)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        self.assertEqual(FAKE.instantiates(g), fake_cuda.CUDA_SUCCESS)
        FAKE.graph_destroy(g)
        FAKE.begin_capture(self.main)  # for tearDown

    def test_control_undeclared_the_wait_lands_in_the_body_and_the_parent_fails(self):
        node, body = self._node()
        self._eager_producer_into_the_body(body)
        self.assertIn(WAIT, FAKE.node_types(body))
        r, g = FAKE.end_capture_graph(self.main)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        self.assertEqual(FAKE.instantiates(g), fake_cuda.CUDA_ERROR_INVALID_VALUE)
        FAKE.graph_destroy(g)
        FAKE.begin_capture(self.main)

    def test_nested_blocks_and_a_body_block_keep_the_declaration(self):
        node, body = self._node()
        with dlsync.conditional_node(self.parent, node, [body]):
            with dlsync.conditional_node(self.parent, node, (body,)):
                pass
            self.assertTrue(dlsync.is_conditional_body(body))
        self.assertFalse(dlsync.is_conditional_body(body))

    def test_removed_when_the_block_raises(self):
        node, body = self._node()
        with self.assertRaises(KeyError):
            with dlsync.conditional_node(self.parent, node, body):
                raise KeyError("x")
        self.assertFalse(dlsync.is_conditional_body(body))

    def test_a_cuda_core_body_builder(self):
        node, body = self._node()
        builder = type("GraphBuilder", (), {"__module__": "cuda.core.experimental._graph",
                                            "_mnff": type("M", (), {"conditional_graph": body,
                                                                     "graph": None})()})()
        with dlsync.conditional_node(self.parent, node, [builder]) as handles:
            self.assertEqual(handles, (body,))

    def test_a_cuda_core_parent_builder_gives_the_node_it_just_added(self):
        """cuda.core's if_then / while_loop add the node with cuGraphAddNode and
        make it the builder's only capture dependency: with node=None,
        dlsync reads it there (cuda.bindings' cuStreamGetCaptureInfo, faked
        over the fake driver here)."""
        import types

        driver = types.ModuleType("cuda.bindings.driver")
        driver.CUstreamCaptureStatus = types.SimpleNamespace(CU_STREAM_CAPTURE_STATUS_ACTIVE=1)

        def get_capture_info(stream):
            r, status, cid, graph, deps = FAKE.capture_info(int(stream))
            return (r, status, cid, graph, deps, None, len(deps))

        driver.cuStreamGetCaptureInfo = get_capture_info
        main = self.main
        builder = type("GraphBuilder", (), {"__module__": "cuda.core.experimental._graph",
                                            "__cuda_stream__": lambda self: (0, main)})()
        saved = {k: sys.modules.get(k) for k in ("cuda", "cuda.bindings", "cuda.bindings.driver")}
        sys.modules.update({"cuda": types.ModuleType("cuda"),
                            "cuda.bindings": types.ModuleType("cuda.bindings"),
                            "cuda.bindings.driver": driver})
        try:
            node, body = self._node(fake_cuda.COND_WHILE)
            FAKE.set_capture_dependencies(self.main, [node])  # what cuda.core does
            waits = FAKE.node_types(self.parent).count(WAIT)
            with dlsync.conditional_node(builder, None, body) as handles:
                self.assertEqual(handles, (body,))
                self._eager_producer_into_the_body(body)
            self.assertEqual(FAKE.node_types(self.parent).count(WAIT), waits + 1)
            self.assertFalse(set(FAKE.node_types(body)) & set(EVENT_NODES))
            # once the builder queued more work, its dependency is no longer the node
            node2, body2 = self._node()
            FAKE.set_capture_dependencies(self.main, [node2])
            FAKE.work(self.main)
            with self.assertRaisesRegex(dlsync.Error, "not a conditional node"):
                dlsync.conditional_node(builder, None, body2).__enter__()
            FAKE.set_capture_dependencies(self.main, FAKE.capture_info(self.main)[4] + [node2])
            with self.assertRaisesRegex(ValueError, "2 dependencies, not the one conditional "
                                                    "node: declare it right after"):
                dlsync.conditional_node(builder, None, body2).__enter__()
            self.assertFalse(dlsync.is_conditional_body(body2))
        finally:
            for k, v in saved.items():
                if v is None:
                    sys.modules.pop(k, None)
                else:
                    sys.modules[k] = v

    def _refused(self, fn, *words):
        with self.assertRaises(dlsync.Error) as cm:
            with fn():
                self.fail("entered")
        self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        for w in words:
            self.assertIn(w, cm.exception.message)

    def test_bad_declarations_refused_nothing_declared(self):
        node, body = self._node()
        other_parent, other_node, other_body = FAKE.conditional_node()
        try:
            plain = FAKE.graph()
            self._refused(lambda: dlsync.conditional_node(self.parent, node, []))
            self._refused(lambda: dlsync.conditional_node(self.parent, node, [body, body]))
            self._refused(lambda: dlsync.conditional_node(self.parent, other_node, body))
            self._refused(lambda: dlsync.conditional_node(self.parent, node, [self.parent]))
            self._refused(lambda: dlsync.conditional_node(self.parent, node, [plain] * 65))
            self.assertFalse(dlsync.is_conditional_body(body))
            with dlsync.conditional_node(self.parent, node, body):
                # declared with another node already
                self._refused(lambda: dlsync.conditional_node(other_parent, other_node, body))
            self.assertFalse(dlsync.is_conditional_body(body))
            FAKE.graph_destroy(plain)
        finally:
            FAKE.graph_destroy(other_parent)

    def test_objects_it_cannot_use(self):
        node, body = self._node()
        for args, words in (((object(), node, body), "the parent"),
                            ((self.parent, 1.5, body), "the node"),
                            ((self.parent, node, object()), "conditional node's body"),
                            ((self.parent, None, body), "node is None"),
                            ((self.parent, node, None), "name the node's bodies")):
            with self.assertRaisesRegex(TypeError, words):
                dlsync.conditional_node(*args).__enter__()
        with self.assertRaisesRegex(TypeError, "list or tuple"):
            _backend.active.node_declare(self.parent, node, {body})
        with self.assertRaisesRegex(TypeError, "bodies\\[1\\] must be an int CUgraph"):
            _backend.active.node_declare(self.parent, node, [body, "x"])
        with self.assertRaisesRegex(TypeError, "the node must be an int CUgraphNode"):
            _backend.active.node_declare(self.parent, None, [body])
        self.assertFalse(dlsync.is_conditional_body(body))


if __name__ == "__main__":
    unittest.main()
