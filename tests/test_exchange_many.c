/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync_exchange_begin_many on the fake driver: the exact calls (each
 * distinct producer once), one join per capture, edges only for a producer
 * already in the consumer's capture, the refusals, the order-back after a
 * failure, fault injection on every driver call and allocation, handle
 * misuse, and many threads. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static CUstream Q; /* a second producer stream, device 0 */

static int setup(void **state) {
  (void)state;
  fixture_open(NULL);
  Q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_non_null(Q);
  fake_log_reset();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  fake_stream_destroy(Q);
  fixture_close();
  return 0;
}

/* Begin/end once between each producer and C: the thread is warm (memo and
 * scratch event) for every pair afterwards. */
static void warm(void) {
  dlsync_lane lc = dlsync_lane_stream(C);
  CUstream ps[2] = {P, Q};
  for (int i = 0; i < 2; i++) {
    dlsync_lane lp = dlsync_lane_stream(ps[i]);
    for (int k = 0; k < 2; k++) {
      dlsync_exchange *ex = NULL;
      assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
      assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    }
  }
}

static void eager_orders_after_each_distinct_producer(void **state) {
  dlsync_lane lps[3] = {dlsync_lane_stream(P), dlsync_lane_stream(Q), dlsync_lane_stream(P)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t pa, qa, consume, pm, qm;
  (void)state;
  warm();
  pa = fake_work(P, "produce p", NULL);
  qa = fake_work(Q, "produce q", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 3, &lc, 0), DLSYNC_SUCCESS);
  /* P given twice: one record on it, one wait; Q one of each; no event made
   * after one status query per distinct producer, none capturing). */
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuStreamIsCapturing,"
                                       "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent,"
                                       "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  consume = fake_work(C, "consume", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuEventRecord"), 2);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 2);
  assert_int_equal(fake_call_count("cuEventCreate"), 0);
  pm = fake_work(P, "mutate p", NULL);
  qm = fake_work(Q, "mutate q", NULL);
  assert_true(fake_happens_before(pa, consume));
  assert_true(fake_happens_before(qa, consume));
  assert_true(fake_happens_before(consume, pm));
  assert_true(fake_happens_before(consume, qm));
}

static void without_it_the_second_producer_is_unordered(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  uint64_t qa, consume;
  (void)state;
  qa = fake_work(Q, "produce q", NULL);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  consume = fake_work(C, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_false(fake_happens_before(qa, consume));
}

/* P and Q in one capture (Q forked from P): the consumer joins once and is
 * joined back to both; no event node in the graph. */
static void one_capture_is_one_join(void **state) {
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode pn, qn, cn, pm, qm;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS); /* Q joins P's capture */
  fake_work(P, "produce p", &pn);
  fake_work(Q, "produce q", &qn);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_id(C), fake_capture_id(P));
  fake_work(C, "consume", &cn);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "mutate p", &pm);
  fake_work(Q, "mutate q", &qm);
  /* Q joined back into P before the capture ends. */
  assert_int_equal(D->EventRecord(fork, Q), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, fork, 0), CUDA_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_true(fake_graph_has_path(g, pn, cn));
  assert_true(fake_graph_has_path(g, qn, cn));
  assert_true(fake_graph_has_path(g, cn, pm));
  assert_true(fake_graph_has_path(g, cn, qm));
  destroy_graph(g);
  fake_event_destroy(fork);
}

/* The consumer captures; P and Q share its capture: edges only, no event,
 * and the end orders each producer after the consumer by edges too. (An
 * eager producer beside them is refused at begin: see
 * capturing_and_eager_producers_are_refused_at_begin.) */
static void producer_in_the_consumers_capture_is_edges_only(void **state) {
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraphNode pn, qn, cn, pm, qm;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, fork, 0), CUDA_SUCCESS); /* P joins C's capture */
  assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS); /* Q too */
  fake_work(P, "produce p", &pn);
  fake_work(Q, "produce q", &qn);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0), DLSYNC_SUCCESS);
  fake_work(C, "consume", &cn);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_work(P, "mutate p", &pm);
  fake_work(Q, "mutate q", &qm);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, Q), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 0);
  assert_true(fake_graph_has_path(g, pn, cn));
  assert_true(fake_graph_has_path(g, qn, cn));
  assert_true(fake_graph_has_path(g, cn, pm));
  assert_true(fake_graph_has_path(g, cn, qm));
  destroy_graph(g);
  fake_event_destroy(fork);
}

static void one_producer_is_the_plain_exchange(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  warm();
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, &lp, 1, &lc, 0), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing,cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
}

