/* SPDX-License-Identifier: Apache-2.0 */
/* The events dlsync puts into graphs built by hand, on the fake driver: each
 * thread takes them from its open batch for the pool (graph/graph.c, "the
 * events of built graphs"), a hold of 1, 1, 2, 4, then 8 events and one user
 * object that every graph given one of its events retains. These tests check
 * the driver calls that costs, that a batch's events come back exactly when
 * the last graph that took the batch is gone and the thread has let go of it
 * (at the batch's last event, the thread's exit, context destroy, or its memo
 * going to another pool), and what each failing driver call leaves. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

/* ---- helpers ---- */

static size_t graph_owned_of(dlsync_context *c) {
  dlsync__pool_stats ps;
  dlsync__pool_stats_get(&ps, &c->pools);
  return ps.graph_owned;
}

static size_t graph_owned_now(void) {
  return graph_owned_of(ctx);
}

/* Events the calling thread's open batches of ctx's pools have not used. */
static size_t unused_now(void) {
  return dlsync__graph_built_unused(&ctx->pools);
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* The size of a thread's i-th batch (from 0) for one pool whose free list
 * has enough events: 1, 1, 2, 4, then DLSYNC__BUILT_BATCH each time. */
static size_t batch_size(size_t i) {
  static const size_t first[] = {1, 1, 2, 4};
  return i < 4 ? first[i] : DLSYNC__BUILT_BATCH;
}

/* How many batches k orders of a fresh thread memo open (*unused: the
 * events of the last one not used yet). */
static size_t batches_after(size_t k, size_t *unused) {
  size_t b = 0, cum = 0;
  while (cum < k)
    cum += batch_size(b++);
  if (unused != NULL)
    *unused = cum - k;
  return b;
}

/* Device 0's pool of context c made warm without touching the thread's
 * batches for built graphs: n EAGER_TO_CAPTURE orders into a capture of C
 * (a cold pool makes one event each), its graph destroyed. */
static void warm_pool_of(dlsync_context *c, int n) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync__pool_stats ps;
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  for (int i = 0; i < n; i++)
    assert_int_equal(dlsync_order(c, &lp, &lc), DLSYNC_SUCCESS);
  destroy_graph(end_capture_ok(C));
  dlsync__pool_stats_get(&ps, &c->pools);
  assert_int_equal(ps.graph_owned, 0);
  assert_true(ps.free_events >= (size_t)n);
}

static void warm_pool(int n) {
  warm_pool_of(ctx, n);
}

/* A graph built by hand with one node of its own, and the lane that orders
 * into it (frontier: that node). Not moved once made: the lane points at
 * deps. */
typedef struct built {
  CUgraph g;
  CUgraphNode own;
  CUgraphNode deps[4];
  dlsync_lane lane;
} built;

static void built_make(built *b) {
  assert_int_equal(D->GraphCreate(&b->g, 0), CUDA_SUCCESS);
  b->own = b->deps[0] = fake_graph_add_work(b->g, NULL, 0, "built's own");
  assert_non_null(b->own);
  b->lane = dlsync_lane_graph(b->g, b->deps, 1, 4);
}

/* n EAGER_TO_BUILT orders from P into b. */
static void orders_into(dlsync_context *c, built *b, size_t n) {
  dlsync_lane lp = dlsync_lane_stream(P);
  for (size_t i = 0; i < n; i++)
    assert_int_equal(dlsync_order(c, &lp, &b->lane), DLSYNC_SUCCESS);
}

/* The calling thread's batch memo of context c's device-0 pool (NULL: none).
 * No cmocka assertion: other threads call it too. */
static dlsync__built_memo *memo_of(dlsync_context *c) {
  dlsync__graph_thread *gt = dlsync__graph_thread_of(dlsync__thread_get());
  dlsync__pool *pool = NULL;
  if (dlsync__pool_for_cuctx(&pool, &c->pools, fake_primary_ctx(0)) != DLSYNC_SUCCESS)
    return NULL;
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++)
    if (gt->built[i].pool == pool && gt->built[i].generation == c->pools.generation)
      return &gt->built[i];
  return NULL;
}

/* The user object of the calling thread's open batch of ctx's device-0
 * pool (NULL: no batch open). */
static CUuserObject open_batch(void) {
  dlsync__built_memo *m = memo_of(ctx);
  return m != NULL ? m->uo : NULL;
}

/* The thread's memo brought to batches of DLSYNC__BUILT_BATCH (1, 1, 2
 * and 4 events, all used, into a graph then destroyed): the next order
 * opens a batch of 8. */
static void batches_at_full_size(void) {
  built b0;
  built_make(&b0);
  orders_into(ctx, &b0, 8);
  assert_int_equal(unused_now(), 0);
  destroy_graph(b0.g);
  assert_int_equal(graph_owned_now(), 0);
}

/* g has exactly `expect` wait nodes, each with an event of its own. */
static bool wait_events_distinct(CUgraph g, size_t expect) {
  CUgraphNode nodes[128];
  CUevent evs[128];
  size_t n = 128, k = 0;
  assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  for (size_t i = 0; i < n; i++)
    if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT)
      evs[k++] = fake_node_event(nodes[i]);
  if (k != expect)
    return false;
  for (size_t i = 0; i < k; i++)
    for (size_t j = 0; j < i; j++)
      if (evs[i] == evs[j])
        return false;
  return true;
}

/* ---- batches ---- */

/* Eager -> built orders into one graph take their events from batches of 1,
 * 1, 2, 4, then 8: one cuUserObjectCreate per batch (none per order served
 * from an open batch), one cuGraphRetainUserObject per order, one
 * cuUserObjectRelease per batch used up, and no event made while the pool
 * has free ones. The pool counts as graph-owned every event used plus the
 * open batch's unused ones, which are never more than the thread has used
 * and always fewer than 8. Destroying the graph gives back every event but
 * the open batch's; closing the batch gives those back too. */
