# SPDX-License-Identifier: Apache-2.0
"""dlsync.conditional_body and dlsync.launch on the fake CUDA driver
(fake_cuda.py), on the backend in use (test_backends.py runs this file on
the compiled one too).

The fake models conditional bodies as the H200 does (R28 of
tests/fake/fake_driver.h): an event node put in a body during a capture
into it is accepted, the capture ends cleanly, and the parent graph then
fails to instantiate. Each refusal test has its control: the same call on
an undeclared body succeeds and leaves a parent that cannot be
instantiated. Plain unittest; ctest runs it with DLSYNC_LIBRARY and
DLSYNC_TEST_FAKE_LIBCUDA set."""
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
EVENT_NODES = (fake_cuda.CU_GRAPH_NODE_TYPE_EVENT_RECORD, fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT)


class _Producer:
    """A CUDA DLPack producer on a stream (its __cuda_stream__)."""

    def __init__(self, stream):
        self.stream = stream

    def __cuda_stream__(self):
        return (0, self.stream)

    def __dlpack_device__(self):
        return (2, 0)

    def __dlpack__(self, stream=None, **kw):
        return "capsule"


def _fake_type(module, name, **attrs):
    """An object whose type claims ``module.name`` (a framework's graph, as
    dlsync recognises it) with the given attributes."""
    return type(name, (), dict(attrs, __module__=module))()


class _CoreBuilder:
    """cuda.core 1.x's GraphBuilder as dlsync sees it: graph_definition (a
    view whose .handle is the CUgraph) raises RuntimeError where cuda.core
    does (a primary builder before its building ended, any builder while it
    builds); is_building; is_join_required (a forked builder)."""

    def __init__(self, graph, body, building=False, forked=False):
        self._graph, self._body = graph, body
        self.is_building, self.is_join_required = building, forked

    @property
    def graph_definition(self):
        if self.is_join_required or self.is_building or (not self._body and not self._graph):
            raise RuntimeError("not available now")
        return type("GraphDefinition", (), {"handle": self._graph})()


_CoreBuilder.__name__ = _CoreBuilder.__qualname__ = "GraphBuilder"
_CoreBuilder.__module__ = "cuda.core.graph._graph_builder"


