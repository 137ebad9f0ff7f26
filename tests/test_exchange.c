/* The decision table on the fake driver: one test per row (the exact driver
 * calls, the resulting graph edges, a clean end of capture, no illegal call),
 * the errors, fault injection on every driver call of begin and end, and
 * exchanges from many threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

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
  /* End asks about both: either may have begun capturing since. The
   * consumer with the full query: were it capturing, its capture id would
   * tell whether the producer shares it (the end of a join). */
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
}

/* A warm join: begin asks about the consumer only; end finds both streams in
 * one capture with two full queries and joins back with a plain record and
 * wait (no general path, no cuStreamGetCtx). */
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
  assert_string_equal(
      fake_call_log(),
      "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,cuEventRecord,cuStreamWaitEvent");
  fake_work(P, "mutate", &n3);
  end_join_checked(n1, n2, n3);
}

/* Warm, both streams in one capture (every exchange after the first inside a
 * capture): begin reads the consumer's status, then both in full, and orders
 * with a plain record and wait; end the same way. With CAPTURE_STABLE, end
 * asks nothing. */
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
    assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuStreamGetCaptureInfo,"
                                         "cuStreamGetCaptureInfo,cuEventRecord,cuStreamWaitEvent");
    fake_work(C, "consume", &n2);
    fake_log_reset();
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    assert_string_equal(fake_call_log(), flags != 0
                                             ? "cuEventRecord,cuStreamWaitEvent"
                                             : "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,"
                                               "cuEventRecord,cuStreamWaitEvent");
  }
  fake_work(P, "mutate", &n3);
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_path(g, n1, n2));
  assert_true(fake_graph_has_path(g, n2, n3));
  destroy_graph(g);
}

/* Warm, eager producer, capturing consumer: what the fast path read is handed
 * to the general path, which reads neither stream again. */
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
  assert_string_equal(fake_call_log(),
                      "cuStreamIsCapturing,cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,"
                      "cuEventRecord,cuUserObjectCreate,cuGraphRetainUserObject,cuStreamWaitEvent");
  /* A second order into the same capture: its holder takes the event, no
   * user object. */
  fake_log_reset();
  assert_int_equal(dlsync_order(ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_call_count("cuStreamGetCtx"), 0);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  destroy_graph(g);
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
  assert_int_equal(dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, 0x6),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "unknown flags 0x6"));
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

