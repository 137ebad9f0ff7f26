/* SPDX-License-Identifier: Apache-2.0 */
/* Other runtimes' events on the fake driver (include/dlsync/foreign.h): an
 * event imported with each provenance and waited on from each kind of lane
 * (the order made, the nodes, the refusals with nothing queued), the
 * provenance check and when it runs, ownership (borrowed, owned: destroyed
 * only once no fence or graph holds it), export of each kind of fence, bad
 * input, and a fault on each driver call of an import. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static int setup(void **state) {
  (void)state;
  fixture_open(NULL);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  pop_all_contexts();
  fixture_close();
  return 0;
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("message \"%s\" lacks \"%s\"", dlsync_last_error(), what);
}

static CUgraphExec instantiate(CUgraph g) {
  CUgraphExec x = NULL;
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  return x;
}

static uint64_t launch(CUgraphExec x, CUstream s) {
  assert_int_equal(D->GraphLaunch(x, s), CUDA_SUCCESS);
  return fake_stream_last_op(s);
}

/* Nothing was queued anywhere since the log was reset: no record, no wait,
 * no node. */
static void assert_nothing_queued(void) {
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  assert_int_equal(fake_call_count("cuEventRecordWithFlags"), 0);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventRecordNode"), 0);
  assert_int_equal(fake_call_count("cuStreamUpdateCaptureDependencies"), 0);
}

static dlsync_fence *import_ok(CUevent e, dlsync_provenance prov, uint64_t id, unsigned flags) {
  dlsync_fence *f = NULL;
  dlsync_fence_kind k = DLSYNC_FENCE_EAGER;
  dlsync_provenance got = (dlsync_provenance)0;
  assert_int_equal(dlsync_fence_import(&f, ctx, e, prov, id, flags), DLSYNC_SUCCESS);
  assert_non_null(f);
  assert_int_equal(dlsync_fence_get_kind(&k, f), DLSYNC_SUCCESS);
  assert_int_equal(k, DLSYNC_FENCE_IMPORTED);
  assert_int_equal(dlsync_fence_get_provenance(&got, f), DLSYNC_SUCCESS);
  assert_int_equal(got, prov);
  return f;
}

/* ---- EAGER: recorded on an eager stream ---- */

static void eager_import_eager_wait_orders_after_the_record(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING), out = NULL;
  dlsync_fence *f;
  uint64_t produce, after, consume;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  after = fake_work(P, "after the record", NULL);
  fake_log_reset();
  f = import_ok(e, DLSYNC_PROVENANCE_EAGER, 0, 0);
  /* The check: one query, in the RELAXED mode, the mode given back. */
  assert_string_equal(fake_call_log(), "cuThreadExchangeStreamCaptureMode,cuEventQuery,"
                                       "cuThreadExchangeStreamCaptureMode");
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  assert_int_equal(fake_call_count("cuEventRecord"), 0); /* the foreign record is the point */
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_false(fake_happens_before(after, consume));
  /* Exported: the imported event itself. */
  assert_int_equal(dlsync_fence_export_event(&out, f), DLSYNC_SUCCESS);
  assert_ptr_equal(out, e);
  dlsync_fence_release(f);
  /* Borrowed: still the caller's. */
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_EAGER);
  fake_event_destroy(e);
}

static void eager_import_capture_wait_is_an_external_wait_node(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  CUgraphNode consume, nodes[8];
  CUgraph g;
  CUgraphExec x;
  size_t n = 8;
  uint64_t produce, l1;
  int waits = 0;
  (void)state;
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  /* Imported during a GLOBAL capture of this thread: legal (R40). */
  f = import_ok(e, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_work(C, "consume", &consume);
  dlsync_fence_release(f); /* the graph still holds the event */
  g = end_capture_ok(C);
  assert_int_equal(D->GraphGetNodes(g, nodes, &n), CUDA_SUCCESS);
  for (size_t i = 0; i < n; i++)
    if (fake_node_type(nodes[i]) == CU_GRAPH_NODE_TYPE_WAIT_EVENT) {
      waits++;
      assert_ptr_equal(fake_node_event(nodes[i]), e);
      assert_true(fake_graph_has_path(g, nodes[i], consume));
    }
  assert_int_equal(waits, 1);
  x = instantiate(g);
  l1 = launch(x, X);
  assert_true(fake_happens_before(produce, l1));
  /* Owned: destroyed once the graph and its executable are gone, not before. */
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_not_equal(fake_event_get_state(e), FAKE_EVENT_INVALID);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  fake_run_destructors();
  dlsync__orphans_collect();
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_INVALID);
  fake_stream_destroy(X);
}

