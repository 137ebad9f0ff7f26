/* SPDX-License-Identifier: Apache-2.0 */
/* Structured graphs on the fake driver: conditional nodes' bodies
 * (include/dlsync/conditional.h) and a library's own graph run on any lane
 * (include/dlsync/graph.h).
 *
 * Bodies: the fake models them as the H200 does (R28..R30 of
 * tests/fake/fake_driver.h, checked by gpu_rules): an event node in a body
 * is accepted when added and the parent graph then fails to instantiate.
 * For a declared body, the rows that take edges only work and leave a parent
 * that instantiates; every row that would add an event node there is
 * refused at once, by name, with nothing queued and the capture still
 * valid; an undeclared body shows the failure the declaration prevents.
 *
 * A library's graph: launched on an eager stream, a child node at a
 * capture's dependencies or a graph lane's frontier; bad input and every
 * driver call failing in turn. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

/* ---- helpers ---- */

/* A graph with an IF node; *body is its body (the node owns it). */
static void if_node_make(CUgraph *parent, CUgraph *body) {
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraphNode node = NULL;
  assert_int_equal(D->GraphCreate(parent, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphConditionalHandleCreate(&h, *parent, fake_primary_ctx(0), 1,
                                                   CU_GRAPH_COND_ASSIGN_DEFAULT),
                   CUDA_SUCCESS);
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = fake_primary_ctx(0);
  assert_int_equal(D->GraphAddNode(&node, *parent, NULL, NULL, 0, &p), CUDA_SUCCESS);
  *body = p.conditional.phGraph_out[0];
  assert_true(fake_graph_is_body(*body));
}

static void body_capture_begin(CUstream s, CUgraph body) {
  assert_int_equal(
      D->StreamBeginCaptureToGraph(s, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED),
      CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(s, "body work", NULL, NULL), CUDA_SUCCESS);
}

/* The body's capture on s ends cleanly (its graph is the body). */
static void body_capture_end(CUstream s, CUgraph body) {
  CUgraph g = NULL;
  assert_int_equal(D->StreamEndCapture(s, &g), CUDA_SUCCESS);
  assert_ptr_equal(g, body);
}

static CUresult instantiate(CUgraph g) {
  CUgraphExec x = NULL;
  CUresult r = D->GraphInstantiateWithFlags(&x, g, 0);
  if (r == CUDA_SUCCESS)
    assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  return r;
}

static size_t event_nodes(CUgraph g) {
  return fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD) +
         fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* A refusal: the status, a message naming the row, the body and what to do
 * instead, and no driver call that queues or adds anything since
 * fake_log_reset. */
static void assert_refused(dlsync_status st, const char *row, CUgraph body) {
  char body_text[32];
  const char *log = fake_call_log();
  if (st != DLSYNC_ERROR_CONDITIONAL_BODY)
    fail_msg("%s, not DLSYNC_ERROR_CONDITIONAL_BODY: %s", dlsync_status_name(st),
             dlsync_last_error());
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has(row);
  snprintf(body_text, sizeof body_text, "graph %p", (void *)body);
  assert_message_has(body_text);
  assert_message_has("conditional node's body");
  assert_message_has("before the conditional node");
  assert_message_has("Nothing was queued");
  if (strstr(log, "cuEventRecord") != NULL || strstr(log, "cuStreamWaitEvent") != NULL ||
      strstr(log, "cuGraphAdd") != NULL ||
      strstr(log, "cuStreamUpdateCaptureDependencies") != NULL ||
      strstr(log, "cuGraphRetainUserObject") != NULL)
    fail_msg("the refusal made driver calls that queue or add: %s", log);
}

/* ---- the failure a declaration prevents ---- */

/* Undeclared, EAGER_TO_CAPTURE into a capture into an IF body succeeds and
 * the capture ends cleanly, but the parent graph cannot be instantiated: the
 * external wait node dlsync added is not admitted in a body (R28). The
 * control for the tests below. */
static void undeclared_body_parent_fails_to_instantiate(void **state) {
  CUgraph parent, body;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  if_node_make(&parent, &body);
  body_capture_begin(C, body);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(instantiate(parent), CUDA_ERROR_INVALID_VALUE);
  destroy_graph(parent);
}

/* ---- declared bodies: refused rows ---- */

/* EAGER_TO_CAPTURE into a declared body's capture: refused by dlsync_order
 * (three times: the fast path's repeated calls too) and by an exchange's
 * begin; the capture goes on and ends cleanly; the parent instantiates. */
static void eager_to_capture_refused(void **state) {
  CUgraph parent, body;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)&ex;
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  for (int i = 0; i < 3; i++) {
    fake_log_reset();
    assert_refused(dlsync_order(ctx, &lp, &lc), "DLSYNC__ROW_EAGER_TO_CAPTURE", body);
    assert_message_has("capturing into graph");
    assert_message_has("the capture is still valid");
  }
  fake_log_reset();
  assert_refused(dlsync_exchange_begin(&ex, ctx, &lp, &lc), "DLSYNC__ROW_EAGER_TO_CAPTURE", body);
  assert_null(ex);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_work_ex(C, "after the refusals", NULL, NULL), CUDA_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* TWO_CAPTURES with either lane in a declared body: refused (a record node
 * in first's graph, a wait node in then's); both captures go on. */
static void two_captures_refused_both_ways(void **state) {
  CUgraph parent, body, other;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(P, "other capture", NULL, NULL), CUDA_SUCCESS);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lp, &lc), "DLSYNC__ROW_TWO_CAPTURES", body);
  assert_message_has("event-wait node");
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lc, &lp), "DLSYNC__ROW_TWO_CAPTURES", body);
  assert_message_has("event-record node");
  other = end_capture_ok(P);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(event_nodes(other), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(other);
  destroy_graph(parent);
}

