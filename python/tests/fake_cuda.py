# SPDX-License-Identifier: Apache-2.0
"""The fake CUDA driver (tests/fake/fake_libcuda.c, built as libcuda.so.1)
for the Python tests, without a GPU.

``DLSYNC_TEST_FAKE_LIBCUDA`` names it (ctest sets it); ``load()`` opens it
with RTLD_GLOBAL before dlsync creates its default context, so that the
library's dlopen("libcuda.so.1") finds it by its soname. It must run before
anything in the process asked dlsync for a context (import this module
first). The driver calls a test needs (a context current, streams, a
capture, work on a stream) are reached through the fake's
cuGetProcAddress_v2, its controls (fake_libcuda_fail_nth, ...) by name."""

import ctypes
import os

CUDA_SUCCESS = 0
CUDA_ERROR_UNKNOWN = 999
CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904
CU_GRAPH_NODE_TYPE_CONDITIONAL = 13
CU_GRAPH_NODE_TYPE_CHILD = 4  # CU_GRAPH_NODE_TYPE_GRAPH
CU_GRAPH_NODE_TYPE_EVENT_RECORD = 7
CU_GRAPH_NODE_TYPE_WAIT_EVENT = 6
CU_GRAPH_COND_ASSIGN_DEFAULT = 1
COND_IF, COND_WHILE = 0, 1
CAPTURE_RELAXED = 2
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_READY = 600
CU_EVENT_DISABLE_TIMING = 2
CU_EVENT_RECORD_EXTERNAL = 1
# The calls that queue work or add a node: a refusal makes none of them.
QUEUEING_CALLS = ("cuEventRecord", "cuEventRecordWithFlags", "cuStreamWaitEvent",
                  "cuGraphAddEventWaitNode", "cuGraphAddEventRecordNode",
                  "cuStreamUpdateCaptureDependencies")
_vp = ctypes.c_void_p
_P = ctypes.POINTER


