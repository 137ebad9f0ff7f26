/* SPDX-License-Identifier: Apache-2.0 */
/* Event nodes hoisted out of conditional bodies (include/dlsync/conditional.h,
 * dlsync_conditional_node_declare) on the fake driver.
 *
 * A body declared with its parent graph and conditional node: a row that
 * would put a wait node in the body puts it in the parent instead, with an
 * edge to the conditional node; one that would put a record node there puts
 * it in the parent after the conditional node; for nested bodies, in the
 * outermost graph that admits it. The body keeps no event node, the parent
 * instantiates, and a launch of the parent is ordered as the row promises
 * (the controls: no order, no ordering). Bad declarations, the rows that
 * cannot hoist, and every driver call failing in turn: a status, a message,
 * nothing declared or queued. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

/* ---- helpers ---- */

/* A conditional node (IF or WHILE, one body) in `parent` after deps[0..n);
 * *body its body. */
static CUgraphNode cond_node_add(CUgraph parent, CUgraphConditionalNodeType type,
                                 const CUgraphNode *deps, size_t n, CUgraph *body) {
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode node = NULL;
  assert_int_equal(D->GraphConditionalHandleCreate(&h, parent, fake_primary_ctx(0), 1,
                                                   CU_GRAPH_COND_ASSIGN_DEFAULT),
                   CUDA_SUCCESS);
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = type;
  p.conditional.size = 1;
  p.conditional.ctx = fake_primary_ctx(0);
  assert_int_equal(D->GraphAddNode(&node, parent, deps, NULL, n, &p), CUDA_SUCCESS);
  *body = p.conditional.phGraph_out[0];
  assert_true(fake_graph_is_body(*body));
  return node;
}

/* A graph built by hand: work, then an IF (or WHILE) node after it. */
static CUgraphNode parent_make(CUgraph *parent, CUgraph *body, CUgraphConditionalNodeType type) {
  CUgraphNode w;
  assert_int_equal(D->GraphCreate(parent, 0), CUDA_SUCCESS);
  w = fake_graph_add_work(*parent, NULL, 0, "before the conditional node");
  return cond_node_add(*parent, type, &w, 1, body);
}

static void declare(CUgraph parent, CUgraphNode node, CUgraph body) {
  assert_int_equal(dlsync_conditional_node_declare(ctx, parent, node, &body, 1), DLSYNC_SUCCESS);
  assert_true(dlsync_conditional_body_is_declared(ctx, body));
}

static void body_capture_begin(CUstream s, CUgraph body) {
  assert_int_equal(
      D->StreamBeginCaptureToGraph(s, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED),
      CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(s, "body work", NULL, NULL), CUDA_SUCCESS);
}

static void body_capture_end(CUstream s, CUgraph body) {
  CUgraph g = NULL;
  assert_int_equal(D->StreamEndCapture(s, &g), CUDA_SUCCESS);
  assert_ptr_equal(g, body);
}

static size_t event_nodes(CUgraph g) {
  return fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) +
         fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

/* The one node of type `type` in g (fails when there is not exactly one). */
static CUgraphNode only_node(CUgraph g, CUgraphNodeType type) {
  CUgraphNode nodes[64], found = NULL;
  size_t n = 64;
  assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  assert_true(n <= 64);
  for (size_t i = 0; i < n; i++) {
    if (fake_node_type(nodes[i]) != (int)type)
      continue;
    assert_null(found);
    found = nodes[i];
  }
  assert_non_null(found);
  return found;
}

/* g instantiated and launched on s: the launch's op (0: instantiate
 * failed, *r the result). */
