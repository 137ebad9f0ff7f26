/* SPDX-License-Identifier: Apache-2.0 */
/* Hardening on the fake driver: each test guards one finding of
 * the bad-input and fault hunt, or one misuse that must be caught, and is
 * named after it; and every public entry point is swept with a fault on each
 * of its driver calls and allocations. Every wait on the reclaimer has a
 * timeout. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "interop/dlpack_abi.h"
#include "dlsync/version.h"
#include "dlsync/arrow.h"
#include "fixture.h"

#define TIMEOUT_MS 5000

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static atomic_int deleted;

static void count_deleter(void *arg) {
  (void)arg;
  atomic_fetch_add(&deleted, 1);
}

static dlsync_release_stats stats_of(dlsync_context *c) {
  dlsync_release_stats s = DLSYNC_RELEASE_STATS_INIT;
  assert_int_equal(dlsync_release_get_stats(&s, c), DLSYNC_SUCCESS);
  return s;
}

/* Waits until pred(stats) holds, or TIMEOUT_MS. */
static bool wait_stats(dlsync_context *c, bool (*pred)(const dlsync_release_stats *)) {
  for (int i = 0; i < TIMEOUT_MS; i++) {
    dlsync_release_stats s = stats_of(c);
    if (pred(&s))
      return true;
    sleep_ms(1);
  }
  return false;
}

static bool one_blocked(const dlsync_release_stats *s) {
  return s->blocked == 1;
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* ---- 1. a graph lane with capacity but no deps array ---- */

static void test_graph_lane_null_deps_is_not_a_crash(void **state) {
  CUgraph g = NULL;
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lg, ls;
  dlsync_exchange *ex = NULL;
  dlsync_fence *f = NULL;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  lg = dlsync_lane_graph(g, NULL, 0, 4);
  assert_int_equal(dlsync_order(ctx, &lp, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("deps is NULL");
  lg = dlsync_lane_graph(g, NULL, 0, 4);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ex);
  lg = dlsync_lane_graph(g, NULL, 0, 4);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(f);
  ls = dlsync_lane_stream(P);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &ls), DLSYNC_SUCCESS);
  lg = dlsync_lane_graph(g, NULL, 0, 4);
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  dlsync_fence_release(f);
  assert_int_equal(fake_graph_count_nodes(g, -1), 0);
  destroy_graph(g);
}

/* ---- 2. exchange handles that detect misuse ---- */

static void test_exchange_end_twice_is_invalid_argument(void **state) {
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

static void test_stale_exchange_handle_does_not_end_another(void **state) {
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

static void test_one_stream_exchange_end_twice_is_invalid_argument(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lp2 = dlsync_lane_stream(P);
  dlsync_exchange *ex = NULL;
  (void)state;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lp2), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT);
}

static void test_garbage_exchange_handle_is_invalid_argument(void **state) {
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

static void test_exchange_handles_ended_on_another_thread_still_work(void **state) {
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

static void test_racing_ends_of_one_exchange_end_it_once(void **state) {
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

/* ---- 3. a reclaimer that cannot enter RELAXED mode ---- */

static void test_reclaimer_without_relaxed_mode_makes_no_illegal_call(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  CUgraph g;
  (void)state;
  atomic_store(&deleted, 0);
  /* Another thread's GLOBAL capture (here: this thread's). */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_fail_always("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_true(wait_stats(ctx, one_blocked));
  /* flush returns at once with the failure; the deleter has not run. */
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuThreadExchangeStreamCaptureMode");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_UNKNOWN);
  assert_int_equal(atomic_load(&deleted), 0);
  s = stats_of(ctx);
  assert_int_equal(s.mode_failures, 1);
  assert_int_equal(s.pending_eager, 1);
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_call_count("cuEventSynchronize"), 0);
  /* Once it can, it runs; the capture was not broken. */
  fake_fail_clear();
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&deleted), 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(fake_illegal_calls(), 0);
  g = end_capture_ok(P);
  destroy_graph(g);
  s = stats_of(ctx);
  assert_int_equal(s.blocked, 0);
  assert_int_equal(s.done, 1);
}

/* ---- 4. a failed reclaimer sync ---- */

static void test_failed_reclaimer_sync_is_counted_and_returned_by_flush(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  (void)state;
  atomic_store(&deleted, 0);
  fake_fail_nth("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_ERROR_DRIVER);
  assert_message_has("CUDA_ERROR_LAUNCH_FAILED");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_LAUNCH_FAILED); /* from that thread */
  assert_int_equal(atomic_load(&deleted), 1);
  s = stats_of(ctx);
  assert_int_equal(s.sync_failures, 1);
  /* Reported once: the next flush is clean. */
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
}

/* A deleter that holds the reclaimer until the test lets it go, so that
 * the releases made meanwhile are taken as one batch. */
static atomic_int batch_gate_in, batch_gate_open;
static void batch_gate_deleter(void *arg) {
  (void)arg;
  atomic_store(&batch_gate_in, 1);
  for (int i = 0; i < TIMEOUT_MS && !atomic_load(&batch_gate_open); i++)
    sleep_ms(1);
}

/* Holds the reclaimer in batch_gate_deleter; returns once it is there. */
static void hold_reclaimer(dlsync_lane *l) {
  atomic_store(&batch_gate_in, 0);
  atomic_store(&batch_gate_open, 0);
  assert_int_equal(dlsync_release(ctx, l, batch_gate_deleter, NULL), DLSYNC_SUCCESS);
  for (int i = 0; i < TIMEOUT_MS && !atomic_load(&batch_gate_in); i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&batch_gate_in), 1);
}

/* One batch of five releases on one stream and two on another: the newest
 * event of each stream is synchronised (events of one stream complete in
 * order), two calls for seven releases and no query of the earlier ones;
 * each deleter runs once. */
static void test_a_batch_synchronises_the_newest_event_of_each_stream(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), lp = dlsync_lane_stream(P);
  unsigned before, queries;
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc);
  before = fake_call_count("cuEventSynchronize");
  queries = fake_call_count("cuEventQuery");
  for (int i = 0; i < 5; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  for (int i = 0; i < 2; i++)
    assert_int_equal(dlsync_release(ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 7);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 2);
  assert_int_equal(fake_call_count("cuEventQuery") - queries, 0);
  assert_int_equal(stats_of(ctx).pending_eager, 0);
}

/* A thread that has released on a device before releases into its own ring
 * (order/release.c): no allocation of dlsync's, and the book counts the
 * queued releases all the same (the one holding the reclaimer too). */
static void test_a_release_into_the_threads_ring_allocates_nothing(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc); /* the thread's ring is made by this release */
  dlsync__alloc_count_start();
  for (int i = 0; i < 100; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync__alloc_live_bytes(), 0);
  assert_int_equal(stats_of(ctx).pending_eager, 101);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 100);
  assert_int_equal(stats_of(ctx).pending_eager, 0);
}

/* The order deleters ran in: each writes its argument (a sequence number)
 * at the next place. */
#define MORE_THAN_A_RING 5000
static uintptr_t ran_order[MORE_THAN_A_RING + 16];
static atomic_uint ran_n;
static void order_deleter(void *arg) {
  unsigned i = atomic_fetch_add(&ran_n, 1);
  if (i < sizeof ran_order / sizeof ran_order[0])
    ran_order[i] = (uintptr_t)arg;
}

static void assert_ran_in_order(unsigned n) {
  assert_int_equal(atomic_load(&ran_n), n);
  for (unsigned i = 0; i < n; i++)
    assert_int_equal(ran_order[i], i);
}

/* More releases than a ring holds (RING_SLOTS, 4096, in order/release.c)
 * while the reclaimer is held: the rest go to the shared queue (which
 * allocates), every one succeeds, and the deleters run once each, in the
 * order the thread released; so do releases made while those in the
 * shared queue wait. */
