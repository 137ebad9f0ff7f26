/* SPDX-License-Identifier: Apache-2.0 */
/* Fences on the fake driver: signal on each kind of lane (eager stream,
 * capturing stream, graph built by hand) and wait from each kind, checking
 * the driver calls, the nodes and edges, the eager order, who holds the event
 * and when it comes back to the pool; the errors; fault injection on every
 * driver call of signal and wait; fences shared between threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static size_t graph_owned(dlsync_context *c) {
  dlsync__pool_stats ps;
  dlsync__pool_stats_get(&ps, &c->pools);
  return ps.graph_owned;
}

static size_t free_events(dlsync_context *c) {
  dlsync__pool_stats ps;
  dlsync__pool_stats_get(&ps, &c->pools);
  return ps.free_events;
}

static int setup(void **state) {
  (void)state;
  fixture_open(NULL);
  return 0;
}

static int teardown(void **state) {
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  (void)state;
  pop_all_contexts();
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_get_stats(&rs, ctx), DLSYNC_SUCCESS);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.pending_graph, 0);
  fixture_close();
  return 0;
}

static CUgraphExec instantiate(CUgraph g) {
  CUgraphExec x = NULL;
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  assert_non_null(x);
  return x;
}

/* Launches x on s; returns the launch's op. */
static uint64_t launch(CUgraphExec x, CUstream s) {
  assert_int_equal(D->GraphLaunch(x, s), CUDA_SUCCESS);
  return fake_stream_last_op(s);
}

/* The one node of a type in g (fails unless there is exactly one). */
static CUgraphNode only_node(CUgraph g, int type) {
  CUgraphNode nodes[64], found = NULL;
  size_t n = 64, count = 0;
  assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  for (size_t i = 0; i < n; i++)
    if (fake_node_type(nodes[i]) == type) {
      found = nodes[i];
      count++;
    }
  if (count != 1)
    fail_msg("graph has %zu nodes of type %d, expected 1", count, type);
  return found;
}

static dlsync_fence_kind kind_of(const dlsync_fence *f) {
  dlsync_fence_kind k = (dlsync_fence_kind)-1;
  assert_int_equal(dlsync_fence_get_kind(&k, f), DLSYNC_SUCCESS);
  return k;
}

/* ---- signalled on an eager stream ---- */

static void eager_fence_eager_wait_orders_after_the_signal(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  uint64_t produce, after, consume;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_non_null(f);
  assert_int_equal(kind_of(f), DLSYNC_FENCE_EAGER);
  assert_int_equal(fake_call_count("cuEventRecord"), 1);
  after = fake_work(P, "after the signal", NULL);
  /* The fence holds its event out of the pool. */
  assert_int_equal(graph_owned(ctx), 1);
  assert_int_equal(free_events(ctx), 0);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuStreamWaitEvent");
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_false(fake_happens_before(after, consume)); /* only the work before the signal */
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 0);
  assert_int_equal(free_events(ctx), 1);
}

static void eager_fence_capture_wait_gets_a_wait_node_the_graph_holds(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_fence *f = NULL;
  CUgraphNode consume, w;
  CUgraph g;
  CUgraphExec x;
  CUevent ev;
  uint64_t produce, l1;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_call_count("cuEventRecord"), 0); /* nothing recorded again */
  fake_work(C, "consume", &consume);
  /* Released before the graph: the graph still holds the event. */
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 1);
  assert_int_equal(free_events(ctx), 0);
  g = end_capture_ok(C);
  w = only_node(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_path(g, w, consume));
  ev = fake_node_event(w);
  assert_int_equal(fake_event_get_state(ev), FAKE_EVENT_EAGER);
  assert_true(fake_happens_before(produce, fake_event_op(ev)));
  /* Replayed, the graph runs after the producer's work. */
  x = instantiate(g);
  l1 = launch(x, X);
  assert_true(fake_happens_before(produce, l1));
  /* The executable keeps the event after the graph is gone. */
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(graph_owned(ctx), 1);
  fake_run_destructors();
  assert_int_equal(graph_owned(ctx), 1);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  assert_int_equal(graph_owned(ctx), 1); /* destructor not run yet */
  fake_run_destructors();
  assert_int_equal(graph_owned(ctx), 0);
  assert_int_equal(free_events(ctx), 1);
  fake_stream_destroy(X);
}

static void eager_fence_built_wait_gets_a_wait_node_at_the_frontier(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  dlsync_fence *f = NULL;
  CUgraphNode m, deps[2];
  CUgraph g;
  uint64_t produce;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "before");
  deps[0] = m;
  lg = dlsync_lane_graph(g, deps, 1, 2);
  /* No current context needed: the event is the fence's. */
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_SUCCESS);
  assert_int_equal(lg.ndeps, 1);
  assert_int_equal(fake_node_type(lg.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(g, m, lg.deps[0]));
  assert_true(fake_happens_before(produce, fake_event_op(fake_node_event(lg.deps[0]))));
  assert_int_equal(fake_graph_count_nodes(g, -1), 2);
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 1);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(graph_owned(ctx), 1);
  fake_run_destructors();
  assert_int_equal(graph_owned(ctx), 0);
}

/* ---- signalled in a capture ---- */