/* A graph lane on a declared body built by hand: EAGER_TO_BUILT and
 * TWO_BUILT are refused, the lane's frontier and the graph unchanged;
 * SAME_BUILT (two lanes in the body) works; the parent instantiates. */
static void built_body_rows(void **state) {
  CUgraph parent, body, other;
  CUgraphNode a[2], b[2], o[2];
  dlsync_lane lp = dlsync_lane_stream(P), la, lb, lo;
  (void)state;
  /* TWO_BUILT takes its events from the thread's current context. */
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  a[0] = fake_graph_add_work(body, NULL, 0, "a");
  b[0] = fake_graph_add_work(body, NULL, 0, "b");
  la = dlsync_lane_graph(body, a, 1, 2);
  lb = dlsync_lane_graph(body, b, 1, 2);
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  o[0] = fake_graph_add_work(other, NULL, 0, "o");
  lo = dlsync_lane_graph(other, o, 1, 2);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lp, &la), "DLSYNC__ROW_EAGER_TO_BUILT", body);
  assert_message_has("a graph lane on graph");
  assert_message_has("the graph is unchanged");
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lo, &la), "DLSYNC__ROW_TWO_BUILT", body);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &la, &lo), "DLSYNC__ROW_TWO_BUILT", body);
  assert_int_equal(la.ndeps, 1);
  assert_ptr_equal(la.deps[0], a[0]);
  assert_int_equal(lo.ndeps, 1);
  assert_ptr_equal(lo.deps[0], o[0]);
  assert_int_equal(fake_graph_count_nodes(body, -1), 2);
  assert_int_equal(fake_graph_count_nodes(other, -1), 1);
  /* SAME_BUILT: edges only. */
  assert_int_equal(dlsync_order(ctx, &la, &lb), DLSYNC_SUCCESS);
  assert_int_equal(lb.ndeps, 2);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(other);
  destroy_graph(parent);
}

/* CAPTURE_TO_BUILT and BUILT_TO_CAPTURE with the capture in a declared
 * body: refused. */
static void capture_and_built_refused(void **state) {
  CUgraph parent, body, other;
  CUgraphNode o[2];
  dlsync_lane lc = dlsync_lane_stream(C), lo;
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  o[0] = fake_graph_add_work(other, NULL, 0, "o");
  lo = dlsync_lane_graph(other, o, 1, 2);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lc, &lo), "DLSYNC__ROW_CAPTURE_TO_BUILT", body);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lo, &lc), "DLSYNC__ROW_BUILT_TO_CAPTURE", body);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(event_nodes(other), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(other);
  destroy_graph(parent);
}

/* A fence signalled in a declared body's capture is refused (its record
 * node); a wait there on an eager fence too (its wait node); the fence of
 * the refused signal is never made. */