static void test_a_full_ring_overflows_into_the_shared_queue_in_order(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  atomic_store(&ran_n, 0);
  hold_reclaimer(&lc);
  dlsync__alloc_count_start();
  for (uintptr_t i = 0; i < MORE_THAN_A_RING; i++)
    assert_int_equal(dlsync_release(ctx, &lc, order_deleter, (void *)i), DLSYNC_SUCCESS);
  assert_true(dlsync__alloc_live_bytes() > 0); /* the shared queue's items */
  assert_int_equal(stats_of(ctx).pending_eager, MORE_THAN_A_RING + 1);
  atomic_store(&batch_gate_open, 1);
  for (uintptr_t i = MORE_THAN_A_RING; i < MORE_THAN_A_RING + 16; i++)
    assert_int_equal(dlsync_release(ctx, &lc, order_deleter, (void *)i), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_ran_in_order(MORE_THAN_A_RING + 16);
  assert_int_equal(stats_of(ctx).pending_eager, 0);
}

/* Releases on the legacy stream go through the thread's ring too: one
 * thread's deleters run in its order across special and ordinary streams. */
static void test_legacy_and_ordinary_stream_releases_run_in_order(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), legacy = dlsync_lane_stream(DLSYNC_STREAM_LEGACY);
  (void)state;
  atomic_store(&ran_n, 0);
  hold_reclaimer(&lc);
  CUcontext cu = NULL, popped = NULL;
  assert_int_equal(D->StreamGetCtx(C, &cu), CUDA_SUCCESS);
  assert_int_equal(D->CtxPushCurrent(cu), CUDA_SUCCESS); /* the legacy stream's context */
  for (uintptr_t i = 0; i < 6; i++)
    assert_int_equal(dlsync_release(ctx, i % 2 ? &legacy : &lc, order_deleter, (void *)i),
                     DLSYNC_SUCCESS);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_ran_in_order(6);
}

/* A thread whose ring cannot be made (no memory) releases through the
 * shared queue. (The failure is armed for any thread's allocation; the
 * reclaimer, idle after a flush, makes none meanwhile.) */
static void *release_one_without_a_ring(void *arg) {
  dlsync_lane *l = arg;
  dlsync_status st;
  dlsync__alloc_fail_nth(1); /* the ring: this thread's first allocation of dlsync's */
  st = dlsync_release(ctx, l, count_deleter, NULL);
  dlsync__alloc_fail_nth(0);
  return (void *)(uintptr_t)st;
}

static void test_a_ring_that_cannot_be_made_leaves_the_shared_queue(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  pthread_t th;
  void *rc = (void *)1;
  (void)state;
  atomic_store(&deleted, 0);
  /* The context's pool made (by this thread), so that the other thread's
   * first allocation is its ring. */
  assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS); /* the reclaimer idle */
  assert_int_equal(pthread_create(&th, NULL, release_one_without_a_ring, &lc), 0);
  assert_int_equal(pthread_join(th, &rc), 0);
  assert_int_equal((dlsync_status)(uintptr_t)rc, DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 2);
}

/* cuStreamGetId failing: a status naming it, nothing queued, the event back
 * in its pool. */
static void test_a_failed_stream_id_queues_nothing(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync__pool_stats before, after;
  (void)state;
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  dlsync__pool_stats_get(&before, &ctx->pools);
  fake_fail_nth("cuStreamGetId", 1, CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuStreamGetId");
  assert_int_equal(stats_of(ctx).pending_eager, 0);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 1);
  dlsync__pool_stats_get(&after, &ctx->pools);
  assert_int_equal(after.free_events, before.free_events);
  assert_int_equal(after.created - after.destroyed, before.created - before.destroyed);
}

static void *release_ten_and_exit(void *arg) {
  dlsync_lane *l = arg;
  for (int i = 0; i < 10; i++)
    if (dlsync_release(ctx, l, count_deleter, NULL) != DLSYNC_SUCCESS)
      return (void *)1;
  return NULL;
}

/* A thread that exits with releases queued in its ring: they run (the ring
 * is freed by the reclaimer once empty). */
static void test_a_threads_ring_runs_after_the_thread_exits(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  pthread_t th;
  void *rc = (void *)2;
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc);
  assert_int_equal(pthread_create(&th, NULL, release_ten_and_exit, &lc), 0);
  assert_int_equal(pthread_join(th, &rc), 0);
  assert_null(rc);
  assert_int_equal(stats_of(ctx).pending_eager, 11);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 10);
}

/* n releases on l queued behind the reclaimer held in a deleter (one batch
 * once batch_gate_open is set); the cuEventSynchronize count before them. */
static unsigned held_batch(dlsync_lane *l, int n) {
  unsigned before;
  atomic_store(&deleted, 0);
  hold_reclaimer(l);
  before = fake_call_count("cuEventSynchronize");
  for (int i = 0; i < n; i++)
    assert_int_equal(dlsync_release(ctx, l, count_deleter, NULL), DLSYNC_SUCCESS);
  return before;
}

/* A stream handle can name a new stream while the old one's work runs
 * (design.md R33; the fake gives a destroyed stream's handle to the next
 * stream made): two releases on a stream, the stream destroyed, two on the
 * new stream of the same handle. The stream id tells the two apart: the
 * newest event of each is synchronised, two calls, none asked. */
static void test_a_reused_handle_is_another_stream_in_a_batch(void **state) {
  CUstream s1, s2;
  dlsync_lane l1, l2;
  unsigned before, queries;
  (void)state;
  s1 = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  l1 = dlsync_lane_stream(s1);
  before = held_batch(&l1, 2);
  queries = fake_call_count("cuEventQuery");
  assert_int_equal(D->StreamDestroy(s1), CUDA_SUCCESS);
  s2 = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_ptr_equal(s2, s1); /* the handle reused */
  l2 = dlsync_lane_stream(s2);
  for (int i = 0; i < 2; i++)
    assert_int_equal(dlsync_release(ctx, &l2, count_deleter, NULL), DLSYNC_SUCCESS);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 4);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 2); /* one per stream */
  assert_int_equal(fake_call_count("cuEventQuery") - queries, 0);
  assert_int_equal(stats_of(ctx).pending_eager, 0);
  assert_int_equal(D->StreamDestroy(s2), CUDA_SUCCESS);
}

/* Without a stream id (a driver before CUDA 12.0 has no cuStreamGetId) a slot is a handle, which
 * may be of two streams (R33): each earlier event is asked, and one not complete when asked
 * (cuEventQuery: CUDA_ERROR_NOT_READY) is synchronised on its own before its deleter runs; nothing
 * is reported as failed. */
static void test_an_earlier_event_not_complete_is_synchronised_on_its_own(void **state) {
  static dlsync__driver no_id;
  dlsync_lane lc;
  dlsync_release_stats s;
  unsigned before, queries;
  (void)state;
  fixture_close();
  no_id = *fake_driver();
  no_id.StreamGetId = NULL;
  fixture_open(&no_id);
  lc = dlsync_lane_stream(C);
  queries = fake_call_count("cuEventQuery");
  before = held_batch(&lc, 4);
  fake_fail_nth("cuEventQuery", 2, CUDA_ERROR_NOT_READY);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 4);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 2); /* the newest, the one */
  assert_int_equal(fake_call_count("cuEventQuery") - queries, 3);      /* each earlier one */
  s = stats_of(ctx);
  assert_int_equal(s.sync_failures, 0);
  assert_int_equal(s.pending_eager, 0);
}

/* The newest event's synchronisation fails inside a batch: each earlier
 * event of its stream is synchronised on its own, every deleter runs once,
 * and the next flush reports the failure, once. */
static void test_a_failed_sync_in_a_batch_runs_each_deleter_once(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  unsigned before;
  (void)state;
  before = held_batch(&lc, 4);
  fake_fail_nth("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_ERROR_DRIVER);
  assert_message_has("CUDA_ERROR_LAUNCH_FAILED");
  assert_int_equal(atomic_load(&deleted), 4);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 4); /* the newest, then 3 */
  s = stats_of(ctx);
  assert_int_equal(s.sync_failures, 1);
  assert_int_equal(s.pending_eager, 0);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
}

/* The reclaimer cannot enter RELAXED mode for a batch of three: the three
 * are blocked (counted, no synchronisation), then run once it can. */
static void test_a_mode_failure_blocks_the_whole_batch(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  unsigned before;
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc);
  for (int i = 0; i < 3; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_deleter, NULL), DLSYNC_SUCCESS);
  before = fake_call_count("cuEventSynchronize");
  fake_fail_always("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_UNKNOWN);
  atomic_store(&batch_gate_open, 1);
  for (int i = 0; i < TIMEOUT_MS && stats_of(ctx).blocked < 3; i++)
    sleep_ms(1);
  s = stats_of(ctx);
  assert_int_equal(s.blocked, 3);
  assert_int_equal(s.mode_failures, 3);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuThreadExchangeStreamCaptureMode");
  assert_int_equal(atomic_load(&deleted), 0);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 0);
  /* Once it can, the three run (a flush while they are blocked returns at
   * once: it waits for what can run). */
  fake_fail_clear();
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) < 3; i++)
    sleep_ms(1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 3);
  assert_int_equal(stats_of(ctx).blocked, 0);
}