static void captured_fence_same_capture_is_edges_only(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent join = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f = NULL;
  CUgraphNode n1, n2, n3, rec, pdeps[4];
  CUgraph cg, g;
  size_t nodes;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(kind_of(f), DLSYNC_FENCE_CAPTURED);
  cg = fake_capture_graph(P);
  rec = only_node(cg, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_true(fake_graph_has_edge(cg, n1, rec));
  /* The capture continues after the record node. */
  assert_int_equal(fake_capture_deps(P, pdeps, 4), 1);
  assert_ptr_equal(pdeps[0], rec);
  fake_work(P, "after", &n3);
  assert_true(fake_graph_has_edge(cg, rec, n3));
  nodes = fake_graph_count_nodes(cg, -1);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuGraphAddNode"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_graph_count_nodes(cg, -1), nodes);
  fake_work(C, "consume", &n2);
  assert_true(fake_graph_has_path(cg, rec, n2));
  assert_true(fake_graph_has_path(cg, n1, n2));
  assert_false(fake_graph_has_path(cg, n3, n2));
  /* Join C back and end cleanly. */
  assert_int_equal(D->EventRecord(join, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, join, 0), CUDA_SUCCESS);
  g = end_capture_ok(P);
  assert_ptr_equal(g, cg);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 1); /* the graph holds the record node's event */
  destroy_graph(g);
  assert_int_equal(graph_owned(ctx), 0);
  fake_event_destroy(fork);
  fake_event_destroy(join);
}

static void captured_fence_waited_on_its_own_stream(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_fence *f = NULL;
  CUgraphNode n1, n2, rec;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_wait(f, &lp), DLSYNC_SUCCESS);
  fake_work(P, "consume", &n2);
  g = end_capture_ok(P);
  rec = only_node(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_edge(g, rec, n2));
  dlsync_fence_release(f);
  destroy_graph(g);
}

static void captured_fence_other_capture_gets_a_wait_node(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_fence *f = NULL;
  CUgraphNode n1, n2, n3, rec, w;
  CUgraph g1, g2;
  CUgraphExec x1, x2;
  uint64_t l1, l2;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  fake_work(P, "next", &n3);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  /* Neither capture is broken (no MERGE, no external wait on an active record). */
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_not_equal(fake_capture_id(P), fake_capture_id(C));
  fake_work(C, "consume", &n2);
  g2 = end_capture_ok(C);
  g1 = end_capture_ok(P);
  rec = only_node(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  w = only_node(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(rec), fake_node_event(w));
  assert_true(fake_graph_has_path(g1, n1, rec));
  assert_true(fake_graph_has_path(g1, rec, n3));
  assert_true(fake_graph_has_path(g2, w, n2));
  /* Launched in order, the second graph runs after the first. */
  x1 = instantiate(g1);
  x2 = instantiate(g2);
  l1 = launch(x1, P);
  l2 = launch(x2, X);
  assert_true(fake_happens_before(l1, l2));
  dlsync_fence_release(f);
  destroy_graph(g1);
  assert_int_equal(graph_owned(ctx), 1); /* g2 and the executables hold it */
  destroy_graph(g2);
  assert_int_equal(graph_owned(ctx), 1);
  assert_int_equal(D->GraphExecDestroy(x1), CUDA_SUCCESS);
  assert_int_equal(D->GraphExecDestroy(x2), CUDA_SUCCESS);
  fake_run_destructors();
  assert_int_equal(graph_owned(ctx), 0);
  fake_stream_destroy(X);
}

static void captured_fence_built_wait_gets_a_wait_node(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  dlsync_fence *f = NULL;
  CUgraphNode n1, rec, deps[2];
  CUgraph g1, g2;
  (void)state;
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  lg = dlsync_lane_graph(g2, deps, 0, 2);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_SUCCESS);
  assert_int_equal(lg.ndeps, 1);
  assert_int_equal(fake_node_type(lg.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_graph(lg.deps[0]), g2);
  g1 = end_capture_ok(P);
  rec = only_node(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_ptr_equal(fake_node_event(rec), fake_node_event(lg.deps[0]));
  dlsync_fence_release(f);
  destroy_graph(g1);
  assert_int_equal(graph_owned(ctx), 1);
  destroy_graph(g2);
  assert_int_equal(graph_owned(ctx), 0);
}

static void captured_fence_eager_wait_is_refused_while_active_then_allowed(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_fence *f = NULL;
  CUgraph g;
  CUgraphExec x;
  uint64_t c_before, l1, consume;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  c_before = fake_stream_last_op(C);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_non_null(strstr(dlsync_last_error(), "still active"));
  assert_non_null(strstr(dlsync_last_error(), "not launched"));
  /* Nothing queued: no wait, no record, C not joined, the capture intact. */
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_stream_last_op(C), c_before);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(P);
  /* Ended: a plain wait (the caller's responsibility to launch first). */
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  /* After a launch, an eager wait orders after that launch's record. */
  x = instantiate(g);
  l1 = launch(x, X);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(l1, consume));
  dlsync_fence_release(f);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(g);
  fake_stream_destroy(X);
}

/* ---- signalled on a graph built by hand ---- */

static void built_fence_record_node_after_the_frontier(void **state) {
  dlsync_fence *f = NULL;
  CUgraphNode m1, m2, deps[2], rec, next;
  CUgraph g;
  dlsync_lane lg;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m1 = fake_graph_add_work(g, NULL, 0, "a");
  m2 = fake_graph_add_work(g, NULL, 0, "b");
  deps[0] = m1;
  deps[1] = m2;
  lg = dlsync_lane_graph(g, deps, 2, 2);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lg), DLSYNC_SUCCESS);
  assert_int_equal(kind_of(f), DLSYNC_FENCE_BUILT);
  assert_int_equal(lg.ndeps, 1);
  rec = lg.deps[0];
  assert_int_equal(fake_node_type(rec), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_ptr_equal(fake_node_graph(rec), g);
  assert_true(fake_graph_has_edge(g, m1, rec));
  assert_true(fake_graph_has_edge(g, m2, rec));
  assert_int_equal(fake_graph_count_nodes(g, -1), 3);
  /* The caller builds on from the record node. */
  next = fake_graph_add_work(g, lg.deps, lg.ndeps, "next");
  assert_true(fake_graph_has_edge(g, rec, next));
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 1);
  destroy_graph(g);
  assert_int_equal(graph_owned(ctx), 0);
}