static void bad_input_is_refused_before_any_driver_call(void **state) {
  dlsync_lane lps[3] = {dlsync_lane_stream(P), dlsync_lane_stream(Q), dlsync_lane_stream(P)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)&lc;
  (void)state;
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_many(NULL, ctx, lps, 2, &lc, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_begin_many(&ex, NULL, lps, 2, &lc, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ex);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 0, &lc, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "0 producers"));
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, NULL, 2, &lc, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "producers is NULL"));
  assert_int_equal(
      dlsync_exchange_begin_many(&ex, ctx, lps, (size_t)DLSYNC_EXCHANGE_MANY_MAX + 1, &lc, 0),
      DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0x80),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "unknown flags"));
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, NULL, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  /* A bad lane late in the array: named, and nothing queued for the others. */
  lps[2].kind = (dlsync_lane_kind)77;
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 3, &lc, 0), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "producer 2"));
  assert_null(ex);
  assert_int_equal(fake_calls_total(), 0);
}

static void an_ended_handle_is_refused(void **state) {
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL, *other = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(fake_calls_total(), 0);
  /* Records reused by a later begin are not ended by the stale handle. */
  assert_int_equal(dlsync_exchange_begin_many(&other, ctx, lps, 2, &lc, 0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_exchange_end(other), DLSYNC_SUCCESS);
}

/* The second producer fails (its capture was invalidated): the first, whose
 * exchange joined the consumer into its capture, is ordered back, so that
 * capture still ends cleanly; nothing is left begun. */
static void a_later_failure_orders_the_earlier_back(void **state) {
  CUstream R = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(R)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = (dlsync_exchange *)&lc;
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce p", NULL);
  /* R's capture is invalidated: a plain wait on an eager event (ISOLATION). */
  assert_int_equal(D->StreamBeginCapture(R, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(e, Q), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(R, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0),
                   DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_null(ex);
  assert_non_null(strstr(dlsync_last_error(), "producer"));
  /* C was joined back: P's capture ends cleanly and C is eager again. */
  g = end_capture_ok(P);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  destroy_graph(g);
  g = NULL;
  (void)D->StreamEndCapture(R, &g);
  if (g != NULL)
    destroy_graph(g);
  fake_event_destroy(e);
  fake_stream_destroy(R);
}

/* The failure reported after the order-back is the first one, with its
 * driver result, and the earlier producer's wait was made and undone. */
static void a_later_driver_failure_keeps_its_result(void **state) {
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  warm();
  fake_log_reset();
  fake_fail_nth("cuStreamWaitEvent", 2, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0), DLSYNC_ERROR_DRIVER);
  assert_null(ex);
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_LAUNCH_FAILED);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamWaitEvent"));
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 3); /* P's, Q's (failed), P's back */
  fake_fail_clear();
}

/* ---- fault injection: every driver call and allocation ---- */

typedef enum scene { SCENE_EAGER, SCENE_JOIN, SCENE_JOIN_STABLE } scene;

static fake_fault sweep_kind = FAKE_FAULT_CALL;

/* One begin_many/end of the scene with fault n (0: none); true when the
 * fault was reached. Everything is cleaned up; a capture whose join was not
 * hit by the fault ends cleanly. */
static bool run_with_fault(scene sc, unsigned n) {
  dlsync_lane lps[3] = {dlsync_lane_stream(P), dlsync_lane_stream(Q), dlsync_lane_stream(P)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_status sb, se = DLSYNC_SUCCESS;
  bool capture = sc != SCENE_EAGER;
  bool reached;
  if (capture) {
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(Q, fork, 0), CUDA_SUCCESS);
  }
  fake_work(P, "produce p", NULL);
  fake_work(Q, "produce q", NULL);
  if (n > 0)
    fake_fail_fault(sweep_kind, n);
  sb = dlsync_exchange_begin_many(&ex, ctx, lps, 3, &lc,
                                  sc == SCENE_JOIN_STABLE ? DLSYNC_EXCHANGE_CAPTURE_STABLE : 0);
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
    bool failed = sb != DLSYNC_SUCCESS || se != DLSYNC_SUCCESS;
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
    assert_int_equal(se, DLSYNC_SUCCESS);
  }
  if (capture) {
    CUgraph g = NULL;
    CUresult er;
    (void)D->EventRecord(fork, Q);
    (void)D->StreamWaitEvent(P, fork, 0);
    er = D->StreamEndCapture(P, &g);
    if (g != NULL)
      destroy_graph(g);
    if (!reached || sweep_kind == FAKE_FAULT_ALLOC)
      assert_int_equal(er, CUDA_SUCCESS);
  }
  fake_event_destroy(fork);
  assert_int_equal(fake_active_captures(), 0);
  assert_pool_intact();
  return reached;
}