static void built_orders_take_events_in_growing_batches(void **state) {
  enum { N = 25 };
  /* cuUserObjectCreate calls after 1, 2, 4, 8, 16, 24 orders */
  static const size_t at[] = {1, 2, 4, 8, 16, 24};
  static const unsigned creates_at[] = {1, 2, 3, 4, 5, 6};
  dlsync_lane lp = dlsync_lane_stream(P);
  built b;
  size_t unused = 0;
  (void)state;
  warm_pool(40);
  built_make(&b);
  fake_log_reset();
  for (size_t k = 1; k <= N; k++) {
    size_t opened;
    assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS); /* EAGER_TO_BUILT */
    opened = batches_after(k, &unused);
    assert_int_equal(fake_call_count("cuUserObjectCreate"), opened);
    assert_int_equal(fake_call_count("cuGraphRetainUserObject"), k);
    assert_int_equal(fake_call_count("cuUserObjectRelease"), unused == 0 ? opened : opened - 1);
    assert_int_equal(fake_call_count("cuEventCreate"), 0);
    assert_int_equal(unused_now(), unused);
    assert_int_equal(graph_owned_now(), k + unused);
    assert_true(unused <= k);
    assert_true(unused < DLSYNC__BUILT_BATCH);
    assert_int_equal(fake_live_user_objects(), opened); /* the graph holds every batch */
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++)
      if (at[i] == k)
        assert_int_equal(fake_call_count("cuUserObjectCreate"), creates_at[i]);
  }
  assert_int_equal(unused, 7); /* the 25th opened the 7th batch */
  assert_true(wait_events_distinct(b.g, N));
  destroy_graph(b.g);
  /* The open batch comes back whole: its used event too. */
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  assert_int_equal(unused_now(), unused);
  assert_int_equal(fake_live_user_objects(), 1);
  dlsync__graph_built_close(&ctx->pools);
  assert_int_equal(unused_now(), 0);
  fake_run_destructors();
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* Destroys b[first_gone]'s graph, then the other's: the `owned` events stay
 * owned while either lives (one batch's events come back together; with uo
 * non-NULL, its references left in between are `refs`), and come back with
 * the second, leaving no user object. */
