/* SPDX-License-Identifier: Apache-2.0 */
/* Stream-ordered release on the fake driver: deleters run on a reclaimer
 * thread, once, only after the work (eager streams: after synchronizing the
 * event recorded behind the producer's work; graphs: after the graph and its
 * executables are gone), never blocking the releasing thread; context
 * shutdown; flush; deleters that call the driver during another thread's
 * capture; the errors; fault injection on every driver call; many threads.
 *
 * Every wait on the reclaimer has a timeout: a broken reclaimer fails a test,
 * it never hangs it. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fixture.h"

#define TIMEOUT_MS 5000

static dlsync__driver W; /* the table the contexts use: the fake's (D), with a probe */

/* ---- the probe: which event the calling thread last synchronized ---- */

static PFN_cuEventSynchronize_v2000 real_event_synchronize;
static _Thread_local uint64_t synced_op;

static CUresult CUDAAPI probe_event_synchronize(CUevent e) {
  CUresult r = real_event_synchronize(e);
  synced_op = r == CUDA_SUCCESS ? fake_event_op(e) : 0;
  return r;
}

/* ---- time ---- */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---- deleters ---- */

static atomic_int sequence;

typedef struct rec {
  atomic_int calls;
  atomic_int order; /* sequence number of the first call */
  pthread_t thread;
  uint64_t synced_op; /* what the reclaimer synchronized just before */
  /* gate_deleter */
  atomic_int entered;
  atomic_int open;
  atomic_int gate_timed_out;
  /* flush_deleter */
  dlsync_context *ctx;
  dlsync_status flush_status;
  char message[256];
  /* driver_deleter */
  CUstream stream;
  CUdeviceptr ptr;
  CUresult query_result;
  CUresult free_result;
} rec;

static void rec_init(rec *r) {
  memset(r, 0, sizeof *r);
  atomic_init(&r->calls, 0);
  atomic_init(&r->order, 0);
  atomic_init(&r->entered, 0);
  atomic_init(&r->open, 0);
  atomic_init(&r->gate_timed_out, 0);
}

/* The count last: a test that saw it may return, and its rec (on its
 * stack) be reused, before this thread would write anything after it. */
static void note(rec *r) {
  r->thread = pthread_self();
  r->synced_op = synced_op;
  if (atomic_load(&r->calls) == 0)
    atomic_store(&r->order, atomic_fetch_add(&sequence, 1) + 1);
  atomic_fetch_add(&r->calls, 1);
}

static void note_deleter(void *arg) {
  note(arg);
}

/* Blocks until the test opens the gate (at most TIMEOUT_MS). */
static void gate_deleter(void *arg) {
  rec *r = arg;
  long long until = now_ms() + TIMEOUT_MS;
  atomic_store(&r->entered, 1);
  while (!atomic_load(&r->open)) {
    if (now_ms() > until) {
      atomic_store(&r->gate_timed_out, 1);
      break;
    }
    sleep_ms(1);
  }
  note(r);
}

static void slow_deleter(void *arg) {
  sleep_ms(200);
  note(arg);
}

static void flush_deleter(void *arg) {
  rec *r = arg;
  r->flush_status = dlsync_release_flush(r->ctx);
  snprintf(r->message, sizeof r->message, "%s", dlsync_last_error());
  note(r);
}

/* Destroys r->ctx from inside its own deleter. */
static void destroying_deleter(void *arg) {
  rec *r = arg;
  r->flush_status = dlsync_context_destroy(r->ctx);
  snprintf(r->message, sizeof r->message, "%s", dlsync_last_error());
  note(r);
}

static void driver_deleter(void *arg) {
  rec *r = arg;
  r->query_result = D->StreamQuery(r->stream);
  r->free_result = r->ptr != 0 ? D->MemFree(r->ptr) : CUDA_SUCCESS;
  note(r);
}

/* ---- waiting, with timeouts ---- */

static bool wait_for(atomic_int *v, int at_least) {
  long long until = now_ms() + TIMEOUT_MS;
  while (atomic_load(v) < at_least) {
    if (now_ms() > until)
      return false;
    sleep_ms(1);
  }
  return true;
}

static dlsync_release_stats stats_of(dlsync_context *c) {
  dlsync_release_stats s = DLSYNC_RELEASE_STATS_INIT;
  assert_int_equal(dlsync_release_get_stats(&s, c), DLSYNC_SUCCESS);
  return s;
}

/* Polls the stats until `done` reaches n (the deleters of graph-owned
 * releases run on the reclaimer after the destructors). */
static bool wait_done(dlsync_context *c, size_t n) {
  long long until = now_ms() + TIMEOUT_MS;
  while (stats_of(c).done < n) {
    if (now_ms() > until)
      return false;
    sleep_ms(1);
  }
  return true;
}

/* A call that may block (flush, context destroy), run on a thread of its own
 * and joined with a timeout. */
typedef struct blocking_call {
  pthread_t thread;
  dlsync_context *ctx;
  bool destroy; /* dlsync_context_destroy instead of dlsync_release_flush */
  dlsync_status status;
  char message[256];
} blocking_call;

static void *blocking_main(void *p) {
  blocking_call *b = p;
  b->status = b->destroy ? dlsync_context_destroy(b->ctx) : dlsync_release_flush(b->ctx);
  snprintf(b->message, sizeof b->message, "%s", dlsync_last_error());
  return NULL;
}