static void eager_import_built_wait_is_a_wait_node_at_the_frontier(void **state) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  dlsync_lane lg;
  CUgraphNode m, deps[2];
  CUgraph g;
  (void)state;
  fake_work(P, "produce", NULL);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  f = import_ok(e, DLSYNC_PROVENANCE_COMPLETE, 0, 0);
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  m = fake_graph_add_work(g, NULL, 0, "before");
  deps[0] = m;
  lg = dlsync_lane_graph(g, deps, 1, 2);
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_SUCCESS);
  assert_int_equal(lg.ndeps, 1);
  assert_int_equal(fake_node_type(lg.deps[0]), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(lg.deps[0]), e);
  assert_true(fake_graph_has_edge(g, m, lg.deps[0]));
  dlsync_fence_release(f);
  destroy_graph(g);
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_EAGER); /* borrowed */
  fake_event_destroy(e);
}

/* An owned event let go waits for the next collection, which the next
 * import makes: an importer's events do not pile up. */
static void owned_event_is_destroyed_by_the_next_import(void **state) {
  CUevent e1 = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent e2 = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  (void)state;
  f = import_ok(e1, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN);
  dlsync_fence_release(f);
  assert_int_equal(fake_event_get_state(e1), FAKE_EVENT_NEVER); /* not on this thread */
  f = import_ok(e2, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN);
  assert_int_equal(fake_event_get_state(e1), FAKE_EVENT_INVALID);
  assert_int_equal(fake_event_get_state(e2), FAKE_EVENT_NEVER);
  dlsync_fence_release(f);
  dlsync__orphans_collect();
  assert_int_equal(fake_event_get_state(e2), FAKE_EVENT_INVALID);
}

/* ---- EXTERNAL_RECORD: an event-record node of a graph ---- */

static void external_record_import_orders_after_the_launch(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), lx;
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  CUgraphNode w, rec, work;
  CUgraph g1, g2;
  CUgraphExec x1, x2;
  uint64_t l1, l2, consume;
  (void)state;
  /* The producer's graph: work, then a record node of e. */
  assert_int_equal(D->GraphCreate(&g1, 0), CUDA_SUCCESS);
  work = fake_graph_add_work(g1, NULL, 0, "produce");
  assert_int_equal(D->GraphAddEventRecordNode(&rec, g1, &work, 1, e), CUDA_SUCCESS);
  x1 = instantiate(g1);
  f = import_ok(e, DLSYNC_PROVENANCE_EXTERNAL_RECORD, 0, 0);
  l1 = launch(x1, P);
  /* Eager, after the launch: a plain wait. */
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 1);
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(l1, consume));
  /* Another capture: a wait node added by hand, armed at its launch. */
  lx = dlsync_lane_stream(X);
  assert_int_equal(D->StreamBeginCapture(X, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lx), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 1);
  assert_int_equal(fake_capture_status(X), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_work(X, "consume in a graph", &w);
  g2 = end_capture_ok(X);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  x2 = instantiate(g2);
  l1 = launch(x1, P);
  l2 = launch(x2, X);
  assert_true(fake_happens_before(l1, l2));
  dlsync_fence_release(f);
  destroy_graph(g2);
  assert_int_equal(D->GraphExecDestroy(x2), CUDA_SUCCESS);
  destroy_graph(g1);
  assert_int_equal(D->GraphExecDestroy(x1), CUDA_SUCCESS);
  fake_run_destructors();
  fake_event_destroy(e);
  fake_stream_destroy(X);
}

/* ---- CAPTURED: a plain record inside capture id ---- */