static void destroy_both(built b[2], int first_gone, size_t owned, CUuserObject uo, unsigned refs) {
  assert_int_equal(graph_owned_now(), owned);
  destroy_graph(b[first_gone].g);
  assert_int_equal(graph_owned_now(), owned); /* the other graph holds them all */
  if (uo != NULL)
    assert_int_equal(fake_user_object_refs(uo), refs);
  destroy_graph(b[1 - first_gone].g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* The objects the graphs retain are one per batch: while the batch is open,
 * the fake counts the thread's reference and one per graph that took one of
 * its events; the batch's events come back only once the last of those
 * graphs is gone, whichever graph that is, the events the first graph used
 * included. Twice: the first graph destroyed first, then the second. */
static void a_batch_lives_while_any_graph_that_took_it_lives(void **state) {
  (void)state;
  warm_pool(40);
  /* batches of 1, 1 and 2 used up: the next is 4 events, then 8 */
  {
    built b0;
    built_make(&b0);
    orders_into(ctx, &b0, 4);
    destroy_graph(b0.g);
  }
  assert_int_equal(unused_now(), 0);
  assert_int_equal(graph_owned_now(), 0);
  for (int first_gone = 0; first_gone < 2; first_gone++) {
    built b[2];
    size_t size, k = 0;
    CUuserObject uo;
    built_make(&b[0]);
    built_make(&b[1]);
    orders_into(ctx, &b[0], 1);
    k++;
    size = unused_now() + 1;
    assert_int_equal(size, first_gone == 0 ? 4 : 8);
    uo = open_batch();
    assert_non_null(uo);
    assert_int_equal(fake_user_object_refs(uo), 2); /* the thread's, b[0]'s */
    while (unused_now() > 0) {
      orders_into(ctx, &b[k % 2], 1);
      k++;
    }
    assert_int_equal(k, size);
    /* Used up: the thread let go; one reference per order is left. */
    assert_null(open_batch());
    assert_int_equal(fake_user_object_refs(uo), size);
    destroy_both(b, first_gone, size, uo, (unsigned)(size / 2));
  }
}

/* Each order retains the batch in its graph, also a graph that has it
 * already (one retain each time: the fake's count rises by one per order):
 * a graph handle names a new graph once the old one is destroyed, so a
 * graph is never trusted to hold the batch. Here the handle is reused
 * within one open batch: the new graph retains it, and the batch's events
 * stay owned until that graph is gone, though the thread has let go. */
static void each_order_retains_even_into_the_same_graph(void **state) {
  enum { N = 5 };
  dlsync_lane lp = dlsync_lane_stream(P);
  built b, again;
  CUuserObject uo;
  CUgraph old;
  (void)state;
  warm_pool(40);
  batches_at_full_size();
  built_make(&b);
  fake_log_reset();
  orders_into(ctx, &b, 1);
  uo = open_batch();
  assert_non_null(uo);
  for (unsigned k = 1; k <= N; k++) {
    if (k > 1)
      assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS);
    assert_int_equal(fake_call_count("cuGraphRetainUserObject"), k);
    assert_int_equal(fake_user_object_refs(uo), 1 + k); /* the thread's and one per order */
  }
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 1);
  assert_ptr_equal(open_batch(), uo);
  assert_int_equal(unused_now(), DLSYNC__BUILT_BATCH - N);
  /* The graph destroyed: its N references gone, the thread's left. */
  old = b.g;
  destroy_graph(b.g);
  assert_int_equal(fake_user_object_refs(uo), 1);
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  /* A new graph with the old handle (the fake reuses the last freed). */
  built_make(&again);
  assert_ptr_equal(again.g, old);
  fake_log_reset();
  orders_into(ctx, &again, 1);
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), 1);
  assert_int_equal(fake_user_object_refs(uo), 2);
  dlsync__graph_built_close(&ctx->pools);
  fake_run_destructors();
  assert_int_equal(fake_user_object_refs(uo), 1); /* the new graph's */
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  destroy_graph(again.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* TWO_BUILT: both graphs retain the batch at each order (two retains), the
 * record node in one and the wait node in the other share the event, and
 * every event stays owned until both graphs are gone, whichever goes
 * first. */
/* Two lanes of one graph built by hand (SAME_BUILT) take edges and no event:
 * no current CUDA context is needed, on either path. */
static void two_lanes_of_one_graph_need_no_current_context(void **state) {
  built b;
  CUgraphNode other[4];
  dlsync_lane lo;
  CUcontext cur = (CUcontext)0x1;
  (void)state;
  built_make(&b);
  other[0] = fake_graph_add_work(b.g, NULL, 0, "other");
  lo = dlsync_lane_graph(b.g, other, 1, 4);
  assert_int_equal(D->CtxGetCurrent(&cur), CUDA_SUCCESS);
  assert_null(cur);
  fake_log_reset();
  if (dlsync_order(ctx, &b.lane, &lo) != DLSYNC_SUCCESS)
    fail_msg("%s", dlsync_last_error());
  assert_int_equal(lo.ndeps, 2);
  assert_true(lo.deps[1] == b.own);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  destroy_graph(b.g);
}

static void two_built_retains_in_both_graphs(void **state) {
  enum { K = 4 }; /* orders a round: batches of 1, 1 and 2, then one of 4 */
  (void)state;
  warm_pool(40);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  for (int first_gone = 0; first_gone < 2; first_gone++) {
    built b[2];
    built_make(&b[0]);
    built_make(&b[1]);
    fake_log_reset();
    for (unsigned k = 1; k <= K; k++) {
      CUgraphNode rec, wait;
      assert_int_equal(dlsync_order(ctx, &b[0].lane, &b[1].lane), DLSYNC_SUCCESS); /* TWO_BUILT */
      rec = b[0].lane.deps[0];
      wait = b[1].lane.deps[0];
      assert_int_equal(fake_node_type(rec), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
      assert_int_equal(fake_node_type(wait), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
      assert_ptr_equal(fake_node_event(rec), fake_node_event(wait));
      assert_int_equal(fake_call_count("cuGraphRetainUserObject"), 2 * k);
    }
    assert_int_equal(unused_now(), 0);
    assert_int_equal(fake_call_count("cuUserObjectCreate"), first_gone == 0 ? 3 : 1);
    assert_int_equal(fake_graph_count_nodes(b[0].g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), K);
    assert_int_equal(fake_graph_count_nodes(b[1].g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), K);
    destroy_both(b, first_gone, K, NULL, 0); /* the other graph holds every batch */
  }
}

/* CAPTURE_TO_BUILT and BUILT_TO_CAPTURE: the built graph retains the batch
 * at every order, the capture's graph once per capture and batch (capture
 * ids are never reused): 17 orders in one capture open 6 batches, so 17 +
 * 6 retains. A second capture ordering from the same open batch retains it
 * again in its own graph. Both captures end cleanly; the events stay owned
 * while any graph that took their batch lives, or the thread keeps it
 * open. */
static void capture_graph_retains_once_per_capture_and_batch(void **state) {
  enum { K1 = 17 };
  dlsync_lane lp = dlsync_lane_stream(P);
  built b;
  CUgraph g1, g2;
  size_t unused = 0;
  unsigned retains;
  (void)state;
  warm_pool(40);
  built_make(&b);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  fake_log_reset();
  for (size_t k = 1; k <= K1; k++) {
    size_t opened;
    assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS); /* CAPTURE_TO_BUILT */
    opened = batches_after(k, &unused);
    assert_int_equal(fake_call_count("cuGraphRetainUserObject"), k + opened);
    assert_int_equal(fake_call_count("cuUserObjectCreate"), opened);
    assert_int_equal(unused_now(), unused);
  }
  assert_int_equal(unused, DLSYNC__BUILT_BATCH - 1);
  retains = fake_call_count("cuGraphRetainUserObject");
  assert_int_equal(retains, K1 + 6);
  g1 = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), K1);
  /* A second capture, the same batch: its graph retains the batch once. */
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS); /* CAPTURE_TO_BUILT */
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), retains + 2);
  assert_int_equal(dlsync_order(ctx, &b.lane, &lp), DLSYNC_SUCCESS); /* BUILT_TO_CAPTURE */
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), retains + 3);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS); /* CAPTURE_TO_BUILT */
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), retains + 4);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 6);
  assert_int_equal(unused_now(), DLSYNC__BUILT_BATCH - 4);
  g2 = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 2);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), K1 + 2);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  assert_int_equal(graph_owned_now(), 16 + DLSYNC__BUILT_BATCH);
  destroy_graph(g1);
  assert_int_equal(graph_owned_now(), 16 + DLSYNC__BUILT_BATCH); /* the built graph's */
  destroy_graph(b.g);
  /* the open batch, which g2 and the thread hold */
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  destroy_graph(g2);
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH); /* the thread's */
  dlsync__graph_built_close(&ctx->pools);
  fake_run_destructors();
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* ---- closing a batch ---- */

typedef struct thread_orders {
  built *b;
  size_t unused;
  CUuserObject uo;
  int failures;
} thread_orders;

/* Three eager -> built orders (batches of 1, 1, 2: one event left unused),
 * then the thread ends with its batch open. */
static void *orders_then_exit(void *p) {
  thread_orders *t = p;
  dlsync_lane lp = dlsync_lane_stream(P);
  for (int i = 0; i < 3; i++)
    t->failures += dlsync_order(ctx, &lp, &t->b->lane) != DLSYNC_SUCCESS;
  t->unused = dlsync__graph_built_unused(&ctx->pools);
  t->uo = open_batch();
  return NULL;
}

/* A thread that ends with a batch open lets go of it at its exit (a key
 * destructor): once the graph is gone its events are all back and no user
 * object is left. Without the destructor the thread's reference would keep
 * the batch (one event) and its user object for good. */
