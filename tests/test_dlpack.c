/* SPDX-License-Identifier: Apache-2.0 */
/* DLPack on the fake driver: the deleter called exactly once, the version
 * read at the ABI's offset, every __dlpack__ stream value and error (with the
 * producer eager, capturing, invalidated, or the legacy stream while a
 * blocking stream captures), and a stream-ordered release of a tensor. The
 * tensors are built on dlsync's private mirror of DLManagedTensorVersioned;
 * tests/gpu/dlpack_layout_*.c checks that mirror against a real dlpack.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "interop/dlpack_abi.h"
#include "fixture.h"

static bool contains(const char *s, const char *part) {
  return strstr(s, part) != NULL;
}

#define assert_message_has(part)                                                        \
  do {                                                                                  \
    if (!contains(dlsync_last_error(), (part)))                                         \
      fail_msg("message \"%s\" lacks \"%s\"", dlsync_last_error(), (const char *)part); \
  } while (0)

/* ---- tensors ---- */

typedef struct test_tensor {
  dlsync__dlpack_managed m; /* first: a pointer to it is the tensor's */
  int deleted;
  struct DLManagedTensorVersioned *deleted_as;
} test_tensor;

static struct DLManagedTensorVersioned *as_dl(test_tensor *t) {
  return (struct DLManagedTensorVersioned *)(void *)&t->m;
}

static void count_deleter(struct DLManagedTensorVersioned *self) {
  test_tensor *t = (test_tensor *)(void *)self;
  t->deleted++;
  t->deleted_as = self;
}

static void tensor_init(test_tensor *t, uint32_t major, uint32_t minor) {
  memset(t, 0, sizeof *t);
  t->m.version.major = major;
  t->m.version.minor = minor;
  t->m.deleter = count_deleter;
  t->m.flags = 1; /* read only: never looked at */
  t->m.dl_tensor.device.device_type = DLSYNC_DLPACK_DEVICE_CUDA;
}

static void deleter_is_called_exactly_once(void **state) {
  test_tensor a, b;
  (void)state;
  tensor_init(&a, 1, 3);
  tensor_init(&b, 1, 0);
  dlsync_dlpack_call_deleter(as_dl(&a));
  assert_int_equal(a.deleted, 1);
  assert_ptr_equal(a.deleted_as, as_dl(&a));
  assert_int_equal(b.deleted, 0);
  dlsync_dlpack_call_deleter(as_dl(&b));
  assert_int_equal(a.deleted, 1);
  assert_int_equal(b.deleted, 1);
  assert_int_equal(fake_calls_total(), 0);
}

static void deleter_null_cases(void **state) {
  test_tensor a;
  (void)state;
  dlsync_dlpack_call_deleter(NULL);
  tensor_init(&a, 1, 3);
  a.m.deleter = NULL; /* DLPack allows it */
  dlsync_dlpack_call_deleter(as_dl(&a));
  assert_int_equal(a.deleted, 0);
}

static void deleter_of_another_major_version_is_called(void **state) {
  test_tensor a;
  uint32_t major = 0, minor = 0;
  (void)state;
  tensor_init(&a, 2, 7);
  assert_int_equal(dlsync_dlpack_version(&major, &minor, as_dl(&a)), DLSYNC_SUCCESS);
  assert_int_equal(major, 2);
  assert_int_equal(minor, 7);
  dlsync_dlpack_call_deleter(as_dl(&a));
  assert_int_equal(a.deleted, 1);
}