static void test_release_stats_need_their_size_and_version(void **state) {
  dlsync_release_stats s;
  (void)state;
  memset(&s, 0, sizeof s);
  assert_int_equal(dlsync_release_get_stats(&s, ctx), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("DLSYNC_RELEASE_STATS_INIT");
}

/* ---- 5. cuUserObjectRelease failing on an error path ---- */

static void test_user_object_release_fault_does_not_strand_a_release(void **state) {
  CUgraph g = NULL;
  CUgraphNode deps[2];
  dlsync_lane lg;
  dlsync__pool_stats ps;
  (void)state;
  atomic_store(&deleted, 0);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = fake_graph_add_work(g, NULL, 0, "uses it");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_release(ctx, &lg, count_deleter, NULL), DLSYNC_ERROR_DRIVER);
  fake_fail_clear();
  fake_run_destructors();
  /* Not "still owned by graphs": no graph holds it. */
  assert_int_equal(stats_of(ctx).pending_graph, 0);
  assert_int_equal(atomic_load(&deleted), 0); /* the object is still the caller's */
  /* An event given to a graph the same way comes back to its pool. */
  {
    dlsync_lane lp = dlsync_lane_stream(P);
    lg = dlsync_lane_graph(g, deps, 1, 2);
    fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
    fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
    assert_int_equal(dlsync_order(ctx, &lp, &lg), DLSYNC_ERROR_DRIVER);
    fake_fail_clear();
    fake_run_destructors();
    dlsync__pool_stats_get(&ps, &ctx->pools);
    assert_int_equal(ps.graph_owned, 0);
  }
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  pop_all_contexts();
  /* The fake keeps the two user objects the driver refused to release (that
   * is the driver's leak, not dlsync's): close without the leak report. */
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  ctx = NULL;
  fixture_open(NULL);
}

/* The same fault after the first of two built graphs took the object (the
 * second refused it): the reference left is given to that graph, whose
 * destruction lets the object go and its event back to the pool (before: the
 * user object lived on, the event counted as held by a graph for good). */
static void test_user_object_release_fault_after_one_graph_took_it(void **state) {
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphNode d1[2], d2[2];
  dlsync_lane l1, l2;
  dlsync__pool_stats ps;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "produce");
  d2[0] = fake_graph_add_work(g2, NULL, 0, "consume");
  l1 = dlsync_lane_graph(g1, d1, 1, 2);
  l2 = dlsync_lane_graph(g2, d2, 1, 2);
  fake_fail_nth("cuGraphRetainUserObject", 2, CUDA_ERROR_UNKNOWN); /* g2 refuses */
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &l1, &l2), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphRetainUserObject");
  fake_fail_clear();
  destroy_graph(g1);
  destroy_graph(g2);
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.graph_owned, 0);
  assert_int_equal(fake_live_user_objects(), 0);
  pop_all_contexts();
}

/* ---- 6. a fence that outlives its context ---- */