static void sweep(fake_fault kind) {
  sweep_kind = kind;
  for (scene sc = SCENE_EAGER; sc <= SCENE_JOIN_STABLE; sc++) {
    unsigned n;
    run_with_fault(sc, 0);
    for (n = 1; n < 300; n++)
      if (!run_with_fault(sc, n))
        break;
    assert_true(n < 300);
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

/* ---- threads: each its own three streams, one context ---- */

#define THREADS 6
#define PER_THREAD 300

typedef struct tdata {
  CUstream p, q, c;
  int failures, unordered;
} tdata;

static void *many_loop(void *arg) {
  tdata *t = arg;
  dlsync_lane lps[2] = {dlsync_lane_stream(t->p), dlsync_lane_stream(t->q)};
  dlsync_lane lc = dlsync_lane_stream(t->c);
  for (int i = 0; i < PER_THREAD; i++) {
    dlsync_exchange *ex = NULL;
    uint64_t a = fake_work(t->p, "p", NULL), b = fake_work(t->q, "q", NULL), c, d;
    if (dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0) != DLSYNC_SUCCESS) {
      t->failures++;
      continue;
    }
    c = fake_work(t->c, "c", NULL);
    if (dlsync_exchange_end(ex) != DLSYNC_SUCCESS)
      t->failures++;
    d = fake_work(t->q, "q2", NULL);
    if (i % 50 == 0 &&
        (!fake_happens_before(a, c) || !fake_happens_before(b, c) || !fake_happens_before(c, d)))
      t->unordered++;
  }
  return NULL;
}

static void many_threads(void **state) {
  pthread_t th[THREADS];
  tdata td[THREADS];
  (void)state;
  for (int i = 0; i < THREADS; i++) {
    td[i].p = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    td[i].q = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
    td[i].c = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    td[i].failures = td[i].unordered = 0;
    assert_int_equal(pthread_create(&th[i], NULL, many_loop, &td[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(td[i].failures, 0);
    assert_int_equal(td[i].unordered, 0);
    fake_stream_destroy(td[i].p);
    fake_stream_destroy(td[i].q);
    fake_stream_destroy(td[i].c);
  }
}

/* ---- capturing and eager producers together ---- */

/* One producer capturing and one eager: the end could never order the eager
 * producer's later work after the capture (not launched yet), so begin
 * refuses the mix, naming which producers capture and which are eager;
 * nothing is queued (the consumer does not join the capture, which ends
 * cleanly). */
static void capturing_and_eager_producers_are_refused_at_begin(void **state) {
  dlsync_lane lps[3] = {dlsync_lane_stream(Q), dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  char words[96];
  (void)state;
  warm();
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce p", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 3, &lc, 0),
                   DLSYNC_ERROR_CAPTURE_ORDER);
  assert_null(ex);
  snprintf(words, sizeof words, "producer 1 (stream %p) is capturing", (void *)P);
  assert_non_null(strstr(dlsync_last_error(), words));
  snprintf(words, sizeof words, "producer 0 (stream %p) is eager", (void *)Q);
  assert_non_null(strstr(dlsync_last_error(), words));
  assert_non_null(strstr(dlsync_last_error(), "nothing was queued"));
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  destroy_graph(end_capture_ok(P));
}

/* An end whose parts fail both ways (one producer's order refused, the
 * other's driver call failing) reports the driver's failure, not the
 * refusal, whichever part failed first: each driver call of such an end
 * failed in turn. */
static void an_ends_driver_failure_is_reported_before_a_refusal(void **state) {
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(Q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  bool reached = true;
  (void)state;
  warm();
  for (unsigned n = 1; reached; n++) {
    dlsync_exchange *ex = NULL;
    dlsync_status st;
    assert_int_equal(dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0), DLSYNC_SUCCESS);
    /* The consumer captures by the end: each eager producer's order is
     * refused, unless a driver call fails first. */
    assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    fake_work(C, "consume", NULL);
    fake_log_reset();
    fake_fail_call(n, CUDA_ERROR_LAUNCH_FAILED);
    st = dlsync_exchange_end(ex);
    reached = !fake_fail_pending();
    fake_fail_clear();
    if (reached) {
      if (st != DLSYNC_ERROR_DRIVER)
        fail_msg("driver call %u of the end failed, and the end said %s: %s", n,
                 dlsync_status_name(st), dlsync_last_error());
      assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_LAUNCH_FAILED);
    } else {
      assert_int_equal(st, DLSYNC_ERROR_CAPTURE_ORDER);
    }
    assert_int_equal(fake_call_count("cuEventRecord"), 0);
    assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
    destroy_graph(end_capture_ok(C));
  }
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(eager_orders_after_each_distinct_producer),
      T(without_it_the_second_producer_is_unordered),
      T(one_capture_is_one_join),
      T(producer_in_the_consumers_capture_is_edges_only),
      T(one_producer_is_the_plain_exchange),
      T(bad_input_is_refused_before_any_driver_call),
      T(an_ended_handle_is_refused),
      T(a_later_failure_orders_the_earlier_back),
      T(a_later_driver_failure_keeps_its_result),
      T(every_driver_failure_is_a_status),
      T(every_allocation_failure_is_a_status),
      T(many_threads),
      T(capturing_and_eager_producers_are_refused_at_begin),
      T(an_ends_driver_failure_is_reported_before_a_refusal),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