static void built_fence_same_graph_adds_the_node_to_the_frontier(void **state) {
  dlsync_fence *f = NULL;
  CUgraphNode m, other, pdeps[2], cdeps[4], rec, consume;
  CUgraph g;
  dlsync_lane lp, lc;
  size_t nodes;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "produce");
  other = fake_graph_add_work(g, NULL, 0, "consumer's own");
  pdeps[0] = m;
  cdeps[0] = other;
  lp = dlsync_lane_graph(g, pdeps, 1, 2);
  lc = dlsync_lane_graph(g, cdeps, 1, 4);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  rec = lp.deps[0];
  nodes = fake_graph_count_nodes(g, -1);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  /* Only reads (is the record node still this graph's?), no node added. */
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventRecordNode"), 0);
  assert_int_equal(fake_call_count("cuGraphEventRecordNodeGetEvent"), 1);
  assert_int_equal(fake_graph_count_nodes(g, -1), nodes);
  assert_int_equal(lc.ndeps, 2);
  assert_ptr_equal(lc.deps[0], other);
  assert_ptr_equal(lc.deps[1], rec);
  /* Again: the frontier already has it. */
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(lc.ndeps, 2);
  /* From the signalling lane itself: its frontier is the node. */
  assert_int_equal(dlsync_fence_wait(f, &lp), DLSYNC_SUCCESS);
  assert_int_equal(lp.ndeps, 1);
  assert_ptr_equal(lp.deps[0], rec);
  consume = fake_graph_add_work(g, lc.deps, lc.ndeps, "consume");
  assert_true(fake_graph_has_path(g, m, consume));
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  /* A frontier with no room: refused, the lane unchanged. */
  {
    CUgraphNode small[1];
    dlsync_lane ls;
    small[0] = consume;
    ls = dlsync_lane_graph(g, small, 1, 1);
    assert_int_equal(dlsync_fence_wait(f, &ls), DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(dlsync_last_error(), "capacity"));
    assert_int_equal(ls.ndeps, 1);
    assert_ptr_equal(small[0], consume);
  }
  dlsync_fence_release(f);
  destroy_graph(g);
}

static void built_fence_other_graphs_and_eager_after_launch(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), l1, l2;
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_fence *f = NULL;
  CUgraphNode d1[2], d2[2], rec, n3, w3;
  CUgraph g1, g2, g3;
  CUgraphExec x1;
  uint64_t launched, consume;
  (void)state;
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "produce");
  l1 = dlsync_lane_graph(g1, d1, 1, 2);
  l2 = dlsync_lane_graph(g2, d2, 0, 2);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &l1), DLSYNC_SUCCESS);
  rec = l1.deps[0];
  /* Another built graph: a wait node on the same event. */
  assert_int_equal(dlsync_fence_wait(f, &l2), DLSYNC_SUCCESS);
  assert_int_equal(l2.ndeps, 1);
  assert_int_equal(fake_node_type(l2.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(l2.deps[0]), fake_node_event(rec));
  /* A capture: a wait node appended to it. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  fake_work(C, "captured consume", &n3);
  g3 = end_capture_ok(C);
  w3 = only_node(g3, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(w3), fake_node_event(rec));
  assert_true(fake_graph_has_edge(g3, w3, n3));
  /* An eager stream after a launch orders after the launch. */
  x1 = instantiate(g1);
  launched = launch(x1, X);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(launched, consume));
  dlsync_fence_release(f);
  assert_int_equal(D->GraphExecDestroy(x1), CUDA_SUCCESS);
  destroy_graph(g1);
  destroy_graph(g3);
  assert_int_equal(graph_owned(ctx), 1);
  destroy_graph(g2);
  assert_int_equal(graph_owned(ctx), 0);
  fake_stream_destroy(X);
}

static void built_fence_needs_a_current_context(void **state) {
  dlsync_fence *f = (dlsync_fence *)0x1;
  CUgraphNode deps[2];
  CUgraph g;
  dlsync_lane lg;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = fake_graph_add_work(g, NULL, 0, "a");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(f);
  assert_non_null(strstr(dlsync_last_error(), "current CUDA context"));
  assert_int_equal(fake_graph_count_nodes(g, -1), 1);
  assert_int_equal(lg.ndeps, 1);
  destroy_graph(g);
}

/* A fence outlives its graph (fence.h), and graph and node handles are
 * reused once destroyed: a new graph with the old handle must get a wait node
 * on the event the surviving executable still records, not the stale node in
 * its frontier (which here would be its own first node, ordering nothing). */
static void wait_from_a_new_graph_that_reuses_the_fence_graph_handle(void **state) {
  dlsync_fence *f = NULL;
  CUstream X = NULL, Y = NULL;
  CUgraphNode d1[2], d2[4], rec, consume;
  CUgraph g1, g2;
  CUgraphExec x1, x2;
  CUevent ev;
  dlsync_lane l1, l2;
  uint64_t launched1, launched2;
  (void)state;
  X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  Y = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "produce");
  l1 = dlsync_lane_graph(g1, d1, 1, 2);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &l1), DLSYNC_SUCCESS);
  rec = l1.deps[0];
  ev = fake_node_event(rec);
  x1 = instantiate(g1);
  assert_int_equal(D->GraphDestroy(g1), CUDA_SUCCESS); /* the executable lives on */
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  assert_ptr_equal(g2, g1); /* the fake reuses handles, like the driver */
  d2[0] = fake_graph_add_work(g2, NULL, 0, "consumer's own");
  l2 = dlsync_lane_graph(g2, d2, 1, 4);
  assert_int_equal(dlsync_fence_wait(f, &l2), DLSYNC_SUCCESS);
  /* Another graph: a wait node on the fence's event. */
  assert_int_equal(l2.ndeps, 1);
  assert_int_equal(fake_node_type(l2.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_graph(l2.deps[0]), g2);
  assert_ptr_equal(fake_node_event(l2.deps[0]), ev);
  consume = fake_graph_add_work(g2, l2.deps, l2.ndeps, "consume");
  assert_non_null(consume);
  x2 = instantiate(g2);
  launched1 = launch(x1, X);
  launched2 = launch(x2, Y);
  assert_true(fake_happens_before(launched1, launched2));
  dlsync_fence_release(f);
  assert_int_equal(D->GraphExecDestroy(x1), CUDA_SUCCESS);
  assert_int_equal(D->GraphExecDestroy(x2), CUDA_SUCCESS);
  destroy_graph(g2);
  fake_stream_destroy(X);
  fake_stream_destroy(Y);
}