static void test_fence_outliving_its_context_still_works(void **state) {
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

static void test_context_destroy_abandons_exchanges_not_ended(void **state) {
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

static void test_fence_used_after_its_last_release_is_invalid_argument(void **state) {
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

/* ---- 7. destroy from a deleter while another release is queued ---- */

typedef struct destroyer {
  dlsync_context *ctx;
  atomic_int go; /* the release behind it is queued */
  atomic_int calls;
  dlsync_status status;
} destroyer;

static void destroying_deleter(void *arg) {
  destroyer *d = arg;
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&d->go) == 0; i++)
    sleep_ms(1);
  d->status = dlsync_context_destroy(d->ctx);
  atomic_fetch_add(&d->calls, 1);
}

static void test_destroy_from_a_deleter_destroys_the_queued_release_event(void **state) {
  destroyer d;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  atomic_store(&deleted, 0);
  memset(&d, 0, sizeof d);
  assert_int_equal(dlsync__context_create_with_driver(&d.ctx, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, destroying_deleter, &d), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  atomic_store(&d.go, 1);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(d.status, DLSYNC_ERROR_BUSY);
  assert_int_equal(atomic_load(&deleted), 1);
  sleep_ms(10); /* the reclaimer gives the event back after the deleter returns */
  assert_int_equal(fake_live_events(), 0);
}

/* ---- 8. two faults in a row ---- */

static void test_pop_then_destroy_fault_counts_no_phantom_destroy(void **state) {
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

/* ---- 10. smaller ones ---- */

static void test_require_of_two_capabilities_needs_both(void **state) {
  dlsync_context *c2 = NULL;
  (void)state;
  fake_set_driver_version(12000); /* user objects, no capture into a user graph */
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, fake_driver()), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_require(c2, DLSYNC_CAP_USER_OBJECTS), DLSYNC_SUCCESS);
  assert_int_equal(
      dlsync_context_require(
          c2, (dlsync_capability)(DLSYNC_CAP_USER_OBJECTS | DLSYNC_CAP_CAPTURE_TO_USER_GRAPH)),
      DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_message_has("cuStreamBeginCaptureToGraph");
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  fake_set_driver_version(13000);
}

static void test_empty_driver_path_is_invalid_argument(void **state) {
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *c2 = NULL;
  (void)state;
  cfg.driver_path = "";
  assert_int_equal(dlsync_context_create(&c2, &cfg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("driver_path");
  assert_null(c2);
}

static void test_capacity_zero_graph_lane_gives_no_event_to_the_graph(void **state) {
  CUgraph g = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  lg = dlsync_lane_graph(g, NULL, 0, 0);
  assert_int_equal(dlsync_order(ctx, &lp, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("capacity 0");
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_live_user_objects(), 0);
  destroy_graph(g);
}

static void test_duplicate_deps_are_named(void **state) {
  CUgraph g = NULL;
  CUgraphNode deps[2];
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = deps[1] = fake_graph_add_work(g, NULL, 0, "work");
  lg = dlsync_lane_graph(g, deps, 2, 2);
  assert_int_equal(dlsync_order(ctx, &lp, &lg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("twice");
  destroy_graph(g);
}

static void test_warm_path_query_failure_names_the_stream(void **state) {
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

/* ---- sweeps: every public entry point, with a fault on each of its driver
 * calls and on each of its allocations ----
 *
 * One scene per entry point of include/dlsync/ (the test
 * every_entry_point_is_swept, in tests/CMakeLists.txt, checks that each is
 * named here): a call of it, with what it needs made before and undone after.
 * Each run is on a fresh fake, context and streams (fixture_open), so it
 * starts from the same state and nothing is left of it afterwards
 * (fixture_close checks: no leak, pool intact, no call illegal during a
 * capture). Rows of the decision table are swept in test_exchange.c
 * (dlsync_order, begin, end), test_exchange_many.c, test_fence.c and
 * test_release.c, on lanes of every kind; context creation from a driver
 * table in test_context.c.
 *
 * The allocation sweep runs first in this binary: allocations made once per
 * process (the first exchange records, capture holds, the reclaimer
 * thread) are then among those failed. */

static struct {
  fake_fault kind;
  unsigned n; /* the fault armed by sweep_arm (0: none) */
  bool reached;
  /* At sweep_disarm: an allocation's fault as fake_fault_reported says; a driver
   * call's, the driver's words in the message (dlsync_release_flush reports
   * a call of the reclaimer thread, and begin_many the failure of a part it
   * ordered back, by message: dlsync_last_driver_result is 0 there). */
  bool reported;
  char message[512];
} sw;

/* Around the entry point's call only: the scene's own set-up makes calls
 * and allocations too. */
static void sweep_arm(void) {
  sw.reached = false;
  if (sw.n > 0)
    fake_fail_fault(sw.kind, sw.n);
}

static void sweep_disarm(void) {
  sw.reached = sw.n > 0 && !fake_fail_pending();
  fake_fail_clear();
  snprintf(sw.message, sizeof sw.message, "%s", dlsync_last_error());
  sw.reported = sw.kind == FAKE_FAULT_ALLOC ? fake_fault_reported(sw.kind)
                                            : strstr(sw.message, "CUDA_ERROR_UNKNOWN") != NULL;
}

/* The reclaimer of device 0, held in a deleter from gate_close to gate_open:
 * the driver-call sweep of a release must not hand its fault to the
 * reclaimer's own calls, made on that thread meanwhile. */
static atomic_int gate_entered, gate_opened;

static void gate_deleter(void *arg) {
  (void)arg;
  atomic_store(&gate_entered, 1);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&gate_opened) == 0; i++)
    sleep_ms(1);
}

static void gate_close(void) {
  dlsync_lane lc = dlsync_lane_stream(C);
  atomic_store(&gate_entered, 0);
  atomic_store(&gate_opened, 0);
  assert_int_equal(dlsync_release(ctx, &lc, gate_deleter, NULL), DLSYNC_SUCCESS);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&gate_entered) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&gate_entered), 1);
}

static void gate_open(void) {
  atomic_store(&gate_opened, 1);
}

static bool all_done(const dlsync_release_stats *s) {
  return s->pending_eager == 0 && s->pending_graph == 0;
}

/* Every release of ctx has run (a blocked one included: faults are gone). */
static void releases_settle(void) {
  assert_true(wait_stats(ctx, all_done));
  (void)dlsync_release_flush(ctx); /* forgets a failure already reported */
}

/* ---- the scenes: each returns the entry point's status ---- */

static dlsync_status scene_context_create(void) {
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *c2 = NULL;
  dlsync_status st;
  cfg.driver_path = "/nonexistent/dlsync-test/libcuda.so.1"; /* no driver: NO_DRIVER */
  sweep_arm();
  st = dlsync_context_create(&c2, &cfg);
  sweep_disarm();
  assert_null(c2);
  return st;
}

/* The default context is dlsync_context_create(NULL) on the real driver
 * (libcuda.so.1, never the fake, so no fake call is ever reached), tried by
 * each call until it is made or fails for good (context.h). A failed
 * allocation is not remembered: the allocation sweep fails each allocation
 * of that creation in turn (the status is OUT_OF_MEMORY), until a run gets
 * through. What that run gives is kept (NO_DRIVER where there is no
 * libcuda.so.1, the context where there is a GPU) and is the scene's status
 * without a fault (want -1); later calls make no driver call and no
 * allocation. */
static dlsync_status scene_context_default(void) {
  dlsync_context *c2 = NULL;
  dlsync_status st;
  sweep_arm();
  st = dlsync_context_default(&c2);
  sweep_disarm();
  return st;
}

static dlsync_status scene_context_destroy(void) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_status st;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_order(c2, &lp, &lc), DLSYNC_SUCCESS); /* a pool, an event */
  sweep_arm();
  st = dlsync_context_destroy(c2);
  sweep_disarm();
  if (sw.reached && sw.kind == FAKE_FAULT_CALL && strstr(sw.message, "cuEventDestroy") == NULL)
    fail_msg("destroy: %s", sw.message);
  return st;
}

static dlsync_status scene_context_facts(void) {
  int version = 0;
  uint32_t caps = 0;
  dlsync_status st;
  sweep_arm();
  st = dlsync_context_driver_version(&version, ctx);
  if (st == DLSYNC_SUCCESS)
    st = dlsync_context_capabilities(&caps, ctx);
  if (st == DLSYNC_SUCCESS)
    st = dlsync_context_require(ctx, DLSYNC_CAP_USER_OBJECTS);
  sweep_disarm();
  assert_non_null(dlsync_capability_name(DLSYNC_CAP_USER_OBJECTS));
  return st;
}

static dlsync_status scene_device_count(void) {
  int n = 0;
  dlsync_status st;
  sweep_arm();
  st = dlsync_device_count(&n, ctx);
  sweep_disarm();
  return st;
}

static dlsync_status scene_device_get_info(void) {
  dlsync_device_info info = DLSYNC_DEVICE_INFO_INIT;
  dlsync_status st;
  sweep_arm();
  st = dlsync_device_get_info(&info, ctx, 1);
  sweep_disarm();
  return st;
}

/* P eager, C capturing: EAGER_TO_CAPTURE (a capture's hold). */
static dlsync_status scene_order(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_status st;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_order(ctx, &lp, &lc);
  sweep_disarm();
  destroy_graph(end_capture_ok(C));
  return st;
}

static dlsync_status scene_exchange_begin(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_status st;
  sweep_arm();
  st = dlsync_exchange_begin(&ex, ctx, &lp, &lc);
  sweep_disarm();
  if (st == DLSYNC_SUCCESS)
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  return st;
}

/* Warm (memo and scratch event): the fast path, with the flag. */
static dlsync_status scene_exchange_begin_flags(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_status st;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  sweep_arm();
  st = dlsync_exchange_begin_flags(&ex, ctx, &lp, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE);
  sweep_disarm();
  if (st == DLSYNC_SUCCESS)
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  return st;
}

static dlsync_status scene_exchange_begin_many(void) {
  CUstream q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane lps[2] = {dlsync_lane_stream(P), dlsync_lane_stream(q)};
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_status st;
  sweep_arm();
  st = dlsync_exchange_begin_many(&ex, ctx, lps, 2, &lc, 0);
  sweep_disarm();
  if (st == DLSYNC_SUCCESS)
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  fake_stream_destroy(q);
  return st;
}

static dlsync_status scene_exchange_end(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_status st;
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  sweep_arm();
  st = dlsync_exchange_end(ex);
  sweep_disarm();
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_INVALID_ARGUMENT); /* ended either way */
  return st;
}

static dlsync_status scene_fence_signal(void) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_fence *f = NULL;
  dlsync_status st;
  sweep_arm();
  st = dlsync_fence_signal(&f, ctx, &lp);
  sweep_disarm();
  assert_true((st == DLSYNC_SUCCESS) == (f != NULL));
  dlsync_fence_release(f);
  return st;
}

/* scene_fence_*: a fence signalled on P, then `what` of it (0 wait on C, 1
 * retain, 2 get_kind, 3 its last release). */
static dlsync_status fence_scene(int what) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  dlsync_fence_kind kind;
  dlsync_status st = DLSYNC_SUCCESS;
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  sweep_arm();
  if (what == 0)
    st = dlsync_fence_wait(f, &lc);
  else if (what == 1)
    assert_ptr_equal(dlsync_fence_retain(f), f);
  else if (what == 2)
    st = dlsync_fence_get_kind(&kind, f);
  else
    dlsync_fence_release(f);
  sweep_disarm();
  if (what == 1)
    dlsync_fence_release(f);
  if (what != 3)
    dlsync_fence_release(f);
  return st;
}

static dlsync_status scene_fence_wait(void) {
  return fence_scene(0);
}

static dlsync_status scene_fence_retain(void) {
  return fence_scene(1);
}

static dlsync_status scene_fence_get_kind(void) {
  return fence_scene(2);
}

static dlsync_status scene_fence_release(void) {
  return fence_scene(3);
}

static dlsync_status scene_lane_query(void) {
  dlsync_lane l = dlsync_lane_stream(P);
  dlsync_lane_state s;
  dlsync_status st;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_lane_query(&s, ctx, &l); /* a status query, then the full one */
  sweep_disarm();
  destroy_graph(end_capture_ok(P));
  return st;
}

/* An eager release on P (stream 0), or on tensor t with dlsync_dlpack_release.
 * For driver calls the reclaimer is held while it is made. */
static dlsync_status release_scene(struct DLManagedTensorVersioned *t) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_status st;
  if (sw.kind == FAKE_FAULT_CALL)
    gate_close();
  sweep_arm();
  st = t != NULL ? dlsync_dlpack_release(ctx, &lp, t)
                 : dlsync_release(ctx, &lp, count_deleter, NULL);
  sweep_disarm();
  if (sw.kind == FAKE_FAULT_CALL)
    gate_open();
  releases_settle();
  return st;
}

static dlsync_status scene_release(void) {
  return release_scene(NULL);
}

/* A release queued behind the gate; the gate opens, and flush waits while the
 * reclaimer makes its calls: their faults come back from flush. */