static void blocking_start(blocking_call *b, dlsync_context *c, bool destroy) {
  b->ctx = c;
  b->destroy = destroy;
  b->status = DLSYNC_ERROR_INTERNAL;
  b->message[0] = '\0';
  assert_int_equal(pthread_create(&b->thread, NULL, blocking_main, b), 0);
}

static bool blocking_returned(blocking_call *b) {
  return pthread_tryjoin_np(b->thread, NULL) == 0;
}

static dlsync_status blocking_join(blocking_call *b) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += TIMEOUT_MS / 1000;
  if (pthread_timedjoin_np(b->thread, NULL, &ts) != 0)
    fail_msg("%s did not return within %d ms",
             b->destroy ? "dlsync_context_destroy" : "dlsync_release_flush", TIMEOUT_MS);
  return b->status;
}

static dlsync_status flush_within(dlsync_context *c) {
  blocking_call b;
  blocking_start(&b, c, false);
  return blocking_join(&b);
}

/* Destructors run on a thread of their own, like the driver's; returns its id. */
static void *destructors_main(void *p) {
  (void)p;
  fake_run_destructors();
  return NULL;
}

static pthread_t run_destructors_elsewhere(void) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, destructors_main, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  return t;
}

/* ---- fixture ---- */

static int setup(void **state) {
  (void)state;
  fixture_open(&W);
  atomic_store(&sequence, 0);
  return 0;
}

static int teardown(void **state) {
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  (void)state;
  pop_all_contexts();
  fake_run_destructors();
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.pending_graph, 0);
  fixture_close();
  return 0;
}

/* The deleter has not run, and does not run while we wait a little. */
static void assert_not_run(rec *r) {
  fake_run_destructors();
  sleep_ms(20);
  assert_int_equal(atomic_load(&r->calls), 0);
}

/* ---- eager streams ---- */

static void eager_release_runs_on_the_reclaimer_after_the_work_once(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  rec r;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  uint64_t produce, recorded;
  (void)state;
  rec_init(&r);
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(ctx, &lp, note_deleter, &r), DLSYNC_SUCCESS);
  /* The release recorded an event on P after the producer's work... */
  recorded = fake_stream_last_op(P);
  assert_int_not_equal(recorded, produce);
  assert_true(fake_happens_before(produce, recorded));
  assert_int_equal(fake_call_count("cuEventRecord"), 1);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  /* ...and the deleter ran after the reclaimer synchronized that record. */
  assert_int_equal(r.synced_op, recorded);
  assert_false(pthread_equal(r.thread, pthread_self()));
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.pending_graph, 0);
  assert_int_equal(rs.done, 1);
  sleep_ms(20);
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(stats_of(ctx).done, 1);
}

static void releasing_never_blocks_and_flush_waits(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  rec a, b;
  blocking_call flush;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  long long t0;
  (void)state;
  rec_init(&a);
  rec_init(&b);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(ctx, &lp, gate_deleter, &a), DLSYNC_SUCCESS);
  assert_true(wait_for(&a.entered, 1));
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 1);
  assert_int_equal(rs.done, 0);
  /* The reclaimer is busy with a's deleter: releasing does not wait for it. */
  t0 = now_ms();
  fake_work(C, "produce", NULL);
  assert_int_equal(dlsync_release(ctx, &lc, note_deleter, &b), DLSYNC_SUCCESS);
  assert_true(now_ms() - t0 < 1000);
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 2);
  assert_int_equal(atomic_load(&b.calls), 0);
  /* Flush waits for both. */
  blocking_start(&flush, ctx, false);
  sleep_ms(50);
  assert_false(blocking_returned(&flush));
  atomic_store(&a.open, 1);
  assert_int_equal(blocking_join(&flush), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&a.gate_timed_out), 0);
  assert_int_equal(atomic_load(&a.calls), 1);
  assert_int_equal(atomic_load(&b.calls), 1);
  assert_true(atomic_load(&a.order) < atomic_load(&b.order)); /* in the order of their work */
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.done, 2);
}

static void eager_releases_on_two_devices(void **state) {
  CUstream s1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  dlsync_lane l0 = dlsync_lane_stream(P), l1 = dlsync_lane_stream(s1);
  rec r0, r1;
  (void)state;
  rec_init(&r0);
  rec_init(&r1);
  assert_int_equal(dlsync_release(ctx, &l0, note_deleter, &r0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &l1, note_deleter, &r1), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r0.calls), 1);
  assert_int_equal(atomic_load(&r1.calls), 1);
  /* One reclaimer per GPU. */
  assert_false(pthread_equal(r0.thread, r1.thread));
  assert_false(pthread_equal(r0.thread, pthread_self()));
  assert_false(pthread_equal(r1.thread, pthread_self()));
  fake_stream_destroy(s1);
}

/* ---- graphs ---- */