static void a_thread_exit_closes_its_batch(void **state) {
  thread_orders t = {NULL, 0, NULL, 0};
  pthread_t th;
  built b;
  (void)state;
  warm_pool(40);
  built_make(&b);
  t.b = &b;
  assert_int_equal(pthread_create(&th, NULL, orders_then_exit, &t), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(t.failures, 0);
  assert_int_equal(t.unused, 1);
  assert_non_null(t.uo);
  assert_int_equal(unused_now(), 0); /* the other thread's batch, not this one's */
  fake_run_destructors();
  assert_int_equal(graph_owned_now(), 4);
  assert_int_equal(fake_user_object_refs(t.uo), 1); /* the graph's: the thread let go */
  destroy_graph(b.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* dlsync_context_destroy closes the calling thread's batches of that
 * context: with the graphs gone and the batch still open (unused events),
 * destroying the context succeeds, and once the batch's destructor has run
 * no user object is left and every event the context made is destroyed. */
static void context_destroy_closes_the_callers_batch(void **state) {
  dlsync_context *c2 = NULL;
  dlsync__pool_stats ps;
  unsigned before;
  built b;
  (void)state;
  fake_run_destructors();
  before = fake_live_events();
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  warm_pool_of(c2, 40);
  built_make(&b);
  orders_into(c2, &b, 5); /* batches of 1, 1, 2, 4: three unused */
  assert_int_equal(dlsync__graph_built_unused(&c2->pools), 3);
  assert_int_equal(unused_now(), 0); /* ctx's: none */
  destroy_graph(b.g);
  dlsync__pool_stats_get(&ps, &c2->pools);
  assert_int_equal(ps.graph_owned, 4); /* the open batch, whole: one used, three not */
  assert_int_equal(ps.created - ps.destroyed, ps.free_events + 4);
  assert_int_equal(fake_live_events(), before + ps.free_events + 4);
  assert_int_equal(fake_live_user_objects(), 1);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 0);
  assert_int_equal(fake_live_events(), before);
}

/* The same with the built graph outliving the context: destroying the
 * context succeeds and closes the batch; the graph keeps its events, which
 * are destroyed once it is gone. */
static void a_built_graph_outliving_its_context_keeps_its_events(void **state) {
  dlsync_context *c2 = NULL;
  unsigned before;
  built b;
  (void)state;
  fake_run_destructors();
  before = fake_live_events();
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  warm_pool_of(c2, 40);
  built_make(&b);
  orders_into(c2, &b, 5);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 4); /* the graph's: one per batch */
  assert_true(fake_live_events() >= before + 8); /* 1 + 1 + 2 + 4 */
  assert_int_equal(fake_dangling_event_uses(), 0);
  destroy_graph(b.g);
  dlsync__orphans_collect();
  assert_int_equal(fake_dangling_event_uses(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
  assert_int_equal(fake_live_events(), before);
}

typedef struct parked_thread {
  dlsync_context *c;
  built *b;
  pthread_barrier_t ordered, go;
  size_t unused;
  int failures;
} parked_thread;

/* Five orders (three events left unused), then waits for the main thread
 * before it ends. */
static void *orders_then_waits(void *p) {
  parked_thread *t = p;
  dlsync_lane lp = dlsync_lane_stream(P);
  for (int i = 0; i < 5; i++)
    t->failures += dlsync_order(t->c, &lp, &t->b->lane) != DLSYNC_SUCCESS;
  t->unused = dlsync__graph_built_unused(&t->c->pools);
  pthread_barrier_wait(&t->ordered);
  pthread_barrier_wait(&t->go);
  return NULL;
}

/* Another thread's open batch of a context destroyed meanwhile, the thread
 * still alive: context destroy closes every thread's batches of its pools,
 * so once it returns (and the driver has run the batch's destructor) no user
 * object is left and every event the context made is destroyed, before the
 * other thread exits. That thread then orders into another context's built
 * graph (its memo of the destroyed context is taken again: nothing to close
 * there) and exits: nothing is left either. */
static void context_destroy_closes_another_threads_batch(void **state) {
  parked_thread t;
  pthread_t th;
  unsigned before;
  built b;
  (void)state;
  fake_run_destructors();
  before = fake_live_events();
  t.c = NULL;
  t.b = &b;
  t.unused = 0;
  t.failures = 0;
  assert_int_equal(pthread_barrier_init(&t.ordered, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&t.go, NULL, 2), 0);
  assert_int_equal(dlsync__context_create_with_driver(&t.c, NULL, D), DLSYNC_SUCCESS);
  warm_pool_of(t.c, 40);
  built_make(&b);
  assert_int_equal(pthread_create(&th, NULL, orders_then_waits, &t), 0);
  pthread_barrier_wait(&t.ordered);
  assert_int_equal(t.failures, 0);
  assert_int_equal(t.unused, 3);
  destroy_graph(b.g);
  assert_int_equal(graph_owned_of(t.c), 4); /* the other thread's batch, whole */
  assert_int_equal(fake_live_user_objects(), 1);
  assert_int_equal(dlsync_context_destroy(t.c), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 0); /* the other thread is still alive */
  assert_int_equal(fake_live_events(), before);
  /* The other thread goes on: an order into ctx's built graph, then exits. */
  built_make(&b);
  t.c = ctx;
  pthread_barrier_wait(&t.go);
  assert_int_equal(pthread_join(th, NULL), 0);
  destroy_graph(b.g);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 0);
  assert_int_equal(fake_dangling_event_uses(), 0);
  pthread_barrier_destroy(&t.ordered);
  pthread_barrier_destroy(&t.go);
}

/* Context destroys racing with another thread's memos of those contexts:
 * the other thread opens a batch of context c2 (orders into c2's built
 * graph, then a barrier), then orders into two other contexts' built graphs
 * in turn, each order of the first round giving one of its memos to another
 * pool, c2's among them, while this thread destroys c2, which closes that
 * thread's batch of c2. 40 rounds: every order and every destroy succeeds,
 * and in the end no user object and no event is left. TSan's run of this
 * file checks the memo accesses. */
typedef struct racing_orders {
  dlsync_context *c2, *c3;
  built *b2, *b3, *b;
  pthread_barrier_t ready, opened, done;
  int failures;
} racing_orders;

enum { RACE_ROUNDS = 40 };

static void *opens_then_orders_elsewhere(void *p) {
  racing_orders *t = p;
  dlsync_lane lp = dlsync_lane_stream(P);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    pthread_barrier_wait(&t->ready);
    for (int k = 0; k < 5; k++) /* batches of 1, 1, 2, 4: three events unused */
      t->failures += dlsync_order(t->c2, &lp, &t->b2->lane) != DLSYNC_SUCCESS;
    pthread_barrier_wait(&t->opened);
    for (int k = 0; k < 8; k++) { /* racing with c2's destroy */
      t->failures += dlsync_order(ctx, &lp, &t->b->lane) != DLSYNC_SUCCESS;
      t->failures += dlsync_order(t->c3, &lp, &t->b3->lane) != DLSYNC_SUCCESS;
    }
    pthread_barrier_wait(&t->done);
  }
  return NULL;
}

static void context_destroys_race_with_another_threads_memos(void **state) {
  racing_orders t;
  pthread_t th;
  built b, b2, b3;
  (void)state;
  fake_run_destructors();
  built_make(&b);
  built_make(&b3);
  t.b = &b;
  t.b2 = &b2;
  t.b3 = &b3;
  t.failures = 0;
  assert_int_equal(dlsync__context_create_with_driver(&t.c3, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(pthread_barrier_init(&t.ready, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&t.opened, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&t.done, NULL, 2), 0);
  assert_int_equal(pthread_create(&th, NULL, opens_then_orders_elsewhere, &t), 0);
  for (int round = 0; round < RACE_ROUNDS; round++) {
    assert_int_equal(dlsync__context_create_with_driver(&t.c2, NULL, D), DLSYNC_SUCCESS);
    built_make(&b2);
    pthread_barrier_wait(&t.ready);
    pthread_barrier_wait(&t.opened);
    destroy_graph(b2.g);
    assert_int_equal(dlsync_context_destroy(t.c2), DLSYNC_SUCCESS);
    pthread_barrier_wait(&t.done);
  }
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(t.failures, 0);
  destroy_graph(b.g);
  destroy_graph(b3.g);
  assert_int_equal(dlsync_context_destroy(t.c3), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_dangling_event_uses(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
  pthread_barrier_destroy(&t.ready);
  pthread_barrier_destroy(&t.opened);
  pthread_barrier_destroy(&t.done);
}

/* A thread keeps batches for DLSYNC__BUILT_MEMOS pools: an order for a
 * third pool takes the memo of the pool it ordered into first, closing its
 * batch (the thread's reference let go: its events come back once its
 * graph is gone), and that pool's batches start again from one event. */
static void a_batch_is_closed_when_its_memo_goes_to_another_pool(void **state) {
  CUstream s1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  dlsync_lane l1 = dlsync_lane_stream(s1);
  dlsync_context *c2 = NULL;
  built b0, b1, b2;
  CUuserObject uo;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  warm_pool(40);
  built_make(&b0);
  built_make(&b1);
  built_make(&b2);
  orders_into(ctx, &b0, 5); /* device 0: three unused */
  uo = open_batch();
  assert_non_null(uo);
  assert_int_equal(fake_user_object_refs(uo), 2); /* the thread's, b0's */
  /* device 1: a second memo */
  assert_int_equal(dlsync_order(ctx, &l1, &b1.lane), DLSYNC_SUCCESS);
  assert_int_equal(unused_now(), 3);
  assert_ptr_equal(open_batch(), uo);
  orders_into(c2, &b2, 1); /* a third pool: the device-0 memo goes */
  assert_null(memo_of(ctx));
  assert_int_equal(unused_now(), 0);
  assert_int_equal(fake_user_object_refs(uo), 1); /* b0's only */
  assert_int_equal(graph_owned_now(), 8 + 1);     /* device 0's 1 + 1 + 2 + 4, device 1's 1 */
  destroy_graph(b0.g);
  assert_int_equal(graph_owned_now(), 1); /* device 1's, in b1 */
  /* device 0's pool again: a fresh memo, a batch of one */
  fake_log_reset();
  orders_into(ctx, &b1, 1);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 1);
  assert_int_equal(fake_call_count("cuUserObjectRelease"), 1);
  assert_int_equal(unused_now(), 0);
  destroy_graph(b1.g);
  destroy_graph(b2.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(graph_owned_of(c2), 0);
  dlsync__graph_built_close(&ctx->pools);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 0);
  fake_stream_destroy(s1);
}

/* Which memo a third pool takes: a free one first (a context destroyed by
 * this thread frees its memo), else the one used least recently. Device
 * 0's memo, used last before the third pool comes, keeps its open batch. */
static void the_memo_used_least_recently_goes_first(void **state) {
  CUstream s1 = fake_stream_create(1, CU_STREAM_NON_BLOCKING);
  dlsync_lane l1 = dlsync_lane_stream(s1);
  dlsync_context *c2 = NULL, *c3 = NULL;
  built b0, b1, b2, b3;
  CUuserObject uo;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&c2, NULL, D), DLSYNC_SUCCESS);
  assert_int_equal(dlsync__context_create_with_driver(&c3, NULL, D), DLSYNC_SUCCESS);
  warm_pool(40);
  built_make(&b0);
  built_make(&b1);
  built_make(&b2);
  built_make(&b3);
  orders_into(ctx, &b0, 5); /* device 0: batches 1, 1, 2, 4: three unused */
  uo = open_batch();
  assert_non_null(uo);
  assert_int_equal(dlsync_order(ctx, &l1, &b1.lane), DLSYNC_SUCCESS); /* device 1 */
  orders_into(ctx, &b0, 1); /* device 0 again: used last now */
  assert_int_equal(unused_now(), 2);
  orders_into(c2, &b2, 1); /* a third pool: device 1's memo goes */
  assert_non_null(memo_of(ctx));
  assert_ptr_equal(open_batch(), uo);
  assert_int_equal(unused_now(), 2);
  /* c2 destroyed by this thread: its memo is free, and the next pool (c3's)
   * takes it rather than device 0's. */
  destroy_graph(b2.g);
  assert_int_equal(dlsync_context_destroy(c2), DLSYNC_SUCCESS);
  orders_into(c3, &b3, 1);
  assert_ptr_equal(open_batch(), uo);
  assert_int_equal(unused_now(), 2);
  destroy_graph(b0.g);
  destroy_graph(b1.g);
  destroy_graph(b3.g);
  assert_int_equal(graph_owned_now(), 4); /* device 0's open batch: 2 used, 2 unused */
  dlsync__graph_built_close(&ctx->pools);
  fake_run_destructors();
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(dlsync_context_destroy(c3), DLSYNC_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_live_user_objects(), 0);
  fake_stream_destroy(s1);
}

/* ---- failures ---- */

/* cuUserObjectCreate failing when an order opens a batch: the driver's
 * error naming the call; no eager record, no node, the lane's frontier as it
 * was, every event the batch took back on the free list and no user object.
 * Orders served from an open batch make no cuUserObjectCreate (the fault
 * armed for them does not fire). After each failure the order goes
 * through, and the batches still grow as if it had not failed. */
static void user_object_create_failing_queues_nothing(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync__pool_stats before, now;
  unsigned failed = 0;
  built b;
  (void)state;
  warm_pool(40);
  built_make(&b);
  for (size_t k = 1; k <= 16; k++) {
    bool opens = unused_now() == 0;
    CUgraphNode frontier = b.lane.deps[0];
    size_t nodes = fake_graph_count_nodes(b.g, -1);
    unsigned objects = fake_live_user_objects(); /* b's, one per batch */
    dlsync_status st;
    dlsync__pool_stats_get(&before, &ctx->pools);
    fake_log_reset();
    fake_fail_nth("cuUserObjectCreate", 1, CUDA_ERROR_UNKNOWN);
    st = dlsync_order(ctx, &lp, &b.lane);
    if (!opens) {
      assert_true(fake_fail_pending());
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      continue;
    }
    failed++;
    assert_false(fake_fail_pending());
    assert_int_equal(st, DLSYNC_ERROR_DRIVER);
    assert_message_has("cuUserObjectCreate");
    assert_int_equal(fake_call_count("cuEventRecord"), 0);
    assert_int_equal(fake_call_count("cuGraphRetainUserObject"), 0);
    assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
    assert_int_equal(fake_graph_count_nodes(b.g, -1), nodes);
    assert_int_equal(b.lane.ndeps, 1);
    assert_ptr_equal(b.lane.deps[0], frontier);
    dlsync__pool_stats_get(&now, &ctx->pools);
    assert_int_equal(now.free_events, before.free_events);
    assert_int_equal(now.graph_owned, before.graph_owned);
    assert_int_equal(fake_live_user_objects(), objects);
    assert_int_equal(unused_now(), 0);
    assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_SUCCESS);
    assert_int_equal(graph_owned_now(), k + unused_now());
  }
  assert_int_equal(failed, 5); /* batches of 1, 1, 2, 4, 8 */
  assert_int_equal(unused_now(), 0);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 16);
  destroy_graph(b.g);
  assert_pool_intact();
}

