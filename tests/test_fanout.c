/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync_exchange_begin_fanout (one producer, many consumers) and its end
 * (the join back) on the fake driver: the exact calls in each capture state
 * (one event eager, joins, edges only in one capture, a wait node per
 * consumer graph), the same nodes at every recapture, the refusals, the
 * order-back after a failure, fault injection on every driver call and
 * allocation, many threads; and DLSYNC_EXCHANGE_KEEP_EDGE_DATA, which keeps
 * a programmatic edge across an exchange inside one capture. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static CUstream Q, R; /* two more consumer streams, device 0 */

static int setup(void **state) {
  (void)state;
  fixture_open(NULL);
  Q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  R = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_non_null(Q);
  assert_non_null(R);
  fake_log_reset();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  fake_stream_destroy(Q);
  fake_stream_destroy(R);
  fixture_close();
  return 0;
}

/* One begin/end from P: the thread is warm (memo and scratch event). */
static void warm(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
}

/* ---- eager ---- */

static void eager_is_one_record_and_a_wait_per_consumer(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  CUstream cs[3] = {C, Q, R};
  dlsync_exchange *ex = NULL;
  uint64_t produce, consume[3], mutate;
  (void)state;
  warm();
  produce = fake_work(P, "produce", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
  /* One status query per consumer (the producer's state does not change
   * the calls: EAGER_EAGER and JOIN are both one record and a wait), ONE
   * record on the producer, one wait per consumer; no event made. */
  assert_string_equal(fake_call_log(),
                      "cuStreamIsCapturing,cuStreamIsCapturing,cuStreamIsCapturing,"
                      "cuEventRecord,cuStreamWaitEvent,cuStreamWaitEvent,cuStreamWaitEvent");
  for (int i = 0; i < 3; i++)
    consume[i] = fake_work(cs[i], "consume", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  /* The join: one record per consumer, the producer waits for each. */
  assert_int_equal(fake_call_count("cuEventRecord"), 3);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 3);
  assert_int_equal(fake_call_count("cuEventCreate"), 0);
  mutate = fake_work(P, "mutate", NULL);
  for (int i = 0; i < 3; i++) {
    assert_true(fake_happens_before(produce, consume[i]));
    assert_true(fake_happens_before(consume[i], mutate));
  }
}

/* The control: a plain exchange with C alone leaves Q unordered (so the
 * checks above can fail). */
static void without_it_the_other_consumers_are_unordered(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t produce, consume, mutate;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  consume = fake_work(Q, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  mutate = fake_work(P, "mutate", NULL);
  assert_false(fake_happens_before(produce, consume));
  assert_false(fake_happens_before(consume, mutate));
}

/* With DLSYNC_EXCHANGE_CAPTURE_STABLE the join asks the driver nothing. */
static void a_stable_join_asks_nothing(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = NULL;
  (void)state;
  warm();
  /* The first join on this thread makes its scratch event on Q. */
  assert_int_equal(
      dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, DLSYNC_EXCHANGE_CAPTURE_STABLE),
      DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(
      dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, DLSYNC_EXCHANGE_CAPTURE_STABLE),
      DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(),
                      "cuEventRecord,cuStreamWaitEvent,cuEventRecord,cuStreamWaitEvent");
}

/* ---- captures ---- */

/* A capturing producer and eager consumers: one plain record, each consumer
 * joins; the join back leaves no consumer in the capture; no event node. */
static void eager_consumers_of_a_capture_each_join(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = NULL;
  CUgraphNode pn, cn, qn, pm;
  CUgraph g;
  (void)state;
  warm();
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &pn);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuEventRecord"), 1);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 2);
  assert_int_equal(fake_capture_id(C), fake_capture_id(P));
  assert_int_equal(fake_capture_id(Q), fake_capture_id(P));
  fake_work(C, "consume c", &cn);
  fake_work(Q, "consume q", &qn);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "mutate", &pm);
  g = end_capture_ok(P);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(Q), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_path(g, pn, cn));
  assert_true(fake_graph_has_path(g, pn, qn));
  assert_true(fake_graph_has_path(g, cn, pm));
  assert_true(fake_graph_has_path(g, qn, pm));
  destroy_graph(g);
}

/* Consumers already in the producer's capture: edges only, no event. */
static void consumers_in_the_capture_are_edges_only(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode pn, cn, qn, pm;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", &pn);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 2);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  fake_work(C, "consume c", &cn);
  fake_work(Q, "consume q", &qn);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  fake_work(P, "mutate", &pm);
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_path(g, pn, cn));
  assert_true(fake_graph_has_path(g, pn, qn));
  assert_true(fake_graph_has_path(g, cn, pm));
  assert_true(fake_graph_has_path(g, qn, pm));
  destroy_graph(g);
  fake_event_destroy(fork);
}

/* Consumers in two other captures (C and Q in one, R in another): a record
 * node in the producer's graph and one wait node per consumer graph; Q takes
 * C's wait node by edges. The join back of such a pair is refused (the
 * producer's graph must be launched first). */