static void fences_refused(void **state) {
  CUgraph parent, body;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL, *eager = NULL;
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&eager, ctx, &lp), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  fake_log_reset();
  assert_refused(dlsync_fence_signal(&f, ctx, &lc), "dlsync_fence_signal", body);
  assert_null(f);
  fake_log_reset();
  assert_refused(dlsync_fence_wait(eager, &lc), "DLSYNC__ROW_EAGER_TO_CAPTURE", body);
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  dlsync_fence_release(eager);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* ---- declared bodies: the rows that take edges only ---- */

/* An exchange inside the body's capture: the eager consumer joins it
 * (JOIN), its work is captured into the body, end joins it back; then
 * SAME_CAPTURE both ways. The capture ends cleanly, the body holds no event
 * node, the parent instantiates, and the consumer's work follows the
 * producer's in the body. */
static void exchange_inside_body(void **state) {
  CUgraph parent, body;
  CUgraphNode pw = NULL, cw = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  fake_work(C, "producer", &pw);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lc, &lp), DLSYNC_SUCCESS); /* JOIN */
  assert_int_equal(fake_capture_id(P), fake_capture_id(C));
  fake_work(P, "consumer", &cw);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_true(fake_graph_has_path(body, pw, cw));
  for (int i = 0; i < 2; i++) { /* SAME_CAPTURE, general and fast path */
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_order(ctx, &lc, &lp), DLSYNC_SUCCESS);
  }
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* Declared bodies change nothing for other graphs: EAGER_TO_CAPTURE into an
 * ordinary capture adds its wait node while a body is declared. */
static void other_captures_unaffected(void **state) {
  CUgraph parent, body, g;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 3; i++)
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 3);
  assert_int_equal(instantiate(g), CUDA_SUCCESS);
  destroy_graph(g);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
}

/* ---- the declarations ---- */

static void declarations(void **state) {
  CUgraph parent, body;
  CUgraph many[DLSYNC_CONDITIONAL_BODIES];
  (void)state;
  if_node_make(&parent, &body);
  assert_false(dlsync_conditional_body_is_declared(ctx, body));
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS); /* counts once */
  assert_true(dlsync_conditional_body_is_declared(ctx, body));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  assert_false(dlsync_conditional_body_is_declared(ctx, body));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("is not a declared body");
  /* The table's size, then a clear refusal. */
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++) {
    many[i] = (CUgraph)(uintptr_t)(0x1000 + 16 * i); /* never dereferenced */
    assert_int_equal(dlsync_conditional_body_add(ctx, many[i]), DLSYNC_SUCCESS);
  }
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("DLSYNC_CONDITIONAL_BODIES");
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    assert_int_equal(dlsync_conditional_body_remove(ctx, many[i]), DLSYNC_SUCCESS);
  assert_false(dlsync__bodies_any(&ctx->bodies));
  destroy_graph(parent);
}