static dlsync_status scene_release_flush(void) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_status st;
  gate_close();
  assert_int_equal(dlsync_release(ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  sweep_arm();
  gate_open();
  st = dlsync_release_flush(ctx);
  sweep_disarm();
  releases_settle();
  return st;
}

static dlsync_status scene_release_get_stats(void) {
  dlsync_release_stats s = DLSYNC_RELEASE_STATS_INIT;
  dlsync_status st;
  sweep_arm();
  st = dlsync_release_get_stats(&s, ctx);
  sweep_disarm();
  return st;
}

/* A DLPack 1.x tensor with a deleter that counts. */
typedef struct tensor {
  dlsync__dlpack_managed m;
} tensor;

static void tensor_deleter(struct DLManagedTensorVersioned *self) {
  (void)self;
  atomic_fetch_add(&deleted, 1);
}

static tensor a_tensor(void) {
  tensor t;
  memset(&t, 0, sizeof t);
  t.m.version.major = DLSYNC_DLPACK_MAJOR_VERSION;
  t.m.deleter = tensor_deleter;
  return t;
}

static dlsync_status scene_dlpack_release(void) {
  tensor t = a_tensor();
  return release_scene((struct DLManagedTensorVersioned *)(void *)&t);
}

static dlsync_status scene_dlpack_tensor(void) {
  tensor t = a_tensor();
  uint32_t major = 0, minor = 0;
  dlsync_status st;
  sweep_arm();
  st = dlsync_dlpack_version(&major, &minor, (struct DLManagedTensorVersioned *)(void *)&t);
  dlsync_dlpack_call_deleter((struct DLManagedTensorVersioned *)(void *)&t);
  sweep_disarm();
  return st;
}

/* Stream value 1 with a producer: its capture state is read. Capturing, the
 * answer is a refusal (LEGACY_STREAM_IN_CAPTURE) after two queries. */
static dlsync_status dlpack_stream_scene(bool capturing) {
  dlsync_lane producer = dlsync_lane_stream(P), out;
  bool ordered = true;
  dlsync_status st;
  if (capturing)
    assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_dlpack_stream(&out, &ordered, ctx, DLSYNC_DLPACK_STREAM_LEGACY, &producer);
  sweep_disarm();
  assert_true(ordered == (st == DLSYNC_SUCCESS));
  if (capturing)
    destroy_graph(end_capture_ok(P));
  return st;
}

static dlsync_status scene_dlpack_stream(void) {
  return dlpack_stream_scene(false);
}

static dlsync_status scene_dlpack_stream_capturing(void) {
  return dlpack_stream_scene(true);
}

/* The env table is the thread's: made by the first set, freed by clear. */
static dlsync_status scene_env_stream_set(void) {
  void *prev = (void *)&prev, *now = NULL;
  dlsync_status st;
  dlsync_env_stream_clear();
  sweep_arm();
  st = dlsync_env_stream_set(&prev, DLSYNC_DLPACK_DEVICE_CUDA, 0, P);
  sweep_disarm();
  assert_null(prev);
  assert_int_equal(dlsync_env_stream_get(&now, DLSYNC_DLPACK_DEVICE_CUDA, 0), DLSYNC_SUCCESS);
  assert_ptr_equal(now, st == DLSYNC_SUCCESS ? (void *)P : NULL); /* nothing changed on failure */
  dlsync_env_stream_clear();
  return st;
}

static dlsync_status scene_env_stream_get_clear(void) {
  void *now = NULL;
  dlsync_status st;
  assert_int_equal(dlsync_env_stream_set(NULL, DLSYNC_DLPACK_DEVICE_CUDA, 1, C), DLSYNC_SUCCESS);
  sweep_arm();
  st = dlsync_env_stream_get(&now, DLSYNC_DLPACK_DEVICE_CUDA, 1);
  dlsync_env_stream_clear();
  sweep_disarm();
  assert_ptr_equal(now, C);
  return st;
}

static int current_work_stream(int32_t device_type, int32_t device_id, void **out) {
  (void)device_type;
  (void)device_id;
  *out = P;
  return 0;
}

static dlsync_status scene_env_stream_from_exchange_api(void) {
  dlsync__dlpack_exchange_api api;
  void *s = NULL;
  dlsync_status st;
  memset(&api, 0, sizeof api);
  api.header.version.major = DLSYNC_DLPACK_MAJOR_VERSION;
  api.current_work_stream = current_work_stream;
  sweep_arm();
  st = dlsync_env_stream_from_exchange_api(&s, (const struct DLPackExchangeAPI *)(void *)&api,
                                           DLSYNC_DLPACK_DEVICE_CUDA, 0);
  sweep_disarm();
  return st;
}

/* The per-thread last error and the version: no driver, no allocation. */
static dlsync_status scene_status_and_version(void) {
  sweep_arm();
  assert_non_null(dlsync_status_name(DLSYNC_ERROR_DRIVER));
  assert_non_null(dlsync_status_string(DLSYNC_ERROR_DRIVER));
  (void)dlsync_last_status();
  assert_non_null(dlsync_last_error());
  (void)dlsync_last_driver_result();
  assert_int_equal(dlsync_version(), DLSYNC_VERSION);
  assert_non_null(dlsync_version_string());
  sweep_disarm();
  return DLSYNC_SUCCESS;
}

/* A conditional body declared, looked up and removed: no driver call, no
 * allocation (a table in the context). */
static dlsync_status scene_conditional_body(void) {
  CUgraph g = NULL;
  dlsync_status st;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_conditional_body_add(ctx, g);
  if (st == DLSYNC_SUCCESS && !dlsync_conditional_body_is_declared(ctx, g))
    st = DLSYNC_ERROR_INTERNAL;
  if (st == DLSYNC_SUCCESS)
    st = dlsync_conditional_body_remove(ctx, g);
  sweep_disarm();
  destroy_graph(g);
  return st;
}

/* scene_fence_import_*: an eager event of the test's imported (the check's
 * capture-mode switch and query swept), then `what` of the fence (0 nothing,
 * 1 export its event, 2 its provenance); owned, so that its event goes with
 * it whichever call failed. */
static dlsync_status import_scene(int what) {
  dlsync_fence *f = NULL;
  dlsync_provenance prov;
  CUevent e = NULL, out = NULL;
  dlsync_status st = DLSYNC_SUCCESS;
  e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  if (what == 0)
    sweep_arm();
  st = dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN);
  if (what == 0) {
    sweep_disarm();
    assert_true((st == DLSYNC_SUCCESS) == (f != NULL));
  } else {
    assert_int_equal(st, DLSYNC_SUCCESS);
    sweep_arm();
    if (what == 1)
      st = dlsync_fence_export_event(&out, f);
    else
      st = dlsync_fence_get_provenance(&prov, f);
    sweep_disarm();
  }
  if (f != NULL)
    dlsync_fence_release(f); /* the event is destroyed by the next collection */
  else
    assert_int_equal(D->EventDestroy(e), CUDA_SUCCESS); /* refused: still the test's */
  dlsync__orphans_collect();
  return st;
}

static dlsync_status scene_fence_import(void) {
  return import_scene(0);
}

static dlsync_status scene_fence_export_event(void) {
  return import_scene(1);
}

static dlsync_status scene_fence_get_provenance(void) {
  return import_scene(2);
}

static atomic_int arrow_released;

static void arrow_release_cb(struct ArrowArray *a) {
  atomic_fetch_add(&arrow_released, 1);
  a->release = NULL;
}

/* scene_arrow_*: an Arrow device array written on P, its sync_event filled
 * (what 0), waited on from C (1), released after C's work (2), its sync
 * dropped (3). */
static dlsync_status arrow_scene(int what) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  struct ArrowDeviceArray a;
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  dlsync_status st = DLSYNC_SUCCESS;
  memset(&a, 0, sizeof a);
  a.device_type = ARROW_DEVICE_CUDA;
  a.array.release = arrow_release_cb;
  atomic_store(&arrow_released, 0);
  if (sw.kind == FAKE_FAULT_CALL) /* the reclaimer makes no call while the fault is armed */
    gate_close();
  if (what == 0)
    sweep_arm();
  st = dlsync_arrow_sync_event(&a, &sync, ctx, &lp);
  if (what == 0) {
    sweep_disarm();
    assert_true((st == DLSYNC_SUCCESS) == (sync.fence != NULL));
  } else {
    assert_int_equal(st, DLSYNC_SUCCESS);
    sweep_arm();
    if (what == 1)
      st = dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0);
    else if (what == 2)
      st = dlsync_arrow_release(ctx, &lc, &a);
    else
      dlsync_arrow_sync_release(&sync);
    sweep_disarm();
  }
  if (sw.kind == FAKE_FAULT_CALL)
    gate_open();
  dlsync_arrow_sync_release(&sync);
  if (a.array.release != NULL) /* not handed over (or refused): still ours */
    a.array.release(&a.array);
  releases_settle();
  assert_int_equal(atomic_load(&arrow_released), 1); /* exactly once, either way */
  return st;
}

