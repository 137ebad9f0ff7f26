/* SPDX-License-Identifier: Apache-2.0 */
/* The decision log at TRACE (DLSYNC_DEBUG=TRACE, set by ctest or by main
 * before the first call): each row of the decision table, run on the fake
 * driver, leaves a line naming that row. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "order/table.h"
#include "fixture.h"

static char log_path[4096];
static long log_seen; /* bytes of the log already checked */

/* The log written since the last call holds `want` (and, when given,
 * `also`). */
static void expect_text(const char *want, const char *also) {
  char text[65536];
  size_t n;
  FILE *f = fopen(log_path, "r");
  if (f == NULL)
    fail_msg("no log at %s", log_path);
  assert_int_equal(fseek(f, log_seen, SEEK_SET), 0);
  n = fread(text, 1, sizeof text - 1, f);
  text[n] = '\0';
  log_seen += (long)n;
  fclose(f);
  if (strstr(text, want) == NULL)
    fail_msg("the log has no \"%s\"; it has:\n%s", want, text);
  if (also != NULL && strstr(text, also) == NULL)
    fail_msg("the log has no \"%s\"; it has:\n%s", also, text);
}

/* ... a line of `op` naming the row. */
static void expect_line(const char *op, dlsync__row row, const char *also) {
  char want[160];
  snprintf(want, sizeof want, " dlsync TRACE %s %s", op, dlsync__row_name(row));
  expect_text(want, also);
}

static void order_ok(dlsync_lane *a, dlsync_lane *b) {
  if (dlsync_order(ctx, a, b) != DLSYNC_SUCCESS)
    fail_msg("dlsync_order: %s", dlsync_last_error());
}

static void stream_rows(void **state) {
  dlsync_lane p = dlsync_lane_stream(P), c = dlsync_lane_stream(C);
  CUgraph g;
  (void)state;
  order_ok(&p, &p);
  expect_line("order", DLSYNC__ROW_SAME_STREAM, NULL);
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_EAGER_EAGER, "nodes added 0");

  /* C joins P's capture, then is joined back (same capture). */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_JOIN, "(capture ");
  order_ok(&c, &p);
  expect_line("order", DLSYNC__ROW_SAME_CAPTURE, NULL);
  destroy_graph(end_capture_ok(P));

  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_EAGER_TO_CAPTURE, "nodes added 1");
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_TWO_CAPTURES, "nodes added 2");
  g = end_capture_ok(P);
  destroy_graph(g);
  destroy_graph(end_capture_ok(C));
}

/* SAME_CAPTURE on the general path (the fast path is off at TRACE), with a
 * producer set larger than the lane's inline copy: handed to the consumer
 * whole, with no event. */
static void same_capture_wide_set_on_the_general_path(void **state) {
  enum { SIDES = DLSYNC__DEPS_INLINE + 2 };
  dlsync_lane p = dlsync_lane_stream(P), c = dlsync_lane_stream(C);
  side_frontier fr;
  CUgraphNode consume = NULL;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_JOIN, NULL);
  side_frontier_make(&fr, P, SIDES);
  fake_log_reset();
  order_ok(&p, &c);
  expect_line("order", DLSYNC__ROW_SAME_CAPTURE, NULL);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 1);
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_true(fake_capture_deps(C, NULL, 0) >= SIDES);
  fake_work(C, "consume", &consume);
  order_ok(&c, &p); /* the join back */
  g = end_capture_ok(P);
  for (int i = 0; i < SIDES; i++)
    assert_true(fake_graph_has_edge(g, fr.work[i], consume));
  destroy_graph(g);
  side_frontier_free(&fr);
}

static void built_rows(void **state) {
  dlsync_lane p = dlsync_lane_stream(P), c = dlsync_lane_stream(C);
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphNode d1[4], d2[4], d3[4];
  dlsync_lane l1, l2, l3;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "a");
  d2[0] = fake_graph_add_work(g2, NULL, 0, "b");
  d3[0] = fake_graph_add_work(g1, NULL, 0, "c");
  l1 = dlsync_lane_graph(g1, d1, 1, 4);
  l2 = dlsync_lane_graph(g2, d2, 1, 4);
  l3 = dlsync_lane_graph(g1, d3, 1, 4);

  order_ok(&p, &l1);
  expect_line("order", DLSYNC__ROW_EAGER_TO_BUILT, "(built, ");
  order_ok(&l1, &l2);
  expect_line("order", DLSYNC__ROW_TWO_BUILT, "nodes added 2");
  order_ok(&l1, &l3);
  expect_line("order", DLSYNC__ROW_SAME_BUILT, NULL);
  assert_int_equal(dlsync_order(ctx, &l1, &c), DLSYNC_ERROR_CAPTURE_ORDER);
  expect_line("order", DLSYNC__ROW_REFUSE_BUILT_TO_EAGER, "failed: DLSYNC_ERROR_CAPTURE_ORDER");

  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&l1, &c);
  expect_line("order", DLSYNC__ROW_BUILT_TO_CAPTURE, NULL);
  destroy_graph(end_capture_ok(C));
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  order_ok(&p, &l2);
  expect_line("order", DLSYNC__ROW_CAPTURE_TO_BUILT, NULL);
  destroy_graph(end_capture_ok(P));
  destroy_graph(g1);
  destroy_graph(g2);
}