typedef struct waiter {
  dlsync_fence *fence;
  CUstream stream;
  dlsync_status status;
} waiter;

static void *wait_on_another_thread(void *p) {
  waiter *w = p;
  dlsync_lane l = dlsync_lane_stream(w->stream);
  w->status = D->CtxPushCurrent(fake_primary_ctx(0)) == CUDA_SUCCESS
                  ? dlsync_fence_wait(w->fence, &l)
                  : DLSYNC_ERROR_INTERNAL;
  return NULL;
}

/* A fence signalled in a capture of the per-thread stream keeps the handle
 * CU_STREAM_PER_THREAD, which names the calling thread's own stream: from
 * another thread the capture's state cannot be read, so an eager wait there
 * is refused (DLSYNC_ERROR_CAPTURE_ORDER) rather than ordering nothing. */
static void per_thread_capture_fence_waited_from_another_thread(void **state) {
  dlsync_lane lpt = dlsync_lane_stream(DLSYNC_STREAM_PER_THREAD), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  pthread_t t;
  waiter w;
  CUgraph g;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(CU_STREAM_PER_THREAD, CU_STREAM_CAPTURE_MODE_RELAXED),
                   CUDA_SUCCESS);
  fake_work(CU_STREAM_PER_THREAD, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lpt), DLSYNC_SUCCESS);
  assert_int_equal(kind_of(f), DLSYNC_FENCE_CAPTURED);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_CAPTURE_ORDER);
  w.fence = f;
  w.stream = C;
  w.status = DLSYNC_ERROR_INTERNAL;
  assert_int_equal(pthread_create(&t, NULL, wait_on_another_thread, &w), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(w.status, DLSYNC_ERROR_CAPTURE_ORDER);
  g = end_capture_ok(CU_STREAM_PER_THREAD);
  dlsync_fence_release(f);
  destroy_graph(g);
  pop_all_contexts();
}

/* ---- many waits, references, lifetime ---- */