static dlsync_status scene_arrow_sync_event(void) {
  return arrow_scene(0);
}

static dlsync_status scene_arrow_wait(void) {
  return arrow_scene(1);
}

static dlsync_status scene_arrow_release(void) {
  return arrow_scene(2);
}

static dlsync_status scene_arrow_sync_release(void) {
  return arrow_scene(3);
}

/* A library's graph run in P's capture: a child-graph node. */
static dlsync_status scene_graph_launch(void) {
  dlsync_lane l = dlsync_lane_stream(P);
  CUgraph g = NULL;
  dlsync_status st;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  assert_non_null(fake_graph_add_work(g, NULL, 0, "library"));
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_graph_launch(ctx, g, NULL, &l);
  sweep_disarm();
  destroy_graph(end_capture_ok(P));
  destroy_graph(g);
  return st;
}

typedef struct entry {
  const char *names; /* the entry points the scene calls */
  dlsync_status (*run)(void);
  /* The status without a fault; -1: whatever the scene's first run that the
   * fault did not reach gave (it depends on the machine). */
  int want;
  /* A driver call that fails to destroy: the fake keeps the object (the
   * driver's leak, not dlsync's); the run closes without the leak check. */
  bool driver_keeps;
} entry;

static const entry entries[] = {
    {"dlsync_exchange_begin", scene_exchange_begin, DLSYNC_SUCCESS, false},
    {"dlsync_order", scene_order, DLSYNC_SUCCESS, false},
    {"dlsync_release", scene_release, DLSYNC_SUCCESS, false},
    {"dlsync_exchange_begin_flags", scene_exchange_begin_flags, DLSYNC_SUCCESS, false},
    {"dlsync_exchange_begin_many", scene_exchange_begin_many, DLSYNC_SUCCESS, false},
    {"dlsync_exchange_end", scene_exchange_end, DLSYNC_SUCCESS, false},
    {"dlsync_fence_signal", scene_fence_signal, DLSYNC_SUCCESS, false},
    {"dlsync_fence_wait", scene_fence_wait, DLSYNC_SUCCESS, false},
    {"dlsync_fence_retain", scene_fence_retain, DLSYNC_SUCCESS, false},
    {"dlsync_fence_get_kind", scene_fence_get_kind, DLSYNC_SUCCESS, false},
    {"dlsync_fence_release", scene_fence_release, DLSYNC_SUCCESS, false},
    {"dlsync_fence_import", scene_fence_import, DLSYNC_SUCCESS, false},
    {"dlsync_fence_export_event", scene_fence_export_event, DLSYNC_SUCCESS, false},
    {"dlsync_fence_get_provenance", scene_fence_get_provenance, DLSYNC_SUCCESS, false},
    {"dlsync_arrow_sync_event", scene_arrow_sync_event, DLSYNC_SUCCESS, false},
    {"dlsync_arrow_wait", scene_arrow_wait, DLSYNC_SUCCESS, false},
    {"dlsync_arrow_release", scene_arrow_release, DLSYNC_SUCCESS, false},
    {"dlsync_arrow_sync_release", scene_arrow_sync_release, DLSYNC_SUCCESS, false},
    {"dlsync_lane_query", scene_lane_query, DLSYNC_SUCCESS, false},
    {"dlsync_release_flush", scene_release_flush, DLSYNC_SUCCESS, false},
    {"dlsync_release_get_stats", scene_release_get_stats, DLSYNC_SUCCESS, false},
    {"dlsync_dlpack_release", scene_dlpack_release, DLSYNC_SUCCESS, false},
    {"dlsync_dlpack_version dlsync_dlpack_call_deleter", scene_dlpack_tensor, DLSYNC_SUCCESS,
     false},
    {"dlsync_dlpack_stream", scene_dlpack_stream, DLSYNC_SUCCESS, false},
    {"dlsync_dlpack_stream (capturing producer)", scene_dlpack_stream_capturing,
     DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE, false},
    {"dlsync_env_stream_set", scene_env_stream_set, DLSYNC_SUCCESS, false},
    {"dlsync_env_stream_get dlsync_env_stream_clear", scene_env_stream_get_clear, DLSYNC_SUCCESS,
     false},
    {"dlsync_env_stream_from_exchange_api", scene_env_stream_from_exchange_api, DLSYNC_SUCCESS,
     false},
    {"dlsync_context_create", scene_context_create, DLSYNC_ERROR_NO_DRIVER, false},
    {"dlsync_context_default", scene_context_default, -1, false},
    {"dlsync_context_destroy", scene_context_destroy, DLSYNC_SUCCESS, true},
    {"dlsync_context_driver_version dlsync_context_capabilities dlsync_context_require "
     "dlsync_capability_name",
     scene_context_facts, DLSYNC_SUCCESS, false},
    {"dlsync_conditional_body_add dlsync_conditional_body_is_declared "
     "dlsync_conditional_body_remove",
     scene_conditional_body, DLSYNC_SUCCESS, false},
    {"dlsync_graph_launch", scene_graph_launch, DLSYNC_SUCCESS, false},
    {"dlsync_device_count", scene_device_count, DLSYNC_SUCCESS, false},
    {"dlsync_device_get_info", scene_device_get_info, DLSYNC_SUCCESS, false},
    {"dlsync_status_name dlsync_status_string dlsync_last_status dlsync_last_error "
     "dlsync_last_driver_result dlsync_version dlsync_version_string",
     scene_status_and_version, DLSYNC_SUCCESS, false},
};

/* One run of the scene with fault n (1, 2, ...) of the kind, on a fresh
 * world; true when the fault was reached. */
static bool run_entry(const entry *e, fake_fault kind, unsigned n, int *want) {
  dlsync_status st;
  fixture_open(NULL);
  atomic_store(&deleted, 0);
  memset(&sw, 0, sizeof sw);
  sw.kind = kind;
  sw.n = n;
  st = e->run();
  fake_fail_clear();
  if (*want < 0 && !sw.reached)
    *want = (int)st;
  if (!sw.reached && (int)st != *want)
    fail_msg("%s, %s %u not reached: %s, not %s: %s", e->names, fake_fault_name(kind), n,
             dlsync_status_name(st), dlsync_status_name((dlsync_status)*want), sw.message);
  if (sw.reached && kind == FAKE_FAULT_CALL && (st == DLSYNC_SUCCESS || (int)st == *want))
    fail_msg("%s: driver call %u failed, and the status is %s", e->names, n,
             dlsync_status_name(st));
  /* A failed allocation: done without it (the status without a fault), or
   * reported. A failed call: reported, in the driver's words. */
  if (sw.reached && (int)st != *want && !sw.reported)
    fail_msg("%s, %s %u: %s: %s", e->names, fake_fault_name(kind), n, dlsync_status_name(st),
             sw.message);
  /* An event a fence or graph gave back while its pool could not grow (an
   * allocation failed) waits on the orphan list until the next collection
   * (a pool growing, a context made or destroyed): collected before the
   * pool is checked. */
  dlsync__orphans_collect();
  if (!(sw.reached && e->driver_keeps && kind == FAKE_FAULT_CALL)) {
    dlsync__pool_stats ps;
    dlsync__pool_stats_get(&ps, &ctx->pools);
    if (ps.created - ps.destroyed != fake_live_events())
      fail_msg("%s, %s %u: the pool counts %zu event(s) alive, the driver has %u", e->names,
               fake_fault_name(kind), n, ps.created - ps.destroyed, fake_live_events());
  }
  if (sw.reached && e->driver_keeps && kind == FAKE_FAULT_CALL) {
    assert_int_equal(fake_illegal_calls(), 0);
    assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
    ctx = NULL; /* the next fixture_open resets the fake, and what it kept */
  } else {
    fixture_close();
  }
  return sw.reached;
}

