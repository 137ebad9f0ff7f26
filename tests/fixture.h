/* SPDX-License-Identifier: Apache-2.0 */
/* The fixture the unit tests on the fake driver share: a fresh fake with two
 * devices, a context, two streams P and C on device 0; on close, checks that
 * nothing illegal happened during any capture, that every event is back in
 * its pool and that nothing leaked. Include after cmocka.h. */
#ifndef DLSYNC_TESTS_FIXTURE_H
#define DLSYNC_TESTS_FIXTURE_H

#include "order/internal.h"
#include "fake/fake_driver.h"

static const dlsync__driver *D;
static dlsync_context *ctx;
static CUstream P, C;

/* drv: the table the context uses (NULL: the fake's own). */
static inline void fixture_open(const dlsync__driver *drv) {
  fake_reset(2);
  D = fake_driver();
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, drv != NULL ? drv : D),
                   DLSYNC_SUCCESS);
  P = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  C = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_non_null(P);
  assert_non_null(C);
  dlsync__order_hints_reset(); /* exact call counts start from "eager" */
  fake_log_reset();
}

/* Every live event is in the pools of c and (when not NULL) other: none
 * lost, none still held by a graph, a fence or a release. */
static inline void assert_pools_intact(dlsync_context *c, dlsync_context *other) {
  dlsync__pool_stats ps, po = {0, 0, 0, 0};
  fake_run_destructors();
  dlsync__pool_stats_get(&ps, &c->pools);
  if (other != NULL)
    dlsync__pool_stats_get(&po, &other->pools);
  assert_int_equal(ps.graph_owned, 0);
  assert_int_equal(po.graph_owned, 0);
  assert_int_equal(ps.created - ps.destroyed, ps.free_events);
  assert_int_equal(po.created - po.destroyed, po.free_events);
  assert_int_equal(fake_live_events(), ps.free_events + po.free_events);
}

static inline void assert_pool_intact_of(dlsync_context *c) {
  assert_pools_intact(c, NULL);
}

static inline void assert_pool_intact(void) {
  assert_pools_intact(ctx, NULL);
}

/* Pops every context this thread has current. */
static inline void pop_all_contexts(void) {
  CUcontext cur = NULL;
  while (D->CtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
}

static inline void fixture_close(void) {
  char leaks[256] = {0};
  fake_fail_clear();
  pop_all_contexts();
  assert_int_equal(fake_illegal_calls(), 0);
  assert_int_equal(fake_dangling_event_uses(), 0);
  assert_pool_intact();
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  ctx = NULL;
  fake_stream_destroy(P);
  fake_stream_destroy(C);
  fake_run_destructors();
  /* An open batch for built graphs is let go by context destroy: its
   * destructor ran just now, after the pools, so its events are orphans,
   * destroyed at the next collection. */
  dlsync__orphans_collect();
  if (fake_leak_report(leaks, sizeof leaks) != 0)
    fail_msg("leaked: %s", leaks);
}

/* cmocka setup/teardown for tests that need nothing more. */
static inline int fixture_setup(void **state) {
  (void)state;
  fixture_open(NULL);
  return 0;
}

static inline int fixture_teardown(void **state) {
  (void)state;
  fixture_close();
  return 0;
}

static inline CUgraph end_capture_ok(CUstream s) {
  CUgraph g = NULL;
  CUresult r = D->StreamEndCapture(s, &g);
  if (r != CUDA_SUCCESS)
    fail_msg("cuStreamEndCapture: %s", dlsync__driver_error_name(D, r));
  assert_non_null(g);
  return g;
}

static inline void destroy_graph(CUgraph g) {
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
}

/* A frontier of n nodes on capturing stream s: n side streams forked from
 * s (with `fork`), each with one node (work[i]), joined back to s. */
typedef struct side_frontier {
  CUevent fork;
  CUstream side[8];
  CUevent joins[8];
  CUgraphNode work[8];
  int n;
} side_frontier;

static inline void side_frontier_make(side_frontier *f, CUstream s, int n) {
  assert_true(n <= 8);
  f->n = n;
  f->fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  assert_int_equal(D->EventRecord(f->fork, s), CUDA_SUCCESS);
  for (int i = 0; i < n; i++) {
    f->side[i] = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    f->joins[i] = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
    assert_int_equal(D->StreamWaitEvent(f->side[i], f->fork, 0), CUDA_SUCCESS);
    fake_work(f->side[i], "side", &f->work[i]);
    assert_int_equal(D->EventRecord(f->joins[i], f->side[i]), CUDA_SUCCESS);
    assert_int_equal(D->StreamWaitEvent(s, f->joins[i], 0), CUDA_SUCCESS);
  }
  assert_int_equal(fake_capture_deps(s, NULL, 0), n);
}

static inline void side_frontier_free(side_frontier *f) {
  for (int i = 0; i < f->n; i++) {
    fake_event_destroy(f->joins[i]);
    fake_stream_destroy(f->side[i]);
  }
  fake_event_destroy(f->fork);
}

#endif