static void captured_import_same_capture_is_edges_only(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent fork = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent join = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  CUgraphNode n1, n2, n3;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->EventRecord(fork, P), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(C, fork, 0), CUDA_SUCCESS); /* C joins */
  fake_work(P, "produce", &n1);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS); /* the foreign runtime's plain record */
  fake_work(P, "after", &n3);
  f = import_ok(e, DLSYNC_PROVENANCE_CAPTURED, fake_capture_id(P), 0);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_SUCCESS);
  assert_int_equal(fake_call_count("cuGraphAddEventWaitNode"), 0);
  assert_int_equal(fake_call_count("cuGraphAddEventRecordNode"), 0);
  fake_work(C, "consume", &n2);
  assert_true(fake_graph_has_path(fake_capture_graph(P), n1, n2));
  assert_false(fake_graph_has_path(fake_capture_graph(P), n3, n2));
  assert_int_equal(D->EventRecord(join, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, join, 0), CUDA_SUCCESS);
  g = end_capture_ok(P);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 0);
  dlsync_fence_release(f);
  destroy_graph(g);
  fake_event_destroy(e);
  fake_event_destroy(fork);
  fake_event_destroy(join);
}

/* From anywhere else: refused, nothing queued, no capture harmed. */
static void captured_import_elsewhere_is_refused(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C), lx, lg;
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING), out = (CUevent)0x1;
  dlsync_fence *f;
  CUgraphNode deps[2];
  CUgraph g, gb;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", NULL);
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  f = import_ok(e, DLSYNC_PROVENANCE_CAPTURED, fake_capture_id(P), 0);
  /* Eager. */
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lc), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_message_has("only from that capture");
  assert_nothing_queued();
  assert_int_equal(fake_capture_status(C), CU_STREAM_CAPTURE_STATUS_NONE);
  /* Another capture. */
  lx = dlsync_lane_stream(X);
  assert_int_equal(D->StreamBeginCapture(X, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lx), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_nothing_queued();
  assert_int_equal(fake_capture_status(X), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* A built graph. */
  assert_int_equal(D->GraphCreate(&gb, 0), CUDA_SUCCESS);
  lg = dlsync_lane_graph(gb, deps, 0, 2);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_nothing_queued();
  assert_int_equal(fake_graph_count_nodes(gb, -1), 0);
  /* Not exported either. */
  assert_int_equal(dlsync_fence_export_event(&out, f), DLSYNC_ERROR_CAPTURE_ORDER);
  assert_null(out);
  dlsync_fence_release(f);
  destroy_graph(end_capture_ok(X));
  g = end_capture_ok(P);
  destroy_graph(g);
  destroy_graph(gb);
  fake_event_destroy(e);
  fake_stream_destroy(X);
}

/* ---- a declared conditional body ---- */

static void import_waited_in_a_declared_body_is_refused(void **state) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f;
  dlsync_lane lg;
  CUgraphNode deps[2];
  CUgraph body;
  (void)state;
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  f = import_ok(e, DLSYNC_PROVENANCE_EAGER, 0, 0);
  assert_int_equal(D->GraphCreate(&body, 0), CUDA_SUCCESS);
  assert_int_equal(dlsync_conditional_body_add(ctx, body), DLSYNC_SUCCESS);
  lg = dlsync_lane_graph(body, deps, 0, 2);
  fake_log_reset();
  assert_int_equal(dlsync_fence_wait(f, &lg), DLSYNC_ERROR_CONDITIONAL_BODY);
  assert_nothing_queued();
  assert_int_equal(fake_graph_count_nodes(body, -1), 0);
  assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  dlsync_fence_release(f);
  destroy_graph(body);
  fake_event_destroy(e);
}

/* ---- export ---- */