static void version_is_read(void **state) {
  test_tensor a;
  uint32_t major = 0, minor = 0;
  (void)state;
  tensor_init(&a, 1, 3);
  assert_int_equal(dlsync_dlpack_version(&major, &minor, as_dl(&a)), DLSYNC_SUCCESS);
  assert_int_equal(major, DLSYNC_DLPACK_MAJOR_VERSION);
  assert_int_equal(minor, 3);
  assert_int_equal(dlsync_dlpack_version(NULL, &minor, as_dl(&a)), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("major is NULL");
  assert_int_equal(dlsync_dlpack_version(&major, NULL, as_dl(&a)), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("minor is NULL");
  assert_int_equal(dlsync_dlpack_version(&major, &minor, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("tensor is NULL");
  assert_int_equal(a.deleted, 0);
}

/* ---- __dlpack__ stream values ---- */

static void assert_stream_lane(const dlsync_lane *l, CUstream s) {
  assert_int_equal(l->kind, DLSYNC_LANE_STREAM);
  assert_ptr_equal(l->stream, s);
  assert_null(l->graph);
  assert_null(l->deps);
  assert_int_equal(l->ndeps, 0);
}

static void assert_no_lane(const dlsync_lane *l) {
  assert_int_equal(l->kind, DLSYNC_LANE_NONE);
  assert_null(l->stream);
  assert_null(l->graph);
}

static void stream_values_without_producer(void **state) {
  dlsync_lane l;
  bool ordered = true;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, -1, NULL), DLSYNC_SUCCESS);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, 1, NULL), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, DLSYNC_STREAM_LEGACY);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, 2, NULL), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, DLSYNC_STREAM_PER_THREAD);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, (int64_t)(uintptr_t)C, NULL),
                   DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, C);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, 3, NULL), DLSYNC_SUCCESS);
  assert_stream_lane(&l, (CUstream)(uintptr_t)3);
  assert_int_equal(fake_calls_total(), 0);
}

static void stream_zero_is_refused_with_advice(void **state) {
  dlsync_lane l = dlsync_lane_stream(C);
  bool ordered = true;
  dlsync_lane lp = dlsync_lane_stream(P);
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 0, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("stream value 0");
  assert_message_has("DLPack specification");
  assert_message_has("ambiguous");
  assert_message_has("pass 1 for the legacy default stream, 2 for the per-thread");
  assert_message_has("-1 for no ordering");
  assert_int_equal(fake_calls_total(), 0);
}

static void other_negative_values_are_refused(void **state) {
  dlsync_lane l;
  bool ordered = true;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, -2, NULL),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_message_has("stream value -2 is not valid");
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, INT64_MIN, NULL),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("-9223372036854775808");
}

static void null_outputs_are_refused(void **state) {
  dlsync_lane l;
  bool ordered = true;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(NULL, &ordered, NULL, 2, NULL),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_false(ordered);
  assert_message_has("out is NULL");
  assert_int_equal(dlsync_dlpack_stream(&l, NULL, NULL, 2, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_no_lane(&l);
  assert_message_has("ordered is NULL");
}

static void bad_producer_lane_is_refused(void **state) {
  dlsync_lane l, bad = dlsync_lane_stream(P);
  bool ordered = true;
  (void)state;
  bad.graph = (CUgraph)(uintptr_t)0x40;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 2, &bad), DLSYNC_ERROR_INVALID_LANE);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_message_has("producer lane names both a stream");
  memset(&bad, 0, sizeof bad);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, -1, &bad), DLSYNC_ERROR_INVALID_LANE);
  assert_int_equal(fake_calls_total(), 0);
}

static void legacy_needs_ctx_with_a_producer(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = true;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, 1, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_false(ordered);
  assert_message_has("ctx is NULL");
  /* Values that need no query need no context. */
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, NULL, 2, &lp), DLSYNC_SUCCESS);
  assert_true(ordered);
}

static void eager_producer_legacy_is_one_query(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = false;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, DLSYNC_STREAM_LEGACY);
  assert_string_equal(fake_call_log(), "cuStreamIsCapturing");
  /* Other values: no driver call at all. */
  fake_log_reset();
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 2, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, (int64_t)(uintptr_t)C, &lp),
                   DLSYNC_SUCCESS);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, -1, &lp), DLSYNC_SUCCESS);
  assert_int_equal(fake_calls_total(), 0);
}

