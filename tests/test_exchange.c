/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table on the fake driver: one test per row (the exact driver
 * calls, the resulting graph edges, a clean end of capture, no illegal call),
 * the errors, fault injection on every driver call and every allocation of
 * dlsync_order and of begin and end, for every row, and exchanges from many
 * threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "order/table.h"
#include "fixture.h"

/* Two begin/end rounds between the lanes: afterwards the thread knows both
 * streams (memo and scratch event), so the next exchange takes the fast
 * path. */
static void warm_pair(dlsync_lane *lp, dlsync_lane *lc, uint32_t flags) {
  dlsync_exchange *ex = NULL;
  for (int i = 0; i < 2; i++) {
    assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, lp, lc, flags), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
}

/* Ends P's capture, which must end cleanly with C joined back (no longer
 * capturing), no event-record node, and produce -> consume -> mutate. */
static void end_join_checked(CUgraphNode produce, CUgraphNode consume, CUgraphNode mutate) {
  CUgraph g = end_capture_ok(P);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_true(fake_graph_has_path(g, produce, consume));
  assert_true(fake_graph_has_path(g, consume, mutate));
  destroy_graph(g);
}

/* ---- A: plain streams ---- */

static void same_stream_is_one_query(void **state) {
  dlsync_lane l = dlsync_lane_stream(P);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &l, &l), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_calls_total(), 1);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing");
}

static void eager_eager_orders_both_ways(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t produce, consume, mutate;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  consume = fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  mutate = fake_work(P, "mutate", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_true(fake_happens_before(consume, mutate));
}

static void eager_eager_without_dlsync_is_unordered(void **state) {
  uint64_t produce, consume;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  consume = fake_work(C, "consume", NULL);
  assert_false(fake_happens_before(produce, consume));
}

static void warm_pool_makes_exactly_the_needed_calls(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_log_reset();
  for (int i = 0; i < 100; i++) {
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  assert_int_equal(fake_call_count("cuEventCreate"), 0);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 0);
  fake_log_reset();
  /* Begin asks about the consumer only: whatever the producer is, recording
   * on it and waiting on the consumer is the table's answer (see the join). */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  fake_log_reset();
  /* End asks about both: either may have begun capturing since. While this
   * thread's ends find eager consumers, with two status queries. */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(),
                      "cuStreamIsCapturing,cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
}

/* A warm join: begin asks about the consumer only; end finds both streams in
 * one capture and joins back by adding the consumer's dependencies to the
 * producer's (no event, no general path, no cuStreamGetCtx). The thread's ends so far found eager
 * consumers, so this end asks the consumer's status first and then reads both in full; from then on
 * its ends read both in full at once (three queries per join). */
static void warm_join_is_three_queries(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  fake_work(C, "consume", &n2);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuStreamGetCaptureInfo,"
                                       "cuStreamGetCaptureInfo,cuStreamUpdateCaptureDependencies");
  fake_work(P, "mutate", &n3);
  /* Another exchange in the capture (both in it now: SAME_CAPTURE): begin
   * found both in it, so end reads the consumer alone. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamGetCaptureInfo,cuStreamUpdateCaptureDependencies");
  end_join_checked(n1, n2, n3);
}

/* The end's queries follow what this thread's last end found; the answer
 * never depends on it. Eager ends: two status queries. An eager end after
 * capture ends: the full query of the consumer finds it eager, then the
 * producer's status, and the next end is back to status queries. A
 * producer that began capturing since begin is refused either way. */
static void end_queries_follow_the_last_end(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g = NULL;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  for (int i = 0; i < 2; i++) { /* joins: the thread's last end found a capture */
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_SUCCESS);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(),
                      "cuStreamIsCapturing,cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  /* Eager at begin; the producer captures by the end: refused, nothing queued. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(D->StreamEndCapture(C, &g), CUDA_SUCCESS);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
}

/* The begin's queries follow what this thread's last begin (or order) found
 * of its consumer: a status query while they are eager; the full query at
 * once while they capture. Either way an eager consumer is one query and a
 * plain record and wait, and a consumer in another capture than the
 * producer's goes to the general path, which reads neither stream again. */
static void begin_queries_follow_the_last_begin(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g = NULL;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  /* the consumer in full at once, the producer (eager last time) its status */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 1);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  assert_int_equal(D->StreamEndCapture(C, &g), CUDA_SUCCESS);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  /* Eager again: one full query, then back to status queries. */
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamGetCaptureInfo,cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
}

/* Warm, both streams in one capture (every exchange after the first inside a
 * capture): begin reads both in full (the first time after eager begins,
 * each one's status before) and adds the producer's dependencies to the
 * consumer's (one call, no event: rule R12); end reads the consumer alone (in
 * that capture still, the producer is too: rule R11) and adds its
 * dependencies to the producer's. With CAPTURE_STABLE the same: the query
 * gives the dependencies (a record and a wait would cost more). */
static void warm_same_capture_is_plain(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3;
  CUgraph g;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS); /* the join */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  for (uint32_t flags = 0; flags <= DLSYNC_EXCHANGE_CAPTURE_STABLE; flags++) {
    fake_log_reset();
    assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, flags), DLSYNC_SUCCESS);
    /* The first time after eager begins, each stream's status before its
     * full query; then both in full at once. */
    assert_string_equal(fake_call_log(), flags == 0
                                             ? "cuStreamIsCapturing,cuStreamGetCaptureInfo,"
                                               "cuStreamIsCapturing,cuStreamGetCaptureInfo,"
                                               "cuStreamUpdateCaptureDependencies"
                                             : "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,"
                                               "cuStreamUpdateCaptureDependencies");
    fake_work(C, "consume", &n2);
    fake_log_reset();
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    assert_string_equal(fake_call_log(),
                        "cuStreamGetCaptureInfo,cuStreamUpdateCaptureDependencies");
  }
  fake_work(P, "mutate", &n3);
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_path(g, n1, n2));
  assert_true(fake_graph_has_path(g, n2, n3));
  destroy_graph(g);
}

/* Both streams in capture X at begin; P's capture starts, C joins it and
 * leaves begin's SAME_CAPTURE exchange open: the setup of the test below. */
static dlsync_exchange *begin_in_one_capture(dlsync_lane *lp, dlsync_lane *lc) {
  dlsync_exchange *ex = NULL;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  for (int i = 0; i < 2; i++) { /* the join, then one in the capture: the hints settle */
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, lp, lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, lp, lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,"
                                       "cuStreamUpdateCaptureDependencies");
  fake_work(C, "consume", NULL);
  return ex;
}

/* C joined back to P by hand and P's capture ended. */
static void join_back_and_end(void) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_SUCCESS);
  destroy_graph(end_capture_ok(P));
  assert_int_equal(D->EventDestroy(e), CUDA_SUCCESS);
}

/* An end after a begin that found both streams in one capture reads the
 * consumer alone, and trusts that read only while it names the same
 * capture: once the capture has ended (both eager again) or the consumer is
 * in another one, end reads the producer too and takes the row they are in
 * now, as an end that read both would. A failed read is a status naming the
 * consumer, with nothing queued. */
static void end_after_one_capture_trusts_only_that_capture(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex;
  (void)state;
  warm_pair(&lp, &lc, 0);
  /* The capture ended between begin and end: both eager, a plain order. */
  ex = begin_in_one_capture(&lp, &lc);
  join_back_and_end();
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  /* The consumer's full query, then the producer's status: both eager. */
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  /* The consumer in a new capture by the end, the producer eager: refused
   * (DLSYNC_ERROR_CAPTURE_ORDER), nothing queued, the new capture unharmed. */
  ex = begin_in_one_capture(&lp, &lc);
  join_back_and_end();
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_NONE);
  destroy_graph(end_capture_ok(C));
  /* The consumer's read fails: a status that names the call and the
   * consumer; nothing queued, so the capture still ends once joined back. */
  ex = begin_in_one_capture(&lp, &lc);
  fake_log_reset();
  fake_fail_call(1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 0);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamGetCaptureInfo"));
  assert_non_null(strstr(dlsync_last_error(), "consumer"));
  join_back_and_end();
}

/* Inside one capture an exchange adds dependency sets (rule R12): begin gives
 * the consumer the producer's (here more than the lane copies inline: the
 * driver's array, passed as it came), end gives the producer the
 * consumer's; no event, no record, no wait. An empty set (a consumer that
 * joined and did nothing) is no call. A failed update is a status naming the
 * call and both streams, with nothing added. */
static void same_capture_adds_dependencies_without_an_event(void **state) {
  enum { SIDES = DLSYNC__DEPS_INLINE + 2 };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  side_frontier fr;
  CUgraphNode consume = NULL, mutate = NULL;
  CUgraph g;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  /* The join (a record and a wait: an eager consumer cannot take a set),
   * then an end whose consumer has nothing: no call after the queries. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  side_frontier_make(&fr, P, SIDES); /* P's frontier: SIDES nodes of side streams */
  assert_int_equal(fake_capture_deps(C, NULL, 0), 0);
  /* Begin's update refused: a status naming it, nothing added. */
  fake_fail_nth("cuStreamUpdateCaptureDependencies", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
  assert_null(ex);
  assert_false(fake_fail_pending());
  assert_non_null(strstr(dlsync_last_error(), "cuStreamUpdateCaptureDependencies"));
  assert_non_null(strstr(dlsync_last_error(), "consumer stream"));
  assert_non_null(strstr(dlsync_last_error(), "producer stream"));
  assert_int_equal(fake_capture_deps(C, NULL, 0), 0);
  /* Begin: C takes P's SIDES nodes. */
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 1);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_capture_deps(C, NULL, 0), SIDES);
  fake_work(C, "consume", &consume);
  /* End's update refused: named, P's set as it was; the exchange is over. */
  fake_fail_nth("cuStreamUpdateCaptureDependencies", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamUpdateCaptureDependencies"));
  assert_non_null(strstr(dlsync_last_error(), "producer stream"));
  assert_int_equal(fake_capture_deps(P, NULL, 0), SIDES);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  /* Again, the end succeeding: P takes C's one node. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamGetCaptureInfo,cuStreamUpdateCaptureDependencies");
  assert_int_equal(fake_capture_deps(P, NULL, 0), SIDES + 1);
  fake_work(P, "mutate", &mutate);
  g = end_capture_ok(P); /* C joined back by the update alone */
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  for (int i = 0; i < SIDES; i++) {
    assert_true(fake_graph_has_edge(g, fr.work[i], consume));
    assert_true(fake_graph_has_edge(g, fr.work[i], mutate));
  }
  assert_true(fake_graph_has_edge(g, consume, mutate));
  destroy_graph(g);
  side_frontier_free(&fr);
}

/* Warm, eager producer, capturing consumer: what the fast path read is handed
 * to the general path, which reads neither stream again. (The thread's last
 * order found its later lane capturing and its earlier lane eager: the fast
 * path reads the consumer in full at once, no status query first, and the
 * producer's status alone.) */
static void warm_eager_to_capture_reads_each_stream_once(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraph g;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* the pool gets an event */
  g = end_capture_ok(C);
  destroy_graph(g);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  /* The capture's hold first (a user object its graph retains), then the
   * record and the wait. */
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamIsCapturing,"
                      "cuUserObjectCreate,cuGraphRetainUserObject,cuEventRecord,cuStreamWaitEvent");
  /* A second order into the same capture: its hold takes the event, no
   * user object. */
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 0);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  destroy_graph(g);
}

/* The producer's hint: while a thread's orders into a capture find their
 * earlier lane eager, its status is asked (EAGER_TO_CAPTURE); when it turns
 * out to capture, its full query follows in the same order, which is still
 * right (TWO_CAPTURES: a record node in the producer's capture, a wait node
 * in the consumer's), and the next orders read it in full at once, until
 * one finds it eager again. */
static void the_producer_hint_turns_when_it_captures(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraph gp, gc;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 2; i++)
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* TWO_CAPTURES, hint wrong */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 2);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 1);
  assert_int_equal(fake_call_count("cuEventRecordWithFlags"), 1);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* TWO_CAPTURES, hint right */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 2);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 0);
  gp = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 2);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* eager again: found in full */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 2);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 0);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* and its status again */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuStreamIsCapturing"), 1);
  gc = end_capture_ok(C);
  /* 2 + 2 orders from eager P, 2 external waits on P's record nodes */
  assert_int_equal(fake_graph_count_nodes(gc, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 6);
  destroy_graph(gp);
  destroy_graph(gc);
}

/* A thread that has made no plain exchange has no scratch event, so its
 * orders into a capture take the general path: the first reads both lanes
 * there; it notes that its consumers capture, so the next reads the consumer
 * in full and the eager producer's status in the fast path's order, and the
 * general path goes on with those reads. Either way each lane is asked about
 * once. */
typedef struct cold_orders {
  dlsync_status st[2];
  unsigned full[2], status[2], waits[2];
} cold_orders;

static void *cold_thread_orders(void *p) {
  cold_orders *co = p;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  for (int i = 0; i < 2; i++) {
    fake_log_reset();
    co->st[i] = dlsync_order(ctx, &lp, &lc);
    co->full[i] = fake_call_count("cuStreamGetCaptureInfo");
    co->status[i] = fake_call_count("cuStreamIsCapturing");
    co->waits[i] = fake_call_count("cuStreamWaitEvent");
  }
  return NULL;
}