static void export_gives_the_fence_event_each_kind(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), lg;
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_fence *fe = NULL, *fc = NULL;
  CUevent ev = NULL, ec = NULL;
  CUgraphNode deps[2];
  CUgraph g;
  CUgraphExec x;
  uint64_t produce, l1, consume;
  (void)state;
  /* Eager: the event recorded at the signal. */
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_fence_signal(&fe, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_export_event(&ev, fe), DLSYNC_SUCCESS);
  assert_int_equal(fake_event_get_state(ev), FAKE_EVENT_EAGER);
  assert_int_equal(D->StreamWaitEvent(C, ev, 0), CUDA_SUCCESS); /* another runtime's wait */
  consume = fake_work(C, "consume", NULL);
  assert_true(fake_happens_before(produce, consume));
  /* Signalled in a built graph: its record node's event, armed at launch. */
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  deps[0] = fake_graph_add_work(g, NULL, 0, "produce in a graph");
  lg = dlsync_lane_graph(g, deps, 1, 2);
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS); /* the pool's */
  assert_int_equal(dlsync_fence_signal(&fc, ctx, &lg), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_export_event(&ec, fc), DLSYNC_SUCCESS);
  assert_ptr_equal(fake_node_event(lg.deps[0]), ec);
  x = instantiate(g);
  l1 = launch(x, X);
  assert_int_equal(D->StreamWaitEvent(C, ec, 0), CUDA_SUCCESS); /* eager, after the launch */
  consume = fake_work(C, "consume after the launch", NULL);
  assert_true(fake_happens_before(l1, consume));
  (void)lc;
  dlsync_fence_release(fe);
  dlsync_fence_release(fc);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(g);
  fake_stream_destroy(X);
}

/* ---- bad input ---- */

