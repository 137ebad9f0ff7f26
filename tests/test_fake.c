/* SPDX-License-Identifier: Apache-2.0 */
/* Tests of the fake CUDA driver itself (tests/fake/): each rule it models is
 * checked here, so the library's tests can trust what it answers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "fake/fake_driver.h"

#if defined(__SANITIZE_ADDRESS__)
#define FAKE_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FAKE_TEST_ASAN 1
#endif
#endif
#ifdef FAKE_TEST_ASAN
#include <sanitizer/asan_interface.h>
#endif

static const dlsync__driver *D;
static CUcontext C0, C1;

#define CU_OK(expr) assert_int_equal((expr), CUDA_SUCCESS)
#define CU_IS(expr, r) assert_int_equal((expr), (r))

static int setup(void **state) {
  (void)state;
  fake_reset(2);
  D = fake_driver();
  if (D->DevicePrimaryCtxRetain(&C0, 0) != CUDA_SUCCESS ||
      D->DevicePrimaryCtxRetain(&C1, 1) != CUDA_SUCCESS || D->CtxPushCurrent(C0) != CUDA_SUCCESS)
    return -1;
  fake_log_reset();
  return 0;
}

static int teardown(void **state) {
  (void)state;
  CUcontext c;
  fake_fail_clear();
  while (D->CtxPopCurrent(&c) == CUDA_SUCCESS) {
  }
  D->DevicePrimaryCtxRelease(0);
  D->DevicePrimaryCtxRelease(1);
  fake_run_destructors();
  fake_run_host_funcs();
  return 0;
}

static CUstream mkstream(unsigned flags) {
  CUstream s = NULL;
  CU_OK(D->StreamCreate(&s, flags));
  return s;
}

static CUevent mkevent(void) {
  CUevent e = NULL;
  CU_OK(D->EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  return e;
}

static CUstreamCaptureStatus info_status(CUstream s, uint64_t *id) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t cid = 0;
  CU_OK(D->StreamGetCaptureInfo(s, &st, &cid, NULL, NULL, NULL, NULL));
  if (id)
    *id = cid;
  return st;
}

/* Runs fn(arg) on a new thread and waits for it. */
static void on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, fn, arg), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
}

/* ---- lifecycle and table ---------------------------------------------------------------- */

static void test_table_complete(void **state) {
  (void)state;
#define CHECK_FIELD(name, pfn, ver, need) assert_true(D->name != NULL);
  DLSYNC__DRIVER_ENTRIES(CHECK_FIELD)
#undef CHECK_FIELD
  assert_int_equal(D->version, 13000);
  assert_string_equal(D->origin, "fake");
  int v = 0;
  CU_OK(D->DriverGetVersion(&v));
  assert_int_equal(v, 13000);
}

static void test_old_driver_nulls_entries(void **state) {
  (void)state;
  fake_set_driver_version(12020);
  assert_true(D->StreamGetCaptureInfo == NULL); /* 12030 */
  assert_true(D->StreamUpdateCaptureDependencies == NULL);
  assert_true(D->GraphAddNode == NULL);
  assert_true(D->StreamGetDevice == NULL); /* 12080 */
  assert_true(D->CtxGetId != NULL);        /* 12000 */
  assert_true(D->StreamWaitEvent != NULL);
  assert_int_equal(D->version, 12020);
  int v = 0;
  CU_OK(D->DriverGetVersion(&v));
  assert_int_equal(v, 12020);
#define CHECK_FIELD(name, pfn, ver, need) assert_true(((ver) <= 12020) == (D->name != NULL));
  DLSYNC__DRIVER_ENTRIES(CHECK_FIELD)
#undef CHECK_FIELD
  fake_set_driver_version(13000);
  assert_true(D->StreamGetCaptureInfo != NULL);
}

static void test_not_initialized(void **state) {
  (void)state;
  fake_set_initialized(false);
  int n = -1, v = 0;
  const char *name = NULL;
  CU_IS(D->DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  assert_int_equal(n, -1);
  CU_OK(D->DriverGetVersion(&v));
  CU_OK(D->GetErrorName(CUDA_ERROR_NOT_INITIALIZED, &name));
  assert_string_equal(name, "CUDA_ERROR_NOT_INITIALIZED");
  CU_IS(D->Init(1), CUDA_ERROR_INVALID_VALUE);
  CU_IS(D->DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
  CU_OK(D->Init(0));
  CU_OK(D->DeviceGetCount(&n));
  assert_int_equal(n, 2);
}

static void test_devices(void **state) {
  (void)state;
  int n = 0, v = 0;
  CUdevice dev = -1;
  char name[64], bus0[32], bus1[32];
  size_t mem = 0;
  CU_OK(D->DeviceGetCount(&n));
  assert_int_equal(n, 2);
  CU_OK(D->DeviceGet(&dev, 1));
  assert_int_equal(dev, 1);
  CU_IS(D->DeviceGet(&dev, 2), CUDA_ERROR_INVALID_DEVICE);
  CU_OK(D->DeviceGetName(name, sizeof name, 0));
  assert_string_equal(name, "Fake GPU 0");
  CU_OK(D->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 0));
  assert_int_equal(v, 9);
  CU_OK(D->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0));
  assert_int_equal(v, 0);
  CU_OK(D->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1));
  assert_int_equal(v, 132);
  CU_IS(D->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->DeviceTotalMem(&mem, 0));
  assert_true(mem == (size_t)80 << 30);
  CU_OK(D->DeviceGetPCIBusId(bus0, sizeof bus0, 0));
  CU_OK(D->DeviceGetPCIBusId(bus1, sizeof bus1, 1));
  assert_string_equal(bus0, "0000:10:00.0");
  assert_string_equal(bus1, "0000:11:00.0");
  CU_OK(D->DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, 1));
  assert_int_equal(v, 0x11);
  CU_OK(D->DeviceCanAccessPeer(&v, 0, 1));
  assert_int_equal(v, 1);
  CU_OK(D->DeviceCanAccessPeer(&v, 1, 1));
  assert_int_equal(v, 0);
  CU_IS(D->DeviceGetName(name, sizeof name, 5), CUDA_ERROR_INVALID_DEVICE);
}