static void cold_thread_reads_each_capture_lane_once(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  cold_orders co;
  pthread_t th;
  CUgraph g;
  (void)state;
  warm_pair(&lp, &lc, 0); /* this thread's, not the other's */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(pthread_create(&th, NULL, cold_thread_orders, &co), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  destroy_graph(g);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(co.st[i], DLSYNC_SUCCESS);
    /* the first: the general path's reads; then the fast path's */
    assert_int_equal(co.full[i], i == 0 ? 2 : 1);
    assert_int_equal(co.status[i], i == 0 ? 0 : 1);
    assert_int_equal(co.waits[i], 1);
  }
}

/* A capture's hold keeps its first events in itself and the rest in chunks:
 * many orders into one capture all hold their events; a chunk that cannot be
 * allocated fails that order with DLSYNC_ERROR_OUT_OF_MEMORY (no wait node,
 * the event back in its pool), and the capture goes on. */
static void capture_hold_grows_and_reports_a_failed_chunk(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraph g;
  int ok = 0;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  for (int i = 0; i < 40; i++) /* the pool grows to 40 events */
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  destroy_graph(end_capture_ok(C));
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  for (; ok < 16; ok++) /* the hold's own items */
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_fail_alloc(1); /* the first chunk */
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_OUT_OF_MEMORY);
  assert_false(fake_fail_pending());
  assert_non_null(strstr(dlsync_last_error(), "out of memory"));
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  for (; ok < 300; ok++) /* chunks of 128 */
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), ok);
  destroy_graph(g); /* the teardown checks that every event is back in the pool */
}

/* The consumer captures in another capture than the producer's: end's fast
 * path leaves it to the general path, which refuses (the producer would join
 * the consumer's capture). */
static void warm_end_in_two_captures_takes_the_general_path(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  /* Two captures: a record node in C's, a wait node in P's. */
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  destroy_graph(g);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  destroy_graph(g);
}

static void warm_order_asks_about_then_only(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  uint64_t a, b;
  (void)state;
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  a = fake_work(P, "produce", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  b = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(a, b));
}

/* ---- DLSYNC_EXCHANGE_CAPTURE_STABLE ---- */

static void stable_end_asks_nothing(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t produce, consume, mutate;
  (void)state;
  warm_pair(&lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE);
  produce = fake_work(P, "produce", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE),
                   DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  consume = fake_work(C, "consume", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuEventRecord,cuStreamWaitEvent");
  mutate = fake_work(P, "mutate", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_true(fake_happens_before(consume, mutate));
}

static void stable_join_is_joined_back_without_queries(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3;
  (void)state;
  warm_pair(&lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE),
                   DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_id(C), fake_capture_id(P));
  fake_work(C, "consume", &n2);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuEventRecord,cuStreamWaitEvent");
  fake_work(P, "mutate", &n3);
  end_join_checked(n1, n2, n3);
}

/* The general path (cold thread) also lets a stable end skip its queries. */
static void stable_cold_begin_still_trusted(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE),
                   DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 1); /* the general path ran */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE),
                   DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuEventRecord,cuStreamWaitEvent");
}

/* What exchange.h says a broken promise costs: a consumer that begins
 * capturing between begin and end pulls the producer into its capture, which
 * then cannot end. Without the flag the same sequence is refused. */
static void stable_broken_promise_costs_the_capture(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g = NULL;
  (void)state;
  warm_pair(&lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_NONE);
  destroy_graph(end_capture_ok(C));

  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE),
                   DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_work(P, "mutate", NULL); /* captured into the consumer's graph */
  assert_int_equal(D->StreamEndCapture(C, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  assert_null(g);
  assert_int_equal(fake_active_captures(), 0);
}

static void unknown_flags_are_refused(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)0x1;
  (void)state;
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, 0xc),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "unknown flags 0xc"));
  assert_int_equal(fake_calls_total(), 0);
}

static void devices_order_across(void **state) {
  CUstream other = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(other);
  dlsync_exchange *ex = NULL;
  uint64_t a, b, c;
  (void)state;
  a = fake_work(P, "dev0", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  b = fake_work(other, "dev1", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  c = fake_work(P, "dev0 again", NULL);
  assert_true(fake_happens_before(a, b));
  assert_true(fake_happens_before(b, c));
  fake_stream_destroy(other);
}

/* A wait the driver refuses between streams of two devices is its own
 * status, naming both devices, for a cold and a warm thread, in begin and in
 * end; between streams of one device the same refusal stays
 * DLSYNC_ERROR_DRIVER. Nothing is queued, the pool stays intact. */
static void cross_device_refusal_is_its_own_status(void **state) {
  CUstream other = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  dlsync_lane lp = dlsync_lane_stream(P), lo = dlsync_lane_stream(other),
              lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  for (int warm = 0; warm < 2; warm++) {
    uint64_t a, b;
    fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_NOT_SUPPORTED);
    ex = (dlsync_exchange *)0x1;
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lo), DLSYNC_ERROR_CROSS_DEVICE);
    assert_null(ex);
    assert_non_null(strstr(dlsync_last_error(), "on device 1 waiting for producer stream"));
    assert_non_null(strstr(dlsync_last_error(), "on device 0"));
    assert_non_null(strstr(dlsync_last_error(), "CUDA_ERROR_NOT_SUPPORTED"));
    assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_NOT_SUPPORTED);
    a = fake_work(P, "produce", NULL);
    b = fake_work(other, "consume", NULL);
    assert_false(fake_happens_before(a, b)); /* nothing was queued */
    /* end: the producer's wait is refused */
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lo), DLSYNC_SUCCESS);
    fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CROSS_DEVICE);
    assert_non_null(strstr(dlsync_last_error(), "producer stream"));
    /* not a refusal (out of memory): the driver's status, devices or not */
    fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_OUT_OF_MEMORY);
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lo), DLSYNC_ERROR_OUT_OF_MEMORY);
    assert_null(strstr(dlsync_last_error(), "device"));
    /* one device: the driver's status */
    fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_NOT_SUPPORTED);
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
    assert_null(strstr(dlsync_last_error(), "device"));
    /* warm up both pairs for the next round */
    warm_pair(&lp, &lo, 0);
    warm_pair(&lp, &lc, 0);
  }
  fake_stream_destroy(other);
}

static void reused_stream_handle_in_another_context_is_noticed(void **state) {
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING), s2;
  dlsync_lane ls, lc;
  dlsync_exchange *ex = NULL;
  uint64_t a, b;
  (void)state;
  ls = dlsync_lane_stream(s);
  lc = dlsync_lane_stream(C);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &ls, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_stream_destroy(s);
  s2 = fake_stream_create(1, CU_STREAM_NON_BLOCKING); /* the fake reuses the handle */
  assert_ptr_equal(s, s2);
  a = fake_work(s2, "on device 1", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &ls, &lc), DLSYNC_SUCCESS);
  b = fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_true(fake_happens_before(a, b));
  fake_stream_destroy(s2);
}

/* The same reuse, then an order into two captures: the memo's pool is
 * checked with the driver before its event goes into a graph node, so the
 * nodes get an event of the stream's new context. */
/* A stream of device 0 that this thread's memo knows (one exchange with C),
 * destroyed, and its handle made again on device 1 (the fake reuses it):
 * returned, and *lane names it. */
static CUstream stream_reused_on_device_1(dlsync_lane *lane) {
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING), s2;
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  *lane = dlsync_lane_stream(s);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, lane, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS); /* the memo: s -> device 0 */
  fake_stream_destroy(s);
  s2 = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  assert_ptr_equal(s, s2);
  return s2;
}

static void reused_stream_handle_in_two_captures_gets_its_contexts_event(void **state) {
  CUstream c1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING), s2;
  dlsync_lane ls, lc1 = dlsync_lane_stream(c1);
  CUgraphNode dep = NULL;
  CUevent ev;
  CUgraph g1, g2;
  (void)state;
  s2 = stream_reused_on_device_1(&ls);
  assert_int_equal(D->StreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(c1, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &ls, &lc1), DLSYNC_SUCCESS); /* TWO_CAPTURES */
  assert_int_equal(fake_capture_deps(s2, &dep, 1), 1);
  assert_int_equal(fake_node_type(dep), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  ev = fake_node_event(dep);
  g1 = end_capture_ok(c1);
  g2 = end_capture_ok(s2);
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  /* The event is of device 1's context: it records on device 1's streams
   * only. */
  assert_int_equal(D->EventRecord(ev, c1), CUDA_SUCCESS);
  assert_int_not_equal(D->EventRecord(ev, P), CUDA_SUCCESS);
  destroy_graph(g1);
  destroy_graph(g2);
  fake_stream_destroy(s2);
  fake_stream_destroy(c1);
}

static size_t wait_events_of(CUgraph g, CUevent *out, size_t max);

/* The same reuse, then an eager producer ordered into a capture
 * (EAGER_TO_CAPTURE): the event the memo's pool gave fails its record, so
 * it stays, unused, with the capture's hold of that pool (back with the
 * graph), and the wait node gets an event of the stream's new context. */
static void reused_stream_handle_into_a_capture_gets_its_contexts_event(void **state) {
  CUstream c1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING), s2;
  dlsync_lane ls, lc1 = dlsync_lane_stream(c1);
  CUevent ev = NULL;
  CUgraph g;
  (void)state;
  s2 = stream_reused_on_device_1(&ls);
  assert_int_equal(D->StreamBeginCapture(c1, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &ls, &lc1), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
  assert_int_equal(fake_call_count("cuEventRecord"), 2); /* the memo's pool's, then the right one */
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 2); /* a hold of each pool */
  g = end_capture_ok(c1);
  assert_int_equal(wait_events_of(g, &ev, 1), 1);
  assert_int_equal(D->EventRecord(ev, c1), CUDA_SUCCESS); /* device 1's */
  assert_int_not_equal(D->EventRecord(ev, P), CUDA_SUCCESS);
  destroy_graph(g); /* both events back in their pools: the teardown checks */
  fake_stream_destroy(s2);
  fake_stream_destroy(c1);
}

/* ---- C: stream capture ---- */

static void warm_streams_still_notice_a_capture(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2;
  CUgraph g;
  (void)state;
  /* Warm: the thread now has a scratch event and a memo for P and C. */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_work(C, "consume", &n2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_true(fake_graph_has_path(g, n1, n2));
  destroy_graph(g);
  /* And the other way: the consumer starts capturing between begin and end. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  g = end_capture_ok(C);
  destroy_graph(g);
}

static void same_capture_is_edges_only(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode n1, n2, n3;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", &n2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "mutate", &n3);
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_int_equal(fake_graph_count_nodes(g, -1), 3);
  assert_true(fake_graph_has_path(g, n1, n2));
  assert_true(fake_graph_has_path(g, n2, n3));
  destroy_graph(g);
  fake_event_destroy(fork);
}

/* A cold thread: begin's join goes the general path, which remembers the
 * capture, so end reads the consumer alone and hands the producer its set. */
static void eager_consumer_joins_and_is_joined_back(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 1); /* the general path ran */
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_id(C), fake_capture_id(P));
  fake_work(C, "consume", &n2);
  assert_non_null(n2);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamGetCaptureInfo,cuStreamUpdateCaptureDependencies");
  fake_work(P, "mutate", &n3);
  end_join_checked(n1, n2, n3);
}

static void join_without_end_leaves_capture_unjoined(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", NULL);
  /* No end: the driver refuses to end the capture. */
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  assert_null(g);
  /* The failed end of capture returned both streams to eager; the handle is
   * still released by end (which now orders them eagerly). */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
}

static void eager_producer_capturing_consumer_gets_a_wait_node(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n2;
  CUgraph g;
  CUevent ev;
  uint64_t produce, later;
  dlsync__pool_stats ps;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", &n2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_non_null(strstr(dlsync_last_error(), "not launched"));
  later = fake_work(P, "after", NULL);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(fake_graph_count_nodes(g, -1), 2);
  /* The wait node's event was recorded on P after the producer's work. */
  {
    CUgraphNode nodes[4];
    size_t n = 4;
    assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
    ev = NULL;
    for (size_t i = 0; i < n; i++)
      if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
        ev = fake_node_event(nodes[i]);
        assert_true(fake_graph_has_path(g, nodes[i], n2));
      }
  }
  assert_non_null(ev);
  assert_int_equal(fake_event_get_state(ev), FAKE_EVENT_EAGER);
  assert_true(fake_happens_before(produce, fake_event_op(ev)));
  assert_true(fake_happens_before(fake_event_op(ev), later));
  /* Owned by the graph until it is gone. */
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 1);
  destroy_graph(g);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 0);
}

/* A capture whose frontier is longer than dlsync copies (more than
 * DLSYNC__DEPS_INLINE nodes): TWO_CAPTURES hands no dependencies to the
 * driver (the external record follows the stream's own), so checking the
 * memo's pool (cuStreamGetCtx, a call on the stream) reads nothing again,
 * and the record node still follows every node of the frontier. A failed
 * read is the driver's error, with nothing added. */