static void capture_release_runs_after_the_graph_and_its_executable(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraphNode n1, n2;
  CUgraph g;
  CUgraphExec x;
  pthread_t dtor_thread;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  rec r;
  (void)state;
  rec_init(&r);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &n1);
  fake_log_reset();
  assert_int_equal(dlsync_release(ctx, &lp, note_deleter, &r), DLSYNC_SUCCESS);
  /* Nothing recorded, synchronized or queried; the capture goes on. */
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuEventSynchronize"), 0);
  assert_int_equal(fake_call_count("cuStreamQuery"), 0);
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_graph, 1);
  assert_int_equal(rs.pending_eager, 0);
  fake_work(P, "more", &n2);
  g = end_capture_ok(P);
  assert_true(fake_graph_has_path(g, n1, n2));
  assert_not_run(&r);
  /* Instantiated and replayed 100 times: still owned. */
  x = NULL;
  assert_int_equal(W.GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  for (int i = 0; i < 100; i++)
    assert_int_equal(W.GraphLaunch(x, C), CUDA_SUCCESS);
  assert_not_run(&r);
  /* Flush waits only for eager releases. */
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 0);
  /* The graph gone, the executable still alive: still owned. */
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_not_run(&r);
  assert_int_equal(stats_of(ctx).pending_graph, 1);
  /* The executable gone too: the destructor queues it, the reclaimer runs it. */
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  assert_int_equal(fake_pending_destructors(), 1);
  dtor_thread = run_destructors_elsewhere();
  assert_true(wait_done(ctx, 1));
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_false(pthread_equal(r.thread, dtor_thread));
  assert_false(pthread_equal(r.thread, pthread_self()));
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_graph, 0);
  assert_int_equal(rs.done, 1);
  sleep_ms(20);
  assert_int_equal(atomic_load(&r.calls), 1);
}

static void capture_release_with_inline_destructors_still_runs_on_the_reclaimer(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraph g;
  rec r;
  (void)state;
  rec_init(&r);
  fake_set_destructors_inline(true);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lp, note_deleter, &r), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(atomic_load(&r.calls), 0);
  /* The destructor runs inside cuGraphDestroy, on this thread. */
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_true(wait_for(&r.calls, 1));
  assert_false(pthread_equal(r.thread, pthread_self()));
  assert_true(wait_done(ctx, 1));
  fake_set_destructors_inline(false);
}

static void built_lane_release_runs_after_the_graph(void **state) {
  CUgraph g;
  CUgraphNode m, deps[2];
  dlsync_lane lg;
  rec r, early;
  (void)state;
  rec_init(&r);
  rec_init(&early);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "uses the tensor");
  deps[0] = m;
  lg = dlsync_lane_graph(g, deps, 1, 2);
  /* Without a current context the GPU is unknown. */
  assert_int_equal(dlsync_release(ctx, &lg, note_deleter, &early), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "current CUDA context"));
  assert_int_equal(stats_of(ctx).pending_graph, 0);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lg, note_deleter, &r), DLSYNC_SUCCESS);
  /* No node, the frontier as it was. */
  assert_int_equal(fake_graph_count_nodes(g, -1), 1);
  assert_int_equal(lg.ndeps, 1);
  assert_ptr_equal(lg.deps[0], m);
  assert_int_equal(stats_of(ctx).pending_graph, 1);
  assert_not_run(&r);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  assert_true(wait_done(ctx, 1));
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_false(pthread_equal(r.thread, pthread_self()));
  assert_not_run(&early);
  pop_all_contexts();
}

/* A release its graph let go is queued: flush waits for its deleter, and
 * the stats (and a context destroy) no longer call it owned by graphs. */
static void graph_release_let_go_is_queued_and_flush_waits(void **state) {
  CUgraph g;
  CUgraphNode m;
  dlsync_lane lg;
  rec r;
  blocking_call flush;
  dlsync_release_stats rs;
  (void)state;
  rec_init(&r);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "uses the tensor");
  lg = dlsync_lane_graph(g, &m, 1, 1);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lg, gate_deleter, &r), DLSYNC_SUCCESS);
  assert_int_equal(stats_of(ctx).pending_graph, 1);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  assert_true(wait_for(&r.entered, 1)); /* its deleter runs, held at the gate */
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_graph, 0);
  assert_int_equal(rs.pending_eager, 1);
  blocking_start(&flush, ctx, false);
  sleep_ms(50);
  assert_false(blocking_returned(&flush));
  atomic_store(&r.open, 1);
  assert_int_equal(blocking_join(&flush), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.gate_timed_out), 0);
  assert_int_equal(atomic_load(&r.calls), 1);
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.pending_graph, 0);
  assert_int_equal(rs.done, 1);
  pop_all_contexts();
}

/* ---- shutdown and flush ---- */

static void context_destroy_waits_for_eager_releases(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P);
  blocking_call destroy;
  rec r;
  (void)state;
  rec_init(&r);
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, &W), DLSYNC_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(c2, &lp, slow_deleter, &r), DLSYNC_SUCCESS);
  blocking_start(&destroy, c2, true);
  assert_int_equal(blocking_join(&destroy), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(fake_live_events(), 0); /* the release's event went back and was destroyed */
}