@needs_fake
class ConditionalBodies(unittest.TestCase):
    def setUp(self):
        self.parent, self.body = FAKE.conditional()
        self.s = FAKE.stream()  # captures into the body
        self.other = FAKE.stream()  # eager

    def tearDown(self):
        FAKE.graph_destroy(self.parent)

    def _begin(self):
        FAKE.begin_capture_to(self.s, self.body)
        FAKE.work(self.s)

    def _end_cleanly(self):
        r, g = FAKE.end_capture_graph(self.s)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        self.assertEqual(g, self.body)

    def _assert_refused(self, fn, row):
        with self.assertRaises(dlsync.Error) as cm:
            fn()
        e = cm.exception
        self.assertEqual(e.status, "DLSYNC_ERROR_CONDITIONAL_BODY")
        self.assertEqual(e.status, dlsync.CONDITIONAL_BODY)
        self.assertIn(row, e.message)
        self.assertIn(f"graph {self.body:#x}", e.message)
        self.assertIn("before the conditional node", e.message)
        self.assertIn("Nothing was queued", e.message)

    def _assert_parent_good(self):
        self.assertFalse(set(FAKE.node_types(self.body)) & set(EVENT_NODES),
                         FAKE.node_types(self.body))
        self.assertEqual(FAKE.instantiates(self.parent), fake_cuda.CUDA_SUCCESS)

    def test_undeclared_body_the_control_parent_fails_to_instantiate(self):
        self._begin()
        ex = dlsync.exchange(self.other, self.s)
        ex.__enter__()  # EAGER_TO_CAPTURE: a wait node in the body
        FAKE.work(self.s)
        try:
            ex.__exit__(None, None, None)
        except dlsync.Error:  # an eager producer cannot wait for the capture: not the point
            pass
        self._end_cleanly()
        self.assertIn(fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT, FAKE.node_types(self.body))
        self.assertEqual(FAKE.instantiates(self.parent), fake_cuda.CUDA_ERROR_INVALID_VALUE)

    def test_exchange_that_adds_a_wait_node_is_refused_by_name(self):
        with dlsync.conditional_body(self.body) as g:
            self.assertEqual(g, self.body)
            self.assertTrue(dlsync.is_conditional_body(self.body))
            self._begin()
            for _ in range(3):  # the fast path's repeated calls too
                self._assert_refused(lambda: dlsync.exchange(self.other, self.s).__enter__(),
                                     "EAGER_TO_CAPTURE")
            self.assertEqual(dlsync.capture_state(self.s), "capturing")
            FAKE.work(self.s)
            self._end_cleanly()
        self.assertFalse(dlsync.is_conditional_body(self.body))
        self._assert_parent_good()

    def test_edge_only_join_works_inside_the_body(self):
        with dlsync.conditional_body(self.body):
            self._begin()
            with dlsync.exchange(self.s, self.other):  # JOIN: the eager stream joins
                self.assertEqual(dlsync.capture_state(self.other), "capturing")
                FAKE.work(self.other)
            FAKE.work(self.s)
            self._end_cleanly()  # joined back: else CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        self._assert_parent_good()
        self.assertGreaterEqual(len(FAKE.node_types(self.body)), 3)

    def test_wrap_in_a_scope_refused_and_joined(self):
        with dlsync.conditional_body(self.body):
            self._begin()
            with dlsync.scope():
                # An eager producer read on the body's capture: EAGER_TO_CAPTURE.
                w = dlsync.wrap(_Producer(self.other))
                self._assert_refused(lambda: w.__dlpack__(stream=self.s), "EAGER_TO_CAPTURE")
                # The body's capture read by an eager consumer: JOIN, edges only.
                dlsync.wrap(_Producer(self.s)).__dlpack__(stream=self.other)
                FAKE.work(self.other)
            FAKE.work(self.s)
            self._end_cleanly()
        self._assert_parent_good()

    def test_fences_in_the_body_refused(self):
        with dlsync.conditional_body(self.body):
            self._begin()
            self._assert_refused(lambda: dlsync.Fence(self.s), "dlsync_fence_signal")
            f = dlsync.Fence(self.other)
            try:
                self._assert_refused(lambda: f.wait(self.s), "EAGER_TO_CAPTURE")
            finally:
                f.close()
            self._end_cleanly()
        self._assert_parent_good()

    def test_fence_control_undeclared_parent_fails(self):
        self._begin()
        f = dlsync.Fence(self.other)
        f.wait(self.s)
        f.close()
        self._end_cleanly()
        self.assertEqual(FAKE.instantiates(self.parent), fake_cuda.CUDA_ERROR_INVALID_VALUE)

    def test_ordering_before_the_conditional_node_instead(self):
        # What the refusal says to do: the wait placed in the parent graph
        # (a capture into the parent, which holds the conditional node),
        # the body captured with edges only; the parent instantiates.
        parent_s = FAKE.stream()
        with dlsync.conditional_body(self.body):
            FAKE.begin_capture_to(parent_s, self.parent)
            f = dlsync.Fence(self.other)
            f.wait(parent_s)  # EAGER_TO_CAPTURE on the parent's capture: a wait node there
            f.close()
            FAKE.work(parent_s)
            r, g = FAKE.end_capture_graph(parent_s)
            self.assertEqual((r, g), (fake_cuda.CUDA_SUCCESS, self.parent))
            self._begin()
            self._end_cleanly()
        self.assertIn(fake_cuda.CU_GRAPH_NODE_TYPE_WAIT_EVENT, FAKE.node_types(self.parent))
        self._assert_parent_good()

    def test_capture_graph_names_the_body_a_stream_captures_into(self):
        self.assertIsNone(dlsync.capture_graph(self.s))
        self._begin()
        self.assertEqual(dlsync.capture_graph(self.s), self.body)
        # torch's way: the body's stream is known, its graph is not.
        with dlsync.conditional_body(dlsync.capture_graph(self.s)):
            self._assert_refused(lambda: dlsync.exchange(self.other, self.s).__enter__(),
                                 "EAGER_TO_CAPTURE")
        self._end_cleanly()
        self._assert_parent_good()

    def test_nested_blocks_keep_the_declaration_until_the_outer_exits(self):
        with dlsync.conditional_body(self.body):
            with dlsync.conditional_body(self.body):
                pass
            self.assertTrue(dlsync.is_conditional_body(self.body))
        self.assertFalse(dlsync.is_conditional_body(self.body))

    def test_declaration_removed_when_the_block_raises(self):
        with self.assertRaises(KeyError):
            with dlsync.conditional_body(self.body):
                raise KeyError("x")
        self.assertFalse(dlsync.is_conditional_body(self.body))

    def test_while_body_and_cuda_core_builder(self):
        parent, body = FAKE.conditional(fake_cuda.COND_WHILE)
        members = type("M", (), {})()
        members.conditional_graph, members.graph = body, None
        builder = _fake_type("cuda.core._graph._graph_builder", "GraphBuilder", _mnff=members)
        try:
            with dlsync.conditional_body(builder) as g:
                self.assertEqual(g, body)
                FAKE.begin_capture_to(self.s, body)
                FAKE.work(self.s)
                with self.assertRaises(dlsync.Error) as cm:
                    dlsync.exchange(self.other, self.s).__enter__()
                self.assertEqual(cm.exception.status, dlsync.CONDITIONAL_BODY)
                r, _ = FAKE.end_capture_graph(self.s)
                self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
            self.assertEqual(FAKE.instantiates(parent), fake_cuda.CUDA_SUCCESS)
        finally:
            FAKE.graph_destroy(parent)

    def test_cuda_core_1_builder(self):
        parent, body = FAKE.conditional()
        try:
            with dlsync.conditional_body(_CoreBuilder(body, body=True)) as g:
                self.assertEqual(g, body)
                self.assertTrue(dlsync.is_conditional_body(body))
            self.assertFalse(dlsync.is_conditional_body(body))
            for builder in (_CoreBuilder(None, body=False),  # a primary builder, not built
                            _CoreBuilder(body, body=True, building=True),  # capture begun
                            _CoreBuilder(body, body=True, forked=True)):
                with self.assertRaisesRegex(TypeError, "not a conditional body's builder"):
                    with dlsync.conditional_body(builder):
                        pass
                self.assertFalse(dlsync.is_conditional_body(body))
        finally:
            FAKE.graph_destroy(parent)

    def test_bad_bodies(self):
        with self.assertRaisesRegex(TypeError, r"not object"):
            with dlsync.conditional_body(object()):
                pass
        not_a_body = _fake_type("cuda.core._graph", "GraphBuilder",
                                _mnff=type("M", (), {"conditional_graph": None})())
        with self.assertRaisesRegex(TypeError, "not a conditional body's builder"):
            with dlsync.conditional_body(not_a_body):
                pass
        with self.assertRaises(dlsync.Error) as cm:
            with dlsync.conditional_body(0):
                pass
        self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
        with self.assertRaisesRegex(TypeError, "must be an int CUgraph handle, not bool"):
            with dlsync.conditional_body(True):
                pass
        with self.assertRaises(dlsync.Error):  # never declared
            _backend.active.body_remove(self.body)