/* The calling thread's batch memo of ctx's device-0 pool for built graphs
 * (NULL: none). */
static dlsync__built_memo *built_memo_now(void) {
  dlsync__graph_thread *gt = dlsync__graph_thread_of(dlsync__thread_get());
  dlsync__pool *pool = NULL;
  assert_int_equal(dlsync__pool_for_cuctx(&pool, &ctx->pools, fake_primary_ctx(0)), DLSYNC_SUCCESS);
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++)
    if (gt->built[i].pool == pool && gt->built[i].generation == ctx->pools.generation)
      return &gt->built[i];
  return NULL;
}

/* Context destroy closes the thread's open batch for built graphs; when the
 * driver refuses to let go of it, the warning says where its events went: a
 * batch a graph took stays with the driver (until the graph, and the CUDA
 * context, are gone), a batch no graph took is given back to the pool at
 * once. */
static void a_refused_batch_release_says_where_its_events_went(void **state) {
  dlsync_lane p = dlsync_lane_stream(P);
  CUgraph g;
  CUgraphNode d[4];
  dlsync_lane l;
  dlsync__built_memo *m;
  CUuserObject uo;
  dlsync_lane c = dlsync_lane_stream(C);
  (void)state;
  /* Free events in the pool (a capture's, back with its graph), so that a
   * batch takes as many as it asks for. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < 8; i++)
    order_ok(&p, &c);
  destroy_graph(end_capture_ok(C));
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  d[0] = fake_graph_add_work(g, NULL, 0, "own");
  l = dlsync_lane_graph(g, d, 1, 4);
  /* Batches of 1, 1, then 2: the third order opens one and uses one event. */
  for (int i = 0; i < 3; i++)
    order_ok(&p, &l);
  m = built_memo_now();
  assert_non_null(m);
  assert_non_null(m->uo);
  assert_true(m->retained);
  assert_int_equal(m->nreserve, 1);
  uo = m->uo;
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  dlsync__graph_built_close(&ctx->pools);
  assert_false(fake_fail_pending());
  expect_text(" dlsync WARN context destroy: cuUserObjectRelease refused a thread's batch of "
              "events for built graphs; they stay with the driver",
              NULL);
  assert_int_equal(D->UserObjectRelease(uo, 1), CUDA_SUCCESS); /* the driver's, by hand */
  destroy_graph(g);

  /* Batches of 1, 1 again, then one of 2 whose graph refuses it. */
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  d[0] = fake_graph_add_work(g, NULL, 0, "own");
  l = dlsync_lane_graph(g, d, 1, 4);
  order_ok(&p, &l);
  order_ok(&p, &l);
  fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &p, &l), DLSYNC_ERROR_DRIVER);
  m = built_memo_now();
  assert_non_null(m);
  assert_non_null(m->uo);
  assert_false(m->retained);
  uo = m->uo;
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  dlsync__graph_built_close(&ctx->pools);
  assert_false(fake_fail_pending());
  expect_text(" dlsync WARN context destroy: cuUserObjectRelease refused a thread's batch of "
              "events for built graphs; no graph had taken it, so its events were given back "
              "to the pool",
              NULL);
  assert_int_equal(D->UserObjectRelease(uo, 1), CUDA_SUCCESS);
  assert_int_equal(fake_run_destructors(), 1); /* it finds the batch given back: nothing twice */
  destroy_graph(g);
  assert_int_equal(fake_live_user_objects(), 0);
}

static void exchange_rows(void **state) {
  dlsync_lane p = dlsync_lane_stream(P), c = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  (void)state;
  /* Warm: the fast path is off at TRACE, every call is named. */
  for (int i = 0; i < 3; i++) {
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &p, &c), DLSYNC_SUCCESS);
    expect_line("exchange begin", DLSYNC__ROW_EAGER_EAGER, NULL);
    assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
    expect_line("exchange end", DLSYNC__ROW_EAGER_EAGER, NULL);
  }
  /* Eager producer, capturing consumer: end is refused. */
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &p, &c), DLSYNC_SUCCESS);
  expect_line("exchange begin", DLSYNC__ROW_EAGER_TO_CAPTURE, NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  expect_line("exchange end", DLSYNC__ROW_REFUSE_END_TO_EAGER, NULL);
  /* Two captures: end after begin's record/wait pair is refused. */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &p, &c), DLSYNC_SUCCESS);
  expect_line("exchange begin", DLSYNC__ROW_TWO_CAPTURES, NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_ERROR_CAPTURE_ORDER);
  expect_line("exchange end", DLSYNC__ROW_REFUSE_END_CROSS, NULL);
  destroy_graph(end_capture_ok(P));
  destroy_graph(end_capture_ok(C));
}