static void eager_producer_legacy_consumer_orders(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = false;
  dlsync_exchange *ex = NULL;
  uint64_t produce, consume, mutate;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  produce = fake_work(P, "produce", NULL);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &l), DLSYNC_SUCCESS);
  consume = fake_work(CU_STREAM_LEGACY, "consume", NULL);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  mutate = fake_work(P, "mutate", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_true(fake_happens_before(consume, mutate));
  {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
}

static void capturing_producer_refuses_legacy(void **state) {
  dlsync_lane l = dlsync_lane_stream(C), lp = dlsync_lane_stream(P);
  bool ordered = true;
  CUgraph g;
  char id[32];
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_log_reset();
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_message_has("stream=1");
  assert_message_has("legacy default stream");
  assert_message_has("being captured");
  snprintf(id, sizeof id, "capture id %llu", (unsigned long long)fake_capture_id(P));
  assert_message_has(id);
  assert_message_has("consumer's own stream handle");
  assert_message_has("or -1");
  /* Only capture queries were made: the capture is intact. */
  assert_int_equal(fake_calls_total(), fake_call_count("cuStreamIsCapturing") +
                                           fake_call_count("cuStreamGetCaptureInfo"));
  assert_int_equal(fake_capture_status(P), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  /* The other values are fine while the producer captures. */
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 2, &lp), DLSYNC_SUCCESS);
  assert_stream_lane(&l, DLSYNC_STREAM_PER_THREAD);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, -1, &lp), DLSYNC_SUCCESS);
  assert_false(ordered);
  g = end_capture_ok(P);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
}

/* What the error message advises works: the consumer's own stream joins the
 * producer's capture and the capture ends cleanly. */
static void capturing_producer_consumer_handle_joins(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = false;
  dlsync_exchange *ex = NULL;
  CUgraphNode produce = NULL, consume = NULL;
  CUgraph g;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "produce", &produce);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, (int64_t)(uintptr_t)C, &lp),
                   DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &l), DLSYNC_SUCCESS);
  fake_work(C, "consume", &consume);
  assert_non_null(consume);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  g = end_capture_ok(P);
  assert_true(fake_graph_has_path(g, produce, consume));
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  fake_run_destructors();
}

static void invalidated_producer_capture_is_reported(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = true;
  CUevent e = fake_event_create(0, 0);
  CUgraph g = NULL;
  (void)state;
  assert_int_equal(D->EventRecord(e, C), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(D->StreamWaitEvent(P, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp),
                   DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_message_has("invalidated");
  assert_int_equal(D->StreamEndCapture(P, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  fake_event_destroy(e);
}

/* The legacy stream while a blocking stream of its context captures: as the
 * producer, the query made for stream=1 reports it; as the consumer (stream=1
 * with an eager producer), the exchange does. Nothing touches the capture. */
static void legacy_stream_while_blocking_stream_captures(void **state) {
  CUstream blocking = fake_stream_create(0, CU_STREAM_DEFAULT);
  dlsync_lane l, lp = dlsync_lane_stream(P);
  dlsync_lane legacy_producer = dlsync_lane_stream(NULL);
  dlsync_exchange *ex = NULL;
  bool ordered = true;
  CUgraph g;
  (void)state;
  assert_int_equal(D->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  /* Producer on the legacy stream (NULL), consumer asks for 1. */
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &legacy_producer),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_message_has("legacy default stream while a blocking stream");
  /* Eager producer P: stream=1 converts, and the exchange refuses the legacy
   * consumer. */
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, DLSYNC_STREAM_LEGACY);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &l), DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_null(ex);
  assert_message_has("legacy");
  /* Producer on the legacy stream, consumer names its own stream: the
   * exchange refuses the legacy producer. */
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, (int64_t)(uintptr_t)C, &legacy_producer),
                   DLSYNC_SUCCESS);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &legacy_producer, &l),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_null(ex);
  assert_int_equal(fake_capture_status(blocking), CU_STREAM_CAPTURE_STATUS_ACTIVE);
  g = end_capture_ok(blocking);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
  {
    CUcontext popped;
    assert_int_equal(D->CtxPopCurrent(&popped), CUDA_SUCCESS);
  }
  fake_stream_destroy(blocking);
}