static void context_destroyed_from_its_own_deleter_returns_instead_of_hanging(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  rec r, after;
  (void)state;
  rec_init(&r);
  rec_init(&after);
  assert_int_equal(dlsync__context_create_with_driver(&r.ctx, NULL, &W), DLSYNC_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(r.ctx, &lp, destroying_deleter, &r), DLSYNC_SUCCESS);
  /* A release of the test's own context queued behind it still runs. */
  assert_int_equal(dlsync_release(ctx, &lp, note_deleter, &after), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  /* Nothing of its own left behind the one running: destroyed, SUCCESS
   * (BUSY is only for work left; the one running is done when it returns). */
  assert_int_equal(r.flush_status, DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&after.calls), 1);
}

static void context_destroy_with_a_graph_owned_release_is_busy(void **state) {
  dlsync_context *c2 = NULL;
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  blocking_call destroy;
  CUgraph g;
  rec r, eager;
  (void)state;
  rec_init(&r);
  rec_init(&eager);
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, &W), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(c2, &lp, note_deleter, &r), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(dlsync_release(c2, &lc, slow_deleter, &eager), DLSYNC_SUCCESS);
  blocking_start(&destroy, c2, true);
  assert_int_equal(blocking_join(&destroy), DLSYNC_ERROR_BUSY);
  assert_non_null(strstr(destroy.message, "1 release(s)"));
  assert_non_null(strstr(destroy.message, "graphs"));
  /* The eager one was waited for, the graph's one was not dropped. */
  assert_int_equal(atomic_load(&eager.calls), 1);
  assert_not_run(&r);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  assert_true(wait_for(&r.calls, 1));
  assert_false(pthread_equal(r.thread, pthread_self()));
  sleep_ms(20);
  assert_int_equal(atomic_load(&r.calls), 1);
}

static void flush_from_a_deleter_is_refused(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraph g;
  rec r, rg;
  (void)state;
  rec_init(&r);
  rec_init(&rg);
  r.ctx = ctx;
  rg.ctx = ctx;
  assert_int_equal(dlsync_release(ctx, &lp, flush_deleter, &r), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(r.flush_status, DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(r.message, "from a deleter"));
  /* The same from a graph-owned release's deleter. */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lp, flush_deleter, &rg), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  assert_true(wait_done(ctx, 2));
  assert_int_equal(rg.flush_status, DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(rg.message, "from a deleter"));
}

/* ---- deleters calling the driver while another thread captures ---- */

static void eager_deleter_may_call_the_driver_during_a_global_capture(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraph g;
  rec r;
  (void)state;
  rec_init(&r);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->MemAlloc(&r.ptr, 4096), CUDA_SUCCESS);
  r.stream = P;
  /* This thread captures C in GLOBAL mode: other GLOBAL threads may not query. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "captured", NULL);
  fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_release(ctx, &lp, driver_deleter, &r), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(r.query_result, CUDA_SUCCESS);
  assert_int_equal(r.free_result, CUDA_SUCCESS);
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(C);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(fake_live_allocs(), 0);
  pop_all_contexts();
}

static void graph_deleter_may_call_the_driver_during_a_global_capture(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraph g1, g2;
  rec r;
  (void)state;
  rec_init(&r);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->MemAlloc(&r.ptr, 4096), CUDA_SUCCESS);
  r.stream = P;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "uses the buffer", NULL);
  assert_int_equal(dlsync_release(ctx, &lp, driver_deleter, &r), DLSYNC_SUCCESS);
  g1 = end_capture_ok(P);
  assert_int_equal(D->GraphDestroy(g1), CUDA_SUCCESS);
  /* The deleter runs while this thread captures C in GLOBAL mode. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(C, "captured", NULL);
  fake_run_destructors();
  assert_true(wait_done(ctx, 1));
  assert_int_equal(atomic_load(&r.calls), 1);
  assert_int_equal(r.query_result, CUDA_SUCCESS);
  assert_int_equal(r.free_result, CUDA_SUCCESS);
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g2 = end_capture_ok(C);
  assert_int_equal(D->GraphDestroy(g2), CUDA_SUCCESS);
  assert_int_equal(fake_live_allocs(), 0);
  pop_all_contexts();
}

/* ---- errors ---- */

static void null_and_invalid_arguments(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), none, both = dlsync_lane_stream(P), bad;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  CUgraph g;
  CUgraphNode deps[1];
  rec r;
  (void)state;
  rec_init(&r);
  memset(&none, 0, sizeof none);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  both.graph = g;
  fake_log_reset();
  assert_int_equal(dlsync_release(NULL, &lp, note_deleter, &r), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "ctx is NULL"));
  assert_int_equal(dlsync_release(ctx, &lp, NULL, &r), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "deleter is NULL"));
  assert_int_equal(dlsync_release(ctx, NULL, note_deleter, &r), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "lane is NULL"));
  assert_int_equal(dlsync_release(ctx, &none, note_deleter, &r), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "neither"));
  assert_int_equal(dlsync_release(ctx, &both, note_deleter, &r), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "both"));
  bad = dlsync_lane_graph(NULL, deps, 0, 1);
  assert_int_equal(dlsync_release(ctx, &bad, note_deleter, &r), DLSYNC_ERROR_INVALID_LANE);
  assert_non_null(strstr(dlsync_last_error(), "no graph"));
  bad = dlsync_lane_graph(g, deps, 2, 1);
  assert_int_equal(dlsync_release(ctx, &bad, note_deleter, &r), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "capacity"));
  bad = dlsync_lane_graph(g, NULL, 1, 1);
  assert_int_equal(dlsync_release(ctx, &bad, note_deleter, &r), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "deps is NULL"));
  assert_int_equal(fake_calls_total(), 0);
  assert_int_equal(dlsync_release_flush(NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "ctx is NULL"));
  assert_int_equal(dlsync_release_get_stats(NULL, ctx), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "out is NULL"));
  assert_int_equal(dlsync_release_get_stats(&rs, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "ctx is NULL"));
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager + rs.pending_graph + rs.done, 0);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_not_run(&r);
}