static uint64_t launch(CUgraph g, CUstream s, CUresult *r) {
  CUgraphExec x = NULL;
  uint64_t op;
  *r = D->GraphInstantiateWithFlags(&x, g, 0);
  if (*r != CUDA_SUCCESS)
    return 0;
  assert_int_equal(D->GraphLaunch(x, s), CUDA_SUCCESS);
  op = fake_stream_last_op(s);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  return op;
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* No driver call since fake_log_reset that queues or adds anything. */
static void assert_nothing_queued(void) {
  const char *log = fake_call_log();
  if (strstr(log, "cuEventRecord") != NULL || strstr(log, "cuStreamWaitEvent") != NULL ||
      strstr(log, "cuGraphAdd") != NULL ||
      strstr(log, "cuStreamUpdateCaptureDependencies") != NULL ||
      strstr(log, "cuGraphRetainUserObject") != NULL)
    fail_msg("driver calls that queue or add: %s", log);
}

/* ---- eager producer, consumer in a body ---- */

/* EAGER_TO_CAPTURE into an IF (then a WHILE) body's capture, the body
 * declared with its parent built by hand: the wait node goes into the parent
 * with an edge to the conditional node, none into the body; the capture ends
 * cleanly, the parent instantiates, and its launch comes after the
 * producer's work. The control: the same launch without the order is not
 * after it. */
static void eager_to_capture_body(CUgraphConditionalNodeType type) {
  CUgraph parent, body;
  CUgraphNode node, wait;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  uint64_t produced, launched;
  CUresult r;
  node = parent_make(&parent, &body, type);
  declare(parent, node, body);
  body_capture_begin(C, body);
  produced = fake_work(P, "slow producer", NULL);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_work_ex(C, "consumer in the body", NULL, NULL), CUDA_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  wait = only_node(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(parent, wait, node));
  assert_int_equal(fake_graph_count_nodes(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  launched = launch(parent, s, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_true(fake_happens_before(produced, launched));
  /* Control: later producer work, no order: the launch is not after it. */
  produced = fake_work(P, "unordered producer", NULL);
  launched = launch(parent, s, &r);
  assert_false(fake_happens_before(produced, launched));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
  fake_stream_destroy(s);
}

static void eager_to_if_body_capture(void **state) {
  (void)state;
  eager_to_capture_body(CU_GRAPH_COND_TYPE_IF);
}

static void eager_to_while_body_capture(void **state) {
  (void)state;
  eager_to_capture_body(CU_GRAPH_COND_TYPE_WHILE);
}

/* EAGER_TO_BUILT onto a graph lane in a declared body: the lane's frontier
 * is unchanged (no node in the body), the parent gets the wait node. */
static void eager_to_built_body(void **state) {
  CUgraph parent, body;
  CUgraphNode node, a[2], wait;
  dlsync_lane lp = dlsync_lane_stream(P), la;
  uint64_t produced, launched;
  CUresult r;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  declare(parent, node, body);
  a[0] = fake_graph_add_work(body, NULL, 0, "a");
  la = dlsync_lane_graph(body, a, 1, 2);
  produced = fake_work(P, "slow producer", NULL);
  assert_int_equal(dlsync_order(ctx, &lp, &la), DLSYNC_SUCCESS);
  assert_int_equal(la.ndeps, 1);
  assert_ptr_equal(la.deps[0], a[0]);
  assert_int_equal(event_nodes(body), 0);
  wait = only_node(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(parent, wait, node));
  launched = launch(parent, C, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_true(fake_happens_before(produced, launched));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* The parent is a capture's graph: the conditional node added to it during
 * the capture (cuGraphAddNode at the capture's dependencies, then the
 * capture's dependencies set to it). The wait node goes into the capture's
 * graph with an edge to the conditional node; both captures end cleanly and
 * the parent instantiates. */
static void parent_under_capture(void **state) {
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUstreamCaptureStatus cs;
  CUgraph cap = NULL, body, parent;
  const CUgraphNode *deps = NULL;
  size_t ndeps = 0;
  CUgraphNode node, wait;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  uint64_t produced, launched;
  CUresult r;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(s, "parent work", NULL, NULL), CUDA_SUCCESS);
  assert_int_equal(D->StreamGetCaptureInfo(s, &cs, NULL, &cap, &deps, NULL, &ndeps), CUDA_SUCCESS);
  node = cond_node_add(cap, CU_GRAPH_COND_TYPE_IF, deps, ndeps, &body);
  assert_int_equal(
      D->StreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES),
      CUDA_SUCCESS);
  declare(cap, node, body);
  body_capture_begin(C, body);
  produced = fake_work(P, "slow producer", NULL);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(fake_work_ex(s, "after the conditional node", NULL, NULL), CUDA_SUCCESS);
  parent = end_capture_ok(s);
  assert_ptr_equal(parent, cap);
  assert_int_equal(event_nodes(body), 0);
  wait = only_node(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(parent, wait, node));
  launched = launch(parent, C, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_true(fake_happens_before(produced, launched));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
  fake_stream_destroy(s);
}

/* A body inside a body: the inner body's wait goes to the outermost graph
 * (the inner parent is a body too, which admits no event node), ahead of
 * the outer conditional node. */
static void nested_bodies(void **state) {
  CUgraph parent, outer, inner;
  CUgraphNode onode, inode, wait;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  uint64_t produced, launched;
  CUresult r;
  (void)state;
  onode = parent_make(&parent, &outer, CU_GRAPH_COND_TYPE_IF);
  inode = cond_node_add(outer, CU_GRAPH_COND_TYPE_WHILE, NULL, 0, &inner);
  declare(parent, onode, outer);
  declare(outer, inode, inner);
  body_capture_begin(C, inner);
  produced = fake_work(P, "slow producer", NULL);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  body_capture_end(C, inner);
  assert_int_equal(event_nodes(inner), 0);
  assert_int_equal(event_nodes(outer), 0);
  wait = only_node(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(parent, wait, onode));
  launched = launch(parent, P, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_true(fake_happens_before(produced, launched));
  assert_int_equal(dlsync_conditional_body_remove(ctx, inner), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, outer), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* ---- producer in a body ---- */

/* CAPTURE_TO_BUILT from a body's capture to a graph lane of another graph:
 * the record node goes into the parent after the conditional node, the wait
 * node at the lane's frontier; the lane's graph launched after the parent
 * waits for it. Then TWO_BUILT from a graph lane in the body. */
static void body_producer_to_built(void **state) {
  CUgraph parent, body, other;
  CUgraphNode node, o[2], b[2], rec;
  dlsync_lane lc = dlsync_lane_stream(C), lo, lb;
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  uint64_t parent_op, other_op;
  CUresult r;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  declare(parent, node, body);
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  o[0] = fake_graph_add_work(other, NULL, 0, "o");
  lo = dlsync_lane_graph(other, o, 1, 2);
  body_capture_begin(C, body);
  assert_int_equal(dlsync_order(ctx, &lc, &lo), DLSYNC_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  rec = only_node(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_true(fake_graph_has_edge(parent, node, rec));
  assert_int_equal(lo.ndeps, 1);
  assert_int_equal(fake_node_type(lo.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(lo.deps[0]), fake_node_event(rec));
  parent_op = launch(parent, s, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  other_op = launch(other, C, &r);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_true(fake_happens_before(parent_op, other_op));
  /* TWO_BUILT: a graph lane in the body as the producer. */
  b[0] = fake_graph_add_work(body, NULL, 0, "b");
  lb = dlsync_lane_graph(body, b, 1, 2);
  assert_int_equal(dlsync_order(ctx, &lb, &lo), DLSYNC_SUCCESS);
  assert_int_equal(lb.ndeps, 1);
  assert_ptr_equal(lb.deps[0], b[0]);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(fake_graph_count_nodes(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 2);
  assert_int_equal(launch(parent, s, &r) != 0, 1);
  assert_int_equal(r, CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(other);
  destroy_graph(parent);
  fake_stream_destroy(s);
}

/* TWO_CAPTURES with the producer in a body and the consumer an ordinary
 * capture: the record node in the parent, the consumer's wait node by hand
 * in its capture, which ends cleanly. */
static void body_producer_to_capture(void **state) {
  CUgraph parent, body, cg;
  CUgraphNode node, rec, wait;
  dlsync_lane lc = dlsync_lane_stream(C), lp = dlsync_lane_stream(P);
  (void)state;
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  declare(parent, node, body);
  body_capture_begin(C, body);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &lc, &lp), DLSYNC_SUCCESS);
  assert_int_equal(fake_work_ex(P, "consumer", NULL, NULL), CUDA_SUCCESS);
  cg = end_capture_ok(P);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  rec = only_node(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_true(fake_graph_has_edge(parent, node, rec));
  wait = only_node(cg, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(wait), fake_node_event(rec));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(cg);
  destroy_graph(parent);
}

/* TWO_CAPTURES with the consumer in a body: an external record in the
 * producer's capture, the wait node in the parent; and TWO_BUILT between
 * lanes in the bodies of two parents: the record node after one conditional
 * node, the wait node ahead of the other. */
static void both_sides_and_other_captures(void **state) {
  CUgraph parent, body, parent2, body2, cg;
  CUgraphNode node, node2, rec, wait, a[2], b[2];
  dlsync_lane lc = dlsync_lane_stream(C), lp = dlsync_lane_stream(P), la, lb;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  node2 = parent_make(&parent2, &body2, CU_GRAPH_COND_TYPE_WHILE);
  declare(parent, node, body);
  declare(parent2, node2, body2);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(P, "producer", NULL, NULL), CUDA_SUCCESS);
  body_capture_begin(C, body);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  body_capture_end(C, body);
  cg = end_capture_ok(P);
  rec = only_node(cg, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  wait = only_node(parent, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(rec), fake_node_event(wait));
  assert_true(fake_graph_has_edge(parent, wait, node));
  assert_int_equal(event_nodes(body), 0);
  /* TWO_BUILT, both lanes in bodies. */
  a[0] = fake_graph_add_work(body, NULL, 0, "a");
  b[0] = fake_graph_add_work(body2, NULL, 0, "b");
  la = dlsync_lane_graph(body, a, 1, 2);
  lb = dlsync_lane_graph(body2, b, 1, 2);
  assert_int_equal(dlsync_order(ctx, &la, &lb), DLSYNC_SUCCESS);
  rec = only_node(parent, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_true(fake_graph_has_edge(parent, node, rec));
  wait = only_node(parent2, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_graph_has_edge(parent2, wait, node2));
  assert_ptr_equal(fake_node_event(rec), fake_node_event(wait));
  assert_ptr_equal(la.deps[0], a[0]);
  assert_ptr_equal(lb.deps[0], b[0]);
  assert_int_equal(event_nodes(body) + event_nodes(body2), 0);
  {
    CUresult r;
    uint64_t op1 = launch(parent, P, &r), op2;
    assert_int_equal(r, CUDA_SUCCESS);
    op2 = launch(parent2, C, &r);
    assert_int_equal(r, CUDA_SUCCESS);
    assert_true(fake_happens_before(op1, op2));
  }
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body2), DLSYNC_SUCCESS);
  destroy_graph(cg);
  destroy_graph(parent2);
  destroy_graph(parent);
}

/* ---- what cannot be hoisted ---- */

/* The producer in a body and the consumer a lane on the body's own parent:
 * both nodes would go to one graph; refused by name, nothing queued. A body
 * declared alone (dlsync_conditional_body_add) is refused as before. */
static void refused_rows(void **state) {
  CUgraph parent, body, body2, parent2;
  CUgraphNode node, a[2], pw[2];
  dlsync_lane la, lpar, lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  declare(parent, node, body);
  a[0] = fake_graph_add_work(body, NULL, 0, "a");
  la = dlsync_lane_graph(body, a, 1, 2);
  pw[0] = node;
  lpar = dlsync_lane_graph(parent, pw, 1, 2);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &la, &lpar), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("DLSYNC__ROW_TWO_BUILT");
  assert_message_has("one graph orders with edges");
  assert_message_has("Nothing was queued");
  assert_nothing_queued();
  assert_int_equal(lpar.ndeps, 1);
  assert_int_equal(event_nodes(parent), 0);
  /* Declared alone: refused, with the way to have it hoisted named. */
  (void)parent_make(&parent2, &body2, CU_GRAPH_COND_TYPE_IF);
  assert_int_equal(dlsync_conditional_body_add(ctx, body2), DLSYNC_SUCCESS);
  body_capture_begin(C, body2);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("dlsync_conditional_node_declare");
  assert_nothing_queued();
  body_capture_end(C, body2);
  assert_int_equal(event_nodes(parent2), 0);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body2), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent2);
  destroy_graph(parent);
}

/* The producer in the parent's own capture and the consumer in the body's
 * capture (TWO_CAPTURES): both nodes would go to the parent's capture graph;
 * refused, nothing queued, both captures go on and the parent instantiates.
 * A fence signalled in a body declared with its node is refused, its message
 * naming no hoist (a fence has none); a body declared with its node by
 * another context is refused the same way. */
static void refused_parent_capture_fence_other_context(void **state) {
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUstreamCaptureStatus cs;
  CUgraph cap = NULL, body, parent, parent2, body2;
  const CUgraphNode *deps = NULL;
  size_t ndeps = 0;
  CUgraphNode node, node2;
  dlsync_lane ls = dlsync_lane_stream(s), lc = dlsync_lane_stream(C), lp = dlsync_lane_stream(P);
  dlsync_fence *f = NULL;
  dlsync_context *c2 = NULL;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(s, "parent work", NULL, NULL), CUDA_SUCCESS);
  assert_int_equal(D->StreamGetCaptureInfo(s, &cs, NULL, &cap, &deps, NULL, &ndeps), CUDA_SUCCESS);
  node = cond_node_add(cap, CU_GRAPH_COND_TYPE_IF, deps, ndeps, &body);
  assert_int_equal(
      D->StreamUpdateCaptureDependencies(s, &node, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES),
      CUDA_SUCCESS);
  declare(cap, node, body);
  body_capture_begin(C, body);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &ls, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("DLSYNC__ROW_TWO_CAPTURES");
  assert_message_has("before the conditional node is added");
  assert_nothing_queued();
  fake_log_reset();
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_null(f);
  if (strstr(dlsync_last_error(), "dlsync_conditional_node_declare") != NULL)
    fail_msg("a fence's refusal names a hoist it cannot make: %s", dlsync_last_error());
  assert_nothing_queued();
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  body_capture_end(C, body);
  parent = end_capture_ok(s);
  assert_int_equal(event_nodes(parent) + event_nodes(body), 0);
  {
    CUresult r;
    (void)launch(parent, P, &r);
    assert_int_equal(r, CUDA_SUCCESS);
  }
  /* Another context's declaration. */
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  node2 = parent_make(&parent2, &body2, CU_GRAPH_COND_TYPE_IF);
  assert_int_equal(dlsync_conditional_node_declare(c2, parent2, node2, &body2, 1), DLSYNC_SUCCESS);
  body_capture_begin(C, body2);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("in another dlsync context");
  assert_nothing_queued();
  body_capture_end(C, body2);
  assert_int_equal(event_nodes(parent2), 0);
  assert_int_equal(dlsync_conditional_body_remove(c2, body2), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent2);
  destroy_graph(parent);
  fake_stream_destroy(s);
}

/* A driver without cuGraphAddDependencies: the wait cannot be hoisted;
 * DLSYNC_ERROR_DRIVER_TOO_OLD naming it, nothing queued. */
static void no_add_dependencies(void **state) {
  static dlsync__driver old;
  dlsync_context *c2 = NULL;
  CUgraph parent, body;
  CUgraphNode node;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  old = *fake_driver();
  old.GraphAddDependencies = NULL;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, &old), DLSYNC_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  assert_int_equal(dlsync_conditional_node_declare(c2, parent, node, &body, 1), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  fake_log_reset();
  assert_int_equal(dlsync_order(c2, &lp, &lc), DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_message_has("cuGraphAddDependencies");
  assert_nothing_queued();
  body_capture_end(C, body);
  assert_int_equal(dlsync_conditional_body_remove(c2, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
  assert_pool_intact_of(c2);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
}

/* ---- declarations ---- */

/* Each bad declaration: DLSYNC_ERROR_INVALID_ARGUMENT, a message naming what
 * was wrong, nothing declared. */
static void declare_bad_input(void **state) {
  CUgraph parent, body, other, obody, twice[2], many[DLSYNC_CONDITIONAL_BODIES + 1];
  CUgraphNode node, onode, work;
  (void)state;
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  onode = parent_make(&other, &obody, CU_GRAPH_COND_TYPE_IF);
  work = fake_graph_add_work(parent, NULL, 0, "work");
#define REFUSED(call, what)                                        \
  do {                                                             \
    assert_int_equal(call, DLSYNC_ERROR_INVALID_ARGUMENT);         \
    assert_message_has(what);                                      \
    assert_message_has("dlsync_conditional_node_declare");         \
    assert_false(dlsync_conditional_body_is_declared(ctx, body));  \
    assert_false(dlsync_conditional_body_is_declared(ctx, obody)); \
  } while (0)
  REFUSED(dlsync_conditional_node_declare(NULL, parent, node, &body, 1), "ctx is NULL");
  REFUSED(dlsync_conditional_node_declare(ctx, NULL, node, &body, 1), "parent is NULL");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, NULL, &body, 1), "node is NULL");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, NULL, 1), "bodies is NULL");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, &body, 0), "nbodies is 0");
  for (int i = 0; i <= DLSYNC_CONDITIONAL_BODIES; i++)
    many[i] = body;
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, many, DLSYNC_CONDITIONAL_BODIES + 1),
          "nbodies is 65");
  twice[0] = body;
  twice[1] = body;
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, twice, 2), "given twice");
  twice[1] = NULL;
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, twice, 2), "bodies[1] is NULL");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, node, &parent, 1), "the parent graph");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, work, &body, 1), "not a conditional node");
  REFUSED(dlsync_conditional_node_declare(ctx, parent, onode, &obody, 1),
          "a conditional node of another graph");
  /* A body declared with its node, then named with another parent. */
  assert_int_equal(dlsync_conditional_node_declare(ctx, parent, node, &body, 1), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_node_declare(ctx, parent, node, &body, 1), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_node_declare(ctx, other, onode, &body, 1),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("not the body's parent");
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_ERROR_INVALID_ARGUMENT);
  /* A destroyed node handle: the driver's refusal, named. */
  assert_int_equal(
      dlsync_conditional_node_declare(ctx, parent, (CUgraphNode)(uintptr_t)0x7777, &body, 1),
      DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphNodeGetType");
  assert_false(dlsync_conditional_body_is_declared(ctx, body));
#undef REFUSED
  destroy_graph(other);
  destroy_graph(parent);
}