@needs_fake
class Launch(unittest.TestCase):
    def setUp(self):
        self.g = FAKE.captured_graph(2)
        r, self.x = FAKE.instantiate(self.g)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        self.s = FAKE.stream()

    def tearDown(self):
        FAKE.exec_destroy(self.x)
        FAKE.graph_destroy(self.g)

    def test_eager_launches_the_executable(self):
        before = FAKE.calls("cuGraphLaunch")
        dlsync.launch(self.g, self.s, exec=self.x)
        self.assertEqual(FAKE.calls("cuGraphLaunch"), before + 1)

    def test_eager_without_an_executable_is_refused(self):
        with self.assertRaises(dlsync.Error) as cm:
            dlsync.launch(self.g, self.s)
        self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")

    def test_in_capture_one_child_node_no_other(self):
        FAKE.begin_capture(self.s)
        FAKE.work(self.s)
        dlsync.launch(self.g, self.s)
        FAKE.work(self.s)
        r, cap = FAKE.end_capture_graph(self.s)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        types = FAKE.node_types(cap)
        self.assertEqual(types.count(fake_cuda.CU_GRAPH_NODE_TYPE_CHILD), 1, types)
        self.assertEqual(len(types), 3, types)
        FAKE.graph_destroy(cap)

    def test_in_a_while_body_as_a_child_node(self):
        parent, body = FAKE.conditional(fake_cuda.COND_WHILE)
        try:
            with dlsync.conditional_body(body):
                FAKE.begin_capture_to(self.s, body)
                dlsync.launch(self.g, self.s)
                r, _ = FAKE.end_capture_graph(self.s)
                self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
            self.assertEqual(FAKE.node_types(body), [fake_cuda.CU_GRAPH_NODE_TYPE_CHILD])
            self.assertEqual(FAKE.instantiates(parent), fake_cuda.CUDA_SUCCESS)
        finally:
            FAKE.graph_destroy(parent)

    def test_a_graph_with_a_conditional_node_is_refused_in_capture(self):
        parent, _ = FAKE.conditional()
        try:
            FAKE.begin_capture(self.s)
            with self.assertRaises(dlsync.Error) as cm:
                dlsync.launch(parent, self.s)
            self.assertEqual(cm.exception.status, "DLSYNC_ERROR_INVALID_ARGUMENT")
            self.assertIn("conditional", cm.exception.message)
            r, cap = FAKE.end_capture_graph(self.s)
            self.assertEqual(r, fake_cuda.CUDA_SUCCESS)  # the capture still valid
            FAKE.graph_destroy(cap)
        finally:
            FAKE.graph_destroy(parent)

    def test_framework_objects(self):
        before = FAKE.calls("cuGraphLaunch")
        g, x = self.g, self.x
        torch_graph = _fake_type("torch.cuda.graphs", "CUDAGraph",
                                 raw_cuda_graph=lambda self: g,
                                 raw_cuda_graph_exec=lambda self: x)
        dlsync.launch(torch_graph, self.s)
        members = type("M", (), {"graph": g, "conditional_graph": None})()
        builder = _fake_type("cuda.core._graph._graph_builder", "GraphBuilder", _mnff=members)
        dlsync.launch(builder, self.s, exec=x)
        core_graph = _fake_type("cuda.core._graph._graph_builder", "Graph", handle=x)
        dlsync.launch(core_graph, self.s)
        dlsync.launch(_CoreBuilder(g, body=False), self.s, exec=x)  # cuda.core 1.x
        # CuPy 14's Graph: its cudaGraph_t destroyed at instantiate (0), its executable shown
        dlsync.launch(_fake_type("cupy.cuda.graph", "Graph", graph=0, graphExec=x), self.s)
        cu_graph = _fake_type("cuda.bindings.driver", "CUgraphExec", __int__=lambda self: x)
        dlsync.launch(None, self.s, exec=cu_graph)
        self.assertEqual(FAKE.calls("cuGraphLaunch"), before + 6)
        # In a capture, the torch graph gives its CUgraph: a child node. CuPy's
        # executable alone cannot be one: refused by the library, nothing added.
        FAKE.begin_capture(self.s)
        with self.assertRaisesRegex(dlsync.Error, "graph is NULL"):
            dlsync.launch(_fake_type("cupy.cuda.graph", "Graph", graph=0, graphExec=x), self.s)
        dlsync.launch(torch_graph, self.s)
        r, cap = FAKE.end_capture_graph(self.s)
        self.assertEqual(r, fake_cuda.CUDA_SUCCESS)
        self.assertEqual(FAKE.node_types(cap), [fake_cuda.CU_GRAPH_NODE_TYPE_CHILD])
        FAKE.graph_destroy(cap)

    def test_objects_it_cannot_use_named(self):
        with self.assertRaisesRegex(TypeError, r"not object$"):
            dlsync.launch(object(), self.s)
        with self.assertRaisesRegex(TypeError, r"cupy\.cuda\.graph\.Graph exposes no handle"):
            dlsync.launch(_fake_type("cupy.cuda.graph", "Graph"), self.s)

        def missing(self):
            raise RuntimeError("You cannot access the raw cudaGraph_t instance")

        kept_nothing = _fake_type("torch.cuda.graphs", "CUDAGraph", raw_cuda_graph=missing,
                                  raw_cuda_graph_exec=missing)
        with self.assertRaisesRegex(ValueError, "keep_graph=True"):
            dlsync.launch(kept_nothing, self.s)
        unbuilt = _fake_type("cuda.core._graph", "GraphBuilder",
                             _mnff=type("M", (), {"graph": None, "conditional_graph": None})())
        with self.assertRaisesRegex(ValueError, "end_building"):
            dlsync.launch(unbuilt, self.s)
        with self.assertRaisesRegex(ValueError, "end_building"):  # cuda.core 1.x
            dlsync.launch(_CoreBuilder(None, body=False), self.s)
        with self.assertRaisesRegex(TypeError, "the exec must be an int CUgraphExec handle"):
            dlsync.launch(self.g, self.s, exec="x")
        with self.assertRaisesRegex(ValueError, r"the graph is -1: a CUgraph handle"):
            dlsync.launch(-1, self.s)


if __name__ == "__main__":
    unittest.main()