static void long_capture_frontier_needs_no_second_read(void **state) {
  enum { SIDES = DLSYNC__DEPS_INLINE + 2 };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  side_frontier fr;
  CUgraphNode rec = NULL;
  CUgraph g1, g2;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  side_frontier_make(&fr, P, SIDES); /* P's frontier: SIDES nodes of side streams */
  /* The producer's read failing: the driver's error, nothing added. */
  fake_fail_nth("cuStreamGetCaptureInfo", 2, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamGetCaptureInfo"));
  assert_int_equal(fake_capture_deps(P, NULL, 0), SIDES);
  assert_int_equal(fake_capture_deps(C, NULL, 0), 0);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* TWO_CAPTURES */
  /* Both lanes read once; the holds and the event made (the first order of
   * these captures); the two external calls. */
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,cuStreamGetCtx,"
                      "cuUserObjectCreate,cuGraphRetainUserObject,cuUserObjectCreate,"
                      "cuGraphRetainUserObject,cuCtxPushCurrent,cuEventCreate,cuCtxPopCurrent,"
                      "cuEventRecordWithFlags,cuStreamWaitEvent");
  assert_int_equal(fake_capture_deps(P, &rec, 1), 1);
  assert_int_equal(fake_node_type(rec), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  g2 = end_capture_ok(C);
  g1 = end_capture_ok(P);
  for (int i = 0; i < SIDES; i++)
    assert_true(fake_graph_has_edge(g1, fr.work[i], rec));
  destroy_graph(g1);
  destroy_graph(g2);
  side_frontier_free(&fr);
}

/* The rows that hand a capture's dependencies to a node they add
 * (BUILT_TO_CAPTURE: the wait node, by hand) read a frontier longer than
 * dlsync copies again after checking the memo's pool (cuStreamGetCtx, a call
 * on the stream: the driver's array is valid only until then), and only
 * then: the pool came from the memo, with no call before the check. A
 * failure of that read is the driver's error, with nothing added. The wait
 * node follows every node of the frontier (under ASan a stale array is a use
 * after free in the fake). */
static void long_capture_frontier_is_read_again_before_its_node(void **state) {
  enum { SIDES = DLSYNC__DEPS_INLINE + 2 };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lb;
  side_frontier fr;
  CUgraphNode wait = NULL, bdeps[2];
  CUgraph g1, gb;
  (void)state;
  warm_pair(&lp, &lc, 0); /* P's pool in the memo */
  assert_int_equal(D->GraphCreate(&gb, 0), CUDA_SUCCESS);
  bdeps[0] = fake_graph_add_work(gb, NULL, 0, "built's own");
  lb = dlsync_lane_graph(gb, bdeps, 1, 2);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  side_frontier_make(&fr, P, SIDES); /* P's frontier: SIDES nodes of side streams */
  /* The read after cuStreamGetCtx failing: the driver's error, nothing added. */
  fake_log_reset();
  fake_fail_nth("cuStreamGetCaptureInfo", 2, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lb, &lp), DLSYNC_ERROR_DRIVER);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamGetCaptureInfo"));
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 1);
  assert_int_equal(fake_capture_deps(P, NULL, 0), SIDES);
  assert_int_equal(fake_graph_count_nodes(gb, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lb, &lp), DLSYNC_SUCCESS); /* BUILT_TO_CAPTURE */
  /* P read, the memo's pool checked, P read again: no other read. */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 2);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 1);
  assert_int_equal(fake_capture_deps(P, &wait, 1), 1);
  assert_int_equal(fake_node_type(wait), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_int_equal(fake_graph_count_nodes(gb, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  g1 = end_capture_ok(P);
  for (int i = 0; i < SIDES; i++)
    assert_true(fake_graph_has_edge(g1, fr.work[i], wait));
  destroy_graph(g1);
  destroy_graph(gb);
  side_frontier_free(&fr);
}

static size_t graph_owned_now(void);

/* CAPTURE_TO_BUILT puts its record node into the capture by an external
 * record (cuEventRecordWithFlags, no node added by hand, no dependency
 * update, so a long frontier is read once): the record node follows every
 * node of the frontier and the capture's next node follows it; the built
 * graph's wait node waits for the same event, which both graphs hold until
 * both are gone. A failed external record is the driver's error naming the
 * call, the capture and the graph, with nothing added; the capture goes on. */
static void capture_to_built_records_by_the_external_flag(void **state) {
  enum { SIDES = DLSYNC__DEPS_INLINE + 2 };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lb;
  side_frontier fr;
  CUgraphNode rec = NULL, next = NULL, own, bdeps[2];
  CUevent waited = NULL;
  char capture[48];
  CUgraph g1, gb;
  (void)state;
  warm_pair(&lp, &lc, 0); /* P's pool in the memo */
  assert_int_equal(D->GraphCreate(&gb, 0), CUDA_SUCCESS);
  own = bdeps[0] = fake_graph_add_work(gb, NULL, 0, "built's own");
  lb = dlsync_lane_graph(gb, bdeps, 1, 2);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  snprintf(capture, sizeof capture, "capture %llu", (unsigned long long)fake_capture_id(P));
  side_frontier_make(&fr, P, SIDES);
  fake_log_reset();
  fake_fail_nth("cuEventRecordWithFlags", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &lb), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_non_null(strstr(dlsync_last_error(), "cuEventRecordWithFlags"));
  assert_non_null(strstr(dlsync_last_error(), capture));
  assert_non_null(strstr(dlsync_last_error(), "graph"));
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_deps(P, NULL, 0), SIDES);
  assert_int_equal(fake_graph_count_nodes(gb, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_ptr_equal(lb.deps[0], own); /* the frontier unchanged */
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lb), DLSYNC_SUCCESS); /* CAPTURE_TO_BUILT */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 1);
  assert_int_equal(fake_call_count("cuEventRecordWithFlags"), 1);
  assert_int_equal(fake_call_count("cuGraphAddEventRecordNode"), 0);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 1);
  assert_int_equal(fake_capture_deps(P, &rec, 1), 1);
  assert_int_equal(fake_node_type(rec), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_int_equal(lb.ndeps, 1);
  assert_int_equal(fake_node_type(lb.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  waited = fake_node_event(lb.deps[0]);
  assert_ptr_equal(waited, fake_node_event(rec));
  assert_true(fake_graph_has_edge(gb, own, lb.deps[0]));
  fake_work(P, "next", &next);
  g1 = end_capture_ok(P);
  for (int i = 0; i < SIDES; i++)
    assert_true(fake_graph_has_edge(g1, fr.work[i], rec));
  assert_true(fake_graph_has_edge(g1, rec, next));
  destroy_graph(g1);
  assert_int_not_equal(graph_owned_now(), 0); /* the built graph still holds it */
  destroy_graph(gb);
  assert_int_equal(graph_owned_now(), 0);
  side_frontier_free(&fr);
}

/* TWO_CAPTURES' two calls failing: the driver's error, naming the call, the
 * node it was adding and both streams; neither capture harmed (both end
 * cleanly), and the event comes back with the graphs (the teardown checks
 * the pool). A failed wait leaves the record node alone in the producer's
 * graph, waited for by nothing. */
static void two_captures_external_calls_failing_say_which(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  char want_p[32], want_c[32];
  CUgraph g1, g2;
  (void)state;
  snprintf(want_p, sizeof want_p, "%p", (void *)P);
  snprintf(want_c, sizeof want_c, "%p", (void *)C);
  for (int which = 0; which < 2; which++) {
    const char *call = which == 0 ? "cuEventRecordWithFlags" : "cuStreamWaitEvent";
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    fake_work(P, "produce", NULL);
    fake_fail_nth(call, 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
    assert_non_null(strstr(dlsync_last_error(), call));
    assert_non_null(strstr(dlsync_last_error(), which == 0 ? "adding an event-record node"
                                                           : "adding an event-wait node"));
    assert_non_null(strstr(dlsync_last_error(), want_p));
    assert_non_null(strstr(dlsync_last_error(), want_c));
    fake_fail_clear();
    g2 = end_capture_ok(C);
    g1 = end_capture_ok(P);
    assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), which);
    assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
    destroy_graph(g1);
    destroy_graph(g2);
  }
}

static void two_captures_get_record_and_wait_nodes(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3, rec = NULL, wait = NULL;
  CUgraph g1, g2;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", &n2);
  fake_work(P, "next", &n3);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  g2 = end_capture_ok(C);
  g1 = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  {
    CUgraphNode nodes[8];
    size_t n = 8;
    assert_int_equal(D->GraphGetNodes(g1, nodes, &n), CUDA_SUCCESS);
    for (size_t i = 0; i < n; i++)
      if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_EVENT_RECORD)
        rec = nodes[i];
    n = 8;
    assert_int_equal(D->GraphGetNodes(g2, nodes, &n), CUDA_SUCCESS);
    for (size_t i = 0; i < n; i++)
      if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
        wait = nodes[i];
  }
  assert_ptr_equal(fake_node_event(rec), fake_node_event(wait));
  assert_true(fake_graph_has_path(g1, n1, rec));
  assert_true(fake_graph_has_path(g1, rec, n3)); /* in the chain, not hanging off */
  assert_true(fake_graph_has_path(g2, wait, n2));
  destroy_graph(g1);
  {
    dlsync__pool_stats ps;
    dlsync__pool_stats_get(&ps, &ctx->pools);
    assert_int_equal(ps.graph_owned, 1); /* g2 still holds it */
  }
  destroy_graph(g2);
}

/* Orders both ways between two captures, past a hold's own items and its
 * first chunk: each event is a pair that both captures hold, so it comes
 * back only when the second graph is gone, whichever goes first; one hold
 * (one user object) per capture. */
static void two_captures_both_ways_hold_each_event_until_both_graphs_are_gone(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync__pool_stats ps;
  CUgraph gp, gc;
  const int n = 150;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  for (int i = 0; i < n; i++) {
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_order(ctx, &lc, &lp), DLSYNC_SUCCESS);
  }
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 2);
  gc = end_capture_ok(C);
  gp = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_EVENT_RECORD), n);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_WAIT_EVENT), n);
  assert_int_equal(fake_graph_count_nodes(gc, CU_GRAPH_NODE_TYPE_EVENT_RECORD), n);
  assert_int_equal(fake_graph_count_nodes(gc, CU_GRAPH_NODE_TYPE_WAIT_EVENT), n);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 2 * n);
  destroy_graph(gc); /* the consumer's first this time */
  fake_run_destructors();
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 2 * n); /* gp still holds every pair */
  assert_int_equal(fake_dangling_event_uses(), 0);
  destroy_graph(gp); /* the teardown checks that all are back */
}

/* Two threads ordering into one capture: each makes a hold of its own (a
 * user object each), and the graph gives back every event of both. */
typedef struct orders_into {
  int n;
  dlsync_status st;
} orders_into;

static void *thread_orders_into_c(void *p) {
  orders_into *o = p;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  o->st = DLSYNC_SUCCESS;
  for (int i = 0; i < o->n && o->st == DLSYNC_SUCCESS; i++)
    o->st = dlsync_order(ctx, &lp, &lc);
  return NULL;
}

static void each_thread_holds_its_events_in_a_capture_through_its_own_hold(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  orders_into o = {20, DLSYNC_ERROR_INVALID_ARGUMENT};
  dlsync__pool_stats ps;
  pthread_t th;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  for (int i = 0; i < 20; i++)
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
  assert_int_equal(pthread_create(&th, NULL, thread_orders_into_c, &o), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(o.st, DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 2);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 40);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 40);
  destroy_graph(g);
}

/* The pool's check of a hold a thread remembers: a hold given back, or made
 * again (the same memory, recycled), takes nothing in its old life; a pair
 * comes back when its second hold does. */