static void eager_consumer_joins_and_is_joined_back(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraphNode n1, n2, n3;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_id(C), fake_capture_id(P));
  fake_work(C, "consume", &n2);
  assert_non_null(n2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
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

/* ---- fault injection: every driver call of begin and end ---- */

typedef enum row {
  ROW_EAGER,
  ROW_JOIN,
  ROW_EAGER_TO_CAPTURE,
  ROW_TWO_CAPTURES,
  ROW_BUILT_TWO,
  ROW_EAGER_STABLE, /* DLSYNC_EXCHANGE_CAPTURE_STABLE: end asks nothing */
  ROW_JOIN_STABLE
} row;

/* What the sweeps fail: the nth driver call or the nth allocation. */
static fake_fault sweep_kind = FAKE_FAULT_CALL;

/* Runs one exchange of the row with call (or allocation) n failing (n = 0:
 * none). Returns true when it was reached. Cleans everything up either way. */
static bool run_row_with_fault(row r, unsigned n) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphNode pdeps[2], cdeps[2];
  dlsync_status sb, se = DLSYNC_SUCCESS;
  bool reached;
  bool join = r == ROW_JOIN || r == ROW_JOIN_STABLE;
  if (join || r == ROW_TWO_CAPTURES)
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  if (r == ROW_EAGER_TO_CAPTURE || r == ROW_TWO_CAPTURES)
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  if (r == ROW_BUILT_TWO) {
    assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
    assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
    assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
    pdeps[0] = fake_graph_add_work(g1, NULL, 0, "produce");
    lp = dlsync_lane_graph(g1, pdeps, 1, 2);
    lc = dlsync_lane_graph(g2, cdeps, 0, 2);
  }
  fake_work(P, "produce", NULL);
  if (n > 0)
    fake_fail_fault(sweep_kind, n);
  sb = dlsync_exchange_begin_flags(
      &ex, ctx, &lp, &lc,
      r == ROW_EAGER_STABLE || r == ROW_JOIN_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE : 0);
  if (sb == DLSYNC_SUCCESS) {
    assert_non_null(ex);
    if (r == ROW_BUILT_TWO)
      cdeps[0] = fake_graph_add_work(g2, lc.deps, lc.ndeps, "consume");
    else
      fake_work(C, "consume", NULL);
    se = dlsync_exchange_end(ex);
  } else {
    assert_null(ex);
  }
  reached = n > 0 && !fake_fail_pending();
  fake_fail_clear();
  if (reached && sweep_kind == FAKE_FAULT_ALLOC) {
    /* A failed allocation: either the library did without it, or a status
     * saying so. */
    bool failed =
        sb != DLSYNC_SUCCESS || (se != DLSYNC_SUCCESS && se != DLSYNC_ERROR_CAPTURE_ORDER);
    if (failed && !fake_fault_reported(sweep_kind))
      fail_msg("row %d: allocation %u failed: %s", (int)r, n, dlsync_last_error());
  } else if (reached) {
    /* The failure surfaced as a status with the driver's words. */
    bool failed =
        sb != DLSYNC_SUCCESS || (se != DLSYNC_SUCCESS && se != DLSYNC_ERROR_CAPTURE_ORDER);
    if (!failed)
      fail_msg("row %d: call %u failed but begin and end succeeded", (int)r, n);
    assert_non_null(strstr(dlsync_last_error(), "CUDA_ERROR_UNKNOWN"));
  } else if (n == 0 || !reached) {
    assert_int_equal(sb, DLSYNC_SUCCESS);
  }
  /* Clean up whatever state the row is in. */
  if (r == ROW_EAGER_TO_CAPTURE || r == ROW_TWO_CAPTURES) {
    CUgraph g = NULL;
    D->StreamEndCapture(C, &g);
    if (g != NULL)
      destroy_graph(g);
  }
  if (join || r == ROW_TWO_CAPTURES) {
    CUgraph g = NULL;
    CUresult er = D->StreamEndCapture(P, &g);
    if (g != NULL)
      destroy_graph(g);
    /* The join row ends cleanly unless the fault hit the join itself. */
    if (join && !reached)
      assert_int_equal(er, CUDA_SUCCESS);
  }
  if (g1 != NULL)
    destroy_graph(g1);
  if (g2 != NULL)
    destroy_graph(g2);
  if (r == ROW_BUILT_TWO) {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  assert_int_equal(fake_active_captures(), 0);
  assert_pool_intact();
  return reached;
}

static void every_driver_failure_in_begin_and_end_is_a_status(void **state) {
  (void)state;
  for (row r = ROW_EAGER; r <= ROW_JOIN_STABLE; r++) {
    unsigned n;
    run_row_with_fault(r, 0);
    for (n = 1; n < 200; n++)
      if (!run_row_with_fault(r, n))
        break;
    assert_true(n > 2);
    assert_true(n < 200);
  }
}

static void every_allocation_failure_in_begin_and_end_is_a_status(void **state) {
  (void)state;
  unsigned most = 0;
  sweep_kind = FAKE_FAULT_ALLOC;
  for (row r = ROW_EAGER; r <= ROW_JOIN_STABLE; r++) {
    unsigned n;
    run_row_with_fault(r, 0);
    for (n = 1; n < 200; n++)
      if (!run_row_with_fault(r, n))
        break;
    assert_true(n < 200);
    most = n > most ? n : most;
  }
  /* The rows that give an event to graphs allocate what holds it. */
  assert_true(most > 1);
  sweep_kind = FAKE_FAULT_CALL;
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

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, fixture_setup, fixture_teardown)
  const struct CMUnitTest tests[] = {
      T(same_stream_is_one_query),
      T(eager_eager_orders_both_ways),
      T(eager_eager_without_dlsync_is_unordered),
      T(warm_pool_makes_exactly_the_needed_calls),
      T(warm_order_asks_about_then_only),
      T(warm_join_is_three_queries),
      T(warm_same_capture_is_plain),
      T(warm_eager_to_capture_reads_each_stream_once),
      T(warm_end_in_two_captures_takes_the_general_path),
      T(stable_end_asks_nothing),
      T(stable_join_is_joined_back_without_queries),
      T(stable_cold_begin_still_trusted),
      T(stable_broken_promise_costs_the_capture),
      T(unknown_flags_are_refused),
      T(devices_order_across),
      T(cross_device_refusal_is_its_own_status),
      T(reused_stream_handle_in_another_context_is_noticed),
      T(warm_streams_still_notice_a_capture),
      T(same_capture_is_edges_only),
      T(eager_consumer_joins_and_is_joined_back),
      T(join_without_end_leaves_capture_unjoined),
      T(eager_producer_capturing_consumer_gets_a_wait_node),
      T(two_captures_get_record_and_wait_nodes),
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
      T(every_driver_failure_in_begin_and_end_is_a_status),
      T(every_allocation_failure_in_begin_and_end_is_a_status),
      T(many_threads_one_context),
  };
#undef T
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