static void bad_input_is_refused_with_a_message(void **state) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING), out = NULL;
  dlsync_fence *f = (dlsync_fence *)0x1;
  dlsync_provenance prov;
  (void)state;
  assert_int_equal(D->EventRecord(e, P), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_fence_import(NULL, ctx, e, DLSYNC_PROVENANCE_EAGER, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("out is NULL");
  assert_int_equal(dlsync_fence_import(&f, NULL, e, DLSYNC_PROVENANCE_EAGER, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(f);
  assert_message_has("ctx is NULL");
  assert_int_equal(dlsync_fence_import(&f, ctx, NULL, DLSYNC_PROVENANCE_EAGER, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("event is NULL");
  assert_int_equal(dlsync_fence_import(&f, ctx, e, (dlsync_provenance)0, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("unknown provenance 0");
  assert_int_equal(dlsync_fence_import(&f, ctx, e, (dlsync_provenance)5, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("unknown provenance 5");
  assert_int_equal(dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_EAGER, 0, 0x6),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("unknown flags 0x6");
  assert_int_equal(dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_CAPTURED, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("capture_id 0 with provenance CAPTURED");
  assert_int_equal(dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_EAGER, 7, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("capture_id 7 with provenance EAGER");
  assert_null(f);
  assert_int_equal(fake_call_count("cuEventQuery"), 0); /* refused before any driver call */
  /* export and get_provenance */
  assert_int_equal(dlsync_fence_export_event(NULL, (dlsync_fence *)0x1),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_fence_export_event(&out, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("fence is NULL");
  assert_int_equal(dlsync_fence_get_provenance(&prov, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_nothing_queued();
  fake_event_destroy(e);
}

static void destroyed_event_is_invalid_argument(void **state) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f = NULL;
  (void)state;
  fake_event_destroy(e);
  fake_log_reset();
  assert_int_equal(dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(f);
  assert_message_has("not a live event");
  assert_message_has("CUDA_ERROR_INVALID_HANDLE");
  assert_nothing_queued();
}

/* The driver's answer contradicts the provenance: refused, nothing made, the
 * event still the caller's. An event declared CAPTURED is not asked (its
 * query would invalidate its capture, R41): the declaration is taken as it
 * is. An event declared otherwise that the query finds plainly recorded in
 * an active capture is refused, and that capture is then invalidated (R41). */
static void contradicted_provenance_is_invalid_argument(void **state) {
  CUevent eager = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  CUevent captured = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  dlsync_fence *f = NULL;
  uint64_t id;
  unsigned queries;
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->EventRecord(eager, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  id = fake_capture_id(P);
  assert_int_equal(D->EventRecord(captured, P), CUDA_SUCCESS);
  fake_log_reset();
  /* CAPTURED: not queried, the capture intact. */
  queries = fake_call_count("cuEventQuery");
  f = import_ok(captured, DLSYNC_PROVENANCE_CAPTURED, id, 0);
  assert_int_equal(fake_call_count("cuEventQuery"), queries);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  dlsync_fence_release(f);
  f = NULL;
  /* COMPLETE of an event whose work is still running (the fake's work
   * completes at once: the query's answer is made NOT_READY). */
  fake_fail_nth("cuEventQuery", 1, CUDA_ERROR_NOT_READY);
  assert_int_equal(dlsync_fence_import(&f, ctx, eager, DLSYNC_PROVENANCE_COMPLETE, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("provenance COMPLETE contradicts");
  fake_fail_clear();
  assert_null(f);
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* The thread's mode was given back. */
  {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
    assert_int_equal(D->ThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
    assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
  }
  /* EAGER of an event plainly recorded in the capture: refused by name; the
   * query has invalidated the capture (R41). */
  assert_int_equal(dlsync_fence_import(&f, ctx, captured, DLSYNC_PROVENANCE_EAGER, 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("provenance EAGER contradicts the driver");
  assert_message_has("CUDA_ERROR_CAPTURED_EVENT");
  assert_message_has("declare it CAPTURED");
  assert_null(f);
  assert_nothing_queued();
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  fake_event_destroy(eager);
  fake_event_destroy(captured);
}

static void released_fence_is_invalid_argument(void **state) {
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING), out = NULL;
  dlsync_fence *f;
  dlsync_provenance prov;
  (void)state;
  f = import_ok(e, DLSYNC_PROVENANCE_EAGER, 0, 0);
  dlsync_fence_release(f);
  assert_int_equal(dlsync_fence_export_event(&out, f), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("was released");
  assert_null(out);
  assert_int_equal(dlsync_fence_get_provenance(&prov, f), DLSYNC_ERROR_INVALID_ARGUMENT);
  fake_event_destroy(e);
}

static void signalled_fence_has_no_provenance(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_fence *f = NULL;
  dlsync_provenance prov;
  (void)state;
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_get_provenance(&prov, f), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("not imported");
  dlsync_fence_release(f);
}

/* ---- faults: each driver call of an import fails in turn ---- */

static void each_import_call_fault_is_reported(void **state) {
  static const char *calls[] = {"cuThreadExchangeStreamCaptureMode", "cuEventQuery",
                                "cuThreadExchangeStreamCaptureMode"};
  static const unsigned nth[] = {1, 1, 2};
  CUevent e = fake_event_create(0, CU_EVENT_DISABLE_TIMING);
  (void)state;
  for (size_t i = 0; i < 3; i++) {
    dlsync_fence *f = NULL;
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_GLOBAL;
    fake_log_reset();
    fake_fail_nth(calls[i], nth[i], CUDA_ERROR_UNKNOWN);
    assert_int_equal(dlsync_fence_import(&f, ctx, e, DLSYNC_PROVENANCE_EAGER, 0, DLSYNC_IMPORT_OWN),
                     DLSYNC_ERROR_DRIVER);
    fake_fail_clear();
    assert_null(f);
    assert_message_has(calls[i]);
    assert_message_has("CUDA_ERROR_UNKNOWN");
    /* Still the caller's, and nothing queued. */
    assert_int_equal(fake_event_get_state(e), FAKE_EVENT_NEVER);
    assert_nothing_queued();
    /* A failed restore leaves the thread RELAXED (the message says so):
     * put it back for the next round. */
    assert_int_equal(D->ThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
    assert_int_equal(m, i == 2 ? CU_STREAM_CAPTURE_MODE_RELAXED : CU_STREAM_CAPTURE_MODE_GLOBAL);
  }
  fake_event_destroy(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
      T(eager_import_eager_wait_orders_after_the_record),
      T(eager_import_capture_wait_is_an_external_wait_node),
      T(eager_import_built_wait_is_a_wait_node_at_the_frontier),
      T(owned_event_is_destroyed_by_the_next_import),
      T(external_record_import_orders_after_the_launch),
      T(captured_import_same_capture_is_edges_only),
      T(captured_import_elsewhere_is_refused),
      T(import_waited_in_a_declared_body_is_refused),
      T(export_gives_the_fence_event_each_kind),
      T(bad_input_is_refused_with_a_message),
      T(destroyed_event_is_invalid_argument),
      T(contradicted_provenance_is_invalid_argument),
      T(released_fence_is_invalid_argument),
      T(signalled_fence_has_no_provenance),
      T(each_import_call_fault_is_reported),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