class FakeCuda:
    def __init__(self, path):
        self.path = path
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        gpa = self.lib.cuGetProcAddress_v2
        gpa.argtypes = [ctypes.c_char_p, _P(_vp), ctypes.c_int, ctypes.c_uint64, _vp]
        self._gpa = gpa
        self.lib.fake_libcuda_fail_nth.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_int]
        self.lib.fake_libcuda_call_count.argtypes = [ctypes.c_char_p]
        self.lib.fake_libcuda_call_count.restype = ctypes.c_uint
        self.lib.fake_libcuda_run_destructors.restype = ctypes.c_uint
        self._check(self._fn("cuInit", ctypes.c_uint)(0), "cuInit")
        ctx = _vp()
        self._check(self._fn("cuDevicePrimaryCtxRetain", _P(_vp), ctypes.c_int)(
            ctypes.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
        self._check(self._fn("cuCtxPushCurrent", _vp)(ctx), "cuCtxPushCurrent")
        self.ctx = ctx.value
        self._stream_create = self._fn("cuStreamCreate", _P(_vp), ctypes.c_uint)
        self._begin_capture = self._fn("cuStreamBeginCapture", _vp, ctypes.c_int)
        self._end_capture = self._fn("cuStreamEndCapture", _vp, _P(_vp))
        self._memset = self._fn("cuMemsetD32Async", ctypes.c_uint64, ctypes.c_uint,
                                ctypes.c_size_t, _vp)
        mem = ctypes.c_uint64()
        self._check(self._fn("cuMemAlloc", _P(ctypes.c_uint64), ctypes.c_size_t)(
            ctypes.byref(mem), 256), "cuMemAlloc")
        self._mem = mem.value
        self._graph_create = self._fn("cuGraphCreate", _P(_vp), ctypes.c_uint)
        self._graph_destroy = self._fn("cuGraphDestroy", _vp)
        self._cond_create = self._fn("cuGraphConditionalHandleCreate", _P(ctypes.c_uint64), _vp,
                                     _vp, ctypes.c_uint, ctypes.c_uint)
        self._add_node = self._fn("cuGraphAddNode", _P(_vp), _vp, _vp, _vp, ctypes.c_size_t,
                                  _vp)
        self._begin_to_graph = self._fn("cuStreamBeginCaptureToGraph", _vp, _vp, _vp, _vp,
                                        ctypes.c_size_t, ctypes.c_int)
        self._instantiate = self._fn("cuGraphInstantiateWithFlags", _P(_vp), _vp,
                                     ctypes.c_uint64)
        self._exec_destroy = self._fn("cuGraphExecDestroy", _vp)
        self._get_nodes = self._fn("cuGraphGetNodes", _vp, _vp, _P(ctypes.c_size_t))
        self._node_type = self._fn("cuGraphNodeGetType", _vp, _P(ctypes.c_int))
        self._event_create = self._fn("cuEventCreate", _P(_vp), ctypes.c_uint)
        self._event_destroy = self._fn("cuEventDestroy", _vp)
        self._event_record = self._fn("cuEventRecord", _vp, _vp)
        self._event_record_flags = self._fn("cuEventRecordWithFlags", _vp, _vp, ctypes.c_uint)
        self._stream_wait_event = self._fn("cuStreamWaitEvent", _vp, _vp, ctypes.c_uint)
        self._graph_launch = self._fn("cuGraphLaunch", _vp, _vp)
        self._capture_info = self._fn("cuStreamGetCaptureInfo", _vp, _P(ctypes.c_int),
                                      _P(ctypes.c_uint64), _P(_vp), _P(_P(_vp)), _P(_vp),
                                      _P(ctypes.c_size_t))
        self._update_deps = self._fn("cuStreamUpdateCaptureDependencies", _vp, _P(_vp), _vp,
                                     ctypes.c_size_t, ctypes.c_uint)

    def _fn(self, name, *argtypes):
        p = _vp()
        self._gpa(name.encode(), ctypes.byref(p), 12080, 0, None)
        if not p.value:
            raise RuntimeError(f"the fake driver has no {name}")
        return ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(p.value)

    @staticmethod
    def _check(result, what):
        if result != CUDA_SUCCESS:
            raise RuntimeError(f"{what} on the fake driver: CUresult {result}")

    def stream(self):
        """A new non-blocking stream's handle."""
        s = _vp()
        self._check(self._stream_create(ctypes.byref(s), 1), "cuStreamCreate")
        return s.value

    def begin_capture(self, stream):
        self._check(self._begin_capture(stream, 0), "cuStreamBeginCapture")  # global mode

    def end_capture(self, stream):
        """cuStreamEndCapture's CUresult (904: a joined stream left unjoined)."""
        graph = _vp()
        return self._end_capture(stream, ctypes.byref(graph))

    def work(self, stream):
        """Some work queued on the stream (a memset)."""
        self._check(self._memset(self._mem, 0, 4, stream), "cuMemsetD32Async")

    # ---- graphs: conditional bodies and graphs to launch ----

    def graph(self):
        """A new empty graph's handle."""
        g = _vp()
        self._check(self._graph_create(ctypes.byref(g), 0), "cuGraphCreate")
        return g.value

    def graph_destroy(self, graph):
        self._check(self._graph_destroy(graph), "cuGraphDestroy")

    def conditional(self, kind=COND_IF):
        """(parent, body): a new graph with one conditional node (IF or
        WHILE) and that node's body (which the node owns)."""
        parent, _, body = self.conditional_node(kind)
        return parent, body

    def conditional_node(self, kind=COND_IF, parent=None):
        """(parent, node, body): a conditional node (IF or WHILE) added to
        ``parent`` (a new graph when None), the node, and its body."""
        if parent is None:
            parent = self.graph()
        handle = ctypes.c_uint64()
        self._check(self._cond_create(ctypes.byref(handle), parent, self.ctx, 1,
                                      CU_GRAPH_COND_ASSIGN_DEFAULT),
                    "cuGraphConditionalHandleCreate")
        # CUgraphNodeParams (256 bytes): type at 0; the conditional params
        # at 16: handle (u64), type (int), size (uint), phGraph_out, ctx.
        params = (ctypes.c_ubyte * 256)()
        ctypes.c_int.from_buffer(params, 0).value = CU_GRAPH_NODE_TYPE_CONDITIONAL
        ctypes.c_uint64.from_buffer(params, 16).value = handle.value
        ctypes.c_int.from_buffer(params, 24).value = kind
        ctypes.c_uint.from_buffer(params, 28).value = 1
        ctypes.c_void_p.from_buffer(params, 40).value = self.ctx
        node = _vp()
        self._check(self._add_node(ctypes.byref(node), parent, None, None, 0,
                                   ctypes.addressof(params)), "cuGraphAddNode")
        bodies = ctypes.c_void_p.from_buffer(params, 32).value
        return parent, node.value, ctypes.c_void_p.from_address(bodies).value

    def begin_capture_to(self, stream, graph):
        """cuStreamBeginCaptureToGraph(stream, graph), relaxed mode."""
        self._check(self._begin_to_graph(stream, graph, None, None, 0, CAPTURE_RELAXED),
                    "cuStreamBeginCaptureToGraph")

    def end_capture_graph(self, stream):
        """cuStreamEndCapture: (CUresult, the graph)."""
        graph = _vp()
        r = self._end_capture(stream, ctypes.byref(graph))
        return r, graph.value

    def captured_graph(self, n=1):
        """A graph of n memset nodes, captured on a stream of its own."""
        s = self.stream()
        self._check(self._begin_capture(s, CAPTURE_RELAXED), "cuStreamBeginCapture")
        for _ in range(n):
            self.work(s)
        r, g = self.end_capture_graph(s)
        self._check(r, "cuStreamEndCapture")
        return g

    def instantiate(self, graph):
        """(CUresult, executable or None) of cuGraphInstantiateWithFlags."""
        x = _vp()
        r = self._instantiate(ctypes.byref(x), graph, 0)
        return r, x.value

    def instantiates(self, graph):
        """cuGraphInstantiateWithFlags' CUresult; the executable destroyed."""
        r, x = self.instantiate(graph)
        if r == CUDA_SUCCESS:
            self._check(self._exec_destroy(x), "cuGraphExecDestroy")
        return r

    def exec_destroy(self, exec_):
        self._check(self._exec_destroy(exec_), "cuGraphExecDestroy")

    def node_types(self, graph):
        """The CUgraphNodeType of each node of the graph."""
        n = ctypes.c_size_t(0)
        self._check(self._get_nodes(graph, None, ctypes.byref(n)), "cuGraphGetNodes")
        nodes = (_vp * max(n.value, 1))()
        self._check(self._get_nodes(graph, nodes, ctypes.byref(n)), "cuGraphGetNodes")
        out = []
        for i in range(n.value):
            t = ctypes.c_int()
            self._check(self._node_type(nodes[i], ctypes.byref(t)), "cuGraphNodeGetType")
            out.append(t.value)
        return out

    # ---- events (other runtimes' events, dlsync.Fence.from_event) ----

    def event(self):
        """A new event's handle (timing disabled)."""
        e = _vp()
        self._check(self._event_create(ctypes.byref(e), CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        return e.value

    def event_destroy(self, event):
        self._check(self._event_destroy(event), "cuEventDestroy")

    def record(self, event, stream):
        """A plain cuEventRecord."""
        self._check(self._event_record(event, stream), "cuEventRecord")

    def record_external(self, event, stream):
        """cuEventRecordWithFlags(CU_EVENT_RECORD_EXTERNAL): in a capture, an
        event-record node."""
        self._check(self._event_record_flags(event, stream, CU_EVENT_RECORD_EXTERNAL),
                    "cuEventRecordWithFlags")

    def wait_event(self, stream, event):
        """A plain cuStreamWaitEvent."""
        self._check(self._stream_wait_event(stream, event, 0), "cuStreamWaitEvent")

    def capture_id(self, stream):
        """cuStreamGetCaptureInfo's id of the stream's capture (0: none)."""
        status, cid = ctypes.c_int(), ctypes.c_uint64()
        self._check(self._capture_info(stream, ctypes.byref(status), ctypes.byref(cid), None,
                                       None, None, None), "cuStreamGetCaptureInfo")
        return cid.value

    def launch(self, exec_, stream):
        self._check(self._graph_launch(exec_, stream), "cuGraphLaunch")

    def queued(self):
        """The counts of QUEUEING_CALLS made so far."""
        return {name: self.calls(name) for name in QUEUEING_CALLS}
    def capture_info(self, stream):
        """(CUresult, status, id, graph, [dependencies]) of cuStreamGetCaptureInfo."""
        status, cid, graph = ctypes.c_int(), ctypes.c_uint64(), _vp()
        deps, n = _P(_vp)(), ctypes.c_size_t()
        r = self._capture_info(stream, ctypes.byref(status), ctypes.byref(cid),
                               ctypes.byref(graph), ctypes.byref(deps), None, ctypes.byref(n))
        nodes = [deps[i] for i in range(n.value)] if r == CUDA_SUCCESS else []
        return r, status.value, cid.value, graph.value, nodes

    def set_capture_dependencies(self, stream, nodes):
        """cuStreamUpdateCaptureDependencies(SET): the capture's next work after ``nodes``."""
        array = (_vp * max(len(nodes), 1))(*nodes)
        self._check(self._update_deps(stream, array, None, len(nodes), 1),
                    "cuStreamUpdateCaptureDependencies")

    def fail_nth(self, symbol, nth, result=CUDA_ERROR_UNKNOWN):
        """The nth call of `symbol` from now fails with `result` (one shot)."""
        self.lib.fake_libcuda_fail_nth(symbol.encode(), nth, result)

    def run_destructors(self):
        """Runs the user-object destructors that destroyed graphs left
        pending (the driver's thread would): how many ran."""
        return self.lib.fake_libcuda_run_destructors()

    def calls(self, symbol):
        return self.lib.fake_libcuda_call_count(symbol.encode())


_fake = None


def load():
    """(FakeCuda, None) or (None, why it is not there)."""
    global _fake
    if _fake is not None:
        return _fake, None
    path = os.environ.get("DLSYNC_TEST_FAKE_LIBCUDA")
    if not path:
        return None, "DLSYNC_TEST_FAKE_LIBCUDA is not set (ctest sets it)"
    _fake = FakeCuda(path)
    return _fake, None