static void a_hold_takes_only_in_its_own_life(void **state) {
  dlsync__pool *pool = NULL;
  dlsync__hold *h = NULL, *h2 = NULL, *h3 = NULL;
  uint64_t life = 0, life2 = 0, life3 = 0;
  dlsync__pool_stats ps;
  CUcontext cu = NULL;
  CUevent ev = NULL, pair = NULL;
  (void)state;
  assert_int_equal(D->StreamGetCtx(P, &cu), CUDA_SUCCESS);
  assert_int_equal(dlsync__pool_for_cuctx(&pool, &ctx->pools, cu), DLSYNC_SUCCESS);
  assert_int_equal(dlsync__hold_new(&h, &life, pool), DLSYNC_SUCCESS);
  assert_int_equal(
      dlsync__hold_take(&ev, pool, (dlsync__hold_life){h, life}, (dlsync__hold_life){NULL, 0}),
      DLSYNC_SUCCESS);
  assert_non_null(ev);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 1);
  dlsync__hold_release(h);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 0);
  assert_int_equal(
      dlsync__hold_take(&ev, pool, (dlsync__hold_life){h, life}, (dlsync__hold_life){NULL, 0}),
      DLSYNC_SUCCESS);
  assert_null(ev); /* given back: stale */
  assert_int_equal(dlsync__hold_new(&h2, &life2, pool), DLSYNC_SUCCESS);
  assert_ptr_equal(h2, h); /* recycled */
  assert_true(life2 != life);
  assert_int_equal(
      dlsync__hold_take(&ev, pool, (dlsync__hold_life){h, life}, (dlsync__hold_life){NULL, 0}),
      DLSYNC_SUCCESS);
  assert_null(ev); /* its old life */
  assert_int_equal(dlsync__hold_new(&h3, &life3, pool), DLSYNC_SUCCESS);
  assert_int_equal(
      dlsync__hold_take(&ev, pool, (dlsync__hold_life){h2, life2}, (dlsync__hold_life){NULL, 0}),
      DLSYNC_SUCCESS);
  assert_non_null(ev);
  assert_int_equal(dlsync__hold_take(&pair, pool, (dlsync__hold_life){h2, life2},
                                     (dlsync__hold_life){h3, life3}),
                   DLSYNC_SUCCESS);
  assert_non_null(pair);
  assert_ptr_not_equal(pair, ev);
  assert_int_equal(
      dlsync__hold_take(&ev, pool, (dlsync__hold_life){h3, life3}, (dlsync__hold_life){h, life}),
      DLSYNC_SUCCESS);
  assert_null(ev); /* one of the two stale: nothing taken */
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 2);
  dlsync__hold_release(h2); /* its own event back, the pair still h3's */
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 1);
  dlsync__hold_release(h3);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 0);
}

static size_t graph_owned_now(void) {
  dlsync__pool_stats ps;
  dlsync__pool_stats_get(&ps, &ctx->pools);
  return ps.graph_owned;
}

/* An event of two captures needs room in both holds: with the consumer's
 * hold full of its own events (16, from an eager producer), each allocation
 * of a first TWO_CAPTURES order fails in turn (the producer's hold, the
 * pair, the consumer's chunk): DLSYNC_ERROR_OUT_OF_MEMORY, nothing held, no
 * node, both captures going on; then it goes through. */
static void a_pair_needs_room_in_both_holds(void **state) {
  CUstream e = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane le = dlsync_lane_stream(e), lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraph gp, gc;
  unsigned n, faults = 0;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 16; i++) /* EAGER_TO_CAPTURE: the consumer's hold is full */
    assert_int_equal(dlsync_order(ctx, &le, &lc), DLSYNC_SUCCESS);
  assert_int_equal(graph_owned_now(), 16);
  for (n = 1; n < 20; n++) {
    dlsync_status st;
    fake_fail_alloc(n);
    st = dlsync_order(ctx, &lp, &lc); /* TWO_CAPTURES */
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    faults++;
    assert_int_equal(st, DLSYNC_ERROR_OUT_OF_MEMORY);
    assert_non_null(strstr(dlsync_last_error(), "out of memory"));
    assert_int_equal(graph_owned_now(), 16);
    assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
    assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  }
  assert_true(faults >= 2); /* at least the pair and the chunk */
  assert_int_equal(graph_owned_now(), 17);
  gc = end_capture_ok(C);
  gp = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  assert_int_equal(fake_graph_count_nodes(gc, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 17);
  destroy_graph(gp);
  fake_run_destructors();
  assert_int_equal(graph_owned_now(), 17); /* the pair is still the consumer's */
  destroy_graph(gc);
  fake_stream_destroy(e);
}

/* A capture and a graph built by hand share an event (CAPTURE_TO_BUILT, then
 * BUILT_TO_CAPTURE): the capture's hold takes a reference to the held event,
 * the built graph's user object another; it comes back when the second of
 * the two graphs is gone, whichever that is. */
static void a_capture_and_a_built_graph_share_an_event_until_both_are_gone(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  for (int built_first = 0; built_first < 2; built_first++) {
    CUgraph gb, gp;
    CUgraphNode deps[4];
    dlsync_lane lb;
    assert_int_equal(D->GraphCreate(&gb, 0), CUDA_SUCCESS);
    assert_int_equal(D->GraphAddEmptyNode(&deps[0], gb, NULL, 0), CUDA_SUCCESS);
    lb = dlsync_lane_graph(gb, deps, 1, 4);
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    assert_int_equal(dlsync_order(ctx, &lp, &lb), DLSYNC_SUCCESS); /* CAPTURE_TO_BUILT */
    assert_int_equal(dlsync_order(ctx, &lb, &lp), DLSYNC_SUCCESS); /* BUILT_TO_CAPTURE */
    gp = end_capture_ok(P);
    assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
    assert_int_equal(fake_graph_count_nodes(gp, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
    assert_int_equal(fake_graph_count_nodes(gb, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
    assert_int_equal(fake_graph_count_nodes(gb, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
    assert_int_equal(graph_owned_now(), 2);
    destroy_graph(built_first ? gb : gp);
    fake_run_destructors();
    assert_int_equal(graph_owned_now(), 2); /* the other graph holds both */
    destroy_graph(built_first ? gp : gb);
    fake_run_destructors();
    assert_int_equal(graph_owned_now(), 0);
  }
}

/* Captured graphs that outlive their dlsync context: destroying the context
 * succeeds, the graphs keep their events (their holds keep the pool), and
 * once the graphs are gone every event the context made is destroyed (by the
 * library's next collection of orphans); nothing leaks. */
static void capture_graphs_outliving_their_context_lose_no_event_and_leak_none(void **state) {
  CUstream e = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane le = dlsync_lane_stream(e), lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_context *c2 = NULL;
  unsigned before = fake_live_events();
  CUgraph gp, gc;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 20; i++) {
    assert_int_equal(dlsync_order(c2, &le, &lc), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
    assert_int_equal(dlsync_order(c2, &lp, &lc), DLSYNC_SUCCESS); /* TWO_CAPTURES */
  }
  gc = end_capture_ok(C);
  gp = end_capture_ok(P);
  assert_true(fake_live_events() >= before + 40);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  assert_true(fake_live_events() >= before + 40); /* the graphs' */
  assert_int_equal(fake_dangling_event_uses(), 0);
  destroy_graph(gp);
  fake_run_destructors();
  destroy_graph(gc);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_events(), before);
  fake_stream_destroy(e);
}

/* A thread's remembered hold that is not live any more (its graph gave it
 * back while the thread still saw the capture: the graph destroyed by another
 * thread) is found stale by the pool, forgotten, and made again: the event
 * goes into the new hold. White-box: the graph layer is called with the old
 * capture's id and a graph that stands in for its capture graph. */
/* As if C were still in capture `id` (ended, its graph destroyed: the
 * thread's hold of it given back), with `stand_in` as its graph: an event for
 * that capture makes a new hold (one user object) and takes one event. */
static void event_for_stale_capture(dlsync__lane_now *lane, dlsync_lane *lc, uint64_t id,
                                    CUgraph stand_in, dlsync__pool *pool) {
  CUevent ev = NULL;
  memset(lane, 0, sizeof *lane);
  lane->kind = DLSYNC_LANE_CAPTURING;
  lane->stream = C;
  lane->capture_id = id;
  lane->graph = stand_in;
  lane->lane = lc;
  lane->role = "then";
  fake_log_reset();
  assert_int_equal(dlsync__graph_capture_event(&ev, dlsync__thread_get(), &ctx->pools, pool,
                                               (dlsync__lane_pair){lane, NULL}),
                   DLSYNC_SUCCESS);
  assert_non_null(ev);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 1); /* a new hold */
}

static void a_stale_hold_is_made_again(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync__lane_now lane;
  dlsync__pool *pool = NULL;
  CUcontext cu = NULL;
  CUgraph stand_in;
  uint64_t id;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  id = fake_capture_id(C);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* the thread's hold of it */
  destroy_graph(end_capture_ok(C));                              /* the hold given back */
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(D->StreamGetCtx(P, &cu), CUDA_SUCCESS);
  assert_int_equal(dlsync__pool_for_cuctx(&pool, &ctx->pools, cu), DLSYNC_SUCCESS);
  assert_int_equal(D->GraphCreate(&stand_in, 0), CUDA_SUCCESS);
  event_for_stale_capture(&lane, &lc, id, stand_in, pool);
  assert_int_equal(graph_owned_now(), 1);
  destroy_graph(stand_in); /* its hold gives the event back */
  assert_int_equal(graph_owned_now(), 0);
}

/* The events of a capture's wait nodes, in the order the nodes were made. */
static size_t wait_events_of(CUgraph g, CUevent *out, size_t max) {
  CUgraphNode nodes[512];
  size_t n = 512, k = 0;
  assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  for (size_t i = 0; i < n && k < max; i++)
    if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
      out[k++] = fake_node_event(nodes[i]);
  return k;
}

/* A capture made again (as a training step is) takes the same events in the
 * same order as the last time: its hold gives them back last first, and the
 * pool hands out the last given back first. Past the hold's own items, into
 * two chunks. */
static void a_capture_made_again_records_the_same_events_in_order(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  enum { N = 200 };
  static CUevent first[N], again[N];
  (void)state;
  for (int round = 0; round < 3; round++) {
    CUgraph g;
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    for (int i = 0; i < N; i++)
      assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* EAGER_TO_CAPTURE */
    g = end_capture_ok(C);
    assert_int_equal(wait_events_of(g, round == 0 ? first : again, N), N);
    destroy_graph(g);
    fake_run_destructors();
    if (round == 0)
      continue;
    for (int i = 0; i < N; i++)
      assert_ptr_equal(again[i], first[i]);
  }
}

/* ---- the thread's reserve of a capture's events ---- */

/* The pool of P's context (device 0). */
static dlsync__pool *pool_of_p(void) {
  dlsync__pool *pool = NULL;
  CUcontext cu = NULL;
  assert_int_equal(D->StreamGetCtx(P, &cu), CUDA_SUCCESS);
  assert_int_equal(dlsync__pool_for_cuctx(&pool, &ctx->pools, cu), DLSYNC_SUCCESS);
  return pool;
}

/* The calling thread's memo of its hold of `pool` for capture `id` (NULL
 * when it remembers none): its reserve is reserve[0..nreserve). */
static dlsync__hold_memo *reserve_memo(dlsync__pool *pool, uint64_t id) {
  return dlsync__hold_find(dlsync__graph_thread_of(dlsync__thread_get()), ctx->pools.generation,
                           pool, id);
}

/* Device 0's pool made warm: 40 EAGER_TO_CAPTURE orders into a capture of C,
 * its graph destroyed, so that 40 events are free for the next capture. */
static void warm_capture_pool(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 40; i++)
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  destroy_graph(end_capture_ok(C));
  assert_int_equal(graph_owned_now(), 0);
}

/* warm_capture_pool, then (*before: the pool's stats then, when non-NULL) a
 * capture of C begun and n EAGER_TO_CAPTURE orders into it; its id. */
static uint64_t orders_into_a_new_capture(int n, dlsync__pool_stats *before) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  uint64_t id;
  warm_capture_pool();
  if (before != NULL)
    dlsync__pool_stats_get(before, &ctx->pools);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  id = fake_capture_id(C);
  for (int i = 0; i < n; i++)
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  return id;
}

static bool event_in(CUevent ev, const CUevent *set, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (set[i] == ev)
      return true;
  return false;
}

/* A capture's hold takes, for each order that finds the thread's reserve
 * empty, as many free events as the thread has taken for that capture so
 * far (1, 1, 2, 4, ... up to DLSYNC__HOLD_RESERVE each time), so that it
 * never holds more unused events than it has used; only events already
 * free: fewer when fewer are free, and with none free exactly one, made.
 * Every wait node has its own event, and the graph gives them all back, the
 * unused ones too. */
_Static_assert((DLSYNC__HOLD_RESERVE & (DLSYNC__HOLD_RESERVE - 1)) == 0,
               "the test below counts batches that double up to the cap");

/* The smallest power of two at or above k (k >= 1). */
static size_t pow2_at_least(size_t k) {
  size_t p = 1;
  while (p < k)
    p *= 2;
  return p;
}

static void a_capture_takes_its_events_in_growing_batches(void **state) {
  /* Batches 1, 1, 2, 4, ..., CAP take 2 CAP events in all; the next takes
   * CAP (the cap: it has taken 2 CAP so far); the one after wants CAP and
   * finds only 5 free. */
  enum { CAP = DLSYNC__HOLD_RESERVE, FREE = 3 * CAP + 5, N = FREE + 3 };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync__pool_stats before, after;
  CUevent evs[N + 1];
  CUgraph g;
  (void)state;
  /* A cold pool: nothing free, so each order makes its one event, and the
   * capture holds exactly what it used. */
  dlsync__pool_stats_get(&before, &ctx->pools);
  assert_int_equal(before.free_events, 0);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  for (size_t k = 1; k <= FREE; k++) {
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(graph_owned_now(), k);
    assert_int_equal(fake_call_count("cuEventCreate"), k);
  }
  destroy_graph(end_capture_ok(C));
  dlsync__pool_stats_get(&before, &ctx->pools);
  assert_int_equal(before.free_events, FREE);
  /* Warm: batches off the free list, no event made while it has some. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  for (size_t k = 1; k <= N; k++) {
    size_t owned;
    assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
    owned = graph_owned_now();
    if (k <= 2 * CAP) /* the k-th order took a batch at 1, 2, 3, 5, 9, ... */
      assert_int_equal(owned, pow2_at_least(k));
    else if (k <= 3 * CAP) /* one batch of CAP, not of the 2 CAP taken so far */
      assert_int_equal(owned, 3 * CAP);
    else if (k <= FREE) /* the next one wants CAP, 5 are free: those */
      assert_int_equal(owned, FREE);
    else /* none free: exactly one made each time, nothing kept */
      assert_int_equal(owned, k);
    assert_true(owned - k <= k); /* never more unused than used */
    assert_true(owned - k < DLSYNC__HOLD_RESERVE);
    assert_int_equal(fake_call_count("cuEventCreate"), k <= FREE ? 0 : k - FREE);
  }
  g = end_capture_ok(C);
  assert_int_equal(wait_events_of(g, evs, N + 1), N);
  for (size_t i = 0; i < N; i++)
    assert_false(event_in(evs[i], evs, i)); /* distinct */
  destroy_graph(g);
  assert_int_equal(graph_owned_now(), 0);
  dlsync__pool_stats_get(&after, &ctx->pools);
  assert_int_equal(after.free_events, before.free_events + (N - FREE)); /* and those made */
  assert_int_equal(after.created, before.created + (N - FREE));
}

/* A thread's reserve for a capture whose hold was given back (its graph
 * destroyed while the thread still names the capture: the stand-in graph,
 * as in a_stale_hold_is_made_again) is dropped: its events are back in the
 * pool, the liveness check says so, and the event comes from a new hold. */
static void a_reserve_is_dropped_with_its_hold(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync__pool *pool = pool_of_p();
  dlsync__pool_stats before, now;
  dlsync__hold_memo *m;
  dlsync__lane_now lane;
  CUgraph stand_in;
  uint64_t id;
  (void)state;
  id = orders_into_a_new_capture(5, &before); /* 1, 1, 2, 4 taken: 8, 3 of them not used */
  assert_int_equal(graph_owned_now(), 8);
  m = reserve_memo(pool, id);
  assert_non_null(m);
  assert_int_equal(m->nreserve, 3);
  destroy_graph(end_capture_ok(C)); /* the hold given back, the reserve with it */
  assert_int_equal(graph_owned_now(), 0);
  dlsync__pool_stats_get(&now, &ctx->pools);
  assert_int_equal(now.free_events, before.free_events);
  /* The thread still remembers the reserve; its hold is not live. */
  assert_ptr_equal(reserve_memo(pool, id), m);
  assert_int_equal(m->nreserve, 3);
  assert_false(dlsync__hold_live(m->hold, m->life));
  assert_int_equal(D->GraphCreate(&stand_in, 0), CUDA_SUCCESS);
  event_for_stale_capture(&lane, &lc, id, stand_in, pool);
  assert_int_equal(graph_owned_now(), 1); /* its one event only */
  m = reserve_memo(pool, id);
  assert_non_null(m);
  assert_int_equal(m->nreserve, 0);
  assert_true(dlsync__hold_live(m->hold, m->life));
  destroy_graph(stand_in);
  assert_int_equal(graph_owned_now(), 0);
}

/* An event in a capture's hold, used by a wait node or kept in the thread's
 * reserve, is not on the pool's free list: taking every free event (until
 * the pool makes a new one) never gives one of them. */
static void a_reserved_event_is_never_free_at_the_same_time(void **state) {
  enum { N = 20 };
  dlsync__pool *pool = pool_of_p();
  dlsync__hold_memo *m;
  CUevent held[N + DLSYNC__HOLD_RESERVE], got[64];
  size_t nheld, ngot = 0;
  uint64_t id;
  CUgraph g;
  (void)state;
  id = orders_into_a_new_capture(N, NULL); /* 1, 1, 2, 4, 8, 16 taken: 20 used, 12 kept */
  g = end_capture_ok(C);
  assert_int_equal(wait_events_of(g, held, N), N);
  m = reserve_memo(pool, id);
  assert_non_null(m);
  assert_int_equal(m->nreserve, 12);
  assert_true(dlsync__hold_live(m->hold, m->life)); /* the graph still holds it */
  nheld = N;
  for (unsigned i = 0; i < m->nreserve; i++)
    held[nheld++] = m->reserve[i];
  for (size_t i = 0; i < nheld; i++)
    assert_false(event_in(held[i], held, i));
  assert_int_equal(graph_owned_now(), nheld);
  fake_log_reset();
  while (fake_call_count("cuEventCreate") == 0) {
    assert_true(ngot < 64);
    assert_int_equal(dlsync__pool_get(&got[ngot], pool), DLSYNC_SUCCESS);
    assert_false(event_in(got[ngot], held, nheld));
    ngot++;
  }
  assert_int_equal(ngot, 40 - nheld + 1); /* every free one, then a new one */
  for (size_t i = 0; i < ngot; i++)
    dlsync__pool_put(pool, got[i]);
  destroy_graph(g);
  assert_int_equal(graph_owned_now(), 0);
}

/* An order served from the thread's reserve (no lock, no new event taken)
 * whose external wait fails: the driver's status, a message naming the
 * call, the capturing stream and the capture; the capture goes on, and
 * every event comes back with the graph. A failed record from the reserve
 * likewise names cuEventRecord. */
static void eager_to_capture_from_the_reserve_reports_a_failed_wait(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync__pool *pool = pool_of_p();
  dlsync__pool_stats before, after;
  dlsync__hold_memo *m;
  char capture[48];
  uint64_t id;
  CUgraph g;
  (void)state;
  id = orders_into_a_new_capture(3, &before); /* 1, 1, 2 taken: one kept */
  snprintf(capture, sizeof capture, "capture %llu", (unsigned long long)id);
  m = reserve_memo(pool, id);
  assert_non_null(m);
  assert_int_equal(m->nreserve, 1);
  assert_int_equal(graph_owned_now(), 4);
  fake_log_reset();
  fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_int_equal(m->nreserve, 0);       /* from the reserve */
  assert_int_equal(graph_owned_now(), 4); /* nothing new taken */
  assert_int_equal(fake_call_count("cuEventRecord"), 1);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_call_count("cuEventCreate"), 0);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamWaitEvent"));
  assert_non_null(strstr(dlsync_last_error(), "CUDA_ERROR_UNKNOWN"));
  assert_non_null(strstr(dlsync_last_error(), "capturing"));
  assert_non_null(strstr(dlsync_last_error(), capture));
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_UNKNOWN);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* The capture goes on: 4 more taken, 3 kept; a failed record from the
   * reserve. */
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(graph_owned_now(), 8);
  assert_int_equal(m->nreserve, 3);
  fake_fail_nth("cuEventRecord", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_int_equal(m->nreserve, 2);
  assert_int_equal(graph_owned_now(), 8);
  assert_non_null(strstr(dlsync_last_error(), "cuEventRecord"));
  assert_non_null(strstr(dlsync_last_error(), "first stream"));
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 5);
  destroy_graph(g);
  assert_int_equal(graph_owned_now(), 0);
  dlsync__pool_stats_get(&after, &ctx->pools);
  assert_int_equal(after.free_events, before.free_events);
  assert_int_equal(after.created, before.created);
}