static void consumers_in_other_captures_get_a_wait_node_per_graph(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode cn, qn, rn;
  CUgraph gp, gc, gr;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS); /* Q joins C's capture */
  assert_int_equal(D->StreamBeginCapture(R, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
  fake_work(C, "consume c", &cn);
  fake_work(Q, "consume q", &qn);
  fake_work(R, "consume r", &rn);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_int_equal(fake_call_count("cuEventRecord") + fake_call_count("cuEventRecordWithFlags"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(D->EventRecord(fork, Q), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  gp = end_capture_ok(P);
  gc = end_capture_ok(C);
  gr = end_capture_ok(R);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 2);
  assert_int_equal(fake_graph_count_nodes(gc, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(fake_graph_count_nodes(gr, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  /* Each consumer's work follows its graph's wait node. */
  for (size_t i = 0; i < 2; i++) {
    CUgraphNode w = NULL, nodes[16];
    size_t nn = 16;
    CUgraph g = i == 0 ? gc : gr;
    assert_int_equal(D->GraphGetNodes(g, nodes, &nn), CUDA_SUCCESS);
    for (size_t k = 0; k < nn; k++)
      if (fake_node_type(nodes[k]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
        w = nodes[k];
    assert_non_null(w);
    if (i == 0) {
      assert_true(fake_graph_has_path(gc, w, cn));
      assert_true(fake_graph_has_path(gc, w, qn));
    } else {
      assert_true(fake_graph_has_path(gr, w, rn));
    }
  }
  destroy_graph(gp);
  destroy_graph(gc);
  destroy_graph(gr);
  fake_event_destroy(fork);
}

/* A graph built by hand with two consumer lanes, another with one, an eager
 * producer: one wait node per graph, each lane's new frontier after it. */
static void built_consumers_get_a_wait_node_per_graph(void **state) {
  CUgraph g1, g2;
  CUgraphNode d1[4], d2[4], d3[4];
  dlsync_lane lp = dlsync_lane_stream(P), lcs[3];
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "a");
  d2[0] = fake_graph_add_work(g1, NULL, 0, "b");
  d3[0] = fake_graph_add_work(g2, NULL, 0, "c");
  lcs[0] = dlsync_lane_graph(g1, d1, 1, 4);
  lcs[1] = dlsync_lane_graph(g1, d2, 1, 4);
  lcs[2] = dlsync_lane_graph(g2, d3, 1, 4);
  fake_work(P, "produce", NULL);
  if (dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0) != DLSYNC_SUCCESS)
    fail_msg("%s", dlsync_last_error());
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  for (size_t i = 0; i < 3; i++) {
    bool after = false;
    for (size_t k = 0; k < lcs[i].ndeps; k++)
      after = after || fake_node_type(lcs[i].deps[k]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT ||
              fake_graph_has_path(lcs[i].graph, d1[0], lcs[i].deps[k]) ||
              fake_graph_has_path(lcs[i].graph, d3[0], lcs[i].deps[k]);
    assert_true(after);
  }
  /* The join back: an eager producer cannot wait for graphs not launched. */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  destroy_graph(g1);
  destroy_graph(g2);
}

/* The same step captured four times: the same nodes and edges each time, so
 * cuGraphExecUpdate would take each capture. A join (eager consumer C), a
 * consumer in the capture (Q) and one in another capture (R, whose own
 * capture is begun and ended with the step). */
static void every_recapture_has_the_same_shape(void **state) {
  size_t nodes0 = 0, edges0 = 0, rnodes0 = 0;
  (void)state;
  warm();
  for (int k = 0; k < 4; k++) {
    dlsync_lane lp = dlsync_lane_stream(P);
    dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
    dlsync_exchange *ex = NULL;
    CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    CUgraph g, gr;
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->StreamBeginCapture(R, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
    fake_work(P, "produce", NULL);
    assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
    fake_work(C, "consume c", NULL);
    fake_work(Q, "consume q", NULL);
    fake_work(R, "consume r", NULL);
    /* R's order back is refused (another graph): the rest is joined. */
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
    assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(fake_capture_id(C), fake_capture_id(P));
    fake_work(P, "mutate", NULL);
    g = end_capture_ok(P);
    gr = end_capture_ok(R);
    if (k == 0) {
      nodes0 = fake_graph_count_nodes(g, -1);
      edges0 = fake_graph_count_edges(g);
      rnodes0 = fake_graph_count_nodes(gr, -1);
      assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
      assert_int_equal(fake_graph_count_nodes(gr, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
    } else {
      assert_int_equal(fake_graph_count_nodes(g, -1), nodes0);
      assert_int_equal(fake_graph_count_edges(g), edges0);
      assert_int_equal(fake_graph_count_nodes(gr, -1), rnodes0);
    }
    destroy_graph(g);
    destroy_graph(gr);
    fake_event_destroy(fork);
  }
}

/* ---- the driver calls of a fan-out in each lane state ----
 *
 * One producer P and three consumers (C, Q, R), a warm thread, one fan-out
 * and join in the same state first (the thread's hints settle), then the
 * calls of the next begin and of its end, exactly. ONE record on the
 * producer however many eager consumers, no stream asked about twice in
 * one call, and the join's dependency updates inside one capture made as
 * ONE update of the producer: a record or a query per consumer more fails
 * here. */

typedef enum fan_state {
  FAN_EAGER,         /* all eager: EAGER_EAGER */
  FAN_EAGER_STABLE,  /* the same with DLSYNC_EXCHANGE_CAPTURE_STABLE */
  FAN_SAME,          /* the consumers in the producer's capture: SAME_CAPTURE */
  FAN_SAME_STABLE,   /* the same with DLSYNC_EXCHANGE_CAPTURE_STABLE */
  FAN_JOIN,          /* the producer captures, the consumers are eager: JOIN */
  FAN_OTHER_CAPTURE, /* the consumers in another capture: TWO_CAPTURES */
  FAN_BUILT,         /* the consumers lanes of a graph built by hand: EAGER_TO_BUILT */
} fan_state;

typedef struct fan_calls {
  char begin[1024], end[1024];
  unsigned begin_records, begin_queries, end_queries;
} fan_calls;

static unsigned queries(void) {
  return fake_call_count("cuStreamIsCapturing") + fake_call_count("cuStreamGetCaptureInfo");
}

/* One fan-out and join in state st (the capture state made before it and
 * undone after); its calls in *out. */
static void fan_once(fan_state st, fan_calls *out) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  uint32_t flags =
      st == FAN_EAGER_STABLE || st == FAN_SAME_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE : 0;
  bool p_captures = st == FAN_SAME || st == FAN_SAME_STABLE || st == FAN_JOIN;
  dlsync_status want_end =
      st == FAN_OTHER_CAPTURE || st == FAN_BUILT ? DLSYNC_ERROR_CAPTURE_ORDER : DLSYNC_SUCCESS;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_exchange *ex = NULL;
  CUgraph gb = NULL;
  CUgraphNode fb[3][4];
  if (st == FAN_BUILT) {
    assert_int_equal(D->GraphCreate(&gb, 0), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++) {
      fb[i][0] = fake_graph_add_work(gb, NULL, 0, "own");
      lcs[i] = dlsync_lane_graph(gb, fb[i], 1, 4);
    }
  }
  if (p_captures)
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  if (st == FAN_SAME || st == FAN_SAME_STABLE) {
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++)
      assert_int_equal(D->StreamWaitEvent(lcs[i].stream, fork, 0), CUDA_SUCCESS);
  }
  if (st == FAN_OTHER_CAPTURE) { /* C, Q and R in one capture, not P's (P eager) */
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->EventRecord(fork, C), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(R, fork, 0), CUDA_SUCCESS);
  }
  fake_work(P, "produce", NULL);
  fake_log_reset();
  if (dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, flags) != DLSYNC_SUCCESS)
    fail_msg("state %d: %s", (int)st, dlsync_last_error());
  snprintf(out->begin, sizeof out->begin, "%s", fake_call_log());
  out->begin_records =
      fake_call_count("cuEventRecord") + fake_call_count("cuEventRecordWithFlags") +
      fake_call_count("cuGraphAddEventRecordNode") + fake_call_count("cuGraphAddNode");
  out->begin_queries = queries();
  for (int i = 0; i < 3; i++)
    if (lcs[i].kind == DLSYNC_LANE_STREAM)
      fake_work(lcs[i].stream, "consume", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), want_end);
  snprintf(out->end, sizeof out->end, "%s", fake_call_log());
  out->end_queries = queries();
  if (st == FAN_OTHER_CAPTURE) {
    assert_int_equal(D->EventRecord(fork, Q), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
    assert_int_equal(D->EventRecord(fork, R), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
    destroy_graph(end_capture_ok(C));
  }
  if (p_captures) {
    /* Joined or not, the consumers stay in the capture until it ends
     * (docs/design.md R11); the join made their work the producer's
     * dependencies, so the capture ends cleanly. */
    for (int i = 0; i < 3; i++)
      assert_int_equal(fake_capture_id(lcs[i].stream), fake_capture_id(P));
    destroy_graph(end_capture_ok(P));
  }
  if (gb != NULL)
    destroy_graph(gb);
  fake_event_destroy(fork);
}

/* Two fan-outs and joins in state st; the calls of the second. */
static fan_calls fan_calls_in(fan_state st) {
  fan_calls out;
  warm();
  fan_once(st, &out);
  fan_once(st, &out);
  if (getenv("FAN_CALLS_PRINT") != NULL)
    printf("state %d\n  begin %s\n  end   %s\n", (int)st, out.begin, out.end);
  return out;
}

#define IS "cuStreamIsCapturing,"
#define INFO "cuStreamGetCaptureInfo,"
#define REC_WAIT "cuEventRecord,cuStreamWaitEvent"
#define WAIT "cuStreamWaitEvent"
#define ADD "cuStreamUpdateCaptureDependencies"

static void eager_calls(void **state) {
  fan_calls c = fan_calls_in(FAN_EAGER);
  (void)state;
  /* A status query per consumer, one record, a wait each. */
  assert_string_equal(c.begin, IS IS IS "cuEventRecord," WAIT "," WAIT "," WAIT);
  /* The producer's status once, then per consumer its status, a record and
   * the producer's wait. */
  assert_string_equal(c.end, IS IS REC_WAIT "," IS REC_WAIT "," IS REC_WAIT);
}

static void eager_stable_calls(void **state) {
  fan_calls c = fan_calls_in(FAN_EAGER_STABLE);
  (void)state;
  assert_string_equal(c.begin, IS IS IS "cuEventRecord," WAIT "," WAIT "," WAIT);
  assert_string_equal(c.end, REC_WAIT "," REC_WAIT "," REC_WAIT); /* no query */
}

static void same_capture_calls(void **state) {
  for (int stable = 0; stable < 2; stable++) {
    fan_calls c = fan_calls_in(stable ? FAN_SAME_STABLE : FAN_SAME);
    (void)state;
    /* The producer's full query, each consumer's, and the producer's
     * dependencies added to each consumer's: no event. */
    assert_string_equal(c.begin, INFO INFO INFO INFO ADD "," ADD "," ADD);
    /* Each consumer's full query and ONE update of the producer with their
     * dependencies. */
    assert_string_equal(c.end, INFO INFO INFO ADD);
  }
}

static void join_calls(void **state) {
  fan_calls c = fan_calls_in(FAN_JOIN);
  (void)state;
  /* As eager: the consumers join the producer's capture by the one record. */
  assert_string_equal(c.begin, IS IS IS "cuEventRecord," WAIT "," WAIT "," WAIT);
  /* The producer's full query (this thread's ends find captures), each
   * consumer's, one update. */
  assert_string_equal(c.end, INFO INFO INFO INFO ADD);
}

/* The rows with nodes (the general path): one record and one wait node for
 * the three consumers of one other graph; upper bounds on the queries (each
 * lane once, and the first consumer again after each order that moved its
 * frontier; the join's refusals read both lanes of each pair). */
static void other_capture_calls(void **state) {
  fan_calls c = fan_calls_in(FAN_OTHER_CAPTURE);
  (void)state;
  assert_int_equal(c.begin_records, 1);
  assert_non_null(strstr(c.begin, WAIT));
  assert_null(strstr(strstr(c.begin, WAIT) + 1, WAIT)); /* one wait */
  assert_true(c.begin_queries <= 6);
  assert_true(c.end_queries <= 12);
}

static void built_calls(void **state) {
  fan_calls c = fan_calls_in(FAN_BUILT);
  (void)state;
  assert_int_equal(c.begin_records, 1);
  assert_non_null(strstr(c.begin, "cuGraphAddEventWaitNode"));
  assert_null(strstr(strstr(c.begin, "cuGraphAddEventWaitNode") + 1, "cuGraphAddEventWaitNode"));
  assert_true(c.begin_queries <= 2);
  assert_true(c.end_queries <= 3);
}

/* ---- bad input ---- */

static void bad_input_is_refused_before_any_driver_call(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  dlsync_lane dup[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(C)};
  dlsync_lane legacy[2] = {dlsync_lane_stream(NULL), dlsync_lane_stream(CU_STREAM_LEGACY)};
  dlsync_lane self[2] = {dlsync_lane_stream(C), dlsync_lane_stream(P)};
  dlsync_exchange *ex = (dlsync_exchange *)&lp;
  CUgraph g;
  CUgraphNode gd[2];
  dlsync_lane glanes[2];
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  gd[0] = fake_graph_add_work(g, NULL, 0, "own");
  glanes[0] = dlsync_lane_graph(g, gd, 1, 2);
  glanes[1] = glanes[0];
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_fanout(NULL, ctx, &lp, lcs, 3, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, NULL, &lp, lcs, 3, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ex);
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "0 consumers"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, NULL, 3, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "consumers is NULL"));
  assert_int_equal(
      dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, (size_t)DLSYNC_EXCHANGE_MANY_MAX + 1, 0),
      DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "1 to 1024"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0x80),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "unknown flags"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, NULL, lcs, 3, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "producer"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, dup, 3, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "consumers 0 and 2 are the same lane"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, legacy, 2, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "consumers 0 and 1 are the same lane"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, glanes, 2, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "the same lane"));
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, self, 2, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "consumer 1 is the producer"));
  /* The producer alone, too (n == 1 checks the same). */
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, &self[1], 1, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  /* A bad lane late in the array: named, nothing queued for the others. */
  lcs[2].kind = (dlsync_lane_kind)77;
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0),
                   DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "consumer 2"));
  assert_null(ex);
  assert_int_equal(fake_calls_total(), 0);
  destroy_graph(g);
}