/* Room: DLSYNC_CONDITIONAL_BODIES bodies at most, all or none. */
static void declare_room(void **state) {
  CUgraph parent, bodies[DLSYNC_CONDITIONAL_BODIES + 1];
  CUgraphNode nodes[DLSYNC_CONDITIONAL_BODIES + 1];
  (void)state;
  assert_int_equal(D->GraphCreate(&parent, 0), CUDA_SUCCESS);
  for (int i = 0; i <= DLSYNC_CONDITIONAL_BODIES; i++)
    nodes[i] = cond_node_add(parent, CU_GRAPH_COND_TYPE_IF, NULL, 0, &bodies[i]);
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    assert_int_equal(dlsync_conditional_node_declare(ctx, parent, nodes[i], &bodies[i], 1),
                     DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_node_declare(ctx, parent, nodes[DLSYNC_CONDITIONAL_BODIES],
                                                   &bodies[DLSYNC_CONDITIONAL_BODIES], 1),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("DLSYNC_CONDITIONAL_BODIES");
  assert_false(dlsync_conditional_body_is_declared(ctx, bodies[DLSYNC_CONDITIONAL_BODIES]));
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    assert_int_equal(dlsync_conditional_body_remove(ctx, bodies[i]), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* ---- faults ---- */

/* Every driver call of a declaration, then of a hoisted wait (eager to a
 * body's capture) and a hoisted record (a body's capture to a graph lane),
 * failing in turn: the driver's error reported with the call named, nothing
 * declared (the declaration), no node in the body, the capture still
 * active and the parent still instantiable (the hoists). */
static void faults(void **state) {
  CUgraph parent, body, other;
  CUgraphNode node, o[2];
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lo;
  unsigned n, calls[3];
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  node = parent_make(&parent, &body, CU_GRAPH_COND_TYPE_IF);
  for (n = 1;; n++) {
    dlsync_status st;
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_conditional_node_declare(ctx, parent, node, &body, 1);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("declare, call %u failing: %s", n, dlsync_last_error());
    assert_false(dlsync_conditional_body_is_declared(ctx, body));
  }
  calls[0] = n;
  body_capture_begin(C, body);
  for (n = 1;; n++) {
    dlsync_status st;
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_order(ctx, &lp, &lc);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("hoisted wait, call %u failing: %s", n, dlsync_last_error());
    assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(event_nodes(body), 0);
  }
  calls[1] = n;
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  o[0] = fake_graph_add_work(other, NULL, 0, "o");
  lo = dlsync_lane_graph(other, o, 1, 2);
  for (n = 1;; n++) {
    dlsync_status st;
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_order(ctx, &lc, &lo);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("hoisted record, call %u failing: %s", n, dlsync_last_error());
    assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(lo.ndeps, 1);
    assert_ptr_equal(lo.deps[0], o[0]);
  }
  calls[2] = n;
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  {
    CUresult r;
    (void)launch(parent, P, &r);
    assert_int_equal(r, CUDA_SUCCESS);
  }
  /* Each sweep reached more than one call (the new ones among them). */
  assert_true(calls[0] >= 3 && calls[1] >= 4 && calls[2] >= 4);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(other);
  destroy_graph(parent);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(eager_to_if_body_capture, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(eager_to_while_body_capture, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(eager_to_built_body, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(parent_under_capture, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(nested_bodies, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(body_producer_to_built, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(body_producer_to_capture, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(both_sides_and_other_captures, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(refused_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(refused_parent_capture_fence_other_context, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(no_add_dependencies, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(declare_bad_input, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(declare_room, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(faults, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