/* As reused_stream_handle_into_a_capture_gets_its_contexts_event, with the
 * thread holding a reserve for the capture in the memo's pool (device 0's,
 * from orders of the stream before its handle was reused on device 1): the
 * fast path's record of a reserved event fails with a context mismatch, the
 * event stays, unused, with the capture's hold of device 0's pool, the
 * memo is forgotten and the general path takes an event of device 1's pool
 * (one record more, a hold of that pool); every event comes back with the
 * graph. */
static void reused_stream_handle_with_a_reserve_gets_its_contexts_event(void **state) {
  CUstream c1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING), s2;
  dlsync_lane ls = dlsync_lane_stream(s), lc = dlsync_lane_stream(C), lc1 = dlsync_lane_stream(c1);
  dlsync__pool *pool0 = pool_of_p();
  dlsync__hold_memo *m;
  CUevent evs[8];
  size_t owned;
  uint64_t id;
  CUgraph g;
  (void)state;
  warm_capture_pool();
  warm_pair(&ls, &lc, 0); /* the memo: s -> device 0's pool */
  assert_int_equal(D->StreamBeginCapture(c1, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  id = fake_capture_id(c1);
  for (int i = 0; i < 5; i++) /* EAGER_TO_CAPTURE, device 0's events: 8 taken, 3 kept */
    assert_int_equal(dlsync_order(ctx, &ls, &lc1), DLSYNC_SUCCESS);
  m = reserve_memo(pool0, id);
  assert_non_null(m);
  assert_int_equal(m->nreserve, 3);
  fake_stream_destroy(s);
  s2 = fake_stream_create(1, CU_STREAM_NON_BLOCKING); /* the fake reuses the handle */
  assert_ptr_equal(s, s2);
  owned = graph_owned_now();
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &ls, &lc1), DLSYNC_SUCCESS);
  assert_int_equal(m->nreserve, 2); /* the fast path's try: kept by the hold, unused */
  assert_int_equal(fake_call_count("cuEventRecord"), 2); /* the reserved one, then the right one */
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 1); /* a hold of device 1's pool */
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  assert_int_equal(graph_owned_now(), owned + 1);
  /* The memo now says device 1: the next order's event is device 1's too,
   * and the device 0 reserve is left alone. */
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &ls, &lc1), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuEventRecord"), 1);
  assert_int_equal(m->nreserve, 2);
  g = end_capture_ok(c1);
  assert_int_equal(wait_events_of(g, evs, 8), 7);
  for (int i = 5; i < 7; i++) { /* device 1's */
    assert_int_equal(D->EventRecord(evs[i], c1), CUDA_SUCCESS);
    assert_int_not_equal(D->EventRecord(evs[i], P), CUDA_SUCCESS);
  }
  destroy_graph(g); /* every event back in its pool: the teardown checks too */
  assert_int_equal(graph_owned_now(), 0);
  fake_stream_destroy(s2);
  fake_stream_destroy(c1);
}

/* ---- B: graphs built by hand ---- */

static void same_built_graph_merges_frontiers(void **state) {
  CUgraph g;
  CUgraphNode m, other, pdeps[4], cdeps[4];
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "produce");
  other = fake_graph_add_work(g, NULL, 0, "consumer's own");
  pdeps[0] = m;
  cdeps[0] = other;
  lp = dlsync_lane_graph(g, pdeps, 1, 4);
  lc = dlsync_lane_graph(g, cdeps, 1, 1);
  fake_log_reset();
  /* Too small for the union: refused, nothing changed. */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(lc.ndeps, 1);
  lc.capacity = 4;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(lc.ndeps, 2);
  assert_ptr_equal(lc.deps[0], other);
  assert_ptr_equal(lc.deps[1], m);
  assert_int_equal(fake_calls_total(), 0);
  lc.deps[0] = fake_graph_add_work(g, lc.deps, lc.ndeps, "consume");
  lc.ndeps = 1;
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(lp.ndeps, 2);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  destroy_graph(g);
}

static void two_built_graphs_get_record_and_wait_nodes(void **state) {
  CUgraph g1, g2;
  CUgraphNode m, pdeps[2], cdeps[2], consume;
  dlsync_lane lp, lc;
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g1, NULL, 0, "produce");
  pdeps[0] = m;
  lp = dlsync_lane_graph(g1, pdeps, 1, 2);
  lc = dlsync_lane_graph(g2, cdeps, 0, 2);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(lp.ndeps, 1);
  assert_int_equal(fake_node_type(lp.deps[0]), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_true(fake_graph_has_edge(g1, m, lp.deps[0]));
  assert_int_equal(lc.ndeps, 1);
  assert_int_equal(fake_node_type(lc.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(lp.deps[0]), fake_node_event(lc.deps[0]));
  consume = fake_graph_add_work(g2, lc.deps, 1, "consume");
  lc.deps[0] = consume;
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  destroy_graph(g1);
  destroy_graph(g2);
}

static void eager_producer_built_consumer(void **state) {
  CUgraph g;
  CUgraphNode cdeps[2];
  dlsync_lane lp = dlsync_lane_stream(P), lc;
  dlsync_exchange *ex = NULL;
  uint64_t produce;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  lc = dlsync_lane_graph(g, cdeps, 0, 2);
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(lc.ndeps, 1);
  assert_int_equal(fake_node_type(lc.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_true(fake_happens_before(produce, fake_event_op(fake_node_event(lc.deps[0]))));
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  destroy_graph(g);
}

static void capture_producer_built_consumer(void **state) {
  CUgraph g1, g2;
  CUgraphNode n1, n3, cdeps[2];
  dlsync_lane lp = dlsync_lane_stream(P), lc;
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  lc = dlsync_lane_graph(g2, cdeps, 0, 2);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(P, "next", &n3);
  assert_int_equal(fake_node_type(lc.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  lc.deps[0] = fake_graph_add_work(g2, lc.deps, 1, "consume");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  g1 = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  destroy_graph(g1);
  destroy_graph(g2);
}

static void built_producer_capture_consumer(void **state) {
  CUgraph g1, g2;
  CUgraphNode m, n2, pdeps[2];
  dlsync_lane lp, lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g1, NULL, 0, "produce");
  pdeps[0] = m;
  lp = dlsync_lane_graph(g1, pdeps, 1, 2);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_work(C, "consume", &n2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  g2 = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  destroy_graph(g1);
  destroy_graph(g2);
}

static void built_producer_eager_consumer_is_refused(void **state) {
  CUgraph g;
  CUgraphNode pdeps[2];
  dlsync_lane lp, lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)0x1;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  pdeps[0] = fake_graph_add_work(g, NULL, 0, "produce");
  lp = dlsync_lane_graph(g, pdeps, 1, 2);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_null(ex);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_graph_count_nodes(g, -1), 1);
  destroy_graph(g);
}

/* ---- errors ---- */

static void bad_lanes_are_refused_before_any_driver_call(void **state) {
  dlsync_lane none, both = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g;
  (void)state;
  memset(&none, 0, sizeof none);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  both.graph = g;
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &none, &lc), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "neither"));
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lc, &both), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "both"));
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, NULL, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_begin(NULL, ctx, &lc, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_begin(&ex, NULL, &lc, &lc), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_end(NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_order(ctx, &none, &lc), DLSYNC_ERROR_INVALID_LANE);
  {
    dlsync_lane gl = dlsync_lane_graph(g, NULL, 1, 1);
    assert_int_equal(dlsync_order(ctx, &lc, &gl), DLSYNC_ERROR_INVALID_ARGUMENT);
  }
  assert_int_equal(fake_calls_total(), 0);
  destroy_graph(g);
}