static void wait_ok(dlsync_fence *f, dlsync_lane *l, dlsync__row row) {
  if (dlsync_fence_wait(f, l) != DLSYNC_SUCCESS)
    fail_msg("dlsync_fence_wait: %s", dlsync_last_error());
  expect_line("fence wait", row, NULL);
}

static void fence_rows(void **state) {
  dlsync_lane p = dlsync_lane_stream(P), c = dlsync_lane_stream(C);
  dlsync_fence *f = NULL;
  CUgraph g1 = NULL, g2 = NULL, gp;
  CUgraphNode d1[4], d2[4], d3[4];
  dlsync_lane l1, l2, l3;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphCreate(&g2, 0), CUDA_SUCCESS);
  d1[0] = fake_graph_add_work(g1, NULL, 0, "a");
  d2[0] = fake_graph_add_work(g2, NULL, 0, "b");
  d3[0] = fake_graph_add_work(g1, NULL, 0, "c");
  l1 = dlsync_lane_graph(g1, d1, 1, 4);
  l2 = dlsync_lane_graph(g2, d2, 1, 4);
  l3 = dlsync_lane_graph(g1, d3, 1, 4);

  /* An eager fence. */
  assert_int_equal(dlsync_fence_signal(&f, ctx, &p), DLSYNC_SUCCESS);
  expect_text(" dlsync TRACE fence signal eager record", NULL);
  wait_ok(f, &c, DLSYNC__ROW_EAGER_EAGER);
  wait_ok(f, &l2, DLSYNC__ROW_EAGER_TO_BUILT);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  wait_ok(f, &c, DLSYNC__ROW_EAGER_TO_CAPTURE);
  destroy_graph(end_capture_ok(C));
  dlsync_fence_release(f);

  /* A fence in a capture. */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &p), DLSYNC_SUCCESS);
  expect_text(" dlsync TRACE fence signal record node", "nodes added 1");
  assert_int_equal(dlsync_fence_wait(f, &c), DLSYNC_ERROR_CAPTURE_ORDER);
  expect_line("fence wait", DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER, NULL);
  order_ok(&p, &c); /* C joins the capture */
  wait_ok(f, &c, DLSYNC__ROW_SAME_CAPTURE);
  order_ok(&c, &p); /* and is joined back */
  wait_ok(f, &l2, DLSYNC__ROW_CAPTURE_TO_BUILT);
  gp = end_capture_ok(P);
  wait_ok(f, &c, DLSYNC__ROW_LAUNCHED_TO_EAGER);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  wait_ok(f, &c, DLSYNC__ROW_TWO_CAPTURES);
  destroy_graph(end_capture_ok(C));
  dlsync_fence_release(f);
  destroy_graph(gp);

  /* A fence in a built graph. */
  assert_int_equal(dlsync_fence_signal(&f, ctx, &l1), DLSYNC_SUCCESS);
  expect_text(" dlsync TRACE fence signal record node", NULL);
  wait_ok(f, &l3, DLSYNC__ROW_SAME_BUILT);
  wait_ok(f, &l2, DLSYNC__ROW_TWO_BUILT);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  wait_ok(f, &c, DLSYNC__ROW_BUILT_TO_CAPTURE);
  destroy_graph(end_capture_ok(C));
  wait_ok(f, &c, DLSYNC__ROW_LAUNCHED_TO_EAGER);
  dlsync_fence_release(f);
  destroy_graph(g1);
  destroy_graph(g2);
}

static void note(void *arg) {
  (void)arg;
}

static void release_and_info(void **state) {
  dlsync_lane p = dlsync_lane_stream(P);
  (void)state;
  assert_int_equal(dlsync_release(ctx, &p, note, NULL), DLSYNC_SUCCESS);
  expect_text(" dlsync TRACE release eager", NULL);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  /* INFO lines come with TRACE: each error, contexts. */
  assert_int_equal(dlsync_order(ctx, NULL, &p), DLSYNC_ERROR_INVALID_ARGUMENT);
  expect_text(" dlsync INFO error DLSYNC_ERROR_INVALID_ARGUMENT: the first lane is NULL", NULL);
}

int main(void) {
  const char *file;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(stream_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(same_capture_wide_set_on_the_general_path, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(built_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(a_refused_batch_release_says_where_its_events_went,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(exchange_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(fence_rows, fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(release_and_info, fixture_setup, fixture_teardown),
  };
  /* ctest sets both; by hand, these defaults. Before the first dlsync call:
   * the log reads its settings once. */
  setenv("DLSYNC_DEBUG", "TRACE", 0);
  setenv("DLSYNC_DEBUG_FILE", "test_decision_log.%p.log", 0);
  file = getenv("DLSYNC_DEBUG_FILE");
  {
    /* The file the log writes: %p is this process's id. */
    char pid[32];
    const char *at = strstr(file, "%p");
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    if (at == NULL)
      snprintf(log_path, sizeof log_path, "%s", file);
    else
      snprintf(log_path, sizeof log_path, "%.*s%s%s", (int)(at - file), file, pid, at + 2);
  }
  remove(log_path);
  {
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (failed == 0)
      remove(log_path); /* kept when a test failed, to be read */
    return failed;
  }
}