/* A producer built by hand and an eager consumer among others: refused
 * before anything is queued (an eager wait now would order nothing). */
static void a_built_producer_and_an_eager_consumer_are_refused(void **state) {
  CUgraph g, gc;
  CUgraphNode d[2], dc[2];
  dlsync_lane lp, lcs[2];
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&gc, 0), CUDA_SUCCESS);
  d[0] = fake_graph_add_work(g, NULL, 0, "produce");
  dc[0] = fake_graph_add_work(gc, NULL, 0, "other");
  lp = dlsync_lane_graph(g, d, 1, 2);
  lcs[0] = dlsync_lane_graph(gc, dc, 1, 2);
  lcs[1] = dlsync_lane_stream(C);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0),
                   DLSYNC_ERROR_CAPTURE_ORDER);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "not launched yet"));
  assert_int_equal(fake_graph_count_nodes(g, -1), 1);
  assert_int_equal(fake_graph_count_nodes(gc, -1), 1);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_call_count("cuGraphAddNode") + fake_call_count("cuGraphAddEventRecordNode"),
                   0);
  destroy_graph(g);
  destroy_graph(gc);
}

static void an_ended_handle_is_refused(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_calls_total(), 0);
}

/* The second consumer's wait fails: the first, which joined the producer's
 * capture, is joined back, so the capture still ends cleanly; the status is
 * the failure's, with its driver result. */