static void invalidated_capture_is_reported(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)0x1;
  CUevent e = fake_event_create(0, 0);
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "invalidated"));
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  fake_event_destroy(e);
}

/* A warm thread does not ask about the producer at begin: the record on its
 * invalidated capture fails and says so, and nothing is queued. */
static void invalidated_capture_is_reported_when_warm(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent e = fake_event_create(0, 0);
  CUgraph g = NULL;
  (void)state;
  warm_pair(&lp, &lc, 0);
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  ex = (dlsync_exchange *)0x1;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "invalidated"));
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  fake_event_destroy(e);
}

static void legacy_stream_during_blocking_capture(void **state) {
  CUstream blocking = fake_stream_create(0, CU_STREAM_DEFAULT);
  dlsync_lane legacy = dlsync_lane_stream(DLSYNC_STREAM_LEGACY), lc = dlsync_lane_stream(C);
  dlsync_lane nul = dlsync_lane_stream(NULL);
  dlsync_exchange *ex = NULL;
  CUgraph g;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &legacy, &lc),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_non_null(strstr(dlsync_last_error(), "legacy"));
  /* Only the query touched the legacy stream (cuGetErrorName names the error). */
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 1);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 0);
  assert_int_equal(fake_calls_total(), 1 + fake_call_count("cuGetErrorName"));
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lc, &nul),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  /* The capture is intact. */
  assert_int_equal(fake_capture_status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(blocking);
  destroy_graph(g);
  {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  fake_stream_destroy(blocking);
}

static void foreign_dependency_is_named(void **state) {
  CUgraph g, other;
  CUgraphNode deps[2];
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  fake_graph_add_work(g, NULL, 0, "own");
  deps[0] = fake_graph_add_work(other, NULL, 0, "foreign");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lg), DLSYNC_ERROR_FOREIGN_DEPENDENCY);
  assert_non_null(strstr(dlsync_last_error(), "not in its graph"));
  /* The producer's eager record (made first: it tells whether the memo's
   * pool is right) orders nothing by itself; no wait was queued anywhere. */
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(lg.ndeps, 1);
  assert_ptr_equal(lg.deps[0], deps[0]);
  destroy_graph(g);
  destroy_graph(other);
}