static void sweep_entries(fake_fault kind) {
  unsigned most = 0;
  fixture_close(); /* each run opens its own */
  for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
    static int wants[sizeof entries / sizeof entries[0]];
    static bool known[sizeof entries / sizeof entries[0]];
    unsigned n;
    if (!known[i]) { /* once: a -1 is then fixed by the first run the fault missed */
      wants[i] = entries[i].want;
      known[i] = true;
    }
    for (n = 1; n < 100; n++)
      if (!run_entry(&entries[i], kind, n, &wants[i]))
        break;
    if (n >= 100)
      fail_msg("%s: more than 100 %ss", entries[i].names, fake_fault_name(kind));
    most = n > most ? n : most;
  }
  /* The sweep went deep: the deepest entry points make at least 3
   * allocations (a first order into two captures: two holds, their user
   * objects' boxes, a pair) and as many driver calls. */
  assert_true(most > 3);
  fixture_open(NULL);
}

static void test_every_allocation_fault_surfaces(void **state) {
  (void)state;
  sweep_entries(FAKE_FAULT_ALLOC);
}

static void test_every_driver_call_fault_surfaces(void **state) {
  (void)state;
  sweep_entries(FAKE_FAULT_CALL);
}

/* ---- second round: unloading, fork, the last leaks ---- */

/* Waits until the driver has `want` events alive, or TIMEOUT_MS. */
static bool wait_live_events(unsigned want) {
  for (int i = 0; i < TIMEOUT_MS; i++) {
    if (fake_live_events() == want)
      return true;
    sleep_ms(1);
  }
  return fake_live_events() == want;
}

typedef struct other_destroyer {
  dlsync_context *victim;
  atomic_int calls;
  dlsync_status status;
  char message[512];
} other_destroyer;

static void destroy_other_deleter(void *arg) {
  other_destroyer *d = arg;
  d->status = dlsync_context_destroy(d->victim);
  snprintf(d->message, sizeof d->message, "%s", dlsync_last_error());
  atomic_fetch_add(&d->calls, 1);
}

static void test_idle_context_destroyed_from_another_contexts_deleter_is_success(void **state) {
  other_destroyer d;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  memset(&d, 0, sizeof d);
  assert_int_equal(dlsync__context_create_with_driver(&d.victim, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lp, destroy_other_deleter, &d), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&d.calls), 1);
  if (d.status != DLSYNC_SUCCESS)
    fail_msg("an idle context destroyed from a deleter: %s: %s", dlsync_status_name(d.status),
             d.message);
}

/* A context destroyed from a deleter with a release of its own queued
 * behind it: BUSY, naming that one release, not the one running. */
typedef struct gated_destroyer {
  dlsync_context *ctx;
  atomic_int go; /* the release behind it is queued */
  atomic_int calls;
  dlsync_status status;
  char message[512];
} gated_destroyer;

static void gated_destroying_deleter(void *arg) {
  gated_destroyer *d = arg;
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&d->go) == 0; i++)
    sleep_ms(1);
  d->status = dlsync_context_destroy(d->ctx);
  snprintf(d->message, sizeof d->message, "%s", dlsync_last_error());
  atomic_fetch_add(&d->calls, 1);
}

static void test_context_destroyed_from_its_deleter_counts_the_release_behind(void **state) {
  gated_destroyer d;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  memset(&d, 0, sizeof d);
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync__context_create_with_driver(&d.ctx, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, gated_destroying_deleter, &d), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  atomic_store(&d.go, 1);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&deleted), 1);
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(d.status, DLSYNC_ERROR_BUSY);
  if (strstr(d.message, "from a deleter with 1 eager release(s) queued") == NULL)
    fail_msg("%s", d.message);
  assert_true(wait_live_events(0));
}

static void test_begin_many_then_destroy_counts_the_callers_handle(void **state) {
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

static void test_destroy_names_each_kind_left_with_its_count(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_fence *f1 = NULL, *f2 = NULL;
  CUgraph g;
  unsigned before = fake_live_events();
  (void)state;
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(c2, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(dlsync_exchange_begin(&ex, c2, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f1, c2, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f2, c2, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_ERROR_BUSY);
  assert_message_has("1 exchange(s) begun and not ended");
  assert_message_has("2 fence(s) not released");
  assert_message_has("1 release(s) still owned by graphs");
  assert_message_has(" and 1 release(s)"); /* the last of three */
  destroy_graph(g);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&deleted), 1);
  dlsync_fence_release(f1);
  dlsync_fence_release(f2);
  /* The context's memory and the fences' events go on dlsync's janitor. */
  assert_true(wait_live_events(before));
}

static void test_fence_wait_on_an_invalidated_capture_says_invalidated(void **state) {
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

static void test_last_fence_release_makes_no_cuda_call_on_the_caller(void **state) {
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

/* A built graph's batch of events, let go when its context is destroyed:
 * gone once the driver runs the batch's destructor, with no other context
 * made after. */
static void warm_pool_of(dlsync_context *c, int n) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < n; i++)
    assert_int_equal(dlsync_order(c, &lp, &lc), DLSYNC_SUCCESS);
  destroy_graph(end_capture_ok(C));
}

static void order_into_built(dlsync_context *c, CUgraph *g_out) {
  CUgraph g = NULL;
  CUgraphNode deps[2];
  dlsync_lane lp = dlsync_lane_stream(P), lg;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = fake_graph_add_work(g, NULL, 0, "work");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  /* Batches of 1, 1, 2, 4 (the pool has events to fill them): three of
   * the last left unused. */
  warm_pool_of(c, 40);
  for (int i = 0; i < 5; i++)
    assert_int_equal(dlsync_order(c, &lp, &lg), DLSYNC_SUCCESS);
  pop_all_contexts();
  *g_out = g;
}

static void test_built_batch_events_are_gone_after_the_last_context(void **state) {
  dlsync_context *c2 = NULL;
  CUgraph g;
  unsigned before;
  (void)state;
  before = fake_live_events();
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  order_into_built(c2, &g);
  assert_true(fake_live_events() > before);
  destroy_graph(g);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  fake_run_destructors(); /* the driver's thread lets the batch go */
  if (!wait_live_events(before))
    fail_msg("%u event(s) of a destroyed context still alive", fake_live_events() - before);
}

typedef struct built_thread {
  dlsync_context *c;
  atomic_int phase; /* 1: ordered; 2: may exit */
} built_thread;

static void *built_thread_main(void *p) {
  built_thread *t = p;
  CUgraph g;
  order_into_built(t->c, &g);
  destroy_graph(g);
  atomic_store(&t->phase, 1);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&t->phase) != 2; i++)
    sleep_ms(1);
  return NULL;
}

static void test_another_threads_built_batch_is_gone_after_the_last_context(void **state) {
  built_thread t;
  pthread_t th;
  unsigned before;
  (void)state;
  before = fake_live_events();
  memset(&t, 0, sizeof t);
  assert_int_equal(dlsync__context_create_with_driver(&t.c, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(pthread_create(&th, NULL, built_thread_main, &t), 0);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&t.phase) != 1; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&t.phase), 1);
  assert_int_equal(dlsync_context_destroy(t.c), DLSYNC_SUCCESS);
  /* The destroy closed the other thread's batch: gone while it still runs. */
  fake_run_destructors();
  if (!wait_live_events(before))
    fail_msg("%u event(s) of a destroyed context still alive while the thread that ordered "
             "into its built graph runs",
             fake_live_events() - before);
  atomic_store(&t.phase, 2);
  assert_int_equal(pthread_join(th, NULL), 0);
  fake_run_destructors();
  assert_int_equal(fake_live_events(), before);
}

/* The duplicate check of a graph lane's deps: n log n, not n^2. Timed at
 * 16,000 and 32,000 distinct nodes (the fake's own calls are linear):
 * doubling n must not near quadruple the time (bounds loose: 3x, plus 20 ms). */
static double time_lane_check(size_t n) {
  CUgraphNode *deps = malloc(n * sizeof *deps);
  dlsync_lane lg;
  struct timespec a, b;
  double best = 1e9;
  assert_non_null(deps);
  for (size_t i = 0; i < n; i++)
    deps[i] = (CUgraphNode)(uintptr_t)(0x10000 + 64 * (n - i)); /* never dereferenced */
  lg = dlsync_lane_graph((CUgraph)(uintptr_t)0x1000, deps, n, n);
  for (int k = 0; k < 3; k++) {
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(dlsync__lane_check(&lg, "timed"), DLSYNC_SUCCESS);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if ((double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec) < best)
      best = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
  }
  free(deps);
  return best;
}