static void a_later_failure_orders_the_earlier_back(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = (dlsync_exchange *)&lp;
  CUgraph g;
  (void)state;
  warm();
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  fake_fail_nth("cuStreamWaitEvent", 2, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0), DLSYNC_ERROR_DRIVER);
  fake_fail_clear();
  assert_null(ex);
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_LAUNCH_FAILED);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamWaitEvent"));
  assert_non_null(strstr(dlsync_last_error(), "consumer 1"));
  g = end_capture_ok(P);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(Q), CU_STREAM_CAPTURE_STATUS_NONE);
  destroy_graph(g);
}

/* A producer whose capture an earlier call invalidated: refused with
 * DLSYNC_ERROR_CAPTURE_INVALIDATED and nothing queued, whether the thread's
 * fan-outs last found eager consumers (the producer is not asked: the
 * record fails) or captures (its full query says so). */
static void an_invalidated_capture_is_reported(void **state) {
  (void)state;
  for (int hint = 0; hint < 2; hint++) {
    dlsync_lane lp = dlsync_lane_stream(P);
    dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
    dlsync_exchange *ex = NULL;
    CUevent e = fake_event_create(0, 0);
    CUgraph g = NULL;
    (void)fan_calls_in(hint ? FAN_SAME : FAN_EAGER); /* the thread's hint */
    assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    ex = (dlsync_exchange *)0x1;
    fake_log_reset();
    assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0),
                     DLSYNC_ERROR_CAPTURE_INVALIDATED);
    assert_null(ex);
    assert_non_null(strstr(dlsync_last_error(), "invalidated"));
    assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
    assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
    for (int i = 0; i < 3; i++)
      assert_int_equal(fake_capture_status(lcs[i].stream), CU_STREAM_CAPTURE_STATUS_NONE);
    assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    fake_event_destroy(e);
  }
}