static void graph_lane_producer_is_not_a_capture(void **state) {
  CUgraph g;
  CUgraphNode deps[1];
  dlsync_lane l, lg;
  bool ordered = false;
  (void)state;
  assert_int_equal(D->GraphCreate(&g, 0), CUDA_SUCCESS);
  lg = dlsync_lane_graph(g, deps, 0, 1);
  fake_log_reset();
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lg), DLSYNC_SUCCESS);
  assert_true(ordered);
  assert_stream_lane(&l, DLSYNC_STREAM_LEGACY);
  assert_int_equal(fake_calls_total(), 0);
  assert_int_equal(D->GraphDestroy(g), CUDA_SUCCESS);
}

static void failed_capture_query_is_a_status(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = true;
  (void)state;
  fake_fail_nth("cuStreamIsCapturing", 1, CUDA_ERROR_INVALID_HANDLE);
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, 1, &lp), DLSYNC_ERROR_DRIVER);
  assert_false(ordered);
  assert_no_lane(&l);
  assert_message_has("cuStreamIsCapturing failed: CUDA_ERROR_INVALID_HANDLE");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_INVALID_HANDLE);
}

static void no_sync_lane_is_refused_by_order(void **state) {
  dlsync_lane l, lp = dlsync_lane_stream(P);
  bool ordered = true;
  (void)state;
  assert_int_equal(dlsync_dlpack_stream(&l, &ordered, ctx, -1, &lp), DLSYNC_SUCCESS);
  assert_false(ordered);
  assert_int_equal(dlsync_order(ctx, &lp, &l), DLSYNC_ERROR_INVALID_LANE);
}

/* ---- stream-ordered release of a tensor ---- */

static void release_runs_the_deleter_once(void **state) {
  test_tensor a;
  dlsync_lane lc = dlsync_lane_stream(C);
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  (void)state;
  tensor_init(&a, 1, 3);
  fake_work(C, "consume", NULL);
  /* The reclaimer thread this starts binds itself near the GPU with hwloc,
   * whose PCI discovery leaks inside libhwloc's plugins (LeakSanitizer sees
   * it); a failed bus-id query makes it skip the binding. */
  fake_fail_nth("cuDeviceGetPCIBusId", 1, CUDA_ERROR_NOT_SUPPORTED);
  assert_int_equal(dlsync_dlpack_release(ctx, &lc, as_dl(&a)), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(a.deleted, 1);
  assert_ptr_equal(a.deleted_as, as_dl(&a));
  assert_int_equal(dlsync_release_get_stats(&rs, ctx), DLSYNC_SUCCESS);
  assert_int_equal(rs.pending_eager, 0);
  assert_int_equal(rs.done, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(a.deleted, 1);
}

static void failed_release_leaves_the_tensor_to_the_caller(void **state) {
  test_tensor a;
  dlsync_lane bad;
  (void)state;
  tensor_init(&a, 1, 3);
  memset(&bad, 0, sizeof bad);
  assert_int_equal(dlsync_dlpack_release(ctx, &bad, as_dl(&a)), DLSYNC_ERROR_INVALID_LANE);
  assert_int_equal(dlsync_dlpack_release(ctx, &bad, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("tensor is NULL");
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(a.deleted, 0);
  dlsync_dlpack_call_deleter(as_dl(&a));
  assert_int_equal(a.deleted, 1);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, fixture_setup, fixture_teardown)
  const struct CMUnitTest tests[] = {
      T(deleter_is_called_exactly_once),
      T(deleter_null_cases),
      T(deleter_of_another_major_version_is_called),
      T(version_is_read),
      T(stream_values_without_producer),
      T(stream_zero_is_refused_with_advice),
      T(other_negative_values_are_refused),
      T(null_outputs_are_refused),
      T(bad_producer_lane_is_refused),
      T(legacy_needs_ctx_with_a_producer),
      T(eager_producer_legacy_is_one_query),
      T(eager_producer_legacy_consumer_orders),
      T(capturing_producer_refuses_legacy),
      T(capturing_producer_consumer_handle_joins),
      T(invalidated_producer_capture_is_reported),
      T(legacy_stream_while_blocking_stream_captures),
      T(graph_lane_producer_is_not_a_capture),
      T(failed_capture_query_is_a_status),
      T(no_sync_lane_is_refused_by_order),
      T(release_runs_the_deleter_once),
      T(failed_release_leaves_the_tensor_to_the_caller),
  };
#undef T
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