static void bad_arguments(void **state) {
  CUgraph g = (CUgraph)(uintptr_t)0x1000;
  (void)state;
  assert_int_equal(dlsync_conditional_body_add(NULL, g), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("ctx is NULL");
  assert_int_equal(dlsync_conditional_body_add(ctx, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("body is NULL");
  assert_int_equal(dlsync_conditional_body_remove(NULL, g), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_conditional_body_remove(ctx, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_false(dlsync_conditional_body_is_declared(NULL, g));
  assert_false(dlsync_conditional_body_is_declared(ctx, NULL));
  assert_string_equal(dlsync_status_name(DLSYNC_ERROR_CONDITIONAL_BODY),
                      "DLSYNC_ERROR_CONDITIONAL_BODY");
}

/* ---- a library's own graph on any lane (include/dlsync/graph.h) ---- */

/* The library's graph: two kernel nodes, one after the other. */
static CUgraph library_graph(void) {
  CUgraph g = NULL;
  CUgraphNode a;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  a = fake_graph_add_work(g, NULL, 0, "lib a");
  assert_non_null(fake_graph_add_work(g, &a, 1, "lib b"));
  return g;
}

/* Eager: the executable is launched on the stream, after its earlier work;
 * no executable: refused before any driver call. */
static void graph_launch_eager(void **state) {
  CUgraph g = library_graph();
  CUgraphExec x = NULL;
  dlsync_lane lp = dlsync_lane_stream(P);
  uint64_t before;
  (void)state;
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  before = fake_work(P, "before", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_graph_launch(ctx, g, x, &lp), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuGraphLaunch"), 1);
  assert_true(fake_happens_before(before, fake_stream_last_op(P)));
  fake_log_reset();
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("exec is NULL");
  assert_int_equal(fake_calls_total(), 1); /* the lane's status query */
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(g);
}

/* Capturing: one child-graph node after the capture's current dependencies
 * only (not after a joined stream's unrelated work), which become that node;
 * the caller's graph may go at once; the capture ends cleanly and
 * instantiates, with the library's two nodes inside. */
static void graph_launch_in_capture(void **state) {
  CUgraph g = library_graph(), cap;
  CUgraphNode w = NULL, side = NULL, deps[2];
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent join = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_lane lc = dlsync_lane_stream(C);
  size_t nodes_before;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, fork, 0), CUDA_SUCCESS); /* P joins */
  assert_int_equal(fake_work_ex(P, "unrelated", NULL, &side), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(C, "caller's work", NULL, &w), CUDA_SUCCESS);
  nodes_before = fake_graph_count_nodes(fake_capture_graph(C), -1);
  fake_log_reset();
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &lc), DLSYNC_SUCCESS);
  destroy_graph(g); /* the caller's copy: the child node has its own */
  assert_int_equal(fake_capture_deps(C, deps, 2), 1);
  assert_int_equal(fake_node_type(deps[0]), CU_GRAPH_NODE_TYPE_GRAPH);
  assert_int_equal(fake_graph_count_nodes(fake_capture_graph(C), -1), nodes_before + 1);
  assert_true(fake_graph_has_edge(fake_capture_graph(C), w, deps[0]));
  assert_false(fake_graph_has_path(fake_capture_graph(C), side, deps[0]));
  assert_int_equal(
      fake_graph_count_nodes(fake_node_child_graph(deps[0]), CU_GRAPH_NODE_TYPE_KERNEL), 2);
  assert_null(strstr(fake_call_log(), "cuGraphLaunch"));
  assert_int_equal(D->EventRecord(join, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, join, 0), CUDA_SUCCESS);
  cap = end_capture_ok(C);
  assert_int_equal(instantiate(cap), CUDA_SUCCESS);
  destroy_graph(cap);
  fake_event_destroy(fork);
  fake_event_destroy(join);
}

/* A graph lane: a child node after the frontier, which becomes it; a lane
 * without room for one node is refused, nothing added. */
static void graph_launch_on_graph_lane(void **state) {
  CUgraph g = library_graph(), host;
  CUgraphNode a[2], b[2];
  dlsync_lane la, full;
  (void)state;
  assert_int_equal(D->GraphCreate(&host, 0), CUDA_SUCCESS);
  a[0] = fake_graph_add_work(host, NULL, 0, "a");
  a[1] = fake_graph_add_work(host, NULL, 0, "a'");
  la = dlsync_lane_graph(host, a, 2, 2);
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &la), DLSYNC_SUCCESS);
  assert_int_equal(la.ndeps, 1);
  assert_int_equal(fake_node_type(a[0]), CU_GRAPH_NODE_TYPE_GRAPH);
  assert_int_equal(fake_graph_count_nodes(host, -1), 3);
  b[0] = a[0];
  full = dlsync_lane_graph(host, b, 1, 0);
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &full), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_graph_count_nodes(host, -1), 3);
  assert_int_equal(instantiate(host), CUDA_SUCCESS);
  destroy_graph(g);
  destroy_graph(host);
}

/* Inside a declared body's capture a child graph of kernels is admitted:
 * the parent instantiates. */