static void many_waits_and_references_keep_the_event_until_the_last_holder(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  enum { NS = 4 };
  CUstream s[NS];
  CUgraph graphs[3];
  CUgraphNode deps[2];
  dlsync_fence *f = NULL;
  uint64_t produce;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_ptr_equal(dlsync_fence_retain(f), f);
  assert_ptr_equal(dlsync_fence_retain(f), f);
  /* Eager waits from several streams, both devices. */
  for (int i = 0; i < NS; i++) {
    dlsync_lane l;
    uint64_t consume;
    s[i] = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    l = dlsync_lane_stream(s[i]);
    assert_int_equal(dlsync_fence_wait(f, &l), DLSYNC_SUCCESS);
    consume = fake_work(s[i], "consume", NULL);
    assert_true(fake_happens_before(produce, consume));
  }
  /* Two captures and a built graph wait on it too. */
  for (int i = 0; i < 2; i++) {
    dlsync_lane l = dlsync_lane_stream(s[i]);
    assert_int_equal(D->StreamBeginCapture(s[i], CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(dlsync_fence_wait(f, &l), DLSYNC_SUCCESS);
    fake_work(s[i], "captured", NULL);
    graphs[i] = end_capture_ok(s[i]);
  }
  assert_int_equal(D->GraphCreate(&graphs[2], 0), CUDA_SUCCESS);
  {
    dlsync_lane l = dlsync_lane_graph(graphs[2], deps, 0, 2);
    assert_int_equal(dlsync_fence_wait(f, &l), DLSYNC_SUCCESS);
  }
  assert_int_equal(graph_owned(ctx), 1); /* one event, however many holders */
  /* All three references dropped before the graphs: the event stays out. */
  dlsync_fence_release(f);
  dlsync_fence_release(f);
  assert_int_equal(graph_owned(ctx), 1);
  dlsync_fence_release(f);
  fake_run_destructors();
  for (int i = 0; i < 3; i++) {
    dlsync__pool_stats ps;
    assert_int_equal(graph_owned(ctx), 1);
    assert_int_equal(free_events(ctx), 0);
    dlsync__pool_stats_get(&ps, &ctx->pools);
    assert_int_equal(fake_live_events(), ps.created - ps.destroyed);
    assert_int_equal(fake_live_events(), ps.free_events + ps.graph_owned);
    destroy_graph(graphs[i]);
  }
  /* The last holder gone: back in the pool. */
  assert_int_equal(graph_owned(ctx), 0);
  assert_int_equal(free_events(ctx), 1);
  assert_int_equal(fake_dangling_event_uses(), 0);
  assert_pool_intact();
  for (int i = 0; i < NS; i++)
    fake_stream_destroy(s[i]);
}

static void a_fence_outlives_its_context(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  CUgraph g;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, c2, &lp), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  g = end_capture_ok(C);
  dlsync_fence_release(f);
  /* The graph still holds the event: the context hands it on. */
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  assert_int_equal(fake_live_events(), 1);
  destroy_graph(g);
  /* Destroyed with the next context created (orphans). */
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(fake_live_events(), 0);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  assert_int_equal(fake_dangling_event_uses(), 0);
}

/* ---- errors ---- */

static void null_and_invalid_arguments(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), none, both = dlsync_lane_stream(P);
  dlsync_fence *f = (dlsync_fence *)0x1, *ok = NULL;
  dlsync_fence_kind k;
  CUgraph g;
  CUgraphNode deps[1];
  (void)state;
  memset(&none, 0, sizeof none);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  both.graph = g;
  fake_log_reset();
  assert_int_equal(dlsync_fence_signal(NULL, ctx, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "out is NULL"));
  assert_int_equal(dlsync_fence_signal(&f, NULL, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "ctx is NULL"));
  assert_null(f);
  f = (dlsync_fence *)0x1;
  assert_int_equal(dlsync_fence_signal(&f, ctx, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "lane is NULL"));
  assert_null(f);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &none), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "neither"));
  assert_int_equal(dlsync_fence_signal(&f, ctx, &both), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "both"));
  {
    dlsync_lane bad = dlsync_lane_graph(g, NULL, 1, 1);
    assert_int_equal(dlsync_fence_signal(&f, ctx, &bad), DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(dlsync_last_error(), "deps is NULL"));
    bad = dlsync_lane_graph(g, deps, 2, 1);
    assert_int_equal(dlsync_fence_signal(&f, ctx, &bad), DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(dlsync_last_error(), "capacity"));
    bad = dlsync_lane_graph(NULL, deps, 0, 1);
    assert_int_equal(dlsync_fence_signal(&f, ctx, &bad), DLSYNC_ERROR_INVALID_LANE);
    assert_non_null(strstr(dlsync_last_error(), "no graph"));
  }
  assert_int_equal(fake_calls_total(), 0);
  assert_int_equal(dlsync_fence_wait(NULL, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "fence is NULL"));
  assert_int_equal(dlsync_fence_get_kind(&k, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "fence is NULL"));
  assert_null(dlsync_fence_retain(NULL));
  dlsync_fence_release(NULL);
  /* With a real fence. */
  assert_int_equal(dlsync_fence_signal(&ok, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_get_kind(NULL, ok), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "out is NULL"));
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(ok, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "lane is NULL"));
  assert_int_equal(dlsync_fence_wait(ok, &none), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "neither"));
  assert_int_equal(dlsync_fence_wait(ok, &both), DLSYNC_ERROR_INVALID_LANE);
  assert_int_equal(fake_calls_total(), 0);
  /* A graph lane with no room for the wait node: nothing added. */
  {
    dlsync_lane l0 = dlsync_lane_graph(g, deps, 0, 0);
    assert_int_equal(dlsync_fence_wait(ok, &l0), DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(dlsync_last_error(), "capacity 0"));
    assert_int_equal(fake_graph_count_nodes(g, -1), 0);
  }
  dlsync_fence_release(ok);
  destroy_graph(g);
}