static void test_large_frontier_duplicate_check_is_not_quadratic(void **state) {
  double t16, t32;
  (void)state;
  t16 = time_lane_check(16000);
  t32 = time_lane_check(32000);
  if (t32 > 3.0 * t16 + 0.020)
    fail_msg("the deps check took %.4f s at 16,000 nodes and %.4f s at 32,000", t16, t32);
}

/* The same through dlsync_order, on the fake: two graph lanes of one graph
 * built by hand (SAME_BUILT), each a frontier of n/2 nodes, half of them
 * shared; their union (n/2 + n/4 nodes) checked and merged. */
static double time_same_built(size_t n) {
  CUgraph g = NULL;
  size_t half = n / 2;
  CUgraphNode *nodes = malloc((half + half / 2) * sizeof *nodes);
  CUgraphNode *da = malloc(n * sizeof *da), *db = malloc(n * sizeof *db);
  dlsync_lane la, lb;
  struct timespec a, b;
  double t;
  assert_non_null(nodes);
  assert_non_null(da);
  assert_non_null(db);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  for (size_t i = 0; i < half + half / 2; i++)
    nodes[i] = fake_graph_add_work(g, NULL, 0, "root");
  for (size_t i = 0; i < half; i++) {
    da[i] = nodes[i];            /* 0 .. half */
    db[i] = nodes[half / 2 + i]; /* half/2 .. half + half/2: half of them shared */
  }
  la = dlsync_lane_graph(g, da, half, n);
  lb = dlsync_lane_graph(g, db, half, n);
  clock_gettime(CLOCK_MONOTONIC, &a);
  assert_int_equal(dlsync_order(ctx, &la, &lb), DLSYNC_SUCCESS);
  clock_gettime(CLOCK_MONOTONIC, &b);
  t = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
  assert_int_equal(lb.ndeps, half + half / 2); /* the union, each node once */
  pop_all_contexts();
  destroy_graph(g);
  free(nodes);
  free(da);
  free(db);
  return t;
}

static void test_large_same_graph_union_is_not_quadratic(void **state) {
  double t16, t32;
  (void)state;
  (void)time_same_built(2000); /* warm */
  t16 = time_same_built(16000);
  t32 = time_same_built(32000);
  for (int k = 0; k < 2; k++) { /* the best of three: a busy machine's pauses */
    double a = time_same_built(16000), b = time_same_built(32000);
    t16 = a < t16 ? a : t16;
    t32 = b < t32 ? b : t32;
  }
  if (t32 > 3.0 * t16 + 0.020)
    fail_msg("an order of two 16,000-node frontiers of one graph took %.4f s, of two "
             "32,000-node ones %.4f s",
             t16, t32);
}

static void test_large_frontier_duplicate_is_named_like_a_small_one(void **state) {
  size_t n = 5000;
  CUgraphNode *deps = malloc(n * sizeof *deps);
  dlsync_lane lg;
  char want[96];
  (void)state;
  assert_non_null(deps);
  for (size_t i = 0; i < n; i++)
    deps[i] = (CUgraphNode)(uintptr_t)(0x10000 + 64 * i);
  deps[4000] = deps[17]; /* the first repeat */
  deps[4500] = deps[3];  /* a later one, of an earlier node */
  lg = dlsync_lane_graph((CUgraph)(uintptr_t)0x1000, deps, n, n);
  assert_int_equal(dlsync__lane_check(&lg, "big"), DLSYNC_ERROR_INVALID_ARGUMENT);
  snprintf(want, sizeof want, "node %p twice (deps[17] and deps[4000])", (void *)deps[17]);
  assert_message_has(want);
  free(deps);
}

/* The check that names a foreign dependency needs memory (the graph's
 * nodes): when it cannot have it, the failure says out of memory (found by
 * the fuzzer: it was the driver's INVALID_VALUE, as if no check were made). */
static void test_foreign_dependency_check_without_memory_says_so(void **state) {
  bool reached = true;
  (void)state;
  for (unsigned n = 1; reached && n < 200; n++) {
    CUgraph g, other;
    CUgraphNode deps[2];
    dlsync_lane lp = dlsync_lane_stream(P), lg;
    dlsync_status st;
    assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
    assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
    fake_graph_add_work(g, NULL, 0, "own");
    deps[0] = fake_graph_add_work(other, NULL, 0, "foreign");
    lg = dlsync_lane_graph(g, deps, 1, 2);
    dlsync__alloc_fail_nth(n);
    st = dlsync_order(ctx, &lp, &lg);
    reached = !dlsync__alloc_fail_pending();
    dlsync__alloc_fail_nth(0);
    if (st != DLSYNC_ERROR_FOREIGN_DEPENDENCY &&
        !(st == DLSYNC_ERROR_OUT_OF_MEMORY && strstr(dlsync_last_error(), "out of memory")))
      fail_msg("allocation %u failed: %s: %s", n, dlsync_status_name(st), dlsync_last_error());
    destroy_graph(g);
    destroy_graph(other);
    dlsync__orphans_collect();
  }
  assert_false(reached); /* every allocation of the call was failed once */
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* First: allocations made once per process are among those swept. */
      cmocka_unit_test_setup_teardown(test_every_allocation_fault_surfaces, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_every_driver_call_fault_surfaces, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_graph_lane_null_deps_is_not_a_crash, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_exchange_end_twice_is_invalid_argument, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_stale_exchange_handle_does_not_end_another,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_one_stream_exchange_end_twice_is_invalid_argument,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_garbage_exchange_handle_is_invalid_argument,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_exchange_handles_ended_on_another_thread_still_work,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_racing_ends_of_one_exchange_end_it_once, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_reclaimer_without_relaxed_mode_makes_no_illegal_call,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_failed_reclaimer_sync_is_counted_and_returned_by_flush,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_batch_synchronises_the_newest_event_of_each_stream,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_sync_in_a_batch_runs_each_deleter_once,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_release_into_the_threads_ring_allocates_nothing,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_full_ring_overflows_into_the_shared_queue_in_order,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_legacy_and_ordinary_stream_releases_run_in_order,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_ring_that_cannot_be_made_leaves_the_shared_queue,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_failed_stream_id_queues_nothing, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_threads_ring_runs_after_the_thread_exits,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_reused_handle_is_another_stream_in_a_batch,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_an_earlier_event_not_complete_is_synchronised_on_its_own,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_mode_failure_blocks_the_whole_batch, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_release_stats_need_their_size_and_version, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_user_object_release_fault_does_not_strand_a_release,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_user_object_release_fault_after_one_graph_took_it,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_fence_outliving_its_context_still_works, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_fence_used_after_its_last_release_is_invalid_argument,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_context_destroy_abandons_exchanges_not_ended,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_from_a_deleter_destroys_the_queued_release_event,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_pop_then_destroy_fault_counts_no_phantom_destroy,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_require_of_two_capabilities_needs_both, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_empty_driver_path_is_invalid_argument, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_capacity_zero_graph_lane_gives_no_event_to_the_graph,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_duplicate_deps_are_named, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_warm_path_query_failure_names_the_stream, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(
          test_idle_context_destroyed_from_another_contexts_deleter_is_success, fixture_setup,
          fixture_teardown),
      cmocka_unit_test_setup_teardown(
          test_context_destroyed_from_its_deleter_counts_the_release_behind, fixture_setup,
          fixture_teardown),
      cmocka_unit_test_setup_teardown(test_begin_many_then_destroy_counts_the_callers_handle,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_names_each_kind_left_with_its_count,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_fence_wait_on_an_invalidated_capture_says_invalidated,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_last_fence_release_makes_no_cuda_call_on_the_caller,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_built_batch_events_are_gone_after_the_last_context,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(
          test_another_threads_built_batch_is_gone_after_the_last_context, fixture_setup,
          fixture_teardown),
      cmocka_unit_test_setup_teardown(test_large_frontier_duplicate_check_is_not_quadratic,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_foreign_dependency_check_without_memory_says_so,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_large_same_graph_union_is_not_quadratic, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(test_large_frontier_duplicate_is_named_like_a_small_one,
                                      fixture_setup, fixture_teardown),
  };
  int rc;
  if (getenv("DLSYNC_TEST_FILTER") != NULL) /* one test by name (a glob) */
    cmocka_set_test_filter(getenv("DLSYNC_TEST_FILTER"));
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
