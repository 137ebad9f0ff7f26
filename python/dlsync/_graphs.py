# SPDX-License-Identifier: Apache-2.0
"""Structured graphs: dlsync.launch (include/dlsync/graph.h) and
dlsync.conditional_body (include/dlsync/conditional.h).

Both take graph objects of the frameworks as well as raw handles; which
handle each object gives is decided here, in Python, for both backends (so
the messages for objects dlsync cannot use are one). The calls themselves
are the backend's ``graph_launch`` and ``body_add`` / ``body_remove`` /
``body_declared``."""

from __future__ import annotations

import contextlib
import importlib
import threading
from typing import Any, Dict, Iterator, Optional, Tuple

from ._backend import active as _b
from ._errors import GRAPH_KIND, not_a_handle

# ---- the handles a graph object gives ----


def _module_of(obj: Any) -> str:
    return type(obj).__module__ or ""


def _type_name(obj: Any) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__


def _as_int(value: Any) -> Optional[int]:
    """An int from a handle object (cuda.bindings' CUgraph and CUgraphExec
    convert with int()); None for None / NULL."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return int(value)


# cuda.bindings' handle types, by name (cuda.bindings is never imported here).
_GRAPH_TYPES = ("CUgraph", "cudaGraph_t")
_EXEC_TYPES = ("CUgraphExec", "cudaGraphExec_t")


def _torch_graph(obj: Any) -> Tuple[Optional[int], Optional[int]]:
    """torch.cuda.CUDAGraph: raw_cuda_graph() (a graph made with
    keep_graph=True, once captured) and raw_cuda_graph_exec() (once
    instantiated); torch raises RuntimeError for the one it does not have."""
    graph = exec_ = None
    try:
        graph = _as_int(obj.raw_cuda_graph())
    except RuntimeError:
        pass
    try:
        exec_ = _as_int(obj.raw_cuda_graph_exec())
    except RuntimeError:
        pass
    if not graph and not exec_:
        raise ValueError(
            "dlsync.launch: this torch.cuda.CUDAGraph exposes neither its cudaGraph_t nor its "
            "cudaGraphExec_t: make it with torch.cuda.CUDAGraph(keep_graph=True) and capture it "
            "(raw_cuda_graph(), for a launch inside a capture or on a graph lane), and "
            "instantiate() or replay it (raw_cuda_graph_exec(), for an eager stream)"
        )
    return graph or None, exec_ or None


def _cuda_core_builder(obj: Any) -> bool:
    """Whether obj is a cuda.core GraphBuilder."""
    return _module_of(obj).startswith("cuda.core") and type(obj).__name__ == "GraphBuilder"


def _cuda_core_builder_graph(obj: Any) -> Optional[int]:
    """The CUgraph of a cuda.core GraphBuilder, or None while it has none
    to give. cuda.core 1.x: ``graph_definition.handle`` (a conditional
    body's builder has it from its creation, a primary builder once
    building ended; RuntimeError before); cuda.core 0.x: the members in
    ``_mnff`` (``graph`` once building ended, ``conditional_graph`` for a
    conditional body's builder)."""
    try:
        definition = obj.graph_definition
    except (AttributeError, RuntimeError):
        definition = None
    if definition is not None:
        return _as_int(definition.handle) or None
    members = getattr(obj, "_mnff", None)
    g = getattr(members, "graph", None) or getattr(members, "conditional_graph", None)
    return _as_int(g) or None


def graph_handles(graph: Any, exec_: Any = None) -> Tuple[Optional[int], Optional[int]]:
    """(CUgraph, CUgraphExec) of what dlsync.launch was given, each an int
    or None. TypeError naming the type for an object dlsync cannot use."""
    x = exec_
    if x is not None and type(x).__name__ in _EXEC_TYPES:
        x = _as_int(x)
    if graph is None or isinstance(graph, int):
        return graph, x
    name = type(graph).__name__
    mod = _module_of(graph)
    if name in _GRAPH_TYPES:
        return _as_int(graph), x
    if name in _EXEC_TYPES:
        return None, _as_int(graph) if x is None else x
    if mod.startswith("torch") and hasattr(graph, "raw_cuda_graph_exec"):
        g, e = _torch_graph(graph)
        return g, e if x is None else x
    if _cuda_core_builder(graph):
        g = _cuda_core_builder_graph(graph)
        if not g:
            raise ValueError(
                "dlsync.launch: this cuda.core GraphBuilder has no graph yet: call "
                "end_building() first (or pass the Graph that complete() returned, for an "
                "eager stream)"
            )
        return g, x
    if mod.startswith("cuda.core") and name == "Graph" and hasattr(graph, "handle"):
        # complete()'s executable; its CUgraph is not kept by cuda.core.
        return None, _as_int(graph.handle) if x is None else x
    if mod.startswith("cupy"):
        # CuPy destroys its cudaGraph_t once instantiated (graph reads 0): where its
        # Graph shows graphExec (CuPy 14), an eager launch of that executable.
        g, e = getattr(graph, "graph", None), getattr(graph, "graphExec", None)
        if isinstance(g, int) or isinstance(e, int):
            return g or None, (e or None) if x is None else x
        raise TypeError(
            f"dlsync.launch: {_type_name(graph)} exposes no handle to Python (CuPy keeps its "
            "cudaGraphExec_t private and destroys its cudaGraph_t once instantiated): capture "
            "the CuPy work with cuStreamBeginCapture / cuStreamEndCapture on its stream and "
            "pass that CUgraph (an int), or run graph.launch(stream) on an eager stream"
        )
    raise TypeError(
        f"dlsync.launch takes a CUgraph handle (int), torch.cuda.CUDAGraph, a cuda.core "
        f"GraphBuilder or Graph, or cuda.bindings' CUgraph / CUgraphExec, not {_type_name(graph)}"
    )


def launch(graph: Any, stream: Any, exec: Any = None) -> None:  # noqa: A002 - the C name
    """Runs ``graph`` at ``stream``, correctly whatever the stream is doing
    (dlsync_graph_launch): on an eager stream its executable is launched;
    on a capturing stream (a conditional body's too) a copy of the graph
    becomes a child-graph node at the capture's current dependencies, which
    move on to it; no other node.

    ``graph`` is a CUgraph handle (int), a ``torch.cuda.CUDAGraph`` (made
    with ``keep_graph=True`` for a launch inside a capture: its
    ``raw_cuda_graph()``; instantiated for an eager one:
    ``raw_cuda_graph_exec()``), a cuda.core ``GraphBuilder`` whose building
    ended, a cuda.core ``Graph`` (an executable only: eager streams), or
    cuda.bindings' ``CUgraph`` / ``CUgraphExec``. ``exec`` names the
    executable where ``graph`` does not carry one. The caller may destroy
    its graph after the call. CuPy's ``Graph`` gives its executable where
    it shows one (CuPy 14: eager streams only; CuPy destroys its graph at
    instantiation), else TypeError. Errors: TypeError naming an object
    dlsync cannot use, :class:`Error` with
    the library's status (a NULL exec for an eager stream, a graph holding
    conditional or memory nodes inside a capture: DLSYNC_ERROR_INVALID_ARGUMENT)."""
    g, x = graph_handles(graph, exec)
    _b.graph_launch(g, x, stream)


# ---- conditional bodies ----


def body_handle(body: Any) -> int:
    """The CUgraph of a conditional node's body: an int, cuda.bindings'
    CUgraph, or the GraphBuilder cuda.core returns from if_cond / if_then /
    if_else / switch / while_loop (its body graph). TypeError naming the
    type otherwise."""
    if isinstance(body, int):
        return body
    if type(body).__name__ in _GRAPH_TYPES:
        handle = _as_int(body)
        if handle is None:  # what body_add would say of it
            raise TypeError(not_a_handle("the body", GRAPH_KIND, handle))
        return handle
    if _cuda_core_builder(body):
        # A conditional body's builder gives its graph before its capture
        # begins; a primary builder gives none until its building ended (and
        # cuda.core 0.x names a body's graph apart).
        members = getattr(body, "_mnff", None)
        if members is not None:
            g = _as_int(getattr(members, "conditional_graph", None))
        elif getattr(body, "is_building", False) or getattr(body, "is_join_required", False):
            g = None
        else:
            g = _cuda_core_builder_graph(body)
        if not g:
            raise TypeError(
                "dlsync.conditional_body: this cuda.core GraphBuilder is not a conditional "
                "body's builder before its capture began (declare the builder that if_cond / "
                "if_then / if_else / switch / while_loop returned, then begin_building() "
                "inside the block)"
            )
        return g
    raise TypeError(
        "dlsync.conditional_body takes a conditional node's body: a CUgraph handle (int, "
        "CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out[i]), cuda.bindings' CUgraph or the cuda.core "
        f"GraphBuilder of a conditional body, not {_type_name(body)}"
    )


# Declarations made through dlsync.conditional_body, counted per body so
# that nested blocks for one body remove it only when the outermost exits
# (the library counts a body declared twice once).
_lock = threading.Lock()
_counts: Dict[int, int] = {}


@contextlib.contextmanager
def conditional_body(body: Any) -> Iterator[int]:
    """Declares ``body`` a conditional node's body while the block runs
    (dlsync_conditional_body_add, and _remove on the way out, whatever the
    block raises). Inside, on a stream capturing into that body (or
    joined to such a capture), exchanges, wraps, scopes and fences whose
    row takes edges only work as anywhere (SAME_CAPTURE, JOIN, one stream);
    the rows that would add an event node to the body (EAGER_TO_CAPTURE,
    TWO_CAPTURES, ..., a fence signalled or waited on there) raise
    :class:`Error` with status ``DLSYNC_ERROR_CONDITIONAL_BODY`` and a
    message naming the row and the body: nothing was queued and the capture
    is still valid. Order such work before the conditional node (on the
    parent's stream, before the body's capture begins) instead. Yields the
    body's handle. Begin the body's capture inside the block; end it before
    the block exits."""
    g = body_handle(body)
    with _lock:
        first = _counts.get(g, 0) == 0
        if first:
            _b.body_add(g)
        _counts[g] = _counts.get(g, 0) + 1
    try:
        yield g
    finally:
        with _lock:
            n = _counts.get(g, 0) - 1
            if n <= 0:
                _counts.pop(g, None)
                _b.body_remove(g)
            else:
                _counts[g] = n


# ---- graph compilers: a conditional node declared with its parent ----


def _node_handle(node: Any) -> int:
    """A CUgraphNode handle: an int or cuda.bindings' CUgraphNode."""
    if isinstance(node, int):
        return node
    if type(node).__name__ in ("CUgraphNode", "cudaGraphNode_t"):
        value = _as_int(node)
        if value is not None:
            return value
    raise TypeError(
        "dlsync.conditional_node: the node is the conditional node's CUgraphNode: an int or "
        f"cuda.bindings' CUgraphNode, not {_type_name(node)}")


def _builder_node(builder: Any) -> int:
    """The conditional node a cuda.core GraphBuilder has just added: its
    stream's capture dependencies, read with cuda.bindings (which cuda.core
    uses), must be exactly that one node. cuda.core does not keep the node:
    if_cond / if_else / switch / while_loop add it with cuGraphAddNode and
    make it the builder's only capture dependency, so this holds until the
    builder queues more work."""
    driver = importlib.import_module("cuda.bindings.driver")  # only with cuda.core objects

    stream = _b.stream_handle(builder)
    info = driver.cuStreamGetCaptureInfo(stream)
    if int(info[0]) != 0:
        raise RuntimeError(f"cuStreamGetCaptureInfo failed: {info[0]}")
    status, deps = info[1], info[4]
    n = int(info[-1])
    if int(status) != int(driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE):
        raise ValueError(
            "dlsync.conditional_node: this cuda.core GraphBuilder is not building: pass it "
            "while its capture is active, right after if_cond / if_else / switch / while_loop")
    if n != 1:
        raise ValueError(
            "dlsync.conditional_node: this cuda.core GraphBuilder's capture has "
            f"{n} dependencies, not the one conditional node: declare it right after "
            "if_cond / if_else / switch / while_loop, before queueing more work on the builder "
            "(or pass node= the CUgraphNode)")
    return int(deps[0])


def _parent_handle(parent: Any) -> int:
    """The parent graph: an int, cuda.bindings' CUgraph, or a cuda.core
    GraphBuilder (while it builds: the graph its capture builds; once its
    building ended: its graph)."""
    if isinstance(parent, int) or type(parent).__name__ in _GRAPH_TYPES:
        return body_handle(parent) if not isinstance(parent, int) else parent
    if _cuda_core_builder(parent):
        g = _b.capture_graph(parent)
        if g is None:
            g = _cuda_core_builder_graph(parent)
        if not g:
            raise ValueError("dlsync.conditional_node: this cuda.core GraphBuilder has no graph "
                             "(it is neither building nor built)")
        return g
    raise TypeError(
        "dlsync.conditional_node: the parent is the graph holding the conditional node: a "
        "CUgraph handle (int), cuda.bindings' CUgraph or the cuda.core GraphBuilder that "
        f"added the node, not {_type_name(parent)}")


def node_handles(parent: Any, node: Any, bodies: Any) -> Tuple[int, int, Tuple[int, ...]]:
    """(parent, node, bodies) as ints, for dlsync.conditional_node."""
    if bodies is None:
        raise TypeError("dlsync.conditional_node: name the node's bodies (bodies=: one body or "
                        "a list of them, CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out)")
    body_list = list(bodies) if isinstance(bodies, (list, tuple)) else [bodies]
    handles = tuple(body_handle(b) for b in body_list)
    p = _parent_handle(parent)
    if node is None:
        if not _cuda_core_builder(parent):
            raise TypeError("dlsync.conditional_node: node is None: name the conditional "
                            "node's CUgraphNode (only a cuda.core GraphBuilder parent that has "
                            "just added the node gives it)")
        n = _builder_node(parent)
    else:
        n = _node_handle(node)
    return p, n, handles


@contextlib.contextmanager
def conditional_node(parent: object, node: object = None,
                     bodies: object = None) -> Iterator[Tuple[int, ...]]:
    """Declares every body of conditional node ``node`` of graph ``parent``
    while the block runs (dlsync_conditional_node_declare; each body removed
    on the way out, whatever the block raises). Inside, on a stream capturing
    into one of the bodies, the rows that would put an event node in the body
    (an eager producer ordered into it: EAGER_TO_CAPTURE, TWO_CAPTURES, ...)
    put it in the parent instead: a wait node ahead of the conditional node
    (the whole node waits), a record node after it. The parent must still
    take nodes (a graph being captured, or built by hand, not instantiated).

    ``parent``: a CUgraph handle (int), cuda.bindings' CUgraph, or the
    cuda.core GraphBuilder that added the node (while it builds).
    ``node``: the CUgraphNode (int or cuda.bindings' CUgraphNode); None with a
    cuda.core builder, whose capture dependencies right after if_cond /
    if_else / switch / while_loop are that node alone (cuda.core does not
    keep it; read with cuda.bindings' cuStreamGetCaptureInfo).
    ``bodies``: one body or a list of them (ints, cuda.bindings' CUgraph, the
    cuda.core builders those calls returned, before their capture begins).
    Yields the bodies' handles.

    Errors: TypeError naming an object dlsync cannot use; ValueError for a
    cuda.core parent that is not building or whose capture depends on more
    than the one node (work queued after the node was added); :class:`Error`
    (DLSYNC_ERROR_INVALID_ARGUMENT, the library's words) for a node that is
    not a conditional node of ``parent``, a body given twice, no body, more
    than 64, a body declared with another node; nothing is declared then."""
    p, n, handles = node_handles(parent, node, bodies)
    with _lock:
        _b.node_declare(p, n, handles)
        for g in handles:
            _counts[g] = _counts.get(g, 0) + 1
    try:
        yield handles
    finally:
        first: Optional[BaseException] = None
        with _lock:
            for g in handles:
                left = _counts.get(g, 0) - 1
                if left > 0:
                    _counts[g] = left
                    continue
                _counts.pop(g, None)
                try:
                    _b.body_remove(g)
                except BaseException as e:  # noqa: BLE001 - raised once all are removed
                    if first is None:
                        first = e
        if first is not None:
            raise first


# ---- end graph compilers ----


def capture_graph(stream: Any) -> Optional[int]:
    """The CUgraph the stream's capture is building now (for a capture
    into a conditional node's body: that body), or None when the stream is
    eager. With PyTorch, whose ``CUDAGraph.begin_capture_to_if_node``
    captures the body on a stream of its own made current, declare the body
    as ``dlsync.conditional_body(dlsync.capture_graph(torch.cuda.current_stream()))``."""
    return _b.capture_graph(stream)


def is_conditional_body(body: Any) -> bool:
    """Whether ``body`` is declared a conditional node's body now."""
    return _b.body_declared(body_handle(body))


__all__ = ["launch", "conditional_body", "conditional_node", "is_conditional_body",
           "capture_graph"]
