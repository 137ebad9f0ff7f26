# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of fuzz_dlsync (fuzz/corpus/). Each seed is a short
program in the harness's byte code (see step() and lane_of() in
fuzz_dlsync.c): an operation byte, a slot byte, then the operation's
arguments; a lane is (slot, what[, graph, ndeps, capacity])."""
import os

S0, S1, SB = (0, 0), (1, 1), (2, 2)  # lanes: stream 0, stream 1 (non-blocking), stream 2 (blocking)
LEGACY = (3, 11)  # what = 3 | 8: the legacy stream


def graph_lane(slot, g, nd, cap, null_deps=False, dup=False):
    return (slot, 4 | (32 if null_deps else 0) | (16 if dup else 0), g, nd, cap)


def fault(n, kind=0): return (0, 0, n - 1, kind)  # driver call n fails (kind: which CUresult)
def alloc_fault(n): return (16, 0, n - 1, 0)  # allocation n fails
def begin_capture(k, mode=2): return (1, 0, k, mode)  # mode 0 GLOBAL, 1 THREAD_LOCAL, 2 RELAXED
def end_capture(k, launch=False, on=0): return (2, 0, k, 1 if launch else 0) + ((on,) if launch else ())
def graph(g): return (3, 0, g)  # create (or destroy) graph g
def order(a, b): return (4, 0) + a + b
def begin(slot, a, b, flags=0): return (6, slot) + a + b + (flags,)
def end(slot, again=False): return (8, slot, 1 if again else 0)
def signal(slot, lane): return (9, slot) + lane
def wait(slot, lane): return (10, slot) + lane
def fence_release(slot): return (11, slot)
def release(lane): return (12, 0) + lane
def work(k): return (13, 0, k)
def push(): return (14, 0, 1)
def flush(): return (15, 0)


# conditional bodies and a library's graph (ops 17..22)
def cond_node(g, b, kind=0): return (17, 0, g, b, kind)  # kind 0 IF, 1 WHILE, 2 IF with two bodies
def body_add(b): return (18, 0, b)  # b | 16: NULL, b | 32: a handle that is no graph, b | 64: by ctx2
def body_remove(b): return (19, 0, b)
def body_check(): return (20, 0)  # is_declared against the harness's model
def body_capture(k, b): return (21, 0, k, b)  # stream k captures into body b


def body_lane(slot, b, nd=1, cap=2):  # a graph lane on body b
    return (slot, 4 | 64 | (128 if b == 3 else 0), b % 3 if b < 3 else 0, nd, cap)


# graph: 0 kernels, 1 with an event-wait node, 2 with a conditional node, 3 NULL, 4 a graph slot,
# 5 a body, 6 no graph, 7 destroyed; exec: 0 NULL, 1 of graph 0, 2 of graph 1, 3 destroyed
def launch(lane, graph=0, exec_=0): return (22, 0, graph, exec_) + lane


seeds = {
    "order_eager": order(S0, S1),
    "exchange_begin_end": begin(0, S0, S1) + end(0),
    "exchange_stable": begin(0, S0, S1, 1) + work(1) + end(0),
    "exchange_unknown_flag": begin(0, S0, S1, 4),
    "end_twice": begin(0, S0, S1) + end(0, again=True),
    # begin_many: lanes 0 and 1 set by the order, then producers lanes[0..2) -> stream 2
    "exchange_many": order(S0, S1) + begin(0, S0, SB, 8 | (2 << 4)) + work(2) + end(0),
    "exchange_many_capture": begin_capture(0) + order(S0, S1) + begin(0, S0, SB, 8 | (2 << 4))
    + work(2) + end(0) + end_capture(0, True, 2),
    # begin_fanout (flags byte | 64): producer stream 2, consumers lanes[0..2) (streams 0, 1)
    "exchange_fanout": order(S0, S1) + begin(0, S0, SB, 8 | 64 | (2 << 4)) + work(0) + end(0),
    "exchange_fanout_capture": begin_capture(2) + order(S0, S1) + begin(0, S0, SB, 8 | 64 | (2 << 4))
    + work(0) + work(1) + end(0) + end_capture(2, True, 0),
    # DLSYNC_EXCHANGE_KEEP_EDGE_DATA (flags byte 2): stream 1 joins stream 0's capture, then an
    # exchange in the capture (SAME_CAPTURE) keeps the edge data
    "exchange_keep_edges": begin_capture(0) + begin(1, S0, S1) + begin(2, S0, S1, 2) + work(1)
    + end(2) + end(1) + end_capture(0, True, 1),
    "exchange_capture_join": begin_capture(0) + begin(1, S0, S1) + work(1) + end(1) + end_capture(0, True, 1),
    "exchange_two_captures": begin_capture(0) + begin_capture(1, 0) + begin(0, S0, S1) + end(0)
    + end_capture(1) + end_capture(0),
    "graph_lane_null_deps": graph(0) + push() + order(S0, graph_lane(1, 0, 0, 1, null_deps=True)),
    "graph_lane_dup_deps": graph(0) + push() + order(S0, graph_lane(1, 0, 2, 2, dup=True)),
    "graph_lane_capacity_0": graph(0) + push() + order(S0, graph_lane(1, 0, 0, 0)),
    # lying counts (capacity byte >= 0xF0: 2^60 and up, or SIZE_MAX), then the lane kept (what 7)
    "graph_lane_lying_counts": graph(0) + push() + order(S0, graph_lane(1, 0, 1, 0xF1) + (3,))
    + begin(0, (1, 7), S1) + begin(1, S0, (1, 7)) + signal(0, (1, 7)) + release((1, 7))
    + order(S0, graph_lane(2, 0, 2, 0xF0) + (255,)) + begin(2, (1, 7), SB, 8 | (3 << 4)),
    "built_graphs_cross": graph(0) + graph(1) + push()
    + begin(0, graph_lane(2, 0, 1, 2), graph_lane(3, 1, 1, 2)) + end(0),
    "fence_eager": signal(0, S0) + wait(0, S1) + fence_release(0),
    "fence_capture": begin_capture(0) + signal(2, S0) + wait(2, S1) + end_capture(0, True, 1)
    + wait(2, S1) + fence_release(2),
    "fence_released_twice": signal(0, S0) + fence_release(0) + fence_release(0),
    "release_eager": release(S1) + flush(),
    "release_capture": begin_capture(0) + release(S0) + end_capture(0, True, 1) + flush(),
    "release_built": graph(0) + push() + release(graph_lane(4, 0, 1, 2)),
    "fault_order": fault(3) + order(S0, S1),
    "fault_release": fault(2, 5) + release(S0) + flush(),
    "fault_cross_graph": graph(0) + push() + fault(4) + order(S0, graph_lane(1, 0, 1, 2)),
    "legacy_blocking_capture": begin_capture(2, 0) + order(LEGACY, S1) + end_capture(2),
    # allocation faults: the pool, the scratch event, a capture's holder, a fence, a release
    "alloc_fault_order": alloc_fault(1) + order(S0, S1) + order(S0, S1),
    "alloc_fault_scratch": alloc_fault(2) + begin(0, S0, S1) + end(0),
    "alloc_fault_capture": begin_capture(1) + alloc_fault(2) + order(S0, S1) + end_capture(1, True, 0),
    "alloc_fault_built": graph(0) + push() + alloc_fault(3) + order(S0, graph_lane(1, 0, 1, 2))
    + graph(0),
    "alloc_fault_fence": begin_capture(0) + alloc_fault(3) + signal(0, S0) + wait(0, S1)
    + end_capture(0, True, 1) + fence_release(0),
    "alloc_fault_release": alloc_fault(3) + release(S0) + flush(),
    "alloc_fault_many": order(S0, S1) + alloc_fault(1) + begin(0, S0, SB, 8 | (2 << 4)) + end(0),
    # two built graphs, the second destroyed (its lane kept: what = 7): cuGraphRetainUserObject
    # refuses it, then a fault fails a later call (call 9: it was the cuUserObjectRelease of
    # the reference left when each event had a user object; with the thread's batch, the
    # fuzzer finds the release at a batch's end); the first graph must still let the events go
    "fault_user_object_release_two_graphs": graph(0) + graph(1) + push()
    + order(graph_lane(2, 0, 1, 2), graph_lane(3, 1, 1, 2)) + graph(1) + fault(9)
    + order((2, 7), (3, 7)),
    # the thread's batches for built graphs: 1, 1, 2, 4, then 8 events; the harness ends with a
    # batch open (used and unused events), a graph destroyed while it is
    "built_batches": graph(0) + graph(1) + push() + order(S0, graph_lane(1, 0, 1, 2)) * 6
    + graph(0) + order(S0, graph_lane(2, 1, 1, 2)) * 3
    + order(graph_lane(3, 1, 1, 2), graph_lane(4, 1, 1, 2)) * 2,
    # conditional bodies: declarations against the model, NULL and no-graph handles
    "body_declarations": graph(0) + cond_node(0, 0) + body_check() + body_add(0) + body_check()
    + body_add(0) + body_remove(0) + body_check() + body_remove(0) + body_add(16) + body_add(32)
    + body_remove(32) + body_remove(16) + body_check(),
    # a declared body's capture: EAGER_TO_CAPTURE and TWO_CAPTURES refused, one stream and an
    # exchange that joins it work; the parent instantiates (finish)
    "body_capture_rows": graph(0) + cond_node(0, 0) + body_add(0) + body_capture(0, 0)
    + order(S1, S0) + order(S0, S0) + begin(0, S0, S1) + work(1) + end(0) + begin_capture(1)
    + order(S0, S1) + end_capture(1) + end_capture(0) + body_check(),
    # a graph lane on a declared WHILE body: EAGER_TO_BUILT refused, SAME_BUILT works, a fence
    # signal refused, a release taken
    "body_graph_lane": graph(1) + cond_node(1, 1, 1) + body_add(1) + push() + order(S0, body_lane(1, 1))
    + order(body_lane(2, 1), body_lane(3, 1)) + signal(0, body_lane(4, 1)) + release(body_lane(5, 1)),
    # undeclared: the rows add event nodes (the parent need not instantiate)
    "body_undeclared": graph(0) + cond_node(0, 3, 2) + body_capture(2, 3) + order(S0, SB)
    + end_capture(2) + body_add(3) + body_check(),
    # declared with its parent and node (body_add's byte | 128): the rows hoist their event
    # nodes into the parent (a capture into the body, a graph lane on it), which instantiates
    "body_hoisted": graph(0) + cond_node(0, 0) + body_add(0 | 128) + body_capture(0, 0)
    + order(S1, S0) + end_capture(0) + push() + order(S1, body_lane(1, 0)) + body_check(),
    # the declaration's driver calls failing in turn
    "body_hoisted_fault": graph(0) + cond_node(0, 0) + fault(1) + body_add(0 | 128)
    + body_capture(0, 0) + order(S1, S0) + end_capture(0) + body_check(),
    "body_hoisted_fault_2": graph(0) + cond_node(0, 0) + fault(2) + body_add(0 | 128)
    + body_capture(0, 0) + order(S1, S0) + end_capture(0) + body_check(),
    # declared by the other context: this one's rows and launches refuse the body all the same
    "body_other_context": graph(0) + cond_node(0, 1) + body_add(1 | 64) + body_check()
    + body_capture(0, 1) + order(S1, S0) + launch(S0, 1) + launch(S0, 0) + end_capture(0)
    + body_remove(1) + body_remove(1 | 64) + body_add(1) + body_add(1 | 64) + body_check(),
    # the parent destroyed: its bodies' declarations removed first, the capture ended
    "body_parent_destroyed": graph(2) + cond_node(2, 2) + body_add(2) + body_capture(1, 2)
    + graph(2) + body_check() + graph(2) + cond_node(2, 2) + body_check(),
    # dlsync_graph_launch: eager (exec, NULL exec, destroyed exec), capturing (kernels, event
    # node, conditional node, NULL, no graph, destroyed graph), graph lane, a body's capture
    "launch_eager": launch(S0, 0, 1) + launch(S1, 1, 2) + launch(S0, 0, 0) + launch(S0, 0, 3)
    + launch(SB, 3, 1),
    "launch_capture": begin_capture(0) + launch(S0, 0) + launch(S0, 1) + launch(S0, 2)
    + launch(S0, 3) + launch(S0, 6) + launch(S0, 7) + launch(S0, 0, 1) + end_capture(0, True, 1),
    "launch_graph_lane": graph(0) + push() + launch(graph_lane(1, 0, 1, 2)) + launch(graph_lane(2, 0, 1, 0))
    + launch(graph_lane(3, 0, 0, 1, null_deps=True), 1) + launch(graph_lane(1, 0, 2, 2), 4),
    # a graph into itself (a graph lane's graph, a body's capture), an executable of another graph
    "launch_into_itself": graph(0) + push() + launch(graph_lane(1, 0, 1, 2), 4) + launch(S0, 1, 1),
    "launch_in_body": graph(0) + cond_node(0, 0) + body_add(0) + body_capture(0, 0) + launch(S0, 0)
    + launch(S0, 1) + launch(S0, 5) + launch(body_lane(1, 0), 0) + end_capture(0),
    # a child graph holding an event node (lib graph 1 launched onto graph 0), then graph 0
    # launched into a declared body's capture: refused (the nodes are read at any depth), the
    # parent (graph 1) instantiates
    "launch_nested_events_in_body": graph(0) + graph(1) + push() + launch(graph_lane(1, 0, 1, 2), 1)
    + cond_node(1, 2) + body_add(2) + body_capture(0, 2) + launch(S0, 4) + end_capture(0),
    "launch_faults": begin_capture(0) + fault(3) + launch(S0, 0) + end_capture(0),
    "launch_fault_lane": graph(0) + fault(1, 1) + launch(graph_lane(1, 0, 1, 2)),
    "alloc_fault_body": graph(0) + cond_node(0, 0) + alloc_fault(1) + body_add(0) + body_capture(0, 0)
    + order(S1, S0) + launch(S0, 0) + end_capture(0),
}

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(here, exist_ok=True)
for name, prog in seeds.items():
    with open(os.path.join(here, name), "wb") as f:
        f.write(bytes(prog))