static void both_graph_lanes_need_a_current_context(void **state) {
  CUgraph g1, g2;
  CUgraphNode d1[2], d2[2];
  dlsync_lane l1, l2;
  (void)state;
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  l1 = dlsync_lane_graph(g1, d1, 0, 2);
  l2 = dlsync_lane_graph(g2, d2, 0, 2);
  assert_int_equal(dlsync_order(ctx, &l1, &l2), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "current CUDA context"));
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &l1, &l2), DLSYNC_SUCCESS);
  assert_int_equal(fake_node_type(l1.deps[0]), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_int_equal(fake_node_type(l2.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  destroy_graph(g1);
  destroy_graph(g2);
}

/* ---- fault injection: every row of the table, in dlsync_order and in
 * begin/end, each driver call and each allocation ----
 *
 * One scene per row that order and begin can take (end's rows follow from
 * them); the fence's own rows (LAUNCHED_TO_EAGER, REFUSE_CAPTURE_TO_EAGER)
 * are swept by tests/test_fence.c. every_row_is_swept checks the list. */

/* What a lane is when a scene starts. */
typedef enum lane_as {
  AS_EAGER,     /* P (producer) or C (consumer), eager */
  AS_CAPTURE,   /* that stream, in a capture of its own */
  AS_JOINED,    /* consumer: C, forked into the producer's capture */
  AS_SAME,      /* consumer: the producer's stream */
  AS_BUILT,     /* a graph built by hand, of its own */
  AS_SAME_BUILT /* consumer: another lane of the producer's graph */
} lane_as;

typedef struct scene {
  const char *name;
  lane_as producer, consumer;
  uint32_t flags;    /* begin's (dlsync_order has none: such scenes are begin's only) */
  dlsync__row begin; /* the row of begin, and of dlsync_order */
  dlsync__row end;   /* the row of end; DLSYNC__ROW_COUNT: begin refuses */
} scene;

#define ROW(r) DLSYNC__ROW_##r
#define STABLE DLSYNC_EXCHANGE_CAPTURE_STABLE
static const scene scenes[] = {
    {"same stream", AS_EAGER, AS_SAME, 0, ROW(SAME_STREAM), ROW(SAME_STREAM)},
    {"eager", AS_EAGER, AS_EAGER, 0, ROW(EAGER_EAGER), ROW(EAGER_EAGER)},
    {"eager, stable", AS_EAGER, AS_EAGER, STABLE, ROW(EAGER_EAGER), ROW(EAGER_EAGER)},
    {"same capture", AS_CAPTURE, AS_JOINED, 0, ROW(SAME_CAPTURE), ROW(SAME_CAPTURE)},
    {"join", AS_CAPTURE, AS_EAGER, 0, ROW(JOIN), ROW(SAME_CAPTURE)},
    {"join, stable", AS_CAPTURE, AS_EAGER, STABLE, ROW(JOIN), ROW(SAME_CAPTURE)},
    {"eager to capture", AS_EAGER, AS_CAPTURE, 0, ROW(EAGER_TO_CAPTURE), ROW(REFUSE_END_TO_EAGER)},
    {"eager to built", AS_EAGER, AS_BUILT, 0, ROW(EAGER_TO_BUILT), ROW(REFUSE_END_TO_EAGER)},
    {"two captures", AS_CAPTURE, AS_CAPTURE, 0, ROW(TWO_CAPTURES), ROW(REFUSE_END_CROSS)},
    {"capture to built", AS_CAPTURE, AS_BUILT, 0, ROW(CAPTURE_TO_BUILT), ROW(REFUSE_END_CROSS)},
    {"built to capture", AS_BUILT, AS_CAPTURE, 0, ROW(BUILT_TO_CAPTURE), ROW(REFUSE_END_CROSS)},
    {"two built", AS_BUILT, AS_BUILT, 0, ROW(TWO_BUILT), ROW(REFUSE_END_CROSS)},
    {"same built", AS_BUILT, AS_SAME_BUILT, 0, ROW(SAME_BUILT), ROW(SAME_BUILT)},
    {"built to eager", AS_BUILT, AS_EAGER, 0, ROW(REFUSE_BUILT_TO_EAGER), DLSYNC__ROW_COUNT},
};
#undef ROW
#undef STABLE
#define NSCENES (sizeof scenes / sizeof scenes[0])

typedef enum sweep_op { SWEEP_ORDER, SWEEP_EXCHANGE } sweep_op;

/* What the sweeps fail: the nth driver call or the nth allocation. */
static fake_fault sweep_kind = FAKE_FAULT_CALL;

static dlsync_status row_status(dlsync__row row) {
  return row != DLSYNC__ROW_COUNT && dlsync__row_is_refusal(row) ? DLSYNC_ERROR_CAPTURE_ORDER
                                                                 : DLSYNC_SUCCESS;
}

/* Record and wait nodes in the scene's graphs (P's and C's captures, the
 * built graphs), each graph counted once. */
static size_t event_nodes(CUgraph g1, CUgraph g2) {
  CUgraph gs[4] = {fake_capture_graph(P), fake_capture_graph(C), g1, g2};
  size_t n = 0;
  for (int i = 0; i < 4; i++) {
    bool seen = gs[i] == NULL;
    for (int j = 0; j < i && !seen; j++)
      seen = gs[j] == gs[i];
    if (!seen)
      n += fake_graph_count_nodes(gs[i], CU_GRAPH_NODE_TYPE_EVENT_RECORD) +
           fake_graph_count_nodes(gs[i], CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  }
  return n;
}

/* Ends the capture s began, which must end cleanly when `clean`. */
static void end_capture_of(CUstream s, bool clean) {
  CUgraph g = NULL;
  CUresult r = D->StreamEndCapture(s, &g);
  if (g != NULL)
    destroy_graph(g);
  if (clean && r != CUDA_SUCCESS)
    fail_msg("cuStreamEndCapture: %s", dlsync__driver_error_name(D, r));
}

/* Work on a lane after it was ordered: a kernel on its stream, or a node
 * after its frontier, which becomes the frontier. Returns the eager op. */
static uint64_t lane_work(dlsync_lane *l, const char *what) {
  if (l->kind == DLSYNC_LANE_STREAM)
    return fake_work(l->stream, what, NULL);
  l->deps[0] = fake_graph_add_work(l->graph, l->deps, l->ndeps, what);
  l->ndeps = 1;
  return 0;
}

/* One dlsync_order (op ORDER) or one begin and end (op EXCHANGE) of the
 * scene, with driver call or allocation n failing (n = 0: none); cold: on a
 * context of its own (no pool, no memo, the general path), else on the
 * fixture's, warm. Checks: the fault surfaces as a status saying so, or (an
 * allocation) the library did without it; done as without a fault, the row
 * it took added its nodes and ordered the work; whatever happened, every
 * capture ends, every graph, user object and event goes, no call was
 * illegal. Returns true when the fault was reached. */
static bool run_scene(const scene *sc, sweep_op op, bool cold, unsigned n) {
  dlsync_context *c = ctx;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphNode pdeps[4], cdeps[4];
  dlsync_status want_b = row_status(sc->begin), want_e = row_status(sc->end), sb, se = want_e;
  size_t nodes0, nodes_b, nodes_e = 0;
  uint64_t produce, consume = 0, mutate;
  bool built = sc->producer == AS_BUILT || sc->consumer == AS_BUILT;
  bool reached, as_without;
  if (cold)
    assert_int_equal(dlsync__context_create_with_driver(&c, NULL, D), DLSYNC_SUCCESS);
  if (built) /* two graph lanes take the current context's pool */
    assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  if (sc->producer == AS_CAPTURE) {
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  } else if (sc->producer == AS_BUILT) {
    assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
    pdeps[0] = fake_graph_add_work(g1, NULL, 0, "produce");
    lp = dlsync_lane_graph(g1, pdeps, 1, 4);
  }
  switch (sc->consumer) {
  case AS_CAPTURE:
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    break;
  case AS_JOINED:
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
    break;
  case AS_SAME:
    lc = lp;
    break;
  case AS_BUILT:
    assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
    lc = dlsync_lane_graph(g2, cdeps, 0, 4);
    break;
  case AS_SAME_BUILT:
    cdeps[0] = fake_graph_add_work(g1, NULL, 0, "consumer's own");
    lc = dlsync_lane_graph(g1, cdeps, 1, 4);
    break;
  default:
    break;
  }
  produce = fake_work(P, "produce", NULL);
  nodes0 = event_nodes(g1, g2);

  if (n > 0)
    fake_fail_fault(sweep_kind, n);
  if (op == SWEEP_ORDER) {
    sb = dlsync_order(c, &lp, &lc);
  } else {
    sb = dlsync_exchange_begin_flags(&ex, c, &lp, &lc, sc->flags);
    assert_true((sb == DLSYNC_SUCCESS) == (ex != NULL));
  }
  nodes_b = event_nodes(g1, g2);
  if (sb == DLSYNC_SUCCESS) {
    consume = lane_work(&lc, "consume");
    if (op == SWEEP_EXCHANGE) {
      se = dlsync_exchange_end(ex);
      nodes_e = event_nodes(g1, g2) - nodes_b;
    }
  }
  reached = n > 0 && !fake_fail_pending();
  fake_fail_clear();
  mutate = fake_work(P, "mutate", NULL);

  as_without = sb == want_b && se == want_e;
  if (reached && sweep_kind == FAKE_FAULT_CALL && as_without)
    fail_msg("%s, %s: call %u failed, and the statuses are those without a fault", sc->name,
             op == SWEEP_ORDER ? "order" : "begin/end", n);
  if (reached && !as_without && !fake_fault_reported(sweep_kind))
    fail_msg("%s, %s: %s %u failed: %s / %s: %s", sc->name,
             op == SWEEP_ORDER ? "order" : "begin/end", fake_fault_name(sweep_kind), n,
             dlsync_status_name(sb), dlsync_status_name(se), dlsync_last_error());
  if (!reached && !as_without)
    fail_msg("%s, %s without a fault: %s / %s: %s", sc->name,
             op == SWEEP_ORDER ? "order" : "begin/end", dlsync_status_name(sb),
             dlsync_status_name(se), dlsync_last_error());
  if (as_without) {
    /* Done as without a fault (or without the allocation): the rows' nodes
     * are there, and eager work is ordered. */
    if (sb == DLSYNC_SUCCESS && nodes_b - nodes0 != (size_t)dlsync__row_nodes(sc->begin))
      fail_msg("%s, %s %u: %zu event nodes added, the row adds %d", sc->name,
               fake_fault_name(sweep_kind), n, nodes_b - nodes0, dlsync__row_nodes(sc->begin));
    if (op == SWEEP_EXCHANGE && sb == DLSYNC_SUCCESS &&
        nodes_e != (size_t)dlsync__row_nodes(sc->end))
      fail_msg("%s, %s %u: end added %zu event nodes, its row adds %d", sc->name,
               fake_fault_name(sweep_kind), n, nodes_e, dlsync__row_nodes(sc->end));
    /* A row that adds nodes gives one event to the graphs, held while they
     * live (not back in its pool while a node names it). */
    if (sb == DLSYNC_SUCCESS) {
      dlsync__pool_stats ps;
      dlsync__pool_stats_get(&ps, &c->pools);
      assert_int_equal(ps.graph_owned, dlsync__row_nodes(sc->begin) > 0 ? 1 : 0);
    }
    if (sc->producer == AS_EAGER && (sc->consumer == AS_EAGER || sc->consumer == AS_SAME)) {
      assert_true(fake_happens_before(produce, consume));
      if (op == SWEEP_EXCHANGE)
        assert_true(fake_happens_before(consume, mutate));
    }
  }

  /* Clean up. A consumer forked into the producer's capture, or joined to it
   * by dlsync_order (which does not join back), is joined back. Captures end
   * cleanly when all went as without a fault. */
  if ((sc->consumer == AS_JOINED || op == SWEEP_ORDER) && fake_capture_id(P) != 0 &&
      fake_capture_id(C) == fake_capture_id(P)) {
    (void)D->EventRecord(fork, C);
    (void)D->StreamWaitEvent(P, fork, 0);
  }
  if (sc->consumer == AS_CAPTURE)
    end_capture_of(C, as_without);
  if (sc->producer == AS_CAPTURE)
    end_capture_of(P, as_without);
  if (g1 != NULL)
    destroy_graph(g1);
  if (g2 != NULL)
    destroy_graph(g2);
  if (built)
    pop_all_contexts();
  fake_event_destroy(fork);
  fake_run_destructors();
  assert_int_equal(fake_active_captures(), 0);
  assert_int_equal(fake_live_graphs(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
  assert_int_equal(fake_pending_destructors(), 0);
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_dangling_event_uses(), 0);
  if (cold) {
    assert_pools_intact(ctx, c);
    assert_int_equal(dlsync_context_destroy(c), DLSYNC_SUCCESS);
  }
  assert_pool_intact();
  return reached;
}

/* Every scene, cold and warm (a warm run follows one without a fault), with
 * fault n = 1, 2, ... until a run no longer reaches it. */
static void sweep_scenes(sweep_op op, fake_fault kind) {
  unsigned most = 0;
  sweep_kind = kind;
  for (size_t i = 0; i < NSCENES; i++) {
    if (op == SWEEP_ORDER && scenes[i].flags != 0)
      continue;
    for (int cold = 1; cold >= 0; cold--) {
      unsigned n;
      for (n = 1; n < 200; n++) {
        if (!cold)
          run_scene(&scenes[i], op, false, 0);
        if (!run_scene(&scenes[i], op, cold, n))
          break;
      }
      if (n >= 200)
        fail_msg("%s: more than 200 %ss", scenes[i].name, fake_fault_name(kind));
      most = n > most ? n : most;
    }
  }
  sweep_kind = FAKE_FAULT_CALL;
  /* Some row made several driver calls, and allocated (a cold one makes its
   * pool; a row that gives an event to graphs, what holds it). */
  assert_true(most > (kind == FAKE_FAULT_CALL ? 4u : 2u));
}

static void every_driver_failure_in_order_is_a_status(void **state) {
  (void)state;
  sweep_scenes(SWEEP_ORDER, FAKE_FAULT_CALL);
}

static void every_allocation_failure_in_order_is_a_status(void **state) {
  (void)state;
  sweep_scenes(SWEEP_ORDER, FAKE_FAULT_ALLOC);
}

static void every_driver_failure_in_begin_and_end_is_a_status(void **state) {
  (void)state;
  sweep_scenes(SWEEP_EXCHANGE, FAKE_FAULT_CALL);
}

static void every_allocation_failure_in_begin_and_end_is_a_status(void **state) {
  (void)state;
  sweep_scenes(SWEEP_EXCHANGE, FAKE_FAULT_ALLOC);
}

/* The scenes take every row of the table that order, begin and end can take:
 * all but the fence's. */
static void every_row_is_swept(void **state) {
  (void)state;
  for (int r = 0; r < DLSYNC__ROW_COUNT; r++) {
    bool swept = r == DLSYNC__ROW_LAUNCHED_TO_EAGER || r == DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER;
    for (size_t i = 0; i < NSCENES && !swept; i++)
      swept = (int)scenes[i].begin == r || (int)scenes[i].end == r;
    if (!swept)
      fail_msg("no sweep scene takes %s", dlsync__row_name((dlsync__row)r));
  }
}

/* ---- threads ---- */

#define THREADS 8
#define PER_THREAD 500

typedef struct tdata {
  CUstream p, c;
  int failures;
  int unordered;
} tdata;

static void *exchange_loop(void *arg) {
  tdata *t = arg;
  dlsync_lane lp = dlsync_lane_stream(t->p), lc = dlsync_lane_stream(t->c);
  for (int i = 0; i < PER_THREAD; i++) {
    dlsync_exchange *ex = NULL;
    uint64_t a = fake_work(t->p, "p", NULL), b, c;
    if (dlsync_exchange_begin(&ex, ctx, &lp, &lc) != DLSYNC_SUCCESS) {
      t->failures++;
      continue;
    }
    b = fake_work(t->c, "c", NULL);
    if (dlsync_exchange_end(ex) != DLSYNC_SUCCESS)
      t->failures++;
    c = fake_work(t->p, "p2", NULL);
    if (i % 50 == 0 && (!fake_happens_before(a, b) || !fake_happens_before(b, c)))
      t->unordered++;
  }
  return NULL;
}

/* Threads ordering into captures of their own while the others' graphs give
 * their holds back (destructors inline: on the thread that destroys the
 * graph), all on one pool: every order succeeds, every event comes back
 * (ThreadSanitizer runs this too). */
typedef struct capture_loop {
  CUstream e, p, c;
  int failures;
} capture_loop;

static void *capture_orders_loop(void *arg) {
  capture_loop *t = arg;
  dlsync_lane le = dlsync_lane_stream(t->e), lp = dlsync_lane_stream(t->p),
              lc = dlsync_lane_stream(t->c);
  for (int round = 0; round < 30; round++) {
    CUgraph gp = NULL, gc = NULL;
    if (D->StreamBeginCapture(t->p, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS ||
        D->StreamBeginCapture(t->c, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) {
      t->failures++;
      return NULL;
    }
    for (int i = 0; i < 40; i++) {
      t->failures += dlsync_order(ctx, &le, &lc) != DLSYNC_SUCCESS; /* EAGER_TO_CAPTURE */
      t->failures += dlsync_order(ctx, &lp, &lc) != DLSYNC_SUCCESS; /* TWO_CAPTURES */
    }
    t->failures += D->StreamEndCapture(t->c, &gc) != CUDA_SUCCESS;
    t->failures += D->StreamEndCapture(t->p, &gp) != CUDA_SUCCESS;
    t->failures += gc == NULL || D->GraphDestroy(gc) != CUDA_SUCCESS;
    t->failures += gp == NULL || D->GraphDestroy(gp) != CUDA_SUCCESS;
  }
  return NULL;
}

static void threads_ordering_into_captures_share_one_pool(void **state) {
  enum { N = 4 };
  capture_loop t[N];
  pthread_t th[N];
  (void)state;
  fake_set_destructors_inline(true);
  for (int i = 0; i < N; i++) {
    t[i].e = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    t[i].p = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    t[i].c = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    t[i].failures = 0;
    assert_int_equal(pthread_create(&th[i], NULL, capture_orders_loop, &t[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(t[i].failures, 0);
  }
  fake_set_destructors_inline(false);
  assert_int_equal(graph_owned_now(), 0);
  for (int i = 0; i < N; i++) {
    fake_stream_destroy(t[i].e);
    fake_stream_destroy(t[i].p);
    fake_stream_destroy(t[i].c);
  }
}

static void many_threads_one_context(void **state) {
  pthread_t th[THREADS];
  tdata td[THREADS];
  (void)state;
  for (int i = 0; i < THREADS; i++) {
    td[i].p = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    td[i].c = fake_stream_create((i + 1) % 2, CU_STREAM_NON_BLOCKING);
    td[i].failures = 0;
    td[i].unordered = 0;
    assert_int_equal(pthread_create(&th[i], NULL, exchange_loop, &td[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(td[i].failures, 0);
    assert_int_equal(td[i].unordered, 0);
    fake_stream_destroy(td[i].p);
    fake_stream_destroy(td[i].c);
  }
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* ---- exchange handles that detect misuse ---- */

static void exchange_end_twice_is_invalid_argument(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL, *ex2 = NULL;
  unsigned records;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  records = fake_call_count("cuEventRecord");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("ended already");
  assert_int_equal(fake_call_count("cuEventRecord"), records); /* nothing queued */
  /* The thread's next exchanges are whole (before: a use after free). */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dlsync_exchange_begin(&ex2, ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex2), DLSYNC_SUCCESS);
  }
}

static void stale_exchange_handle_does_not_end_another(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *a = NULL, *b = NULL;
  unsigned records;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&a, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(a), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&b, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_true(a != b);
  records = fake_call_count("cuEventRecord");
  assert_int_equal(dlsync_exchange_end(a), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_call_count("cuEventRecord"), records);
  assert_int_equal(dlsync_exchange_end(b), DLSYNC_SUCCESS); /* b was not ended by a */
  assert_int_equal(fake_call_count("cuEventRecord"), records + 1);
}

static void one_stream_exchange_end_twice_is_invalid_argument(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lp2 = dlsync_lane_stream(P);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lp2), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
}

static void garbage_exchange_handle_is_invalid_argument(void **state) {
  (void)state;
  /* Values that were never handles are refused without being read. */
  assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)0x10),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)0x7fffffffffffULL),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  /* The shapes of a handle (order/exchange.c: the low 24 bits the index,
   * above them the generation, odd while begun): an odd generation with
   * index 0, or with the last possible index (its chunk never made). */
  assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)(UINT64_C(3) << 24)),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(
      dlsync_exchange_end((dlsync_exchange *)(uintptr_t)((UINT64_C(1) << 24) | ((1u << 24) - 1))),
      DLSYNC_ERROR_INVALID_ARGUMENT);
  {
    dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
    dlsync_exchange *ex = NULL;
    const uint64_t index_mask = (UINT64_C(1) << 24) - 1, gen_one = UINT64_C(1) << 24;
    uint64_t h;
    unsigned records;
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    h = (uint64_t)(uintptr_t)ex;
    assert_true((h & gen_one) != 0); /* begun: odd */
    records = fake_call_count("cuEventRecord");
    /* The next records of its chunk, with its generation: not begun
     * (generation 0, or another). */
    for (uint64_t k = 1; k <= 3; k++)
      assert_int_equal(
          dlsync_exchange_end(
              (dlsync_exchange *)(uintptr_t)((h & ~index_mask) | ((h & index_mask) + 500 + k))),
          DLSYNC_ERROR_INVALID_ARGUMENT);
    /* Its own record with a generation it has not reached (odd, 2 on), one
     * it had (2 back) and the even one of its end. */
    assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)(h + 2 * gen_one)),
                     DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)(h - 2 * gen_one)),
                     DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_int_equal(dlsync_exchange_end((dlsync_exchange *)(uintptr_t)(h + gen_one)),
                     DLSYNC_ERROR_INVALID_ARGUMENT);
    assert_int_equal(fake_call_count("cuEventRecord"), records); /* nothing queued */
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);   /* still begun */
  }
}