static void invalidated_capture_is_reported(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUevent e = fake_event_create(0, 0);
  dlsync_fence *f = (dlsync_fence *)0x1, *ok = NULL;
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(dlsync_fence_signal(&ok, ctx, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_null(f);
  assert_non_null(strstr(dlsync_last_error(), "invalidated"));
  assert_int_equal(dlsync_fence_wait(ok, &lp), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_non_null(strstr(dlsync_last_error(), "invalidated"));
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  dlsync_fence_release(ok);
  fake_event_destroy(e);
}

static void legacy_stream_during_blocking_capture(void **state) {
  CUstream blocking = fake_stream_create(0, CU_STREAM_DEFAULT);
  dlsync_lane legacy = dlsync_lane_stream(DLSYNC_STREAM_LEGACY), nul = dlsync_lane_stream(NULL);
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_fence *f = (dlsync_fence *)0x1, *ok = NULL;
  CUgraph g;
  (void)state;
  assert_int_equal(dlsync_fence_signal(&ok, ctx, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(blocking, "captured", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_fence_signal(&f, ctx, &legacy), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_null(f);
  assert_non_null(strstr(dlsync_last_error(), "legacy"));
  /* Only the query named the legacy stream: no record, no event taken. */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 0);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &nul), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(ok, &legacy), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_non_null(strstr(dlsync_last_error(), "legacy"));
  assert_int_equal(dlsync_fence_wait(ok, &nul), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  /* The capture is intact. */
  assert_int_equal(fake_capture_status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(blocking);
  destroy_graph(g);
  /* Without the capture, the legacy stream is an eager lane like any other. */
  {
    uint64_t produce = fake_work(C, "produce", NULL), consume;
    dlsync_fence *f2 = NULL;
    assert_int_equal(dlsync_fence_signal(&f2, ctx, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_fence_wait(f2, &legacy), DLSYNC_SUCCESS);
    consume = fake_work(CU_STREAM_LEGACY, "consume", NULL);
    assert_true(fake_happens_before(produce, consume));
    dlsync_fence_release(f2);
  }
  dlsync_fence_release(ok);
  pop_all_contexts();
  fake_stream_destroy(blocking);
}

/* ---- fault injection: every driver call of signal and of wait ---- */

typedef enum lane_kind { K_EAGER, K_CAPTURE, K_BUILT } lane_kind;

typedef enum wait_kind {
  W_EAGER,          /* another eager stream */
  W_CAPTURE,        /* another capture */
  W_SAME_CAPTURE,   /* a stream joined to the signalling capture */
  W_BUILT,          /* another built graph */
  W_SAME_BUILT,     /* another lane of the signalling graph */
  W_EAGER_AFTER_END /* an eager stream, after the signalling capture ended */
} wait_kind;

typedef struct fault_row {
  lane_kind sig;
  wait_kind wait;
  dlsync_status wait_status; /* without a fault */
} fault_row;

static const fault_row fault_rows[] = {
    {K_EAGER, W_EAGER, DLSYNC_SUCCESS},
    {K_EAGER, W_CAPTURE, DLSYNC_SUCCESS},
    {K_EAGER, W_BUILT, DLSYNC_SUCCESS},
    {K_CAPTURE, W_SAME_CAPTURE, DLSYNC_SUCCESS},
    {K_CAPTURE, W_CAPTURE, DLSYNC_SUCCESS},
    {K_CAPTURE, W_BUILT, DLSYNC_SUCCESS},
    {K_CAPTURE, W_EAGER_AFTER_END, DLSYNC_SUCCESS},
    {K_CAPTURE, W_EAGER, DLSYNC_ERROR_CAPTURE_ORDER}, /* REFUSE_CAPTURE_TO_EAGER */
    {K_BUILT, W_SAME_BUILT, DLSYNC_SUCCESS},
    {K_BUILT, W_BUILT, DLSYNC_SUCCESS},
    {K_BUILT, W_CAPTURE, DLSYNC_SUCCESS},
    {K_BUILT, W_EAGER, DLSYNC_SUCCESS},
};

/* One signal and one wait of a row, on a context, streams and graphs of its
 * own, with driver call n of the signal (in_wait false) or of the wait (in_wait
 * true) failing; n = 0: none. Everything is cleaned up, then checked against
 * nothing left alive (fake_leak_report). Returns true when call n was reached. */
static fake_fault sweep_kind = FAKE_FAULT_CALL;

static bool run_fence_row(const fault_row *row, bool in_wait, unsigned n) {
  dlsync_context *fc = NULL;
  CUstream p = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUstream c = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUevent fork = NULL, join = NULL;
  CUgraph g1 = NULL, g2 = NULL, gp = NULL, gc = NULL;
  CUgraphNode d1[4], d2[4];
  dlsync_lane ls = dlsync_lane_stream(p), lw = dlsync_lane_stream(c);
  dlsync_fence *f = NULL;
  dlsync_status ss, sw = DLSYNC_SUCCESS;
  char leaks[256] = {0};
  bool reached;
  assert_int_equal(dlsync__context_create_with_driver(&fc, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  /* The signalling lane. */
  if (row->sig == K_CAPTURE) {
    assert_int_equal(D->StreamBeginCapture(p, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  } else if (row->sig == K_BUILT) {
    assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
    d1[0] = fake_graph_add_work(g1, NULL, 0, "produce");
    ls = dlsync_lane_graph(g1, d1, 1, 4);
  }
  if (row->sig != K_BUILT)
    fake_work(p, "produce", NULL);
  /* The waiting lane. */
  if (row->wait == W_CAPTURE) {
    assert_int_equal(D->StreamBeginCapture(c, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  } else if (row->wait == W_SAME_CAPTURE) {
    fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    assert_int_equal(D->EventRecord(fork, p), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(c, fork, 0), CUDA_SUCCESS);
  } else if (row->wait == W_BUILT) {
    assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
    d2[0] = fake_graph_add_work(g2, NULL, 0, "consumer's own");
    lw = dlsync_lane_graph(g2, d2, 1, 4);
  } else if (row->wait == W_SAME_BUILT) {
    d2[0] = fake_graph_add_work(g1, NULL, 0, "consumer's own");
    lw = dlsync_lane_graph(g1, d2, 1, 4);
  }

  if (n > 0 && !in_wait)
    fake_fail_fault(sweep_kind, n);
  ss = dlsync_fence_signal(&f, fc, &ls);
  reached = n > 0 && !in_wait && !fake_fail_pending();
  fake_fail_clear(); /* with the signal under test, the rest runs without faults */
  if (ss == DLSYNC_SUCCESS) {
    assert_non_null(f);
    if (row->wait == W_EAGER_AFTER_END)
      gp = end_capture_ok(p);
    if (n > 0 && in_wait)
      fake_fail_fault(sweep_kind, n);
    sw = dlsync_fence_wait(f, &lw);
    if (in_wait)
      reached = n > 0 && !fake_fail_pending();
    fake_fail_clear();
  } else {
    assert_null(f);
  }
  if (reached && sweep_kind == FAKE_FAULT_ALLOC) {
    if ((ss != DLSYNC_SUCCESS || sw != row->wait_status) && !fake_fault_reported(sweep_kind))
      fail_msg("row %d/%d, allocation %u of the %s: %s", (int)row->sig, (int)row->wait, n,
               in_wait ? "wait" : "signal", dlsync_last_error());
  } else if (reached) {
    if (ss == DLSYNC_SUCCESS && sw == row->wait_status)
      fail_msg("row %d/%d: call %u of the %s failed but signal and wait did as without it",
               (int)row->sig, (int)row->wait, n, in_wait ? "wait" : "signal");
    if (strstr(dlsync_last_error(), "CUDA_ERROR_") == NULL)
      fail_msg("row %d/%d, call %u of the %s: message without the driver's error: %s",
               (int)row->sig, (int)row->wait, n, in_wait ? "wait" : "signal", dlsync_last_error());
    assert_int_not_equal(dlsync_last_driver_result(), 0);
  } else {
    if (ss != DLSYNC_SUCCESS || sw != row->wait_status)
      fail_msg("row %d/%d without a fault: %s", (int)row->sig, (int)row->wait, dlsync_last_error());
  }

  /* Clean up. */
  if (row->wait == W_SAME_CAPTURE) {
    join = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    assert_int_equal(D->EventRecord(join, c), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(p, join, 0), CUDA_SUCCESS);
  }
  if (row->wait == W_CAPTURE) {
    CUresult r = D->StreamEndCapture(c, &gc);
    if (!reached)
      assert_int_equal(r, CUDA_SUCCESS);
  }
  if (row->sig == K_CAPTURE && gp == NULL) {
    CUresult r = D->StreamEndCapture(p, &gp);
    if (!reached)
      assert_int_equal(r, CUDA_SUCCESS);
  }
  dlsync_fence_release(f);
  if (gc != NULL)
    assert_int_equal(D->GraphDestroy(gc), CUDA_SUCCESS);
  if (gp != NULL)
    assert_int_equal(D->GraphDestroy(gp), CUDA_SUCCESS);
  if (g1 != NULL)
    assert_int_equal(D->GraphDestroy(g1), CUDA_SUCCESS);
  if (g2 != NULL)
    assert_int_equal(D->GraphDestroy(g2), CUDA_SUCCESS);
  if (fork != NULL)
    fake_event_destroy(fork);
  if (join != NULL)
    fake_event_destroy(join);
  fake_run_destructors();
  assert_int_equal(fake_active_captures(), 0);
  assert_pool_intact_of(fc);
  pop_all_contexts();
  assert_int_equal(dlsync_context_destroy(fc), DLSYNC_SUCCESS);
  fake_stream_destroy(p);
  fake_stream_destroy(c);
  fake_run_destructors();
  if (fake_leak_report(leaks, sizeof leaks) != 0)
    fail_msg("row %d/%d, call %u of the %s: leaked: %s", (int)row->sig, (int)row->wait, n,
             in_wait ? "wait" : "signal", leaks);
  assert_int_equal(fake_dangling_event_uses(), 0);
  assert_int_equal(fake_illegal_calls(), 0);
  return reached;
}

static void every_driver_failure_in_signal_and_wait_is_a_status(void **state) {
  (void)state;
  /* Each row brings its own context and streams: nothing else is alive. */
  fake_stream_destroy(P);
  fake_stream_destroy(C);
  assert_int_equal(fake_leak_report(NULL, 0), 0);
  for (size_t r = 0; r < sizeof fault_rows / sizeof fault_rows[0]; r++) {
    for (int in_wait = 0; in_wait <= 1; in_wait++) {
      unsigned n;
      run_fence_row(&fault_rows[r], in_wait, 0);
      for (n = 1; n < 100; n++)
        if (!run_fence_row(&fault_rows[r], in_wait, n))
          break;
      assert_true(n < 100);
      /* The signal makes several calls, a wait at least one (from the same
       * built graph: the reads that check the record node is still its). */
      if (!in_wait)
        assert_true(n > 2);
      else
        assert_true(n > 1);
    }
  }
  P = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  C = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

static void every_allocation_failure_in_signal_and_wait_is_a_status(void **state) {
  unsigned most = 0;
  (void)state;
  fake_stream_destroy(P);
  fake_stream_destroy(C);
  assert_int_equal(fake_leak_report(NULL, 0), 0);
  sweep_kind = FAKE_FAULT_ALLOC;
  for (size_t r = 0; r < sizeof fault_rows / sizeof fault_rows[0]; r++) {
    for (int in_wait = 0; in_wait <= 1; in_wait++) {
      unsigned n;
      for (n = 1; n < 100; n++)
        if (!run_fence_row(&fault_rows[r], in_wait, n))
          break;
      assert_true(n < 100);
      most = n > most ? n : most;
    }
  }
  sweep_kind = FAKE_FAULT_CALL;
  assert_true(most > 1); /* a signal allocates its fence */
  P = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  C = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

/* ---- threads ---- */

#define FT 8
#define ROUNDS 40

static dlsync_fence *shared_fences[FT];
static uint64_t shared_ops[FT];
static pthread_barrier_t barrier;
static atomic_int deleted[FT];

typedef struct fthread {
  int index;
  CUstream s;
  int failures;
  int unordered;
} fthread;

static void count_deleter(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void *fence_loop(void *arg) {
  fthread *t = arg;
  dlsync_lane l = dlsync_lane_stream(t->s);
  for (int r = 0; r < ROUNDS; r++) {
    uint64_t consume;
    shared_ops[t->index] = fake_work(t->s, "produce", NULL);
    if (dlsync_fence_signal(&shared_fences[t->index], ctx, &l) != DLSYNC_SUCCESS)
      t->failures++;
    pthread_barrier_wait(&barrier);
    for (int k = 1; k < FT; k += 2) {
      int j = (t->index + k + r) % FT;
      if (j == t->index || shared_fences[j] == NULL)
        continue;
      if (dlsync_fence_wait(shared_fences[j], &l) != DLSYNC_SUCCESS)
        t->failures++;
    }
    consume = fake_work(t->s, "consume", NULL);
    for (int k = 1; k < FT; k += 2) {
      int j = (t->index + k + r) % FT;
      if (j != t->index && !fake_happens_before(shared_ops[j], consume))
        t->unordered++;
    }
    if (dlsync_release(ctx, &l, count_deleter, &deleted[t->index]) != DLSYNC_SUCCESS)
      t->failures++;
    pthread_barrier_wait(&barrier); /* no one waits on this round's fences any more */
    dlsync_fence_release(shared_fences[t->index]);
  }
  return NULL;
}

static void threads_signal_and_wait_on_each_others_fences(void **state) {
  pthread_t th[FT];
  fthread td[FT];
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  (void)state;
  assert_int_equal(pthread_barrier_init(&barrier, NULL, FT), 0);
  for (int i = 0; i < FT; i++) {
    td[i].index = i;
    td[i].s = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    td[i].failures = 0;
    td[i].unordered = 0;
    atomic_init(&deleted[i], 0);
    shared_fences[i] = NULL;
  }
  for (int i = 0; i < FT; i++)
    assert_int_equal(pthread_create(&th[i], NULL, fence_loop, &td[i]), 0);
  for (int i = 0; i < FT; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  assert_int_equal(pthread_barrier_destroy(&barrier), 0);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_get_stats(&rs, ctx), DLSYNC_SUCCESS);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.done, FT * ROUNDS);
  for (int i = 0; i < FT; i++) {
    assert_int_equal(td[i].failures, 0);
    assert_int_equal(td[i].unordered, 0);
    assert_int_equal(atomic_load(&deleted[i]), ROUNDS);
    fake_stream_destroy(td[i].s);
  }
  assert_int_equal(graph_owned(ctx), 0);
}

#define TIMEOUT_MS 5000

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* ---- a fence that outlives its context ---- */

static void fence_outliving_its_context_still_works(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, c2, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
  assert_message_has("1 fence(s) not released");
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS); /* before: use after free */
  assert_int_equal(fake_live_events(), 1);
  dlsync_fence_release(f);
  /* Its event went with it, destroyed on dlsync's janitor thread. */
  for (int i = 0; i < TIMEOUT_MS && fake_live_events() != 0; i++)
    sleep_ms(1);
  assert_int_equal(fake_live_events(), 0);
}

static void fence_used_after_its_last_release_is_invalid_argument(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  dlsync_fence_kind kind;
  (void)state;
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_ptr_equal(dlsync_fence_retain(f), f);
  dlsync_fence_release(f);
  dlsync_fence_release(f); /* the last one */
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("was released");
  assert_int_equal(dlsync_fence_get_kind(&kind, f), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(dlsync_fence_retain(f));
  dlsync_fence_release(f); /* one too many: ignored, with a message */
  assert_message_has("dlsync_fence_release");
  assert_int_equal(fake_live_events(), 1); /* its event is back in the pool */
}

/* ---- an invalidated capture, and the last release ---- */

/* Waits until the driver has `want` events alive, or TIMEOUT_MS. */
static bool wait_live_events(unsigned want) {
  for (int i = 0; i < TIMEOUT_MS; i++) {
    if (fake_live_events() == want)
      return true;
    sleep_ms(1);
  }
  return fake_live_events() == want;
}

static void fence_wait_on_an_invalidated_capture_says_invalidated(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUevent e = fake_event_create(0, 0);
  dlsync_fence *f = NULL;
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  /* An eager event waited on in capture: ISOLATION, the capture invalidated. */
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_message_has("invalidated");
  if (strstr(dlsync_last_error(), "still active") != NULL)
    fail_msg("%s", dlsync_last_error());
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  dlsync_fence_release(f);
  fake_event_destroy(e);
}

/* The fence's last release from a place where no CUDA call is allowed (a
 * host function, a user-object destructor): no cuEventDestroy there. */
static dlsync__driver W; /* the fake's table with EventDestroy watched */
static _Thread_local bool in_forbidden;
static atomic_int forbidden_calls;

static CUresult CUDAAPI watched_event_destroy(CUevent e) {
  if (in_forbidden)
    atomic_fetch_add(&forbidden_calls, 1);
  return fake_driver()->EventDestroy(e);
}

static void last_fence_release_makes_no_cuda_call_on_the_caller(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_fence *f = NULL;
  unsigned before;
  (void)state;
  W = *D;
  W.EventDestroy = watched_event_destroy;
  atomic_store(&forbidden_calls, 0);
  before = fake_live_events();
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, &W), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, c2, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
  assert_int_equal(fake_live_events(), before + 1);
  in_forbidden = true;
  dlsync_fence_release(f); /* the context's last reference */
  in_forbidden = false;
  assert_int_equal(atomic_load(&forbidden_calls), 0);
  /* Done on dlsync's own thread: the event is gone soon. */
  assert_true(wait_live_events(before));
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(eager_fence_eager_wait_orders_after_the_signal),
      T(eager_fence_capture_wait_gets_a_wait_node_the_graph_holds),
      T(eager_fence_built_wait_gets_a_wait_node_at_the_frontier),
      T(captured_fence_same_capture_is_edges_only),
      T(captured_fence_waited_on_its_own_stream),
      T(captured_fence_other_capture_gets_a_wait_node),
      T(captured_fence_built_wait_gets_a_wait_node),
      T(captured_fence_eager_wait_is_refused_while_active_then_allowed),
      T(built_fence_record_node_after_the_frontier),
      T(built_fence_same_graph_adds_the_node_to_the_frontier),
      T(built_fence_other_graphs_and_eager_after_launch),
      T(built_fence_needs_a_current_context),
      T(wait_from_a_new_graph_that_reuses_the_fence_graph_handle),
      T(per_thread_capture_fence_waited_from_another_thread),
      T(many_waits_and_references_keep_the_event_until_the_last_holder),
      T(a_fence_outlives_its_context),
      T(null_and_invalid_arguments),
      T(invalidated_capture_is_reported),
      T(legacy_stream_during_blocking_capture),
      T(every_driver_failure_in_signal_and_wait_is_a_status),
      T(every_allocation_failure_in_signal_and_wait_is_a_status),
      T(threads_signal_and_wait_on_each_others_fences),
      cmocka_unit_test_setup_teardown(fence_outliving_its_context_still_works, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(fence_used_after_its_last_release_is_invalid_argument,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(fence_wait_on_an_invalidated_capture_says_invalidated,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(last_fence_release_makes_no_cuda_call_on_the_caller,
                                      fixture_setup, fixture_teardown),
  };
#undef T
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
