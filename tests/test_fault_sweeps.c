/* SPDX-License-Identifier: Apache-2.0 */
/* The fault sweeps on the fake driver: every public entry point, with a fault
 * on each of its driver calls and on each of its allocations.
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

static dlsync_status scene_exchange_begin_fanout(void) {
  CUstream q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  dlsync_lane lp = dlsync_lane_stream(P);
  dlsync_lane lcs[2] = {dlsync_lane_stream(C), dlsync_lane_stream(q)};
  dlsync_exchange *ex = NULL;
  dlsync_status st;
  sweep_arm();
  st = dlsync_exchange_begin_fanout(&ex, ctx, &lp, lcs, 2, 0);
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

/* A conditional node's body declared with its parent and node, then an
 * order from eager P into the body's capture on C: the wait node hoisted
 * into the parent, with an edge to the conditional node. */
static dlsync_status scene_conditional_node(void) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUgraphConditionalHandle h = 0;
  CUgraphNodeParams p;
  CUgraph parent = NULL, body, got = NULL;
  CUgraphNode node = NULL;
  dlsync_status st;
  assert_int_equal(D->GraphCreate(&parent, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphConditionalHandleCreate(&h, parent, fake_primary_ctx(0), 1,
                                                   CU_GRAPH_COND_ASSIGN_DEFAULT),
                   CUDA_SUCCESS);
  memset(&p, 0, sizeof p);
  p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
  p.conditional.handle = h;
  p.conditional.type = CU_GRAPH_COND_TYPE_IF;
  p.conditional.size = 1;
  p.conditional.ctx = fake_primary_ctx(0);
  assert_int_equal(D->GraphAddNode(&node, parent, NULL, NULL, 0, &p), CUDA_SUCCESS);
  body = p.conditional.phGraph_out[0];
  assert_int_equal(
      D->StreamBeginCaptureToGraph(C, body, NULL, NULL, 0, CU_STREAM_CAPTURE_MODE_RELAXED),
      CUDA_SUCCESS);
  sweep_arm();
  st = dlsync_conditional_node_declare(ctx, parent, node, &body, 1);
  if (st == DLSYNC_SUCCESS)
    st = dlsync_order(ctx, &lp, &lc);
  sweep_disarm();
  assert_int_equal(D->StreamEndCapture(C, &got), CUDA_SUCCESS);
  if (dlsync_conditional_body_is_declared(ctx, body))
    assert_int_equal(dlsync_conditional_body_remove(ctx, body), DLSYNC_SUCCESS);
  destroy_graph(parent);
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
    {"dlsync_exchange_begin_fanout", scene_exchange_begin_fanout, DLSYNC_SUCCESS, false},
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
    {"dlsync_conditional_node_declare", scene_conditional_node, DLSYNC_SUCCESS, false},
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

static void every_allocation_fault_surfaces(void **state) {
  (void)state;
  sweep_entries(FAKE_FAULT_ALLOC);
}

static void every_driver_call_fault_surfaces(void **state) {
  (void)state;
  sweep_entries(FAKE_FAULT_CALL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      /* First: allocations made once per process are among those swept. */
      cmocka_unit_test_setup_teardown(every_allocation_fault_surfaces, fixture_setup,
                                      fixture_teardown),
      cmocka_unit_test_setup_teardown(every_driver_call_fault_surfaces, fixture_setup,
                                      fixture_teardown),
  };
  int rc;
  if (getenv("DLSYNC_TEST_FILTER") != NULL) /* one test by name (a glob) */
    cmocka_set_test_filter(getenv("DLSYNC_TEST_FILTER"));
  rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