/* A consumer that begins a capture between begin and end: its join is
 * refused (the eager producer cannot wait for a graph not launched), the
 * others are joined all the same. */
static void a_consumer_that_captures_by_the_end_is_refused_alone(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  dlsync_exchange *ex = NULL;
  uint64_t cq, cr, mutate;
  (void)state;
  warm();
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  cq = fake_work(Q, "consume", NULL);
  cr = fake_work(R, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  mutate = fake_work(P, "mutate", NULL);
  assert_true(fake_happens_before(cq, mutate));
  assert_true(fake_happens_before(cr, mutate));
  destroy_graph(end_capture_ok(C));
}

/* A fan-out not ended when its context is destroyed: the caller's one
 * handle is counted (the fan-out's one record for stream lanes; the
 * record of its parts with a graph lane among the consumers), and is
 * refused after. */
static void context_destroy_counts_the_fanouts_handle(void **state) {
  (void)state;
  for (int graph = 0; graph < 2; graph++) {
    dlsync_context *c2 = NULL;
    dlsync_lane lp = dlsync_lane_stream(P);
    dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
    dlsync_exchange *ex = NULL;
    CUgraph g = NULL;
    CUgraphNode gd[2];
    if (graph) {
      assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
      gd[0] = fake_graph_add_work(g, NULL, 0, "own");
      lcs[2] = dlsync_lane_graph(g, gd, 1, 2);
    }
    assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
    if (!graph) { /* warm: the thread's scratch event of c2, so that the fan-out is one record */
      assert_int_equal(dlsync_exchange_begin_fanout(&ex, c2, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
      assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    }
    fake_log_reset();
    assert_int_equal(dlsync_exchange_begin_fanout(&ex, c2, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
    if (!graph) /* the one record's path: the producer is not asked */
      assert_int_equal(fake_call_count("cuStreamIsCapturing"), 3);
    if (g != NULL) /* first: the event its wait node holds goes back to c2's pool */
      destroy_graph(g);
    assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
    assert_non_null(strstr(dlsync_last_error(), "1 exchange(s) begun and not ended"));
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  }
}

/* ---- fault injection: every driver call and allocation ---- */

typedef enum scene {
  SCENE_EAGER,
  SCENE_JOIN,
  SCENE_MIXED,
  SCENE_STABLE,
  SCENE_KEEP,
  SCENE_SAME,
  SCENE_COUNT
} scene;

static fake_fault sweep_kind = FAKE_FAULT_CALL;

/* One fan-out and join of the scene with fault n (0: none); true when the
 * fault was reached. SCENE_MIXED: the producer captures, C is eager (joins),
 * Q is in the capture (edges) and R in another capture (a wait node).
 * SCENE_KEEP: C and Q in the producer's capture, DLSYNC_EXCHANGE_KEEP_EDGE_DATA
 * (the query of the producer's edge data, the updates with it, both ways).
 * SCENE_SAME: C and Q in the producer's capture, no flag (the fan-out's own
 * record: its updates, and the join's one update). */
static bool run_with_fault(scene sc, unsigned n) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_status sb, se = DLSYNC_SUCCESS, want_end = DLSYNC_SUCCESS;
  bool capture = sc == SCENE_JOIN || sc == SCENE_MIXED || sc == SCENE_KEEP || sc == SCENE_SAME;
  uint32_t flags = sc == SCENE_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE
                   : sc == SCENE_KEEP ? DLSYNC_EXCHANGE_KEEP_EDGE_DATA
                                      : 0;
  bool reached;
  size_t nc = sc == SCENE_MIXED ? 3 : 2;
  if (capture)
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  if (sc == SCENE_MIXED) {
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
    assert_int_equal(D->StreamBeginCapture(R, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    want_end = DLSYNC_ERROR_CAPTURE_ORDER; /* R's order back */
  }
  if (sc == SCENE_KEEP || sc == SCENE_SAME) {
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
  }
  fake_work(P, "produce", NULL);
  if (n > 0)
    fake_fail_fault(sweep_kind, n);
  sb = dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, nc, flags);
  if (sb == DLSYNC_SUCCESS) {
    assert_non_null(ex);
    fake_work(C, "consume", NULL);
    se = dlsync_exchange_end(ex);
  } else {
    assert_null(ex);
  }
  reached = n > 0 && !fake_fail_pending();
  fake_fail_clear();
  if (reached) {
    bool failed = sb != DLSYNC_SUCCESS || (se != DLSYNC_SUCCESS && se != want_end);
    if (sweep_kind == FAKE_FAULT_ALLOC) {
      if (failed && !fake_fault_reported(sweep_kind))
        fail_msg("scene %d: allocation %u failed: %s", (int)sc, n, dlsync_last_error());
    } else {
      if (!failed)
        fail_msg("scene %d: call %u failed but begin and end succeeded", (int)sc, n);
      assert_non_null(strstr(dlsync_last_error(), "CUDA_ERROR_UNKNOWN"));
    }
  } else {
    assert_int_equal(sb, DLSYNC_SUCCESS);
    assert_int_equal(se, want_end);
  }
  if (capture) {
    CUgraph g = NULL;
    CUresult er;
    if (sc == SCENE_KEEP ||
        sc == SCENE_SAME) { /* joined back by hand too (a failed end leaves them) */
      (void)D->EventRecord(fork, Q);
      (void)D->StreamWaitEvent(P, fork, 0);
      (void)D->EventRecord(fork, C);
      (void)D->StreamWaitEvent(P, fork, 0);
    }
    if (sc == SCENE_MIXED) {
      (void)D->EventRecord(fork, Q);
      (void)D->StreamWaitEvent(P, fork, 0);
      if (fake_capture_id(C) == fake_capture_id(P)) { /* C still joined: a failed end */
        (void)D->EventRecord(fork, C);
        (void)D->StreamWaitEvent(P, fork, 0);
      }
      g = NULL;
      (void)D->StreamEndCapture(R, &g);
      if (g != NULL)
        destroy_graph(g);
      g = NULL;
    }
    er = D->StreamEndCapture(P, &g);
    if (g != NULL)
      destroy_graph(g);
    if ((!reached || sweep_kind == FAKE_FAULT_ALLOC) && er != CUDA_SUCCESS)
      fail_msg("scene %d, %s %u: the capture ended with %s (begin %s, end %s: %s)", (int)sc,
               fake_fault_name(sweep_kind), n, dlsync__driver_error_name(D, er),
               dlsync_status_name(sb), dlsync_status_name(se), dlsync_last_error());
  }
  fake_event_destroy(fork);
  assert_int_equal(fake_active_captures(), 0);
  assert_pool_intact();
  return reached;
}

static void sweep(fake_fault kind) {
  sweep_kind = kind;
  for (scene sc = SCENE_EAGER; sc < SCENE_COUNT; sc++) {
    unsigned n;
    run_with_fault(sc, 0);
    for (n = 1; n < 400; n++)
      if (!run_with_fault(sc, n))
        break;
    assert_true(n < 400);
    if (kind == FAKE_FAULT_CALL)
      assert_true(n > 4);
  }
  sweep_kind = FAKE_FAULT_CALL;
}

static void every_driver_failure_is_a_status(void **state) {
  (void)state;
  sweep(FAKE_FAULT_CALL);
}

static void every_allocation_failure_is_a_status(void **state) {
  (void)state;
  sweep(FAKE_FAULT_ALLOC);
}

/* ---- threads: each its own four streams, one context ---- */

#define THREADS 6
#define PER_THREAD 300

typedef struct tdata {
  CUstream p, c[3];
  int failures, unordered;
} tdata;

static void *fan_loop(void *arg) {
  tdata *t = arg;
  dlsync_lane lp = dlsync_lane_stream(t->p);
  dlsync_lane lcs[3] = {dlsync_lane_stream(t->c[0]), dlsync_lane_stream(t->c[1]),
                        dlsync_lane_stream(t->c[2])};
  for (int i = 0; i < PER_THREAD; i++) {
    dlsync_exchange *ex = NULL;
    uint64_t a = fake_work(t->p, "p", NULL), c[3], d;
    if (dlsync_exchange_begin_fanout(
            &ex, ctx, &lp, lcs, 3, i % 2 ? DLSYNC_EXCHANGE_CAPTURE_STABLE : 0) != DLSYNC_SUCCESS) {
      t->failures++;
      continue;
    }
    for (int k = 0; k < 3; k++)
      c[k] = fake_work(t->c[k], "c", NULL);
    if (dlsync_exchange_end(ex) != DLSYNC_SUCCESS)
      t->failures++;
    d = fake_work(t->p, "p2", NULL);
    if (i % 50 == 0)
      for (int k = 0; k < 3; k++)
        if (!fake_happens_before(a, c[k]) || !fake_happens_before(c[k], d))
          t->unordered++;
  }
  return NULL;
}

static void many_threads(void **state) {
  pthread_t th[THREADS];
  tdata td[THREADS];
  (void)state;
  for (int i = 0; i < THREADS; i++) {
    td[i].p = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    for (int k = 0; k < 3; k++)
      td[i].c[k] = fake_stream_create((i + k) % 2, CU_STREAM_NON_BLOCKING);
    td[i].failures = td[i].unordered = 0;
    assert_int_equal(pthread_create(&th[i], NULL, fan_loop, &td[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(td[i].failures, 0);
    assert_int_equal(td[i].unordered, 0);
    fake_stream_destroy(td[i].p);
    for (int k = 0; k < 3; k++)
      fake_stream_destroy(td[i].c[k]);
  }
}

/* ---- edge data (DLSYNC_EXCHANGE_KEEP_EDGE_DATA) ---- */

/* The type of the edge from -> to in g (-1: no such edge). */
static int edge_type(CUgraph g, CUgraphNode from, CUgraphNode to) {
  size_t n = 0;
  int type = -1;
  CUgraphNode *f, *t;
  CUgraphEdgeData *e;
  assert_int_equal(D->GraphGetEdges(g, NULL, NULL, NULL, &n), CUDA_SUCCESS);
  f = calloc(n + 1, sizeof *f);
  t = calloc(n + 1, sizeof *t);
  e = calloc(n + 1, sizeof *e);
  assert_int_equal(D->GraphGetEdges(g, f, t, e, &n), CUDA_SUCCESS);
  for (size_t i = 0; i < n; i++)
    if (f[i] == from && t[i] == to)
      type = e[i].type;
  free(f);
  free(t);
  free(e);
  return type;
}

/* P's next node depends on pn programmatically (what a PDL launch after
 * pn would make). */
static void programmatic_after(CUstream s, CUgraphNode pn) {
  CUgraphEdgeData ed;
  memset(&ed, 0, sizeof ed);
  ed.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  ed.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
  assert_int_equal(
      D->StreamUpdateCaptureDependencies(s, &pn, &ed, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES),
      CUDA_SUCCESS);
}

typedef enum edge_call { EDGE_BEGIN, EDGE_FANOUT } edge_call;

/* P's kernel pn, a programmatic edge pending after it; C (and Q) in P's
 * capture; the exchange; C's kernel cn. The type of the edge pn -> cn. */
static int edge_across(edge_call call, uint32_t flags) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(Q)};
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode pn, cn;
  CUgraph g;
  int type;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
  fake_work(P, "primary", &pn);
  programmatic_after(P, pn);
  if (call == EDGE_BEGIN)
    assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lcs[0], flags), DLSYNC_SUCCESS);
  else
    assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, flags), DLSYNC_SUCCESS);
  fake_work(C, "secondary", &cn);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "after", NULL);
  assert_int_equal(D->EventRecord(fork, Q), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, fork, 0), CUDA_SUCCESS);
  g = end_capture_ok(P);
  assert_true(fake_graph_has_path(g, pn, cn));
  type = edge_type(g, pn, cn);
  destroy_graph(g);
  fake_event_destroy(fork);
  return type;
}