static void test_error_names(void **state) {
  (void)state;
  static const CUresult codes[] = {CUDA_SUCCESS,
                                   CUDA_ERROR_INVALID_VALUE,
                                   CUDA_ERROR_OUT_OF_MEMORY,
                                   CUDA_ERROR_NOT_INITIALIZED,
                                   CUDA_ERROR_NO_DEVICE,
                                   CUDA_ERROR_INVALID_DEVICE,
                                   CUDA_ERROR_INVALID_CONTEXT,
                                   CUDA_ERROR_INVALID_HANDLE,
                                   CUDA_ERROR_ILLEGAL_STATE,
                                   CUDA_ERROR_LOSSY_QUERY,
                                   CUDA_ERROR_NOT_SUPPORTED,
                                   CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                                   CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
                                   CUDA_ERROR_STREAM_CAPTURE_MERGE,
                                   CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
                                   CUDA_ERROR_STREAM_CAPTURE_UNJOINED,
                                   CUDA_ERROR_STREAM_CAPTURE_ISOLATION,
                                   CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
                                   CUDA_ERROR_CAPTURED_EVENT,
                                   CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD,
                                   CUDA_ERROR_UNKNOWN};
  const char *s = NULL;
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    s = NULL;
    CU_OK(D->GetErrorName(codes[i], &s));
    assert_non_null(s);
    assert_true(strncmp(s, "CUDA_", 5) == 0);
    s = NULL;
    CU_OK(D->GetErrorString(codes[i], &s));
    assert_non_null(s);
  }
  CU_OK(D->GetErrorName(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, &s));
  assert_string_equal(s, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION");
  CU_OK(D->GetErrorString(CUDA_ERROR_INVALID_VALUE, &s));
  assert_string_equal(s, "invalid argument");
  s = "x";
  CU_IS(D->GetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
  assert_null(s);
}

/* ---- contexts and streams ----------------------------------------------------------------- */

static void *thread_get_current(void *arg) {
  CUcontext *out = arg;
  *out = (CUcontext)(uintptr_t)1;
  if (D->CtxGetCurrent(out) != CUDA_SUCCESS)
    *out = (CUcontext)(uintptr_t)2;
  return NULL;
}

static void test_contexts(void **state) {
  (void)state;
  CUcontext c = NULL, again = NULL;
  CUdevice dev = -1;
  unsigned long long id0 = 0, id1 = 0;
  assert_int_equal(fake_primary_ctx_refs(0), 1);
  CU_OK(D->DevicePrimaryCtxRetain(&again, 0));
  assert_ptr_equal(again, C0);
  assert_int_equal(fake_primary_ctx_refs(0), 2);
  CU_OK(D->DevicePrimaryCtxRelease(0));
  assert_int_equal(fake_primary_ctx_refs(0), 1);
  CU_OK(D->CtxGetCurrent(&c));
  assert_ptr_equal(c, C0);
  CU_OK(D->CtxPushCurrent(C1));
  CU_OK(D->CtxGetDevice(&dev));
  assert_int_equal(dev, 1);
  CU_OK(D->CtxGetId(NULL, &id1));
  CU_OK(D->CtxGetId(C0, &id0));
  assert_true(id0 != id1);
  CU_OK(D->CtxPopCurrent(&c));
  assert_ptr_equal(c, C1);
  CU_OK(D->CtxGetDevice(&dev));
  assert_int_equal(dev, 0);
  /* Another thread starts with no current context. */
  CUcontext other = NULL;
  on_thread(thread_get_current, &other);
  assert_null(other);
  CU_OK(D->CtxPopCurrent(NULL));
  CU_IS(D->CtxPopCurrent(&c), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(D->CtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(D->CtxPushCurrent(NULL), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(D->DevicePrimaryCtxRelease(1));
  CU_IS(D->DevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(D->DevicePrimaryCtxRetain(&c, 1)); /* for teardown */
}

static void test_streams(void **state) {
  (void)state;
  CUstream s = mkstream(CU_STREAM_NON_BLOCKING), bad = NULL;
  CUcontext c = NULL;
  unsigned flags = 0;
  unsigned long long id = 0, id2 = 0, idl = 0, idp = 0;
  CUdevice dev = -1;
  assert_int_equal(fake_live_streams(), 1);
  CU_OK(D->StreamGetCtx(s, &c));
  assert_ptr_equal(c, C0);
  CU_OK(D->StreamGetFlags(s, &flags));
  assert_int_equal(flags, CU_STREAM_NON_BLOCKING);
  CU_OK(D->StreamGetDevice(s, &dev));
  assert_int_equal(dev, 0);
  CU_OK(D->StreamGetId(s, &id));
  CU_IS(D->StreamCreate(&bad, 0x10), CUDA_ERROR_INVALID_VALUE);
  /* Handles are reused after destroy, ids never. */
  CU_OK(D->StreamDestroy(s));
  assert_int_equal(fake_live_streams(), 0);
  CU_IS(D->StreamGetId(s, &id2), CUDA_ERROR_INVALID_HANDLE);
  CUstream s2 = mkstream(0);
  assert_ptr_equal(s2, s);
  CU_OK(D->StreamGetId(s2, &id2));
  assert_true(id2 != id);
  /* NULL and CU_STREAM_LEGACY are the current context's legacy stream. */
  CU_OK(D->StreamGetId(NULL, &idl));
  CU_OK(D->StreamGetId(CU_STREAM_LEGACY, &id));
  assert_true(id == idl);
  CU_OK(D->StreamGetId(CU_STREAM_PER_THREAD, &idp));
  assert_true(idp != idl);
  CU_OK(D->CtxPushCurrent(C1));
  CU_OK(D->StreamGetCtx(CU_STREAM_LEGACY, &c));
  assert_ptr_equal(c, C1);
  CU_OK(D->StreamGetId(CU_STREAM_LEGACY, &id));
  assert_true(id != idl);
  CU_OK(D->CtxPopCurrent(NULL));
  CU_OK(D->CtxPopCurrent(NULL));
  CU_IS(D->StreamGetId(NULL, &id), CUDA_ERROR_INVALID_CONTEXT);
  CU_IS(D->StreamCreate(&bad, 0), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(D->CtxPushCurrent(C0));
  /* fake_stream_create works without a current context, in the device's primary one. */
  CUstream s3 = fake_stream_create(1, 0);
  CU_OK(D->StreamGetCtx(s3, &c));
  assert_ptr_equal(c, C1);
  fake_stream_destroy(s3);
  CU_OK(D->StreamDestroy(s2));
  assert_int_equal(fake_live_streams(), 0);
}

static void test_events_basic(void **state) {
  (void)state;
  CUevent e = NULL, t0 = NULL, t1 = NULL;
  CUstream s0 = mkstream(0);
  float ms = -1.0f;
  CU_OK(D->CtxPopCurrent(NULL));
  CU_IS(D->EventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
  CU_OK(D->CtxPushCurrent(C1));
  CU_OK(D->EventCreate(&e, CU_EVENT_DISABLE_TIMING));
  CU_OK(D->CtxPopCurrent(NULL));
  CU_OK(D->CtxPushCurrent(C0));
  /* An event of context 1 recorded on a stream of context 0. */
  CU_IS(D->EventRecord(e, s0), CUDA_ERROR_INVALID_HANDLE);
  CU_IS(D->EventCreate(&t0, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->EventCreate(&t0, 0));
  CU_OK(D->EventCreate(&t1, 0));
  assert_int_equal(fake_live_events(), 3);
  CU_IS(D->EventElapsedTime(&ms, t0, t1), CUDA_ERROR_INVALID_HANDLE); /* never recorded */
  CU_OK(D->EventRecord(t0, s0));
  CU_OK(D->EventRecord(t1, s0));
  CU_OK(D->EventElapsedTime(&ms, t0, t1));
  assert_true(ms == 0.0f);
  CU_OK(D->EventQuery(t1));
  CU_OK(D->EventSynchronize(t1));
  CU_OK(D->StreamSynchronize(s0));
  CU_OK(D->StreamQuery(s0));
  CU_OK(D->CtxSynchronize());
  assert_int_equal(fake_event_get_state(t1), FAKE_EVENT_EAGER);
  assert_true(fake_event_op(t1) > fake_event_op(t0));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->EventDestroy(t0));
  CU_OK(D->EventDestroy(t1));
  CU_IS(D->EventDestroy(t1), CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(fake_live_events(), 0);
  CU_OK(D->StreamDestroy(s0));
  assert_int_equal(fake_illegal_calls(), 0);
}

/* ---- eager order ------------------------------------------------------------------------- */

static void test_eager_happens_before(void **state) {
  (void)state;
  CUstream s1 = mkstream(CU_STREAM_NON_BLOCKING), s2 = mkstream(CU_STREAM_NON_BLOCKING);
  CUevent e = mkevent();
  CUgraphNode node = (CUgraphNode)(uintptr_t)1;
  uint64_t a = fake_work(s1, "a", &node);
  assert_true(a > 0);
  assert_null(node);
  uint64_t unordered = fake_work(s2, "x", NULL);
  assert_false(fake_happens_before(a, unordered));
  CU_OK(D->EventRecord(e, s1));
  uint64_t after_record = fake_work(s1, "c", NULL);
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  uint64_t b = fake_work(s2, "b", NULL);
  assert_true(fake_happens_before(a, b));
  assert_false(fake_happens_before(after_record, b));
  assert_false(fake_happens_before(b, a));
  assert_false(fake_happens_before(a, a));
  assert_true(fake_happens_before(unordered, b)); /* stream order */
  assert_int_equal(fake_stream_last_op(s2), b);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_legacy_stream_implicit_sync(void **state) {
  (void)state;
  CUstream blocking = mkstream(0), nonblocking = mkstream(CU_STREAM_NON_BLOCKING);
  uint64_t a = fake_work(blocking, "a", NULL);
  uint64_t nb = fake_work(nonblocking, "nb", NULL);
  uint64_t l = fake_work(NULL, "legacy", NULL);
  uint64_t b = fake_work(blocking, "b", NULL);
  uint64_t nb2 = fake_work(nonblocking, "nb2", NULL);
  assert_true(fake_happens_before(a, l));
  assert_true(fake_happens_before(l, b));
  assert_false(fake_happens_before(nb, l));
  assert_false(fake_happens_before(l, nb2));
  CU_OK(D->StreamDestroy(blocking));
  CU_OK(D->StreamDestroy(nonblocking));
}

/* ---- capture basics ------------------------------------------------------------------------ */

static void test_capture_begin_end(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUgraph g = NULL, ginfo = NULL;
  CUgraphNode a = NULL, b = NULL;
  CUstreamCaptureStatus st;
  cuuint64_t id = 0;
  const CUgraphNode *deps = NULL;
  size_t n = 0;
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_ILLEGAL_STATE);
  CU_IS(D->StreamBeginCapture(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_GLOBAL),
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_STATE);
  assert_int_equal(fake_work(s, "a", &a), 0);
  assert_non_null(a);
  fake_work(s, "b", &b);
  CU_OK(D->StreamGetCaptureInfo(s, &st, &id, &ginfo, &deps, NULL, &n));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_true(id == fake_capture_id(s) && id != 0);
  assert_ptr_equal(ginfo, fake_capture_graph(s));
  assert_int_equal(n, 1);
  assert_ptr_equal(deps[0], b);
  CU_OK(D->StreamIsCapturing(s, &st));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s, &g));
  assert_ptr_equal(g, ginfo);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_graph_count_nodes(g, -1), 2);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_KERNEL), 2);
  assert_int_equal(fake_graph_count_edges(g), 1);
  assert_true(fake_graph_has_edge(g, a, b));
  assert_string_equal(fake_node_label(b), "b");
  /* Capture ids are unique and increasing. */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  assert_true(fake_capture_id(s) > id);
  CUgraph g2 = NULL;
  CU_OK(D->StreamEndCapture(s, &g2));
  assert_int_equal(fake_graph_count_nodes(g2, -1), 0);
  assert_int_equal(fake_live_graphs(), 2);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->GraphDestroy(g2));
  assert_int_equal(fake_live_graphs(), 0);
  CU_OK(D->StreamDestroy(s));
}

static void test_capture_join_unjoined(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraphNode a = NULL, b = NULL, dep = NULL;
  CUgraph g = (CUgraph)(uintptr_t)1;
  uint64_t id1 = 0, id2 = 0;
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s1, "a", &a);
  CU_OK(D->EventRecord(e, s1));
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_CAPTURED);
  CU_OK(D->StreamWaitEvent(s2, e, 0)); /* s2 joins */
  assert_int_equal(info_status(s2, &id2), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(info_status(s1, &id1), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_true(id1 == id2);
  assert_int_equal(fake_capture_deps(s2, &dep, 1), 1);
  assert_ptr_equal(dep, a);
  assert_int_equal(fake_graph_count_nodes(fake_capture_graph(s1), -1), 1); /* no event nodes */
  fake_work(s2, "b", &b);
  assert_true(fake_graph_has_edge(fake_capture_graph(s1), a, b));
  /* s2 never joined back. */
  CU_IS(D->StreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
  assert_null(g);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_live_graphs(), 0);
  assert_int_equal(fake_active_captures(), 0);

  /* The same, joined back: a graph a -> b -> c. */
  CUevent back = mkevent();
  CUgraphNode c = NULL;
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s1, "a", &a);
  CU_OK(D->EventRecord(e, s1));
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  fake_work(s2, "b", &b);
  CU_OK(D->EventRecord(back, s2));
  CU_OK(D->StreamWaitEvent(s1, back, 0));
  fake_work(s1, "c", &c);
  CU_OK(D->StreamEndCapture(s1, &g));
  assert_true(fake_graph_has_path(g, a, c));
  assert_true(fake_graph_has_edge(g, b, c));
  assert_int_equal(fake_graph_count_nodes(g, -1), 3);
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_NONE);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->EventDestroy(back));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_capture_edges_only_same_capture(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent fork = mkevent(), e = mkevent();
  CUgraphNode a = NULL, x = NULL, deps[4];
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->EventRecord(fork, s1));
  CU_OK(D->StreamWaitEvent(s2, fork, 0));
  fake_work(s2, "x", &x);
  fake_work(s1, "a", &a);
  size_t before = fake_graph_count_nodes(fake_capture_graph(s1), -1);
  fake_log_reset();
  CU_OK(D->EventRecord(e, s1));
  CU_OK(D->StreamWaitEvent(s2, e, 0)); /* both in the same capture: edges only */
  assert_string_equal(fake_call_log(), "cuEventRecord,cuStreamWaitEvent");
  assert_int_equal(fake_graph_count_nodes(fake_capture_graph(s1), -1), before);
  assert_int_equal(fake_capture_deps(s2, deps, 4), 2);
  assert_true((deps[0] == x && deps[1] == a) || (deps[0] == a && deps[1] == x));
  CUgraphNode y = NULL;
  fake_work(s2, "y", &y);
  CUgraph g = fake_capture_graph(s1);
  assert_true(fake_graph_has_edge(g, a, y));
  assert_true(fake_graph_has_edge(g, x, y));
  CU_OK(D->EventRecord(e, s2));
  CU_OK(D->StreamWaitEvent(s1, e, 0));
  CU_OK(D->StreamEndCapture(s1, &g));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(fork));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_capture_merge(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraph g = (CUgraph)(uintptr_t)1;
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  assert_true(fake_capture_id(s1) != fake_capture_id(s2));
  fake_work(s1, "a", NULL);
  CU_OK(D->EventRecord(e, s1));
  CU_IS(D->StreamWaitEvent(s2, e, 0), CUDA_ERROR_STREAM_CAPTURE_MERGE);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(info_status(s2, NULL), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_IS(D->StreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  CU_IS(D->StreamEndCapture(s2, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_int_equal(fake_live_graphs(), 0);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_capture_isolation(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent(), never = mkevent();
  CUgraph g = (CUgraph)(uintptr_t)1;
  CU_OK(D->EventRecord(e, s2));
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamWaitEvent(s1, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  uint64_t op = 1;
  CUgraphNode node = (CUgraphNode)(uintptr_t)1;
  CU_IS(fake_work_ex(s1, "late", &op, &node), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_int_equal(op, 0);
  assert_null(node);
  CU_IS(D->StreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  assert_int_equal(fake_live_graphs(), 0);
  /* A never-recorded event is isolation too (the fake's loud choice). */
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamWaitEvent(s1, never, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  CU_IS(D->StreamEndCapture(s1, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->EventDestroy(never));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

/* ---- external record / wait nodes --------------------------------------------------------- */

static void test_external_wait_node(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraphNode a = NULL, dep = NULL;
  CUgraph g = NULL;
  CU_OK(D->EventRecord(e, s2));
  CU_IS(D->StreamWaitEvent(s1, e, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_ILLEGAL_STATE); /* eager */
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s1, "a", &a);
  CU_OK(D->StreamWaitEvent(s1, e, CU_EVENT_WAIT_EXTERNAL));
  assert_int_equal(fake_capture_deps(s1, &dep, 1), 1);
  assert_int_equal(fake_node_type(dep), CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(dep), e);
  assert_true(fake_graph_has_edge(fake_capture_graph(s1), a, dep));
  CU_IS(D->StreamWaitEvent(s1, e, 0x8), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->StreamEndCapture(s1, &g));
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_external_record_node(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraphNode rec = NULL;
  CUgraph g = NULL;
  CU_IS(D->EventRecordWithFlags(e, s1, CU_EVENT_RECORD_EXTERNAL), CUDA_ERROR_ILLEGAL_STATE);
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s1, "a", NULL);
  CU_OK(D->EventRecordWithFlags(e, s1, CU_EVENT_RECORD_EXTERNAL));
  assert_int_equal(fake_capture_deps(s1, &rec, 1), 1);
  assert_int_equal(fake_node_type(rec), CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  assert_ptr_equal(fake_node_event(rec), e);
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_NODE);
  /* While the capture is active, a plain wait on the event from an eager
   * stream: an ordinary eager wait (R10), no join, nothing ordered. */
  uint64_t w0 = fake_work(s2, "w0", NULL);
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  uint64_t w1 = fake_work(s2, "w1", NULL);
  assert_true(fake_happens_before(w0, w1));
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s1, &g));
  /* Ended, not launched: a wait orders nothing. */
  uint64_t other = fake_work(s1, "unrelated", NULL);
  uint64_t before = fake_work(s2, "before", NULL);
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  uint64_t after = fake_work(s2, "after", NULL);
  assert_true(fake_happens_before(before, after));
  assert_false(fake_happens_before(other, after));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

static void test_external_wait_on_record_node_of_other_capture(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraph g1 = NULL, g2 = NULL;
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUgraph g3 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  fake_work(s1, "before the record", NULL);
  CU_OK(D->EventRecordWithFlags(e, s1, CU_EVENT_RECORD_EXTERNAL));
  /* R13: an external wait in another, active capture takes the record
   * node's event, and neither capture is harmed. */
  CU_OK(D->StreamWaitEvent(s2, e, CU_EVENT_WAIT_EXTERNAL));
  fake_work(s2, "after the wait", NULL);
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s2, &g2));
  CU_OK(D->StreamEndCapture(s1, &g1));
  assert_int_equal(fake_graph_count_nodes(g1, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  assert_int_equal(fake_graph_count_nodes(g2, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  /* Launched in that order on two streams, the second graph's work follows
   * the first's. */
  CU_OK(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU_OK(D->GraphInstantiateWithFlags(&x2, g2, 0));
  CU_OK(D->GraphLaunch(x1, s1));
  uint64_t l1 = fake_stream_last_op(s1);
  CU_OK(D->GraphLaunch(x2, s2));
  assert_true(fake_happens_before(l1, fake_stream_last_op(s2)));
  /* Once the record's capture has ended, an external wait in a new capture is fine. */
  CU_OK(D->StreamBeginCapture(s2, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamWaitEvent(s2, e, CU_EVENT_WAIT_EXTERNAL));
  CU_OK(D->StreamEndCapture(s2, &g3));
  assert_int_equal(fake_graph_count_nodes(g3, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  CU_OK(D->GraphExecDestroy(x1));
  CU_OK(D->GraphExecDestroy(x2));
  CU_OK(D->GraphDestroy(g1));
  CU_OK(D->GraphDestroy(g2));
  CU_OK(D->GraphDestroy(g3));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

/* ---- legacy stream during capture ----------------------------------------------------------- */

static void test_implicit_legacy(void **state) {
  (void)state;
  CUstream s = mkstream(0), nb = mkstream(CU_STREAM_NON_BLOCKING);
  CUstreamCaptureStatus st;
  CUgraph g = NULL;
  CUevent e = mkevent();
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamGetCaptureInfo(CU_STREAM_LEGACY, &st, NULL, NULL, NULL, NULL, NULL),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  CU_IS(D->StreamGetCaptureInfo(NULL, &st, NULL, NULL, NULL, NULL, NULL),
        CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE); /* not invalidated */
  /* Work on a non-blocking stream is unaffected. */
  assert_true(fake_work(nb, "nb", NULL) > 0);
  /* A wait on the legacy stream invalidates. */
  CU_IS(D->StreamWaitEvent(CU_STREAM_LEGACY, e, 0), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* Work on the legacy stream too. */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_IS(fake_work_ex(NULL, "legacy", NULL, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* A non-blocking capturing stream leaves the legacy stream alone. */
  CU_OK(D->StreamBeginCapture(nb, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamGetCaptureInfo(CU_STREAM_LEGACY, &st, NULL, NULL, NULL, NULL, NULL));
  assert_int_equal(st, CU_STREAM_CAPTURE_STATUS_NONE);
  assert_true(fake_work(CU_STREAM_LEGACY, "legacy", NULL) > 0);
  CU_OK(D->StreamEndCapture(nb, &g));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(nb));
}

/* ---- illegal calls during capture ----------------------------------------------------------- */

static void test_unsupported_global_same_thread(void **state) {
  (void)state;
  CUstream s = mkstream(0), other = mkstream(CU_STREAM_NON_BLOCKING);
  CUevent e = mkevent();
  CUdeviceptr p = 0;
  CUgraph g = NULL;
  CU_OK(D->EventRecord(e, other));
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamQuery(other), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_illegal_calls(), 1);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_IS(D->EventSynchronize(e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(D->EventQuery(e), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(D->CtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(D->MemAlloc(&p, 64), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(D->StreamSynchronize(other), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_illegal_calls(), 6);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* Allowed during capture: event create/destroy. */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUevent tmp = mkevent();
  CU_OK(D->EventDestroy(tmp));
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s, &g));
  CU_OK(D->GraphDestroy(g));
  /* Outside capture, all of them succeed. */
  CU_OK(D->StreamQuery(other));
  CU_OK(D->MemAlloc(&p, 64));
  CU_OK(D->MemFree(p));
  assert_int_equal(fake_illegal_calls(), 6);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(other));
}

typedef struct thread_call {
  CUstream stream;
  CUcontext ctx;
  CUstreamCaptureMode mode; /* mode the thread switches to first */
  bool switch_mode;
  CUresult result;
  CUstreamCaptureMode previous;
} thread_call;

static void *thread_stream_query(void *arg) {
  thread_call *t = arg;
  if (t->switch_mode) {
    t->previous = t->mode;
    if (D->ThreadExchangeStreamCaptureMode(&t->previous) != CUDA_SUCCESS) {
      t->result = CUDA_ERROR_UNKNOWN;
      return NULL;
    }
  }
  t->result = D->StreamQuery(t->stream);
  return NULL;
}

static void test_unsupported_other_thread_global(void **state) {
  (void)state;
  CUstream s = mkstream(0), other = mkstream(CU_STREAM_NON_BLOCKING);
  CUgraph g = NULL;
  thread_call t = {other, NULL,         CU_STREAM_CAPTURE_MODE_GLOBAL,
                   false, CUDA_SUCCESS, CU_STREAM_CAPTURE_MODE_GLOBAL};
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  on_thread(thread_stream_query, &t); /* default mode GLOBAL */
  assert_int_equal(t.result, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(fake_illegal_calls(), 1);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* The other thread in RELAXED mode may. */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  t.switch_mode = true;
  t.mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  on_thread(thread_stream_query, &t);
  assert_int_equal(t.result, CUDA_SUCCESS);
  assert_int_equal(t.previous, CU_STREAM_CAPTURE_MODE_GLOBAL);
  /* In THREAD_LOCAL mode it ignores other threads' captures. */
  t.mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
  on_thread(thread_stream_query, &t);
  assert_int_equal(t.result, CUDA_SUCCESS);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s, &g));
  CU_OK(D->GraphDestroy(g));
  assert_int_equal(fake_illegal_calls(), 1);
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(other));
}

static void test_unsupported_thread_local_capture(void **state) {
  (void)state;
  CUstream s = mkstream(0), other = mkstream(CU_STREAM_NON_BLOCKING);
  CUgraph g = NULL;
  thread_call t = {other, NULL,         CU_STREAM_CAPTURE_MODE_GLOBAL,
                   false, CUDA_SUCCESS, CU_STREAM_CAPTURE_MODE_GLOBAL};
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  /* Another thread, even in GLOBAL mode, is not concerned by a THREAD_LOCAL capture. */
  on_thread(thread_stream_query, &t);
  assert_int_equal(t.result, CUDA_SUCCESS);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* The capturing thread is. */
  CU_IS(D->StreamQuery(other), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(fake_illegal_calls(), 1);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(other));
}

static void test_relaxed_capture_and_mode(void **state) {
  (void)state;
  CUstream s = mkstream(0), other = mkstream(CU_STREAM_NON_BLOCKING);
  CUevent e = mkevent();
  CUgraph g = NULL;
  CUdeviceptr p = 0;
  CUstreamCaptureMode m = (CUstreamCaptureMode)7;
  CU_IS(D->ThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->EventRecord(e, other));
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(D->EventSynchronize(e));
  CU_OK(D->StreamQuery(other));
  CU_OK(D->MemAlloc(&p, 256));
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* Synchronizing the capturing stream itself is never allowed. */
  CU_IS(D->StreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  assert_int_equal(fake_illegal_calls(), 1);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  /* A GLOBAL capture; the capturing thread switches itself to RELAXED (as
   * PyTorch's allocator does around cudaMalloc). */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(D->ThreadExchangeStreamCaptureMode(&m));
  assert_int_equal(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CU_OK(D->MemFree(p));
  CU_OK(D->MemAlloc(&p, 256));
  CU_OK(D->ThreadExchangeStreamCaptureMode(&m));
  assert_int_equal(m, CU_STREAM_CAPTURE_MODE_RELAXED);
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CU_OK(D->StreamEndCapture(s, &g));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->MemFree(p));
  assert_int_equal(fake_illegal_calls(), 1);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(other));
}

/* [R41] A query of an event plainly recorded in an active capture, even
 * from a thread switched to RELAXED: CAPTURED_EVENT, the capture invalidated. */
static void test_captured_event_query_invalidates(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUevent e = mkevent();
  CUgraph g = NULL;
  CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->EventRecord(e, s));
  CU_OK(D->ThreadExchangeStreamCaptureMode(&m));
  CU_IS(D->EventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
  CU_OK(D->ThreadExchangeStreamCaptureMode(&m));
  assert_int_equal(fake_capture_status(s), CU_STREAM_CAPTURE_STATUS_INVALIDATED);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
}

static void test_captured_event_query(void **state) {
  (void)state;
  CUstream s = mkstream(0), other = mkstream(CU_STREAM_NON_BLOCKING);
  CUevent e = mkevent();
  CUgraph g = NULL;
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
  CU_OK(D->EventRecord(e, s));
  CU_IS(D->EventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
  assert_int_equal(fake_illegal_calls(), 1);
  CU_OK(D->StreamEndCapture(s, &g));
  /* After the capture: an eager wait on it orders nothing. */
  uint64_t unrelated = fake_work(s, "u", NULL);
  CU_OK(D->StreamWaitEvent(other, e, 0));
  uint64_t w = fake_work(other, "w", NULL);
  assert_false(fake_happens_before(unrelated, w));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->StreamDestroy(other));
}

/* ---- capture info, dependencies ----------------------------------------------------------------
 */

static void test_lossy_query_and_edge_data(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUgraphNode k = NULL;
  CUgraph g = NULL;
  CUstreamCaptureStatus st;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *ed = NULL;
  size_t n = 0;
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s, "k", &k);
  CUgraphEdgeData prog;
  memset(&prog, 0, sizeof prog);
  prog.type = CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC;
  prog.from_port = CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC;
  CU_OK(D->StreamUpdateCaptureDependencies(s, &k, &prog, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  CU_IS(D->StreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n), CUDA_ERROR_LOSSY_QUERY);
  CU_IS(D->StreamGetCaptureInfo(s, &st, NULL, NULL, NULL, &ed, &n), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, NULL, NULL, NULL, &n)); /* no deps asked: fine */
  assert_int_equal(n, 1);
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, NULL, &deps, &ed, &n));
  assert_int_equal(n, 1);
  assert_ptr_equal(deps[0], k);
  assert_int_equal(ed[0].type, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  CUgraphNode k2 = NULL;
  fake_work(s, "k2", &k2);
  /* The edge k -> k2 carries the data. */
  CU_OK(D->StreamEndCapture(s, &g));
  CUgraphNode from[2], to[2];
  CUgraphEdgeData data[2];
  n = 2;
  CU_IS(D->GraphGetEdges(g, from, to, NULL, &n), CUDA_ERROR_LOSSY_QUERY);
  n = 2;
  CU_OK(D->GraphGetEdges(g, from, to, data, &n));
  assert_int_equal(n, 1);
  assert_ptr_equal(from[0], k);
  assert_ptr_equal(to[0], k2);
  assert_int_equal(data[0].type, CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC);
  assert_null(from[1]);
  /* Non-default edge data out of a non-kernel node is refused. */
  CUgraphNode empty = NULL;
  CU_OK(D->GraphAddEmptyNode(&empty, g, NULL, 0));
  CUgraphNode e2 = NULL;
  CUgraphNodeParams params;
  memset(&params, 0, sizeof params);
  params.type = CU_GRAPH_NODE_TYPE_EMPTY;
  CU_IS(D->GraphAddNode(&e2, g, &empty, &prog, 1, &params), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->StreamDestroy(s));
}

static void test_capture_info_deps_reallocated(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUgraphNode a = NULL, b = NULL;
  CUgraph g = NULL;
  CUstreamCaptureStatus st;
  const CUgraphNode *d1 = NULL, *d2 = NULL;
  size_t n = 0;
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s, "a", &a);
  fake_work(s, "b", &b);
  CU_OK(D->StreamUpdateCaptureDependencies(s, &a, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES));
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, NULL, &d1, NULL, &n));
  assert_int_equal(n, 2);
  assert_ptr_equal(d1[0], b);
  assert_ptr_equal(d1[1], a);
#ifdef FAKE_TEST_ASAN
  assert_false(__asan_address_is_poisoned(d1));
#endif
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, NULL, &d2, NULL, &n));
  assert_int_equal(n, 2);
  assert_ptr_equal(d2[0], b);
#ifdef FAKE_TEST_ASAN
  /* The first array was freed by the second call: a caller that kept it reads freed memory. */
  assert_true(__asan_address_is_poisoned(d1));
  assert_true(d1 != d2);
#endif
  /* Any other call naming the stream ends the validity too. */
  unsigned long long id;
  CU_OK(D->StreamGetId(s, &id));
#ifdef FAKE_TEST_ASAN
  assert_true(__asan_address_is_poisoned(d2));
#endif
  CU_OK(D->StreamEndCapture(s, &g));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->StreamDestroy(s));
}

static void test_update_capture_deps_and_manual_append(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUevent e = mkevent();
  CUgraphNode a = NULL, rec = NULL, after = NULL, foreign = NULL, side = NULL;
  CUgraph g = NULL, other = NULL, capg = NULL;
  CUstreamCaptureStatus st;
  const CUgraphNode *deps = NULL;
  size_t n = 0;
  CU_OK(D->GraphCreate(&other, 0));
  CU_OK(D->GraphAddEmptyNode(&foreign, other, NULL, 0));
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  fake_work(s, "a", &a);
  CU_IS(
      D->StreamUpdateCaptureDependencies(s, &foreign, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES),
      CUDA_ERROR_INVALID_VALUE);
  CU_IS(D->StreamUpdateCaptureDependencies(s, &a, NULL, 1, 7), CUDA_ERROR_INVALID_VALUE);
  /* The manual route: info -> add record node after deps -> SET. */
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, &capg, &deps, NULL, &n));
  CU_OK(D->GraphAddEventRecordNode(&rec, capg, deps, n, e));
  CU_OK(D->StreamUpdateCaptureDependencies(s, &rec, NULL, 1, CU_STREAM_SET_CAPTURE_DEPENDENCIES));
  fake_work(s, "after", &after);
  assert_true(fake_graph_has_edge(capg, rec, after));
  assert_true(fake_graph_has_edge(capg, a, rec));
  /* Without the update, a node hangs off the side: legal, no UNJOINED. */
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, &capg, &deps, NULL, &n));
  CU_OK(D->GraphAddEmptyNode(&side, capg, deps, n));
  CU_IS(D->GraphAddEmptyNode(&side, capg, &foreign, 1), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->StreamEndCapture(s, &g));
  assert_int_equal(fake_graph_count_nodes(g, -1), 4);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_EVENT_RECORD), 1);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->GraphDestroy(other));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
}

static void test_begin_capture_to_graph(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUgraph user = NULL, g = NULL;
  CUgraphNode x = NULL, y = NULL;
  CUstreamCaptureStatus st;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *ed = NULL;
  size_t n = 0;
  CU_OK(D->GraphCreate(&user, 0));
  CU_OK(D->GraphAddEmptyNode(&x, user, NULL, 0));
  CU_OK(D->StreamBeginCaptureToGraph(s, user, &x, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, &g, &deps, &ed, &n));
  assert_ptr_equal(g, user);
  assert_int_equal(n, 1);
  assert_ptr_equal(deps[0], x);
  CU_IS(D->GraphDestroy(user), CUDA_ERROR_ILLEGAL_STATE); /* being captured into */
  fake_work(s, "y", &y);
  CU_OK(D->StreamEndCapture(s, &g));
  assert_ptr_equal(g, user);
  assert_true(fake_graph_has_edge(user, x, y));
  /* A failed capture into the user's graph leaves the graph to the user. */
  CU_OK(D->StreamBeginCaptureToGraph(s, user, &y, NULL, 1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_IS(D->StreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_null(g);
  assert_int_equal(fake_live_graphs(), 1);
  CU_OK(D->GraphDestroy(user));
  assert_int_equal(fake_live_graphs(), 0);
  CU_OK(D->StreamDestroy(s));
}

typedef struct end_call {
  CUstream stream;
  CUgraph graph;
  CUresult result;
} end_call;

static void *thread_end_capture(void *arg) {
  end_call *c = arg;
  c->result = D->StreamEndCapture(c->stream, &c->graph);
  return NULL;
}

static void test_end_capture_unmatched_and_wrong_thread(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUgraph g = NULL;
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->EventRecord(e, s1));
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  CU_IS(D->StreamEndCapture(s2, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
  assert_null(g);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_capture_status(s2), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_live_graphs(), 0);
  assert_int_equal(fake_active_captures(), 0);
  /* Ending a GLOBAL capture from another thread. */
  end_call ec = {s1, (CUgraph)(uintptr_t)1, CUDA_SUCCESS};
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_GLOBAL));
  on_thread(thread_end_capture, &ec);
  assert_int_equal(ec.result, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  assert_null(ec.graph);
  assert_int_equal(fake_capture_status(s1), CU_STREAM_CAPTURE_STATUS_NONE);
  assert_int_equal(fake_live_graphs(), 0);
  /* A RELAXED capture may be ended by any thread. */
  CU_OK(D->StreamBeginCapture(s1, CU_STREAM_CAPTURE_MODE_RELAXED));
  on_thread(thread_end_capture, &ec);
  assert_int_equal(ec.result, CUDA_SUCCESS);
  assert_non_null(ec.graph);
  CU_OK(D->GraphDestroy(ec.graph));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

/* ---- graphs built by hand -----------------------------------------------------------------------
 */

static void test_graph_api(void **state) {
  (void)state;
  CUgraph g = NULL, h = NULL;
  CUevent e = mkevent();
  CUdeviceptr p = 0;
  CUgraphNode a = NULL, r = NULL, w = NULL, m = NULL, c = NULL, n5 = NULL, n6 = NULL, hn = NULL;
  CUgraphNodeType t;
  CU_OK(D->MemAlloc(&p, 4096));
  CU_OK(D->GraphCreate(&g, 0));
  CU_OK(D->GraphCreate(&h, 0));
  CU_OK(D->GraphAddEmptyNode(&a, g, NULL, 0));
  CU_OK(D->GraphAddEventRecordNode(&r, g, &a, 1, e));
  CU_OK(D->GraphAddEventWaitNode(&w, g, NULL, 0, e));
  CUDA_MEMSET_NODE_PARAMS ms;
  memset(&ms, 0, sizeof ms);
  ms.dst = p;
  ms.elementSize = 4;
  ms.width = 1024;
  ms.height = 1;
  CU_OK(D->GraphAddMemsetNode(&m, g, &w, 1, &ms, C0));
  ms.width = 1025; /* one element past the allocation */
  CU_IS(D->GraphAddMemsetNode(&n5, g, NULL, 0, &ms, C0), CUDA_ERROR_INVALID_VALUE);
  CUDA_MEMCPY3D cp;
  memset(&cp, 0, sizeof cp);
  CU_OK(D->GraphAddMemcpyNode(&c, g, &m, 1, &cp, C0));
  /* Dependencies from another graph, and duplicated ones. */
  CU_IS(D->GraphAddEmptyNode(&n5, h, &a, 1), CUDA_ERROR_INVALID_VALUE);
  CUgraphNode dup[2] = {a, a};
  CU_IS(D->GraphAddEmptyNode(&n5, g, dup, 2), CUDA_ERROR_INVALID_VALUE);
  /* cuGraphAddNode. */
  CUgraphNodeParams params;
  memset(&params, 0, sizeof params);
  params.type = CU_GRAPH_NODE_TYPE_EVENT_RECORD;
  params.eventRecord.event = e;
  CU_OK(D->GraphAddNode(&n5, g, &c, NULL, 1, &params));
  memset(&params, 0, sizeof params);
  params.type = CU_GRAPH_NODE_TYPE_WAIT_EVENT;
  params.eventWait.event = e;
  CU_OK(D->GraphAddNode(&n6, g, NULL, NULL, 0, &params));
  memset(&params, 0, sizeof params);
  params.type = CU_GRAPH_NODE_TYPE_MEMSET;
  params.memset.dst = p;
  params.memset.elementSize = 4;
  params.memset.width = 16;
  params.memset.height = 1;
  params.memset.ctx = C0;
  CU_OK(D->GraphAddNode(&hn, g, NULL, NULL, 0, &params));
  CU_OK(D->GraphNodeGetType(hn, &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_MEMSET);
  memset(&params, 0, sizeof params);
  params.type = CU_GRAPH_NODE_TYPE_KERNEL;
  CU_IS(D->GraphAddNode(&hn, g, NULL, NULL, 0, &params), CUDA_ERROR_NOT_SUPPORTED);
  CU_OK(D->GraphNodeGetType(r, &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_EVENT_RECORD);
  CU_OK(D->GraphNodeGetType(w, &t));
  assert_int_equal(t, CU_GRAPH_NODE_TYPE_WAIT_EVENT);
  assert_ptr_equal(fake_node_event(n6), e);
  /* Dependencies. */
  CU_OK(D->GraphAddDependencies(g, &r, &n6, NULL, 1));
  CU_IS(D->GraphAddDependencies(g, &r, &n6, NULL, 1), CUDA_ERROR_INVALID_VALUE); /* exists */
  CU_IS(D->GraphAddDependencies(g, &r, &r, NULL, 1), CUDA_ERROR_INVALID_VALUE);  /* self */
  assert_true(fake_graph_has_path(g, a, n6));
  assert_true(fake_graph_has_path(g, w, n5));
  assert_false(fake_graph_has_path(g, n5, w));
  /* Nodes and edges. */
  size_t num = 0;
  CU_OK(D->GraphGetNodes(g, NULL, &num));
  assert_int_equal(num, 8);
  CUgraphNode nodes[9];
  num = 9;
  CU_OK(D->GraphGetNodes(g, nodes, &num));
  assert_int_equal(num, 8);
  assert_ptr_equal(nodes[0], a);
  assert_null(nodes[8]);
  num = 2;
  CU_OK(D->GraphGetNodes(g, nodes, &num));
  assert_int_equal(num, 2);
  CU_OK(D->GraphGetEdges(g, NULL, NULL, NULL, &num));
  assert_int_equal(num, 5); /* a-r, w-m, m-c, c-n5, r-n6 */
  assert_int_equal(fake_graph_count_edges(g), 5);
  CUgraphNode from[5], to[5];
  CU_OK(D->GraphGetEdges(g, from, to, NULL, &num));
  assert_ptr_equal(from[0], a);
  assert_ptr_equal(to[0], r);
  CU_IS(D->GraphGetEdges(g, from, NULL, NULL, &num), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->GraphDestroy(h));
  CU_IS(D->GraphDestroy(g), CUDA_ERROR_INVALID_VALUE);
  assert_int_equal(fake_dangling_event_uses(), 0);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->MemFree(p));
  assert_int_equal(fake_live_allocs(), 0);
}

static unsigned g_dtor_runs;
static void *g_dtor_arg;

static void count_dtor(void *arg) {
  g_dtor_runs++;
  g_dtor_arg = arg;
}

static void test_user_object_lifetime(void **state) {
  (void)state;
  int token = 0;
  CUuserObject o = NULL;
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  g_dtor_runs = 0;
  CU_IS(D->UserObjectCreate(&o, &token, count_dtor, 1, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->UserObjectCreate(&o, &token, count_dtor, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  assert_int_equal(fake_live_user_objects(), 1);
  CU_OK(D->GraphCreate(&g, 0));
  CU_OK(D->GraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE)); /* our ref moves */
  assert_int_equal(fake_user_object_refs(o), 1);
  CU_OK(D->GraphInstantiateWithFlags(&x, g, 0));
  assert_int_equal(fake_user_object_refs(o), 2);
  CU_OK(D->GraphDestroy(g)); /* the executable keeps it alive */
  assert_int_equal(fake_user_object_refs(o), 1);
  assert_int_equal(fake_pending_destructors(), 0);
  assert_int_equal(fake_live_user_objects(), 1);
  CU_OK(D->GraphExecDestroy(x));
  assert_int_equal(fake_live_user_objects(), 0);
  assert_int_equal(fake_pending_destructors(), 1);
  assert_int_equal(g_dtor_runs, 0); /* deferred: the driver runs it on its own thread */
  assert_int_equal(fake_run_destructors(), 1);
  assert_int_equal(g_dtor_runs, 1);
  assert_ptr_equal(g_dtor_arg, &token);
  assert_int_equal(fake_pending_destructors(), 0);
  /* Inline mode, and a plain release. */
  fake_set_destructors_inline(true);
  CU_OK(D->UserObjectCreate(&o, &token, count_dtor, 2, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CU_IS(D->UserObjectRelease(o, 3), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->UserObjectRelease(o, 1));
  assert_int_equal(g_dtor_runs, 1);
  CU_OK(D->UserObjectRelease(o, 1));
  assert_int_equal(g_dtor_runs, 2);
  assert_int_equal(fake_pending_destructors(), 0);
  fake_set_destructors_inline(false);
}

static void test_user_object_released_by_failed_capture(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUuserObject o = NULL;
  CUgraph g = NULL;
  CUstreamCaptureStatus st;
  g_dtor_runs = 0;
  CU_OK(D->UserObjectCreate(&o, NULL, count_dtor, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->StreamGetCaptureInfo(s, &st, NULL, &g, NULL, NULL, NULL));
  CU_OK(D->GraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE));
  CU_IS(D->StreamQuery(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_pending_destructors(), 0);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  assert_int_equal(fake_pending_destructors(), 1);
  assert_int_equal(fake_run_destructors(), 1);
  assert_int_equal(g_dtor_runs, 1);
  CU_OK(D->StreamDestroy(s));
}

static unsigned g_host_runs;

static void count_host(void *arg) {
  (void)arg;
  g_host_runs++;
}

static void test_graph_launch_orders(void **state) {
  (void)state;
  CUstream s1 = mkstream(CU_STREAM_NON_BLOCKING), s2 = mkstream(CU_STREAM_NON_BLOCKING);
  CUevent e = mkevent();
  CUgraph g1 = NULL, g2 = NULL;
  CUgraphExec x1 = NULL, x2 = NULL;
  CUgraphNode k = NULL, rec = NULL, wait = NULL, hostn = NULL;
  g_host_runs = 0;
  /* G1: work -> record e. G2: wait e -> host node. */
  CU_OK(D->GraphCreate(&g1, 0));
  k = fake_graph_add_work(g1, NULL, 0, "producer");
  assert_non_null(k);
  CU_OK(D->GraphAddEventRecordNode(&rec, g1, &k, 1, e));
  CU_OK(D->GraphCreate(&g2, 0));
  CU_OK(D->GraphAddEventWaitNode(&wait, g2, NULL, 0, e));
  CUgraphNodeParams hp;
  memset(&hp, 0, sizeof hp);
  hp.type = CU_GRAPH_NODE_TYPE_HOST;
  hp.host.fn = count_host;
  CU_OK(D->GraphAddNode(&hostn, g2, &wait, NULL, 1, &hp));
  CU_OK(D->GraphInstantiateWithFlags(&x1, g1, 0));
  CU_OK(D->GraphInstantiateWithFlags(&x2, g2, 0));
  /* G2 launched before any G1 launch: nothing to wait for. */
  uint64_t early_prev = fake_work(s1, "early", NULL);
  CU_OK(D->GraphLaunch(x2, s2));
  uint64_t l2_early = fake_stream_last_op(s2);
  assert_false(fake_happens_before(early_prev, l2_early));
  assert_int_equal(fake_pending_host_funcs(), 1);
  /* G1 then G2. */
  CU_OK(D->GraphLaunch(x1, s1));
  uint64_t l1 = fake_stream_last_op(s1);
  assert_int_equal(fake_event_get_state(e), FAKE_EVENT_EAGER);
  assert_int_equal(fake_event_op(e), l1);
  CU_OK(D->GraphLaunch(x2, s2));
  uint64_t l2 = fake_stream_last_op(s2);
  assert_true(fake_happens_before(l1, l2));
  /* A later eager wait also waits for the launch's record node. */
  CUstream s3 = mkstream(CU_STREAM_NON_BLOCKING);
  CU_OK(D->StreamWaitEvent(s3, e, 0));
  assert_true(fake_happens_before(l1, fake_work(s3, "after", NULL)));
  assert_int_equal(fake_run_host_funcs(), 2);
  assert_int_equal(g_host_runs, 2);
  /* Graphs may go before their executables. */
  CU_OK(D->GraphDestroy(g1));
  CU_OK(D->GraphDestroy(g2));
  CU_OK(D->GraphLaunch(x1, s1));
  CU_OK(D->GraphExecDestroy(x1));
  CU_OK(D->GraphExecDestroy(x2));
  assert_int_equal(fake_live_execs(), 0);
  fake_run_host_funcs();
  CU_OK(D->EventDestroy(e));
  assert_int_equal(fake_dangling_event_uses(), 0);
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
  CU_OK(D->StreamDestroy(s3));
}

static void test_dangling_event_use(void **state) {
  (void)state;
  CUevent e = mkevent();
  CUgraph g = NULL;
  CUgraphExec x = NULL;
  CUgraphNode w = NULL;
  CUstream s = mkstream(0);
  CU_OK(D->GraphCreate(&g, 0));
  CU_OK(D->GraphAddEventWaitNode(&w, g, NULL, 0, e));
  CU_OK(D->GraphInstantiateWithFlags(&x, g, 0));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e)); /* the executable still uses it */
  assert_int_equal(fake_dangling_event_uses(), 1);
  /* A new event taking the same handle is not the one the node used. */
  CUevent e2 = mkevent();
  assert_ptr_equal(e2, e);
  CU_OK(D->GraphLaunch(x, s));
  assert_int_equal(fake_dangling_event_uses(), 2);
  CU_OK(D->GraphExecDestroy(x));
  CU_OK(D->EventDestroy(e2));
  assert_int_equal(fake_dangling_event_uses(), 2);
  CU_OK(D->StreamDestroy(s));
}

static void test_host_func(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUgraph g = NULL;
  CUgraphNode n = NULL;
  g_host_runs = 0;
  CU_OK(D->LaunchHostFunc(s, count_host, NULL));
  assert_int_equal(fake_pending_host_funcs(), 1);
  assert_int_equal(g_host_runs, 0);
  assert_int_equal(fake_run_host_funcs(), 1);
  assert_int_equal(g_host_runs, 1);
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->LaunchHostFunc(s, count_host, NULL));
  assert_int_equal(fake_capture_deps(s, &n, 1), 1);
  assert_int_equal(fake_node_type(n), CU_GRAPH_NODE_TYPE_HOST);
  assert_int_equal(fake_pending_host_funcs(), 0);
  CU_OK(D->StreamEndCapture(s, &g));
  fake_set_host_funcs_inline(true);
  CU_OK(D->LaunchHostFunc(s, count_host, NULL));
  assert_int_equal(g_host_runs, 2);
  fake_set_host_funcs_inline(false);
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->StreamDestroy(s));
}

/* ---- memory
 * -------------------------------------------------------------------------------------- */

static void test_memory(void **state) {
  (void)state;
  CUstream s = mkstream(0);
  CUdeviceptr p = 0, q = 0;
  CUgraph g = NULL;
  CUgraphNode n = NULL;
  unsigned char host[16];
  CU_IS(D->MemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->MemAlloc(&p, 1024));
  CU_OK(D->MemAlloc(&q, 1024));
  assert_true(p != q && p != 0);
  assert_int_equal(fake_live_allocs(), 2);
  CU_OK(D->MemsetD32Async(p, 7, 256, s));
  CU_IS(D->MemsetD32Async(p, 7, 257, s), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->MemcpyDtoDAsync(q, p, 1024, s));
  memset(host, 0xab, sizeof host);
  CU_OK(D->MemcpyDtoHAsync(host, p, sizeof host, s));
  assert_int_equal(host[0], 0);
  memset(host, 0xab, sizeof host);
  CU_OK(D->MemcpyDtoH(host, p + 16, sizeof host));
  assert_int_equal(host[15], 0);
  CU_OK(D->MemcpyHtoD(q, host, sizeof host));
  /* Captured: nodes; synchronous copies are illegal. */
  CU_OK(D->StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CU_OK(D->MemsetD32Async(p, 1, 4, s));
  CU_OK(D->MemcpyDtoDAsync(q, p, 16, s));
  assert_int_equal(fake_capture_deps(s, &n, 1), 1);
  assert_int_equal(fake_node_type(n), CU_GRAPH_NODE_TYPE_MEMCPY);
  assert_int_equal(fake_graph_count_nodes(fake_capture_graph(s), CU_GRAPH_NODE_TYPE_MEMSET), 1);
  CU_IS(D->MemcpyHtoD(q, host, sizeof host), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  assert_int_equal(fake_illegal_calls(), 1);
  CU_IS(D->StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CU_OK(D->MemFree(p));
  CU_IS(D->MemFree(p), CUDA_ERROR_INVALID_VALUE);
  CU_OK(D->MemFree(q));
  assert_int_equal(fake_live_allocs(), 0);
  CU_OK(D->StreamDestroy(s));
}

/* ---- fault injection and the log
 * ------------------------------------------------------------------ */

static void test_fail_nth_by_symbol(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CU_OK(D->EventRecord(e, s1));
  fake_fail_nth("cuStreamWaitEvent", 2, CUDA_ERROR_OUT_OF_MEMORY);
  assert_true(fake_fail_pending());
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  uint64_t last = fake_stream_last_op(s2);
  CU_OK(D->EventRecord(e, s1)); /* other entries do not count */
  CU_IS(D->StreamWaitEvent(s2, e, 0), CUDA_ERROR_OUT_OF_MEMORY);
  assert_int_equal(fake_stream_last_op(s2), last); /* it did nothing */
  assert_false(fake_fail_pending());
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  assert_true(fake_stream_last_op(s2) > last);
  /* Always-failing entry. */
  fake_fail_always("cuStreamGetDevice", CUDA_ERROR_NOT_SUPPORTED);
  CUdevice dev;
  CU_IS(D->StreamGetDevice(s1, &dev), CUDA_ERROR_NOT_SUPPORTED);
  CU_IS(D->StreamGetDevice(s1, &dev), CUDA_ERROR_NOT_SUPPORTED);
  fake_fail_clear();
  CU_OK(D->StreamGetDevice(s1, &dev));
  /* Failed calls are still logged and counted. */
  assert_int_equal(fake_call_count("cuStreamWaitEvent"), 3);
  assert_int_equal(fake_call_count("cuStreamGetDevice"), 3);
  assert_int_equal(fake_call_count("cuNoSuchThing"), 0);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
}

/* An operation of four driver calls that cleans up after any failure. */
static CUresult fork_join(CUstream a, CUstream b) {
  CUevent e = NULL;
  CUresult r = D->EventCreate(&e, CU_EVENT_DISABLE_TIMING);
  if (r != CUDA_SUCCESS)
    return r;
  r = D->EventRecord(e, a);
  if (r == CUDA_SUCCESS)
    r = D->StreamWaitEvent(b, e, 0);
  CUresult r2 = D->EventDestroy(e);
  return r != CUDA_SUCCESS ? r : r2;
}

static void test_fail_call_by_number(void **state) {
  (void)state;
  CUstream a = mkstream(0), b = mkstream(0);
  unsigned n;
  unsigned failures = 0;
  for (n = 1;; n++) {
    fake_log_reset();
    fake_fail_call(n, CUDA_ERROR_UNKNOWN);
    CUresult r = fork_join(a, b);
    if (fake_fail_pending()) { /* completed without reaching call n */
      CU_OK(r);
      fake_fail_clear();
      break;
    }
    assert_int_equal(r, CUDA_ERROR_UNKNOWN);
    failures++;
    /* create | create,record,destroy | create,record,wait,destroy | the same */
    static const unsigned long calls[] = {1, 3, 4, 4};
    assert_true(n <= 4);
    assert_int_equal(fake_calls_total(), calls[n - 1]);
  }
  assert_int_equal(n, 5);
  assert_int_equal(failures, 4);
  /* A failed cuEventCreate made no event, a failed destroy left one behind. */
  assert_int_equal(fake_live_events(), 1);
  fake_log_reset();
  CU_OK(fork_join(a, b));
  assert_int_equal(fake_calls_total(), 4);
  CU_OK(D->StreamDestroy(a));
  CU_OK(D->StreamDestroy(b));
}

static void test_call_log(void **state) {
  (void)state;
  CUstream s1 = mkstream(0), s2 = mkstream(0);
  CUevent e = mkevent();
  CUstreamCaptureStatus st;
  fake_log_reset();
  assert_string_equal(fake_call_log(), "");
  assert_int_equal(fake_calls_total(), 0);
  CU_OK(D->StreamGetCaptureInfo(s1, &st, NULL, NULL, NULL, NULL, NULL));
  CU_OK(D->StreamGetCaptureInfo(s2, &st, NULL, NULL, NULL, NULL, NULL));
  CU_OK(D->EventRecord(e, s1));
  fake_work(s1, "not logged", NULL); /* test-side helpers are not driver calls */
  CU_OK(D->StreamWaitEvent(s2, e, 0));
  assert_string_equal(fake_call_log(),
                      "cuStreamGetCaptureInfo,cuStreamGetCaptureInfo,cuEventRecord,"
                      "cuStreamWaitEvent");
  assert_int_equal(fake_calls_total(), 4);
  assert_int_equal(fake_call_count("cuStreamGetCaptureInfo"), 2);
  fake_log_reset();
  assert_string_equal(fake_call_log(), "");
  assert_int_equal(fake_call_count("cuEventRecord"), 0);
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s1));
  CU_OK(D->StreamDestroy(s2));
  assert_string_equal(fake_call_log(), "cuEventDestroy,cuStreamDestroy,cuStreamDestroy");
}

/* ---- accounting and threads --------------------------------------------------------------------
 */

static void test_leak_report_and_reset(void **state) {
  (void)state;
  char buf[256];
  CUstream s = mkstream(0);
  CUevent e = mkevent();
  CUgraph g = NULL;
  CU_OK(D->GraphCreate(&g, 0));
  assert_int_equal(fake_leak_report(buf, sizeof buf), 4); /* + our 2 primary context refs */
  assert_non_null(strstr(buf, "1 event"));
  assert_non_null(strstr(buf, "1 stream"));
  assert_non_null(strstr(buf, "1 graph"));
  assert_non_null(strstr(buf, "2 primary context references"));
  CU_OK(D->GraphDestroy(g));
  CU_OK(D->EventDestroy(e));
  CU_OK(D->StreamDestroy(s));
  CU_OK(D->DevicePrimaryCtxRelease(0));
  CU_OK(D->DevicePrimaryCtxRelease(1));
  assert_int_equal(fake_leak_report(buf, sizeof buf), 0);
  assert_string_equal(buf, "");
  CU_OK(D->DevicePrimaryCtxRetain(&C0, 0));
  CU_OK(D->DevicePrimaryCtxRetain(&C1, 1));
  /* fake_reset frees everything, ids stay unique across resets. */
  unsigned long long before = 0, after = 0;
  CU_OK(D->StreamGetId(NULL, &before));
  s = mkstream(0);
  fake_reset(1);
  assert_int_equal(fake_live_streams(), 0);
  assert_int_equal(fake_primary_ctx_refs(0), 0);
  assert_int_equal(fake_primary_ctx_refs(1), -1);
  CU_OK(D->DevicePrimaryCtxRetain(&C0, 0));
  CU_OK(D->CtxPushCurrent(C0));
  CU_OK(D->StreamGetId(NULL, &after));
  assert_true(after > before);
  fake_reset(2); /* for teardown */
  CU_OK(D->DevicePrimaryCtxRetain(&C0, 0));
  CU_OK(D->DevicePrimaryCtxRetain(&C1, 1));
  CU_OK(D->CtxPushCurrent(C0));
}

typedef struct worker {
  CUcontext ctx;
  int rounds;
  int failures;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  CUstream a = NULL, b = NULL;
  CUevent e = NULL;
  if (D->CtxPushCurrent(w->ctx) != CUDA_SUCCESS || D->StreamCreate(&a, 0) != CUDA_SUCCESS ||
      D->StreamCreate(&b, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      D->EventCreate(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    w->failures++;
    return NULL;
  }
  for (int i = 0; i < w->rounds; i++) {
    uint64_t x = fake_work(a, "x", NULL);
    if (D->EventRecord(e, a) != CUDA_SUCCESS || D->StreamWaitEvent(b, e, 0) != CUDA_SUCCESS)
      w->failures++;
    uint64_t y = fake_work(b, "y", NULL);
    if (!fake_happens_before(x, y))
      w->failures++;
  }
  if (D->EventDestroy(e) != CUDA_SUCCESS || D->StreamDestroy(a) != CUDA_SUCCESS ||
      D->StreamDestroy(b) != CUDA_SUCCESS || D->CtxPopCurrent(NULL) != CUDA_SUCCESS)
    w->failures++;
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  enum { N = 8 };
  pthread_t t[N];
  worker w[N];
  fake_log_reset();
  for (int i = 0; i < N; i++) {
    w[i].ctx = i % 2 ? C1 : C0;
    w[i].rounds = 200;
    w[i].failures = 0;
    assert_int_equal(pthread_create(&t[i], NULL, worker_main, &w[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(pthread_join(t[i], NULL), 0);
    assert_int_equal(w[i].failures, 0);
  }
  assert_int_equal(fake_call_count("cuEventRecord"), N * 200);
  assert_int_equal(fake_live_streams(), 0);
  assert_int_equal(fake_live_events(), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T_(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
      T_(test_table_complete),
      T_(test_old_driver_nulls_entries),
      T_(test_not_initialized),
      T_(test_devices),
      T_(test_error_names),
      T_(test_contexts),
      T_(test_streams),
      T_(test_events_basic),
      T_(test_eager_happens_before),
      T_(test_legacy_stream_implicit_sync),
      T_(test_capture_begin_end),
      T_(test_capture_join_unjoined),
      T_(test_capture_edges_only_same_capture),
      T_(test_capture_merge),
      T_(test_capture_isolation),
      T_(test_external_wait_node),
      T_(test_external_record_node),
      T_(test_external_wait_on_record_node_of_other_capture),
      T_(test_implicit_legacy),
      T_(test_unsupported_global_same_thread),
      T_(test_unsupported_other_thread_global),
      T_(test_unsupported_thread_local_capture),
      T_(test_relaxed_capture_and_mode),
      T_(test_captured_event_query),
      T_(test_captured_event_query_invalidates),
      T_(test_lossy_query_and_edge_data),
      T_(test_capture_info_deps_reallocated),
      T_(test_update_capture_deps_and_manual_append),
      T_(test_begin_capture_to_graph),
      T_(test_end_capture_unmatched_and_wrong_thread),
      T_(test_graph_api),
      T_(test_user_object_lifetime),
      T_(test_user_object_released_by_failed_capture),
      T_(test_graph_launch_orders),
      T_(test_dangling_event_use),
      T_(test_host_func),
      T_(test_memory),
      T_(test_fail_nth_by_symbol),
      T_(test_fail_call_by_number),
      T_(test_call_log),
      T_(test_leak_report_and_reset),
      T_(test_threads),
#undef T_
  };
  int failed = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return failed;
}