/* cuGraphRetainUserObject failing in the middle of an open batch: the
 * driver's error naming the call; no eager record, no node, the lane's
 * frontier as it was. The event it took stays in the batch, unused (one
 * fewer left), and comes back with it; later orders use the rest. */
static void retain_failing_mid_batch_leaves_the_lane(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  CUgraphNode frontier;
  built b;
  (void)state;
  warm_pool(40);
  batches_at_full_size();
  built_make(&b);
  orders_into(ctx, &b, 2);
  assert_int_equal(unused_now(), DLSYNC__BUILT_BATCH - 2);
  frontier = b.lane.deps[0];
  fake_log_reset();
  fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_message_has("cuGraphRetainUserObject");
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(b.lane.ndeps, 1);
  assert_ptr_equal(b.lane.deps[0], frontier);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  assert_int_equal(unused_now(), DLSYNC__BUILT_BATCH - 3);
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  /* the rest of the batch */
  fake_log_reset();
  orders_into(ctx, &b, DLSYNC__BUILT_BATCH - 3);
  assert_int_equal(unused_now(), 0);
  assert_int_equal(fake_call_count("cuUserObjectCreate"), 0);
  assert_int_equal(fake_call_count("cuUserObjectRelease"), 1);
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT),
                   DLSYNC__BUILT_BATCH - 1);
  assert_true(wait_events_distinct(b.g, DLSYNC__BUILT_BATCH - 1));
  assert_int_equal(graph_owned_now(), DLSYNC__BUILT_BATCH);
  destroy_graph(b.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* TWO_BUILT with the second graph's retain failing: the first graph took a
 * reference, but neither graph gets a node and neither frontier moves; the
 * batch's events come back once both graphs are gone. */
static void retain_failing_in_the_second_graph_leaves_both_lanes(void **state) {
  built b[2];
  CUgraphNode f0, f1;
  (void)state;
  warm_pool(40);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  built_make(&b[0]);
  built_make(&b[1]);
  assert_int_equal(dlsync_order(ctx, &b[0].lane, &b[1].lane), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_order(ctx, &b[0].lane, &b[1].lane), DLSYNC_SUCCESS);
  f0 = b[0].lane.deps[0];
  f1 = b[1].lane.deps[0];
  fake_log_reset();
  fake_fail_nth("cuGraphRetainUserObject", 2, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &b[0].lane, &b[1].lane), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_message_has("cuGraphRetainUserObject");
  assert_int_equal(fake_call_count("cuGraphAddEventRecordNode"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_ptr_equal(b[0].lane.deps[0], f0);
  assert_ptr_equal(b[1].lane.deps[0], f1);
  assert_int_equal(fake_graph_count_nodes(b[0].g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 2);
  assert_int_equal(fake_graph_count_nodes(b[1].g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  assert_int_equal(unused_now(), 1); /* the third batch: two, one taken by the failed order */
  assert_int_equal(dlsync_order(ctx, &b[0].lane, &b[1].lane), DLSYNC_SUCCESS);
  assert_int_equal(unused_now(), 0);
  assert_int_equal(graph_owned_now(), 4);
  destroy_graph(b[1].g);
  assert_int_equal(graph_owned_now(), 4);
  destroy_graph(b[0].g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* cuUserObjectRelease failing when an order takes a batch's last event:
 * DLSYNC_ERROR_DRIVER naming it, no eager record, no node, the frontier as
 * it was. The thread's reference is moved into the graph that retained the
 * batch in that order, so the batch comes back once that graph is gone:
 * first with the batch's only graph, then with a batch two graphs took (the
 * other one destroyed first changes nothing). */
static void release_failing_at_a_batch_end_moves_it_into_the_graph(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  built b, b1, b2;
  CUgraphNode frontier;
  (void)state;
  warm_pool(40);
  /* The first batch (one event): its only graph takes the reference. */
  built_make(&b);
  frontier = b.lane.deps[0];
  fake_log_reset();
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_message_has("cuUserObjectRelease");
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), 2); /* retain, then move */
  assert_ptr_equal(b.lane.deps[0], frontier);
  assert_int_equal(b.lane.ndeps, 1);
  assert_int_equal(fake_graph_count_nodes(b.g, -1), 1);
  assert_int_equal(unused_now(), 0);
  assert_int_equal(graph_owned_now(), 1);
  assert_int_equal(fake_live_user_objects(), 1);
  destroy_graph(b.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
  /* The second batch (one event), then the third (two): into b1, then the
   * last into b2, whose release fails. */
  built_make(&b1);
  built_make(&b2);
  orders_into(ctx, &b1, 2);
  assert_int_equal(unused_now(), 1);
  frontier = b2.lane.deps[0];
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &b2.lane), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuUserObjectRelease");
  assert_ptr_equal(b2.lane.deps[0], frontier);
  assert_int_equal(fake_graph_count_nodes(b2.g, -1), 1);
  assert_int_equal(unused_now(), 0);
  assert_int_equal(graph_owned_now(), 3);
  destroy_graph(b1.g);
  assert_int_equal(graph_owned_now(), 2); /* the third batch: b2 holds it */
  destroy_graph(b2.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

/* A batch no graph ever retained (each of its orders' retains failed),
 * whose release fails at its last event: the order reports the retain's
 * failure, and the batch's events come back at once (its destructor run by
 * hand). The user object the driver would not release is left to it; the
 * test drops it, and the destructor the driver then runs does nothing. */
static void a_batch_no_graph_took_comes_back_when_its_release_fails(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync__pool_stats before, now;
  CUuserObject uo;
  built b;
  (void)state;
  warm_pool(40);
  built_make(&b);
  orders_into(ctx, &b, 2); /* batches of 1, 1: the next holds two */
  dlsync__pool_stats_get(&before, &ctx->pools);
  fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_ERROR_DRIVER);
  assert_message_has("cuGraphRetainUserObject");
  uo = open_batch();
  assert_non_null(uo);
  assert_int_equal(unused_now(), 1);
  assert_int_equal(graph_owned_now(), 2 + 2);
  fake_log_reset();
  fake_fail_nth("cuGraphRetainUserObject", 1, CUDA_ERROR_UNKNOWN);
  fake_fail_nth("cuUserObjectRelease", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_order(ctx, &lp, &b.lane), DLSYNC_ERROR_DRIVER);
  assert_false(fake_fail_pending());
  assert_message_has("cuGraphRetainUserObject");
  assert_int_equal(fake_call_count("cuUserObjectRelease"), 1);
  assert_int_equal(fake_call_count("cuGraphRetainUserObject"), 1); /* nothing moved */
  assert_null(open_batch());
  assert_int_equal(fake_graph_count_nodes(b.g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 2);
  /* back at once, no destructor of the driver's needed */
  assert_int_equal(graph_owned_now(), 2);
  dlsync__pool_stats_get(&now, &ctx->pools);
  assert_int_equal(now.free_events, before.free_events);
  assert_int_equal(fake_user_object_refs(uo), 1);
  assert_int_equal(D->UserObjectRelease(uo, 1), CUDA_SUCCESS);
  assert_int_equal(fake_run_destructors(), 1);
  dlsync__pool_stats_get(&now, &ctx->pools);
  assert_int_equal(now.free_events, before.free_events); /* not given back twice */
  destroy_graph(b.g);
  assert_int_equal(graph_owned_now(), 0);
  assert_int_equal(fake_live_user_objects(), 0);
}

#define TIMEOUT_MS 5000

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- graph lanes given bad input ---- */

static void graph_lane_null_deps_is_not_a_crash(void **state) {
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

static void capacity_zero_graph_lane_gives_no_event_to_the_graph(void **state) {
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

static void duplicate_deps_are_named(void **state) {
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

/* ---- built batches after the last context ---- */

/* Waits until the driver has `want` events alive, or TIMEOUT_MS. */
static bool wait_live_events(unsigned want) {
  for (int i = 0; i < TIMEOUT_MS; i++) {
    if (fake_live_events() == want)
      return true;
    sleep_ms(1);
  }
  return fake_live_events() == want;
}

/* A built graph's batch of events, let go when its context is destroyed:
 * gone once the driver runs the batch's destructor, with no other context
 * made after. */
static void warm_pool_in_capture(dlsync_context *c, int n) {
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
  warm_pool_in_capture(c, 40);
  for (int i = 0; i < 5; i++)
    assert_int_equal(dlsync_order(c, &lp, &lg), DLSYNC_SUCCESS);
  pop_all_contexts();
  *g_out = g;
}

static void built_batch_events_are_gone_after_the_last_context(void **state) {
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

static void another_threads_built_batch_is_gone_after_the_last_context(void **state) {
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

/* ---- large frontiers: linear checks, the same messages ---- */

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

static void large_frontier_duplicate_check_is_not_quadratic(void **state) {
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

static void large_same_graph_union_is_not_quadratic(void **state) {
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

static void large_frontier_duplicate_is_named_like_a_small_one(void **state) {
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
static void foreign_dependency_check_without_memory_says_so(void **state) {
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

/* ---- graph lanes whose counts no array can hold ---- */

static int lying_deleter_runs;
static void lying_deleter(void *arg) {
  (void)arg;
  lying_deleter_runs++;
}

/* Every entry point that takes a lane refuses a graph lane whose ndeps or
 * capacity no array of nodes can hold (2^60 and up: more than PTRDIFF_MAX
 * bytes), naming the count, before reading deps or allocating anything. */
static void lanes_with_counts_no_array_holds_are_refused_everywhere(void **state) {
  static const size_t lies[][2] = {
      /* ndeps, capacity */
      {(size_t)1 << 60, (size_t)1 << 60},
      {1, (size_t)1 << 60},
      {0, SIZE_MAX},
      {SIZE_MAX, SIZE_MAX},
  };
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_lane many[2];
  dlsync_exchange *ex = NULL;
  dlsync_fence *f = NULL, *fl = NULL;
  dlsync_lane_state qs;
  dlsync_lane out;
  bool ordered = true;
  CUgraph other;
  built b;
  char count[32];
  (void)state;
  built_make(&b);
  assert_int_equal(D->GraphCreate(&other, 0), CUDA_SUCCESS);
  assert_non_null(fake_graph_add_work(other, NULL, 0, "launched"));
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  /* the thread's own records made once (they are no count's) */
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  ex = NULL;
  for (size_t k = 0; k < sizeof lies / sizeof lies[0]; k++) {
    dlsync_lane lie = dlsync_lane_graph(b.g, b.deps, lies[k][0], lies[k][1]);
    snprintf(count, sizeof count, "%zu", lies[k][1]);
#define REFUSED(call)                                        \
  do {                                                       \
    unsigned long calls = fake_calls_total();                \
    fake_fail_alloc(1);                                      \
    assert_int_equal((call), DLSYNC_ERROR_INVALID_ARGUMENT); \
    assert_message_has(count);                               \
    assert_message_has("no array");                          \
    assert_true(fake_fail_pending()); /* no allocation */    \
    fake_fail_clear();                                       \
    assert_int_equal(fake_calls_total(), calls);             \
    assert_int_equal(lie.ndeps, lies[k][0]);                 \
  } while (0)
    REFUSED(dlsync_order(ctx, &lie, &lc));
    REFUSED(dlsync_order(ctx, &lp, &lie));
    REFUSED(dlsync_exchange_begin(&ex, ctx, &lie, &lc));
    assert_null(ex);
    REFUSED(dlsync_exchange_begin(&ex, ctx, &lp, &lie));
    REFUSED(dlsync_exchange_begin_flags(&ex, ctx, &lie, &lc, DLSYNC_EXCHANGE_CAPTURE_STABLE));
    many[0] = lp;
    many[1] = lie;
    REFUSED(dlsync_exchange_begin_many(&ex, ctx, many, 2, &lc, 0));
    REFUSED(dlsync_exchange_begin_many(&ex, ctx, many, 1, &lie, 0));
    assert_null(ex);
    REFUSED(dlsync_fence_signal(&fl, ctx, &lie));
    assert_null(fl);
    REFUSED(dlsync_fence_wait(f, &lie));
    REFUSED(dlsync_graph_launch(ctx, other, NULL, &lie));
    REFUSED(dlsync_lane_query(&qs, ctx, &lie));
    REFUSED(dlsync_release(ctx, &lie, lying_deleter, NULL));
    REFUSED(dlsync_dlpack_stream(&out, &ordered, ctx, 1, &lie));
    assert_false(ordered);
#undef REFUSED
  }
  assert_int_equal(lying_deleter_runs, 0);
  dlsync_fence_release(f);
  destroy_graph(other);
  destroy_graph(b.g);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, fixture_setup, fixture_teardown)
  const struct CMUnitTest tests[] = {
      T(built_orders_take_events_in_growing_batches),
      T(a_batch_lives_while_any_graph_that_took_it_lives),
      T(each_order_retains_even_into_the_same_graph),
      T(two_built_retains_in_both_graphs),
      T(two_lanes_of_one_graph_need_no_current_context),
      T(capture_graph_retains_once_per_capture_and_batch),
      T(a_thread_exit_closes_its_batch),
      T(context_destroy_closes_the_callers_batch),
      T(a_built_graph_outliving_its_context_keeps_its_events),
      T(context_destroy_closes_another_threads_batch),
      T(context_destroys_race_with_another_threads_memos),
      T(a_batch_is_closed_when_its_memo_goes_to_another_pool),
      T(the_memo_used_least_recently_goes_first),
      T(user_object_create_failing_queues_nothing),
      T(retain_failing_mid_batch_leaves_the_lane),
      T(retain_failing_in_the_second_graph_leaves_both_lanes),
      T(release_failing_at_a_batch_end_moves_it_into_the_graph),
      T(a_batch_no_graph_took_comes_back_when_its_release_fails),
      T(graph_lane_null_deps_is_not_a_crash),
      T(capacity_zero_graph_lane_gives_no_event_to_the_graph),
      T(duplicate_deps_are_named),
      T(built_batch_events_are_gone_after_the_last_context),
      T(another_threads_built_batch_is_gone_after_the_last_context),
      T(large_frontier_duplicate_check_is_not_quadratic),
      T(foreign_dependency_check_without_memory_says_so),
      T(large_same_graph_union_is_not_quadratic),
      T(large_frontier_duplicate_is_named_like_a_small_one),
      T(lanes_with_counts_no_array_holds_are_refused_everywhere),
  };
#undef T
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