static void a_programmatic_edge_is_kept_with_the_flag(void **state) {
  (void)state;
  assert_int_equal(edge_across(EDGE_BEGIN, DLSYNC_EXCHANGE_KEEP_EDGE_DATA),
                   CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  assert_int_equal(edge_across(EDGE_FANOUT, DLSYNC_EXCHANGE_KEEP_EDGE_DATA),
                   CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  assert_int_equal(
      edge_across(EDGE_BEGIN, DLSYNC_EXCHANGE_KEEP_EDGE_DATA | DLSYNC_EXCHANGE_CAPTURE_STABLE),
      CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
}

/* The control: without the flag the edge is a full edge. */
static void without_the_flag_it_is_a_full_edge(void **state) {
  (void)state;
  assert_int_equal(edge_across(EDGE_BEGIN, 0), CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
  assert_int_equal(edge_across(EDGE_FANOUT, 0), CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
}

/* The end keeps the consumer's edge data too: the producer's next node
 * after the consumer's kernel, programmatically. */
static void the_end_keeps_the_consumers_edge_data(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode cn, pm;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_KEEP_EDGE_DATA),
                   DLSYNC_SUCCESS);
  fake_work(C, "consume", &cn);
  programmatic_after(C, cn);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 1);
  fake_work(P, "mutate", &pm);
  g = end_capture_ok(P);
  assert_int_equal(edge_type(g, cn, pm), CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  destroy_graph(g);
  fake_event_destroy(fork);
}

/* Without the flag, the end's dependency update passes no edge data (C's
 * programmatic edge becomes a full one) and the query asks for edge data
 * (no CUDA_ERROR_LOSSY_QUERY). */
static void without_the_flag_the_end_makes_a_full_edge(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode cn, pm;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", &cn);
  programmatic_after(C, cn);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "mutate", &pm);
  g = end_capture_ok(P);
  assert_int_equal(edge_type(g, cn, pm), CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
  destroy_graph(g);
  fake_event_destroy(fork);
}

/* The flag's one more query fails: a status, nothing queued. */
static void a_failed_edge_query_queues_nothing(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode pn;
  unsigned queries;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", &pn);
  programmatic_after(P, pn);
  /* How many capture queries the begin makes: the last is the flag's. */
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_KEEP_EDGE_DATA),
                   DLSYNC_SUCCESS);
  queries = fake_call_count("cuStreamGetCaptureInfo");
  assert_true(queries >= 3);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_log_reset();
  fake_fail_nth("cuStreamGetCaptureInfo", queries, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_KEEP_EDGE_DATA),
                   DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  fake_fail_clear();
  assert_non_null(strstr(dlsync_last_error(), "edge data"));
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
  destroy_graph(end_capture_ok(P));
  fake_event_destroy(fork);
}

/* The join inside one capture adds the consumers' dependencies to the
 * producer's in ONE update; past what that update takes at once (32 nodes,
 * here 3 consumers of 12), one update per consumer. Either way the
 * producer's next node has an edge from each consumer's last nodes. */
static void the_join_in_a_capture_is_one_update(void **state) {
  (void)state;
  for (int wide = 0; wide < 2; wide++) {
    size_t per = wide ? 12 : 2;
    dlsync_lane lp = dlsync_lane_stream(P);
    dlsync_lane lcs[3] = {dlsync_lane_stream(C), dlsync_lane_stream(Q), dlsync_lane_stream(R)};
    dlsync_exchange *ex = NULL;
    CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    CUgraphNode pn, pm, nodes[3][12];
    CUgraph g;
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    for (int i = 0; i < 3; i++)
      assert_int_equal(D->StreamWaitEvent(lcs[i].stream, fork, 0), CUDA_SUCCESS);
    fake_work(P, "produce", &pn);
    assert_int_equal(dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 3, 0), DLSYNC_SUCCESS);
    for (int i = 0; i < 3; i++) { /* per nodes side by side after pn, all pending */
      for (size_t k = 0; k < per; k++) {
        assert_int_equal(D->StreamUpdateCaptureDependencies(lcs[i].stream, &pn, NULL, 1,
                                                            CU_STREAM_SET_CAPTURE_DEPENDENCIES),
                         CUDA_SUCCESS);
        fake_work(lcs[i].stream, "consume", &nodes[i][k]);
      }
      assert_int_equal(D->StreamUpdateCaptureDependencies(lcs[i].stream, nodes[i], NULL, per,
                                                          CU_STREAM_SET_CAPTURE_DEPENDENCIES),
                       CUDA_SUCCESS);
    }
    fake_log_reset();
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), wide ? 3 : 1);
    assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 3);
    fake_work(P, "mutate", &pm);
    g = end_capture_ok(P);
    for (int i = 0; i < 3; i++)
      for (size_t k = 0; k < per; k++)
        assert_int_equal(edge_type(g, nodes[i][k], pm), CU_GRAPH_DEPENDENCY_TYPE_DEFAULT);
    destroy_graph(g);
    fake_event_destroy(fork);
  }
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(eager_is_one_record_and_a_wait_per_consumer),
      T(without_it_the_other_consumers_are_unordered),
      T(a_stable_join_asks_nothing),
      T(eager_consumers_of_a_capture_each_join),
      T(consumers_in_the_capture_are_edges_only),
      T(consumers_in_other_captures_get_a_wait_node_per_graph),
      T(built_consumers_get_a_wait_node_per_graph),
      T(every_recapture_has_the_same_shape),
      T(bad_input_is_refused_before_any_driver_call),
      T(a_built_producer_and_an_eager_consumer_are_refused),
      T(an_ended_handle_is_refused),
      T(a_later_failure_orders_the_earlier_back),
      T(every_driver_failure_is_a_status),
      T(every_allocation_failure_is_a_status),
      T(many_threads),
      T(a_programmatic_edge_is_kept_with_the_flag),
      T(without_the_flag_it_is_a_full_edge),
      T(the_end_keeps_the_consumers_edge_data),
      T(without_the_flag_the_end_makes_a_full_edge),
      T(a_failed_edge_query_queues_nothing),
      T(the_join_in_a_capture_is_one_update),
      T(an_invalidated_capture_is_reported),
      T(context_destroy_counts_the_fanouts_handle),
      T(a_consumer_that_captures_by_the_end_is_refused_alone),
      T(eager_calls),
      T(eager_stable_calls),
      T(same_capture_calls),
      T(join_calls),
      T(other_capture_calls),
      T(built_calls),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