typedef struct handoff {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  dlsync_exchange *ex;
  bool has;
  int failures;
} handoff;

static void *end_elsewhere(void *p) {
  handoff *h = p;
  for (int i = 0; i < 5000; i++) {
    dlsync_exchange *ex;
    pthread_mutex_lock(&h->lock);
    while (!h->has)
      pthread_cond_wait(&h->cond, &h->lock);
    ex = h->ex;
    h->has = false;
    pthread_cond_signal(&h->cond);
    pthread_mutex_unlock(&h->lock);
    if (dlsync_exchange_end(ex) != DLSYNC_SUCCESS)
      h->failures++;
    if (dlsync_exchange_end(ex) != DLSYNC_ERROR_INVALID_ARGUMENT) /* misuse stays caught */
      h->failures++;
  }
  return NULL;
}

static void exchange_handles_ended_on_another_thread_still_work(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  handoff h;
  pthread_t th;
  (void)state;
  memset(&h, 0, sizeof h);
  pthread_mutex_init(&h.lock, NULL);
  pthread_cond_init(&h.cond, NULL);
  assert_int_equal(pthread_create(&th, NULL, end_elsewhere, &h), 0);
  for (int i = 0; i < 5000; i++) {
    dlsync_exchange *ex = NULL;
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    pthread_mutex_lock(&h.lock);
    while (h.has)
      pthread_cond_wait(&h.cond, &h.lock);
    h.ex = ex;
    h.has = true;
    pthread_cond_signal(&h.cond);
    pthread_mutex_unlock(&h.lock);
  }
  pthread_join(th, NULL);
  assert_int_equal(h.failures, 0);
  pthread_cond_destroy(&h.cond);
  pthread_mutex_destroy(&h.lock);
}

typedef struct racer {
  dlsync_exchange *ex;
  atomic_int *go;
  dlsync_status st;
} racer;

static void *race_end(void *p) {
  racer *r = p;
  while (atomic_load(r->go) == 0) {
  }
  r->st = dlsync_exchange_end(r->ex);
  return NULL;
}

static void racing_ends_of_one_exchange_end_it_once(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  for (int i = 0; i < 200; i++) {
    dlsync_exchange *ex = NULL;
    atomic_int go;
    racer r[2];
    pthread_t th[2];
    int ok = 0;
    atomic_init(&go, 0);
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    for (int k = 0; k < 2; k++) {
      r[k].ex = ex;
      r[k].go = &go;
      assert_int_equal(pthread_create(&th[k], NULL, race_end, &r[k]), 0);
    }
    atomic_store(&go, 1);
    for (int k = 0; k < 2; k++) {
      pthread_join(th[k], NULL);
      ok += r[k].st == DLSYNC_SUCCESS ? 1 : 0;
      assert_true(r[k].st == DLSYNC_SUCCESS || r[k].st == DLSYNC_ERROR_INVALID_ARGUMENT);
    }
    assert_int_equal(ok, 1);
  }
}

/* ---- exchanges left at a context's destroy ---- */

static void context_destroy_abandons_exchanges_not_ended(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, c2, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
  assert_message_has("1 exchange(s) begun and not ended");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_live_events(), 0);
}

static void begin_many_then_destroy_counts_the_callers_handle(void **state) {
  dlsync_context *c2 = NULL;
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUstream Y = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane producers[3] = {dlsync_lane_stream(P), dlsync_lane_stream(X), dlsync_lane_stream(Y)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_begin_many(&ex, c2, producers, 3, &lc, 0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
  assert_message_has("with 1 exchange(s) begun and not ended");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  fake_stream_destroy(X);
  fake_stream_destroy(Y);
}

/* ---- two faults in a row (a pool that grows) ---- */

static void pop_then_destroy_fault_counts_no_phantom_destroy(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lg;
  dlsync__pool_stats ps;
  CUgraph g = NULL;
  CUgraphNode deps[2];
  (void)state;
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS); /* the pool exists */
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = fake_graph_add_work(g, NULL, 0, "work");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  /* The pool grows (push, create, pop): the pop fails, then the destroy. */
  fake_fail_nth("cuCtxPopCurrent", 1, CUDA_ERROR_UNKNOWN);
  fake_fail_nth("cuEventDestroy", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &lg), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuCtxPopCurrent");
  fake_fail_clear();
  destroy_graph(g);
  pop_all_contexts();
  dlsync__pool_stats_get(&ps, &ctx->pools);
  /* What the pool counts as alive is what the driver has. */
  assert_int_equal(ps.created - ps.destroyed, fake_live_events());
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  ctx = NULL;
  fixture_open(NULL); /* the leaked event dies with the fake */
}

static void warm_path_query_failure_names_the_stream(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  char want[64];
  (void)state;
  for (int i = 0; i < 2; i++) { /* warm */
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  }
  /* end asks about the consumer, then the producer (status queries, the
   * thread's ends being eager): fail each in turn. */
  for (unsigned nth = 1; nth <= 2; nth++) {
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    fake_fail_nth("cuStreamIsCapturing", nth, CUDA_ERROR_INVALID_HANDLE);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
    snprintf(want, sizeof want, "%s stream %p", nth == 1 ? "consumer" : "producer",
             nth == 1 ? (void *)C : (void *)P);
    assert_message_has(want);
    assert_null(strstr(dlsync_last_error(), " or "));
  }
}

/* ---- an end that fails before queuing anything ---- */

/* The end's failure says that nothing was queued and how to finish. */
static void assert_end_queued_nothing(const char *call) {
  assert_non_null(strstr(dlsync_last_error(), call));
  assert_non_null(strstr(dlsync_last_error(), "nothing was queued"));
  assert_non_null(strstr(dlsync_last_error(), "dlsync_order(ctx, consumer, producer)"));
}

/* A consumer joined to the producer's capture, whose end fails at a call
 * that queues nothing (the consumer's capture query, then the dependency
 * update): the handle is ended, the failure says nothing was queued, and
 * dlsync_order(consumer, producer) joins the consumer back, so the capture
 * ends cleanly with produce -> consume -> mutate. */
static void an_end_that_queued_nothing_is_finished_by_order(void **state) {
  static const char *const calls[] = {"cuStreamGetCaptureInfo",
                                      "cuStreamUpdateCaptureDependencies"};
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  for (int warm = 0; warm < 2; warm++) {
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
      dlsync_exchange *ex = NULL;
      CUgraphNode produce, consume, mutate;
      if (warm)
        warm_pair(&lp, &lc, 0);
      assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
      fake_work(P, "produce", &produce);
      assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
      fake_work(C, "consume", &consume);
      fake_log_reset();
      fake_fail_nth(calls[k], 1, CUDA_ERROR_UNKNOWN);
      assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
      assert_false(fake_fail_pending());
      assert_end_queued_nothing(calls[k]);
      assert_int_equal(fake_call_count("cuEventRecord"), 0);
      assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
      assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE); /* still joined */
      assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);  /* ended */
      assert_int_equal(dlsync_order(ctx, &lc, &lp), DLSYNC_SUCCESS);
      fake_work(P, "mutate", &mutate);
      end_join_checked(produce, consume, mutate);
    }
  }
}

/* Eager streams: an end whose stream lookup (cuStreamGetCtx) or status
 * query fails is finished by dlsync_order the same way; one whose wait
 * fails after its record was queued does not say that nothing was queued. */
static void an_eager_end_that_queued_nothing_is_finished_by_order(void **state) {
  static const char *const calls[] = {"cuStreamGetCtx", "cuStreamIsCapturing"};
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t consume, mutate;
  (void)state;
  for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
    if (k == 1)
      warm_pair(&lp, &lc, 0); /* the end's fast path: two status queries */
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
    consume = fake_work(C, "consume", NULL);
    if (k == 0)
      dlsync__pool_memo_forget(&ctx->pools, C); /* end looks the consumer's pool up */
    fake_log_reset();
    fake_fail_nth(calls[k], 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
    assert_false(fake_fail_pending());
    assert_end_queued_nothing(calls[k]);
    assert_int_equal(fake_call_count("cuEventRecord"), 0);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
    mutate = fake_work(P, "mutate", NULL);
    assert_false(fake_happens_before(consume, mutate));
    assert_int_equal(dlsync_order(ctx, &lc, &lp), DLSYNC_SUCCESS);
    mutate = fake_work(P, "mutate", NULL);
    assert_true(fake_happens_before(consume, mutate));
  }
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  fake_fail_nth("cuStreamWaitEvent", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_DRIVER);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamWaitEvent"));
  assert_null(strstr(dlsync_last_error(), "nothing was queued"));
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, fixture_setup, fixture_teardown)
  const struct CMUnitTest tests[] = {
      T(same_stream_is_one_query),
      T(eager_eager_orders_both_ways),
      T(eager_eager_without_dlsync_is_unordered),
      T(warm_pool_makes_exactly_the_needed_calls),
      T(warm_order_asks_about_then_only),
      T(warm_join_is_three_queries),
      T(end_queries_follow_the_last_end),
      T(begin_queries_follow_the_last_begin),
      T(warm_same_capture_is_plain),
      T(end_after_one_capture_trusts_only_that_capture),
      T(same_capture_adds_dependencies_without_an_event),
      T(warm_eager_to_capture_reads_each_stream_once),
      T(the_producer_hint_turns_when_it_captures),
      T(cold_thread_reads_each_capture_lane_once),
      T(capture_hold_grows_and_reports_a_failed_chunk),
      T(warm_end_in_two_captures_takes_the_general_path),
      T(stable_end_asks_nothing),
      T(stable_join_is_joined_back_without_queries),
      T(stable_cold_begin_still_trusted),
      T(stable_broken_promise_costs_the_capture),
      T(unknown_flags_are_refused),
      T(devices_order_across),
      T(cross_device_refusal_is_its_own_status),
      T(reused_stream_handle_in_another_context_is_noticed),
      T(reused_stream_handle_in_two_captures_gets_its_contexts_event),
      T(reused_stream_handle_into_a_capture_gets_its_contexts_event),
      T(warm_streams_still_notice_a_capture),
      T(same_capture_is_edges_only),
      T(eager_consumer_joins_and_is_joined_back),
      T(join_without_end_leaves_capture_unjoined),
      T(eager_producer_capturing_consumer_gets_a_wait_node),
      T(two_captures_get_record_and_wait_nodes),
      T(two_captures_both_ways_hold_each_event_until_both_graphs_are_gone),
      T(each_thread_holds_its_events_in_a_capture_through_its_own_hold),
      T(a_hold_takes_only_in_its_own_life),
      T(a_capture_made_again_records_the_same_events_in_order),
      T(a_pair_needs_room_in_both_holds),
      T(a_capture_and_a_built_graph_share_an_event_until_both_are_gone),
      T(capture_graphs_outliving_their_context_lose_no_event_and_leak_none),
      T(a_stale_hold_is_made_again),
      T(a_capture_takes_its_events_in_growing_batches),
      T(a_reserve_is_dropped_with_its_hold),
      T(a_reserved_event_is_never_free_at_the_same_time),
      T(eager_to_capture_from_the_reserve_reports_a_failed_wait),
      T(reused_stream_handle_with_a_reserve_gets_its_contexts_event),
      T(long_capture_frontier_needs_no_second_read),
      T(long_capture_frontier_is_read_again_before_its_node),
      T(capture_to_built_records_by_the_external_flag),
      T(two_captures_external_calls_failing_say_which),
      T(same_built_graph_merges_frontiers),
      T(two_built_graphs_get_record_and_wait_nodes),
      T(eager_producer_built_consumer),
      T(capture_producer_built_consumer),
      T(built_producer_capture_consumer),
      T(built_producer_eager_consumer_is_refused),
      T(bad_lanes_are_refused_before_any_driver_call),
      T(invalidated_capture_is_reported),
      T(invalidated_capture_is_reported_when_warm),
      T(legacy_stream_during_blocking_capture),
      T(foreign_dependency_is_named),
      T(both_graph_lanes_need_a_current_context),
      T(every_row_is_swept),
      T(every_driver_failure_in_order_is_a_status),
      T(every_allocation_failure_in_order_is_a_status),
      T(every_driver_failure_in_begin_and_end_is_a_status),
      T(every_allocation_failure_in_begin_and_end_is_a_status),
      T(many_threads_one_context),
      T(threads_ordering_into_captures_share_one_pool),
      T(exchange_end_twice_is_invalid_argument),
      T(stale_exchange_handle_does_not_end_another),
      T(one_stream_exchange_end_twice_is_invalid_argument),
      T(garbage_exchange_handle_is_invalid_argument),
      T(exchange_handles_ended_on_another_thread_still_work),
      T(racing_ends_of_one_exchange_end_it_once),
      T(context_destroy_abandons_exchanges_not_ended),
      T(pop_then_destroy_fault_counts_no_phantom_destroy),
      T(warm_path_query_failure_names_the_stream),
      T(begin_many_then_destroy_counts_the_callers_handle),
      T(an_end_that_queued_nothing_is_finished_by_order),
      T(an_eager_end_that_queued_nothing_is_finished_by_order),
  };
#undef T
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