static void graph_launch_in_body(void **state) {
  CUgraph parent, body, g = library_graph();
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &lc), DLSYNC_SUCCESS);
  body_capture_end(C, body);
  assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), 1);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  /* A child holding an event node is refused there, nothing added. */
  {
    CUgraph with_event = library_graph(), cap2;
    CUevent ev = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    CUgraphNode wn = NULL;
    assert_int_equal(D->GraphAddEventWaitNode(&wn, with_event, NULL, 0, ev), CUDA_SUCCESS);
    assert_int_equal(
        D->StreamBeginCaptureToGraph(C, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED),
        CUDA_SUCCESS);
    assert_int_equal(dlsync_graph_launch(ctx, with_event, NULL, &lc),
                     DLSYNC_ERROR_CONDITIONAL_BODY);
    assert_message_has("holds 1 event-record or event-wait node");
    assert_int_equal(D->StreamEndCapture(C, &cap2), CUDA_SUCCESS);
    assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), 1);
    assert_int_equal(instantiate(parent), CUDA_SUCCESS);
    destroy_graph(with_event);
    fake_event_destroy(ev);
  }
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(g);
  destroy_graph(parent);
}

/* Bad input: a graph that cannot be a child (it holds a conditional node),
 * no graph, a destroyed graph, no context, no lane: each a status and a
 * message, nothing added, the capture still valid. */