static void invalidated_capture_and_legacy_stream_are_refused(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane legacy = dlsync_lane_stream(DLSYNC_STREAM_LEGACY), nul = dlsync_lane_stream(NULL);
  CUstream blocking = fake_stream_create(0, CU_STREAM_DEFAULT);
  CUevent e = fake_event_create(0, 0);
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  CUgraph g = NULL;
  rec r;
  (void)state;
  rec_init(&r);
  /* An invalidated capture. */
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(dlsync_release(ctx, &lp, note_deleter, &r), DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_non_null(strstr(dlsync_last_error(), "invalidated"));
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  /* The legacy stream while a blocking stream captures. */
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(blocking, "captured", NULL);
  fake_log_reset();
  assert_int_equal(dlsync_release(ctx, &legacy, note_deleter, &r),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_non_null(strstr(dlsync_last_error(), "legacy"));
  assert_int_equal(dlsync_release(ctx, &nul, note_deleter, &r),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_capture_status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(blocking);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  rs = stats_of(ctx);
  assert_int_equal(rs.pending_eager + rs.pending_graph + rs.done, 0);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_not_run(&r);
  /* Without the capture the legacy stream is an eager lane. */
  assert_int_equal(dlsync_release(ctx, &legacy, note_deleter, &r), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&r.calls), 1);
  pop_all_contexts();
  fake_event_destroy(e);
  fake_stream_destroy(blocking);
}

/* ---- fault injection: every driver call of a release ---- */

typedef enum release_row { R_EAGER, R_CAPTURE, R_BUILT } release_row;

/* One release of the row on a context and stream of its own, with driver call
 * n failing (n = 0: none), then cleaned up and checked: nothing left alive.
 * While the release is made, the reclaimer is held in the deleter of another
 * context's release, so that its own driver calls cannot take the fault.
 * Returns true when call n was reached. */
static fake_fault sweep_kind = FAKE_FAULT_CALL;

static bool run_release_row(release_row row, unsigned n) {
  dlsync_context *fc = NULL, *fb = NULL;
  CUstream s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUstream sb = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane l = dlsync_lane_stream(s), lb = dlsync_lane_stream(sb);
  CUgraph g = NULL;
  CUgraphNode deps[2];
  rec blocker, r;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  dlsync_status st;
  char leaks[256] = {0};
  bool reached;
  rec_init(&blocker);
  rec_init(&r);
  assert_int_equal(dlsync__context_create_with_driver(&fb, NULL, &W), DLSYNC_SUCCESS);
  assert_int_equal(dlsync__context_create_with_driver(&fc, NULL, &W), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(fb, &lb, gate_deleter, &blocker), DLSYNC_SUCCESS);
  assert_true(wait_for(&blocker.entered, 1));
  if (row == R_CAPTURE) {
    assert_int_equal(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  } else if (row == R_BUILT) {
    assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
    assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
    deps[0] = fake_graph_add_work(g, NULL, 0, "uses it");
    l = dlsync_lane_graph(g, deps, 1, 2);
  }
  if (row != R_BUILT)
    fake_work(s, "uses it", NULL);

  if (n > 0)
    fake_fail_fault(sweep_kind, n);
  st = dlsync_release(fc, &l, note_deleter, &r);
  reached = n > 0 && !fake_fail_pending();
  fake_fail_clear();
  atomic_store(&blocker.open, 1);
  if (reached && sweep_kind == FAKE_FAULT_ALLOC) {
    if (st != DLSYNC_SUCCESS && !fake_fault_reported(sweep_kind))
      fail_msg("row %d, allocation %u: %s", (int)row, n, dlsync_last_error());
  } else if (reached) {
    if (st == DLSYNC_SUCCESS)
      fail_msg("row %d: call %u failed but the release succeeded", (int)row, n);
    if (strstr(dlsync_last_error(), "CUDA_ERROR_") == NULL)
      fail_msg("row %d, call %u: message without the driver's error: %s", (int)row, n,
               dlsync_last_error());
  } else if (st != DLSYNC_SUCCESS) {
    fail_msg("row %d without a fault: %s", (int)row, dlsync_last_error());
  }

  /* Clean up: end the capture, destroy the graph, let everything run. */
  if (row == R_CAPTURE)
    assert_int_equal(D->StreamEndCapture(s, &g), CUDA_SUCCESS);
  if (g != NULL)
    assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  assert_int_equal(flush_within(fb), DLSYNC_SUCCESS);
  assert_int_equal(flush_within(fc), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&blocker.gate_timed_out), 0);
  assert_int_equal(atomic_load(&blocker.calls), 1);
  if (st != DLSYNC_SUCCESS) {
    /* The object is still the caller's: its deleter never runs. */
    assert_not_run(&r);
    rs = stats_of(fc);
    assert_int_equal(rs.done, 0);
  } else {
    assert_true(wait_done(fc, 1));
    assert_int_equal(atomic_load(&r.calls), 1);
  }
  rs = stats_of(fc);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.pending_graph, 0);
  assert_pools_intact(fc, fb);
  pop_all_contexts();
  assert_int_equal(dlsync_context_destroy(fc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(fb), DLSYNC_SUCCESS);
  fake_stream_destroy(s);
  fake_stream_destroy(sb);
  fake_run_destructors();
  if (fake_leak_report(leaks, sizeof leaks) != 0)
    fail_msg("row %d, call %u: leaked: %s", (int)row, n, leaks);
  assert_int_equal(fake_illegal_calls(), 0);
  return reached;
}

static void every_driver_failure_in_a_release_is_a_status(void **state) {
  (void)state;
  /* Each row brings its own contexts and streams: nothing else is alive. */
  fake_stream_destroy(P);
  fake_stream_destroy(C);
  assert_int_equal(fake_leak_report(NULL, 0), 0);
  for (release_row row = R_EAGER; row <= R_BUILT; row++) {
    unsigned n;
    run_release_row(row, 0);
    for (n = 1; n < 100; n++)
      if (!run_release_row(row, n))
        break;
    assert_true(n > 2);
    assert_true(n < 100);
  }
  P = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  C = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

static void every_allocation_failure_in_a_release_is_a_status(void **state) {
  unsigned most = 0;
  (void)state;
  fake_stream_destroy(P);
  fake_stream_destroy(C);
  assert_int_equal(fake_leak_report(NULL, 0), 0);
  sweep_kind = FAKE_FAULT_ALLOC;
  for (release_row row = R_EAGER; row <= R_BUILT; row++) {
    unsigned n;
    for (n = 1; n < 100; n++)
      if (!run_release_row(row, n))
        break;
    assert_true(n < 100);
    most = n > most ? n : most;
  }
  sweep_kind = FAKE_FAULT_CALL;
  assert_true(most > 1); /* a release allocates its record */
  P = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  C = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

/* ---- threads ---- */

#define RT 8
#define RROUNDS 60

typedef struct rthread {
  int index;
  CUstream s;
  atomic_int deleted;
  int expected;
  int failures;
} rthread;

static void count_deleter(void *arg) {
  atomic_fetch_add((atomic_int *)arg, 1);
}

static void *release_loop(void *arg) {
  rthread *t = arg;
  dlsync_lane l = dlsync_lane_stream(t->s);
  for (int i = 0; i < RROUNDS; i++) {
    fake_work(t->s, "produce", NULL);
    if (i % 6 == 5) {
      /* Now and then a capture whose graph owns the release. */
      CUgraph g = NULL;
      if (D->StreamBeginCapture(t->s, CU_STREAM_CAPTURE_MODE_GLOBAL) != CUDA_SUCCESS) {
        t->failures++;
        continue;
      }
      fake_work(t->s, "captured", NULL);
      if (dlsync_release(ctx, &l, count_deleter, &t->deleted) != DLSYNC_SUCCESS)
        t->failures++;
      else
        t->expected++;
      if (D->StreamEndCapture(t->s, &g) != CUDA_SUCCESS || D->GraphDestroy(g) != CUDA_SUCCESS)
        t->failures++;
      fake_run_destructors();
    } else {
      if (dlsync_release(ctx, &l, count_deleter, &t->deleted) != DLSYNC_SUCCESS)
        t->failures++;
      else
        t->expected++;
    }
  }
  return NULL;
}

static void many_threads_release_at_once(void **state) {
  pthread_t th[RT];
  rthread td[RT];
  size_t expected = 0;
  (void)state;
  for (int i = 0; i < RT; i++) {
    td[i].index = i;
    td[i].s = fake_stream_create(i % 2, CU_STREAM_NON_BLOCKING);
    atomic_init(&td[i].deleted, 0);
    td[i].expected = 0;
    td[i].failures = 0;
  }
  for (int i = 0; i < RT; i++)
    assert_int_equal(pthread_create(&th[i], NULL, release_loop, &td[i]), 0);
  for (int i = 0; i < RT; i++)
    assert_int_equal(pthread_join(th[i], NULL), 0);
  fake_run_destructors();
  for (int i = 0; i < RT; i++)
    expected += (size_t)td[i].expected;
  assert_int_equal(flush_within(ctx), DLSYNC_SUCCESS);
  assert_true(wait_done(ctx, expected));
  assert_int_equal(stats_of(ctx).done, expected);
  for (int i = 0; i < RT; i++) {
    assert_int_equal(td[i].failures, 0);
    assert_int_equal(td[i].expected, RROUNDS);
    assert_int_equal(atomic_load(&td[i].deleted), td[i].expected);
    fake_stream_destroy(td[i].s);
  }
}

static atomic_int deleted;

static void count_into_deleted(void *arg) {
  (void)arg;
  atomic_fetch_add(&deleted, 1);
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

/* ---- a reclaimer that cannot enter RELAXED mode ---- */

static void reclaimer_without_relaxed_mode_makes_no_illegal_call(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  CUgraph g;
  (void)state;
  atomic_store(&deleted, 0);
  /* Another thread's GLOBAL capture (here: this thread's). */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_fail_always("cuThreadExchangeStreamCaptureMode", CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
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

/* ---- a failed reclaimer sync ---- */

static void failed_reclaimer_sync_is_counted_and_returned_by_flush(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  (void)state;
  atomic_store(&deleted, 0);
  fake_fail_nth("cuEventSynchronize", 1, CUDA_ERROR_LAUNCH_FAILED);
  assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
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
static void a_batch_synchronises_the_newest_event_of_each_stream(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), lp = dlsync_lane_stream(P);
  unsigned before, queries;
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc);
  before = fake_call_count("cuEventSynchronize");
  queries = fake_call_count("cuEventQuery");
  for (int i = 0; i < 5; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
  for (int i = 0; i < 2; i++)
    assert_int_equal(dlsync_release(ctx, &lp, count_into_deleted, NULL), DLSYNC_SUCCESS);
  atomic_store(&batch_gate_open, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 7);
  assert_int_equal(fake_call_count("cuEventSynchronize") - before, 2);
  assert_int_equal(fake_call_count("cuEventQuery") - queries, 0);
  assert_int_equal(stats_of(ctx).pending_eager, 0);
}

/* ---- the releasing threads' rings ---- */

/* A thread that has released on a device before releases into its own ring
 * (order/release_rings.c): no allocation of dlsync's, and the book counts the
 * queued releases all the same (the one holding the reclaimer too). */
static void a_release_into_the_threads_ring_allocates_nothing(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc); /* the thread's ring is made by this release */
  dlsync__alloc_count_start();
  for (int i = 0; i < 100; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
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

/* More releases than a ring holds (RING_SLOTS, 4096, in order/release_int.h)
 * while the reclaimer is held: the rest go to the shared queue (which
 * allocates), every one succeeds, and the deleters run once each, in the
 * order the thread released; so do releases made while those in the
 * shared queue wait. */
static void a_full_ring_overflows_into_the_shared_queue_in_order(void **state) {
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
static void legacy_and_ordinary_stream_releases_run_in_order(void **state) {
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
  st = dlsync_release(ctx, l, count_into_deleted, NULL);
  dlsync__alloc_fail_nth(0);
  return (void *)(uintptr_t)st;
}

static void a_ring_that_cannot_be_made_leaves_the_shared_queue(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  pthread_t th;
  void *rc = (void *)1;
  (void)state;
  atomic_store(&deleted, 0);
  /* The context's pool made (by this thread), so that the other thread's
   * first allocation is its ring. */
  assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS); /* the reclaimer idle */
  assert_int_equal(pthread_create(&th, NULL, release_one_without_a_ring, &lc), 0);
  assert_int_equal(pthread_join(th, &rc), 0);
  assert_int_equal((dlsync_status)(uintptr_t)rc, DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 2);
}

/* cuStreamGetId failing: a status naming it, nothing queued, the event back
 * in its pool. */
static void a_failed_stream_id_queues_nothing(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync__pool_stats before, after;
  (void)state;
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  dlsync__pool_stats_get(&before, &ctx->pools);
  fake_fail_nth("cuStreamGetId", 1, CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_ERROR_DRIVER);
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
    if (dlsync_release(ctx, l, count_into_deleted, NULL) != DLSYNC_SUCCESS)
      return (void *)1;
  return NULL;
}

/* A thread that exits with releases queued in its ring: they run (the ring
 * is freed by the reclaimer once empty). */
static void a_threads_ring_runs_after_the_thread_exits(void **state) {
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

/* ---- batches: the newest event of each stream ---- */

/* n releases on l queued behind the reclaimer held in a deleter (one batch
 * once batch_gate_open is set); the cuEventSynchronize count before them. */
static unsigned held_batch(dlsync_lane *l, int n) {
  unsigned before;
  atomic_store(&deleted, 0);
  hold_reclaimer(l);
  before = fake_call_count("cuEventSynchronize");
  for (int i = 0; i < n; i++)
    assert_int_equal(dlsync_release(ctx, l, count_into_deleted, NULL), DLSYNC_SUCCESS);
  return before;
}

/* A stream handle can name a new stream while the old one's work runs
 * (design.md R33; the fake gives a destroyed stream's handle to the next
 * stream made): two releases on a stream, the stream destroyed, two on the
 * new stream of the same handle. The stream id tells the two apart: the
 * newest event of each is synchronised, two calls, none asked. */
static void a_reused_handle_is_another_stream_in_a_batch(void **state) {
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
    assert_int_equal(dlsync_release(ctx, &l2, count_into_deleted, NULL), DLSYNC_SUCCESS);
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
static void an_earlier_event_not_complete_is_synchronised_on_its_own(void **state) {
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
static void a_failed_sync_in_a_batch_runs_each_deleter_once(void **state) {
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
static void a_mode_failure_blocks_the_whole_batch(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats s;
  unsigned before;
  (void)state;
  atomic_store(&deleted, 0);
  hold_reclaimer(&lc);
  for (int i = 0; i < 3; i++)
    assert_int_equal(dlsync_release(ctx, &lc, count_into_deleted, NULL), DLSYNC_SUCCESS);
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

/* ---- stats ---- */

static void release_stats_need_their_size_and_version(void **state) {
  dlsync_release_stats s;
  (void)state;
  memset(&s, 0, sizeof s);
  assert_int_equal(dlsync_release_get_stats(&s, ctx), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("DLSYNC_RELEASE_STATS_INIT");
}

/* ---- cuUserObjectRelease failing on an error path ---- */

static void user_object_release_fault_does_not_strand_a_release(void **state) {
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
  assert_int_equal(dlsync_release(ctx, &lg, count_into_deleted, NULL), DLSYNC_ERROR_DRIVER);
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
static void user_object_release_fault_after_one_graph_took_it(void **state) {
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

/* ---- destroy from a deleter while another release is queued ---- */

typedef struct destroyer {
  dlsync_context *ctx;
  atomic_int go; /* the release behind it is queued */
  atomic_int calls;
  dlsync_status status;
} destroyer;

static void destroying_deleter_after_go(void *arg) {
  destroyer *d = arg;
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&d->go) == 0; i++)
    sleep_ms(1);
  d->status = dlsync_context_destroy(d->ctx);
  atomic_fetch_add(&d->calls, 1);
}

static void destroy_from_a_deleter_destroys_the_queued_release_event(void **state) {
  destroyer d;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  atomic_store(&deleted, 0);
  memset(&d, 0, sizeof d);
  assert_int_equal(dlsync__context_create_with_driver(&d.ctx, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, destroying_deleter_after_go, &d), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, count_into_deleted, NULL), DLSYNC_SUCCESS);
  atomic_store(&d.go, 1);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&deleted) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&d.calls), 1);
  assert_int_equal(d.status, DLSYNC_ERROR_BUSY);
  assert_int_equal(atomic_load(&deleted), 1);
  sleep_ms(10); /* the reclaimer gives the event back after the deleter returns */
  assert_int_equal(fake_live_events(), 0);
}

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

static void idle_context_destroyed_from_another_contexts_deleter_is_success(void **state) {
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

static void context_destroyed_from_its_deleter_counts_the_release_behind(void **state) {
  gated_destroyer d;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  memset(&d, 0, sizeof d);
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync__context_create_with_driver(&d.ctx, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, gated_destroying_deleter, &d), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(d.ctx, &lp, count_into_deleted, NULL), DLSYNC_SUCCESS);
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

/* ---- what a busy destroy names ---- */

static void destroy_names_each_kind_left_with_its_count(void **state) {
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
  assert_int_equal(dlsync_release(c2, &lp, count_into_deleted, NULL), DLSYNC_SUCCESS);
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

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(eager_release_runs_on_the_reclaimer_after_the_work_once),
      T(releasing_never_blocks_and_flush_waits),
      T(eager_releases_on_two_devices),
      T(capture_release_runs_after_the_graph_and_its_executable),
      T(capture_release_with_inline_destructors_still_runs_on_the_reclaimer),
      T(built_lane_release_runs_after_the_graph),
      T(graph_release_let_go_is_queued_and_flush_waits),
      T(context_destroy_waits_for_eager_releases),
      T(context_destroyed_from_its_own_deleter_returns_instead_of_hanging),
      T(context_destroy_with_a_graph_owned_release_is_busy),
      T(flush_from_a_deleter_is_refused),
      T(graph_deleter_may_call_the_driver_during_a_global_capture),
      T(eager_deleter_may_call_the_driver_during_a_global_capture),
      T(null_and_invalid_arguments),
      T(invalidated_capture_and_legacy_stream_are_refused),
      T(every_driver_failure_in_a_release_is_a_status),
      T(every_allocation_failure_in_a_release_is_a_status),
      T(many_threads_release_at_once),
      cmocka_unit_test_setup_teardown(reclaimer_without_relaxed_mode_makes_no_illegal_call,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(failed_reclaimer_sync_is_counted_and_returned_by_flush,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_batch_synchronises_the_newest_event_of_each_stream,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_failed_sync_in_a_batch_runs_each_deleter_once,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_release_into_the_threads_ring_allocates_nothing,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_full_ring_overflows_into_the_shared_queue_in_order,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(legacy_and_ordinary_stream_releases_run_in_order,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_ring_that_cannot_be_made_leaves_the_shared_queue,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_failed_stream_id_queues_nothing, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(a_threads_ring_runs_after_the_thread_exits, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(a_reused_handle_is_another_stream_in_a_batch, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(an_earlier_event_not_complete_is_synchronised_on_its_own,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_mode_failure_blocks_the_whole_batch, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(release_stats_need_their_size_and_version, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(user_object_release_fault_does_not_strand_a_release,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(user_object_release_fault_after_one_graph_took_it,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(destroy_from_a_deleter_destroys_the_queued_release_event,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(
          idle_context_destroyed_from_another_contexts_deleter_is_success, fixture_setup,
          fixture_teardown),
      cmocka_unit_test_setup_teardown(context_destroyed_from_its_deleter_counts_the_release_behind,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(destroy_names_each_kind_left_with_its_count, fixture_setup,
                                      fixture_teardown),
  };
#undef T
  int rc;
  fake_reset(2);
  W = *fake_driver();
  real_event_synchronize = W.EventSynchronize;
  W.EventSynchronize = probe_event_synchronize;
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