static void graph_launch_bad_input(void **state) {
  CUgraph parent, body, gone = library_graph(), cap;
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  if_node_make(&parent, &body);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  destroy_graph(gone); /* after the capture's graph is made: the fake reuses a free handle */
  assert_int_equal(fake_work_ex(C, "w", NULL, NULL), CUDA_SUCCESS);
  assert_int_equal(dlsync_graph_launch(ctx, parent, NULL, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("1 conditional");
  assert_message_has("cannot run as a child graph");
  assert_int_equal(dlsync_graph_launch(ctx, NULL, NULL, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("graph is NULL");
  assert_int_equal(dlsync_graph_launch(ctx, gone, NULL, &lc), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphAddChildGraphNode");
  assert_int_equal(dlsync_graph_launch(NULL, parent, NULL, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_graph_launch(ctx, parent, NULL, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cap = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(cap, -1), 1);
  destroy_graph(cap);
  destroy_graph(parent);
}

/* A graph whose event node sits in a child graph (at depth 2), or past
 * its first 256 nodes, is refused in a declared body like one that holds it
 * directly: the parent still instantiates. (The nodes were once read to a
 * depth of one and up to 256.) */
static void graph_launch_in_body_nested_events(void **state) {
  CUgraph parent, body, inner = library_graph(), middle, outer, wide;
  CUevent ev = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode n = NULL, prev = NULL;
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  assert_int_equal(D->GraphAddEventWaitNode(&n, inner, NULL, 0, ev), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&middle, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphAddChildGraphNode(&n, middle, NULL, 0, inner), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&outer, 0), CUDA_SUCCESS);
  (void)fake_graph_add_work(outer, NULL, 0, "outer work");
  assert_int_equal(D->GraphAddChildGraphNode(&n, outer, NULL, 0, middle), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&wide, 0), CUDA_SUCCESS);
  for (int i = 0; i < 300; i++)
    prev = fake_graph_add_work(wide, prev != NULL ? &prev : NULL, prev != NULL, "wide");
  assert_int_equal(D->GraphAddEventWaitNode(&n, wide, &prev, 1, ev), CUDA_SUCCESS);
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  assert_int_equal(dlsync_graph_launch(ctx, outer, NULL, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("holds 1 event-record or event-wait node");
  assert_int_equal(dlsync_graph_launch(ctx, wide, NULL, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_int_equal(dlsync_graph_launch(ctx, middle, NULL, &lc), DLSYNC_ERROR_CONDITIONAL_BODY);
  /* Each driver call of the nested read failing, then each allocation of
   * the wide one's: the fault reported, nothing added. */
  for (int kind = 0; kind < 2; kind++) {
    fake_fault f = kind == 0 ? FAKE_FAULT_CALL : FAKE_FAULT_ALLOC;
    unsigned k;
    for (k = 1;; k++) {
      dlsync_status st;
      fake_fail_fault(f, k);
      st = dlsync_graph_launch(ctx, kind == 0 ? outer : wide, NULL, &lc);
      if (fake_fail_pending()) {
        fake_fail_clear();
        assert_int_equal(st, DLSYNC_ERROR_CONDITIONAL_BODY);
        break;
      }
      fake_fail_clear();
      if (!fake_fault_reported(f))
        fail_msg("%s %u failing: %s", fake_fault_name(f), k, dlsync_last_error());
      assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), 0);
    }
    /* outer: the two queries, then per graph its count, list and types, and
     * a child's graph: 2 + (2 + 2 + 1) + (2 + 1 + 1) + (2 + 3); wide: one
     * allocation (its node list) */
    assert_int_equal(k, kind == 0 ? 17 : 2);
  }
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  body_capture_end(C, body);
  assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
  destroy_graph(outer);
  destroy_graph(middle);
  destroy_graph(inner);
  destroy_graph(wide);
  fake_event_destroy(ev);
}

/* More bad input, each a status and a message with nothing added or
 * queued: a handle that is no graph (the fake tells; the real driver may
 * not) and a destroyed graph on a graph lane, a graph launched into itself
 * (a graph lane on it, a capture into it), a destroyed executable on an
 * eager stream. An executable of another graph cannot be told from the
 * right one (include/dlsync/graph.h): on an eager stream what runs is exec,
 * whatever graph says (NULL too). */
static void graph_launch_bad_handles(void **state) {
  CUgraph g = library_graph(), host, gone, cap;
  CUgraphExec x = NULL, x_gone = NULL;
  CUgraphNode a[2];
  dlsync_lane la, lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  uint64_t before;
  (void)state;
  assert_int_equal(D->GraphCreate(&host, 0), CUDA_SUCCESS);
  a[0] = fake_graph_add_work(host, NULL, 0, "a");
  la = dlsync_lane_graph(host, a, 1, 2);
  fake_log_reset();
  assert_int_equal(dlsync_graph_launch(ctx, (CUgraph)P, NULL, &la), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphAddChildGraphNode");
  assert_message_has("not-a-graph handle");
  assert_int_equal(fake_call_count("cuGraphAddChildGraphNode"), 1);
  assert_int_equal(dlsync_graph_launch(ctx, host, NULL, &la), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("the launching lane's own graph");
  assert_int_equal(fake_call_count("cuGraphAddChildGraphNode"), 1); /* refused before */
  assert_int_equal(D->GraphCreate(&gone, 0), CUDA_SUCCESS);
  destroy_graph(gone);
  assert_int_equal(dlsync_graph_launch(ctx, gone, NULL, &la), DLSYNC_ERROR_DRIVER);
  assert_message_has("a destroyed or not-a-graph handle");
  assert_int_equal(fake_graph_count_nodes(host, -1), 1);
  assert_ptr_equal(la.deps[0], a[0]);
  assert_int_equal(la.ndeps, 1);
  /* A capture into itself. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(fake_work_ex(C, "w", NULL, NULL), CUDA_SUCCESS);
  assert_int_equal(dlsync_graph_launch(ctx, fake_capture_graph(C), NULL, &lc),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("the graph its stream captures into");
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  cap = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(cap, -1), 1);
  destroy_graph(cap);
  /* Eager: a destroyed executable, then another graph's executable. */
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphInstantiateWithFlags(&x_gone, g, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphExecDestroy(x_gone), CUDA_SUCCESS);
  before = fake_work(P, "before", NULL);
  assert_int_equal(dlsync_graph_launch(ctx, g, x_gone, &lp), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphLaunch");
  assert_int_equal(fake_stream_last_op(P), before); /* nothing queued */
  assert_int_equal(dlsync_graph_launch(ctx, host, x, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_graph_launch(ctx, NULL, x, &lp), DLSYNC_SUCCESS);
  assert_true(fake_happens_before(before, fake_stream_last_op(P)));
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(host);
  destroy_graph(g);
}

/* A body declared in another dlsync context: this context's rows and
 * launches refuse it too (the graph is a body whatever context said so),
 * naming the other context, nothing queued; the declaration is that
 * context's (is_declared, remove) and goes with it when it is destroyed. */
static void body_of_another_context(void **state) {
  CUgraph parent, body, g = library_graph(), with_event = library_graph();
  CUevent ev = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode wn = NULL, a[2];
  dlsync_context *other = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lb;
  (void)state;
  assert_int_equal(D->GraphAddEventWaitNode(&wn, with_event, NULL, 0, ev), CUDA_SUCCESS);
  assert_int_equal(dlsync__context_create_with_driver(&other, NULL, D), DLSYNC_SUCCESS);
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(other, body), DLSYNC_SUCCESS);
  assert_true(dlsync_conditional_body_is_declared(other, body));
  assert_false(dlsync_conditional_body_is_declared(ctx, body));
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_ERROR_INVALID_ARGUMENT);
  /* A graph lane on it. */
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  a[0] = fake_graph_add_work(body, NULL, 0, "body a");
  lb = dlsync_lane_graph(body, a, 1, 2);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lp, &lb), "EAGER_TO_BUILT", body);
  assert_message_has("in another dlsync context");
  fake_log_reset();
  assert_int_equal(dlsync_graph_launch(ctx, with_event, NULL, &lb), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_message_has("in another dlsync context");
  assert_int_equal(fake_call_count("cuGraphAddChildGraphNode"), 0);
  assert_int_equal(dlsync_graph_launch(ctx, g, NULL, &lb), DLSYNC_SUCCESS); /* kernels only */
  assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), 1);
  /* A capture into it. */
  body_capture_begin(C, body);
  fake_log_reset();
  assert_refused(dlsync_order(ctx, &lp, &lc), "EAGER_TO_CAPTURE", body);
  assert_message_has("in another dlsync context");
  body_capture_end(C, body);
  assert_int_equal(event_nodes(body), 0);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  /* The other context destroyed: its declaration is gone with it (the
   * control: the order now adds its wait node and the parent fails). */
  assert_int_equal(dlsync_context_destroy(other), DLSYNC_SUCCESS);
  assert_false(dlsync__bodies_any(&ctx->bodies));
  lb = dlsync_lane_graph(body, a, 1, 2);
  assert_int_equal(dlsync_order(ctx, &lp, &lb), DLSYNC_SUCCESS);
  assert_int_equal(instantiate(parent), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(D->CtxPopCurrent(NULL), CUDA_SUCCESS);
  destroy_graph(parent);
  destroy_graph(with_event);
  destroy_graph(g);
  fake_event_destroy(ev);
}

/* Every driver call of the new paths failing in turn (the sweep of
 * tests/test_fault_sweeps.c): an eager launch, a launch into a declared body's
 * capture (its nodes read first). Each failure is the driver's, reported
 * with the call named; nothing queued on the stream, and no child node in
 * the body but when the last call (the dependency update) failed. */
static void graph_launch_faults_new_calls(void **state) {
  CUgraph g = library_graph(), parent, body;
  CUgraphExec x = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  unsigned n;
  (void)state;
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  for (n = 1;; n++) {
    uint64_t before = fake_work(P, "before", NULL);
    dlsync_status st;
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_graph_launch(ctx, g, x, &lp);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("eager, call %u failing: %s", n, dlsync_last_error());
    assert_int_equal(fake_stream_last_op(P), before);
  }
  assert_int_equal(n, 3); /* the lane's query, the launch */
  if_node_make(&parent, &body);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  body_capture_begin(C, body);
  for (n = 1;; n++) {
    size_t children = fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH);
    dlsync_status st;
    fake_log_reset();
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_graph_launch(ctx, g, NULL, &lc);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("body, call %u failing: %s", n, dlsync_last_error());
    if (strstr(dlsync_last_error(), "cuStreamUpdateCaptureDependencies") == NULL)
      assert_int_equal(fake_graph_count_nodes(body, CU_GRAPH_NODE_TYPE_GRAPH), children);
  }
  /* the two queries, the node count and list, each of its two nodes'
   * types, the add, the dependency update */
  assert_int_equal(n, 9);
  body_capture_end(C, body);
  assert_int_equal(instantiate(parent), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(parent);
  destroy_graph(g);
}

/* Every driver call of a launch into a capture and onto a graph lane
 * failing in turn: the driver's error reported, and no child node left in
 * a graph lane's frontier. */
static void graph_launch_faults(void **state) {
  CUgraph g = library_graph(), host, cap;
  CUgraphNode a[1];
  dlsync_lane lc = dlsync_lane_stream(C), la;
  unsigned n;
  (void)state;
  assert_int_equal(D->GraphCreate(&host, 0), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (n = 1;; n++) {
    dlsync_status st;
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_graph_launch(ctx, g, NULL, &lc);
    if (fake_fail_pending()) { /* it made fewer calls than n: done */
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    if (!fake_fault_reported(FAKE_FAULT_CALL))
      fail_msg("call %u failing: %s", n, dlsync_last_error());
  }
  assert_int_equal(n, 5); /* the two queries, the add, the dependency update */
  for (n = 1;; n++) {
    dlsync_status st;
    a[0] = fake_graph_add_work(host, NULL, 0, "a");
    la = dlsync_lane_graph(host, a, 1, 1);
    fake_fail_fault(FAKE_FAULT_CALL, n);
    st = dlsync_graph_launch(ctx, g, NULL, &la);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    fake_fail_clear();
    assert_int_not_equal(st, DLSYNC_SUCCESS);
    assert_true(fake_fault_reported(FAKE_FAULT_CALL));
    assert_int_equal(fake_node_type(la.deps[0]), CU_GRAPH_NODE_TYPE_KERNEL);
  }
  assert_int_equal(n, 2); /* the add */
  cap = end_capture_ok(C);
  destroy_graph(cap);
  destroy_graph(host);
  destroy_graph(g);
}

/* ---- recapture applied with cuGraphExecUpdate ---- */

/* A step recaptured with the same lane states takes the same nodes whatever
 * the pool holds (one wait node for EAGER_TO_CAPTURE, a record and a wait
 * node for TWO_CAPTURES), so cuGraphExecUpdate accepts each recapture; the
 * pool is churned between steps (orders into other captures). */
static void recapture_same_topology(void **state) {
  CUstream q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lq = dlsync_lane_stream(q);
  CUgraphExec x = NULL, x2 = NULL;
  size_t nodes0 = 0, nodes2 = 0;
  (void)state;
  for (int k = 0; k < 4; k++) {
    CUgraph g, g2, churn;
    CUgraphExecUpdateResultInfo info;
    /* The step: EAGER_TO_CAPTURE (P -> C), TWO_CAPTURES (C -> q's capture). */
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(D->StreamBeginCapture(q, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(fake_work_ex(C, "step", NULL, NULL), CUDA_SUCCESS);
    assert_int_equal(dlsync_order(ctx, &lc, &lq), DLSYNC_SUCCESS);
    assert_int_equal(fake_work_ex(q, "next", NULL, NULL), CUDA_SUCCESS);
    g = end_capture_ok(C);
    g2 = end_capture_ok(q);
    if (k == 0) {
      nodes0 = fake_graph_count_nodes(g, -1);
      nodes2 = fake_graph_count_nodes(g2, -1);
      assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
      assert_int_equal(D->GraphInstantiateWithFlags(&x2, g2, 0), CUDA_SUCCESS);
    } else {
      assert_int_equal(fake_graph_count_nodes(g, -1), nodes0);
      assert_int_equal(fake_graph_count_nodes(g2, -1), nodes2);
      assert_int_equal(D->GraphExecUpdate(x, g, &info), CUDA_SUCCESS);
      assert_int_equal(info.result, CU_GRAPH_EXEC_UPDATE_SUCCESS);
      assert_int_equal(D->GraphExecUpdate(x2, g2, &info), CUDA_SUCCESS);
    }
    destroy_graph(g);
    destroy_graph(g2);
    /* Churn: k + 1 orders into a capture thrown away. */
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    for (int i = 0; i <= k; i++)
      assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    churn = end_capture_ok(C);
    destroy_graph(churn);
  }
  /* C's graph: EAGER_TO_CAPTURE's wait node, the step, TWO_CAPTURES'
   * record node; q's: its wait node and its own node. */
  assert_int_equal(nodes0, 3);
  assert_int_equal(nodes2, 2);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  assert_int_equal(D->GraphExecDestroy(x2), CUDA_SUCCESS);
  fake_stream_destroy(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(undeclared_body_parent_fails_to_instantiate, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(eager_to_capture_refused, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(two_captures_refused_both_ways, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(built_body_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(capture_and_built_refused, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(fences_refused, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(exchange_inside_body, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(other_captures_unaffected, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(declarations, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(bad_arguments, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_eager, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_in_capture, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_on_graph_lane, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_in_body, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_bad_input, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_in_body_nested_events, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_bad_handles, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(body_of_another_context, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_faults, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(graph_launch_faults_new_calls, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(recapture_same_topology, fixture_setup, fixture_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
