/* SPDX-License-Identifier: Apache-2.0 */
/* The Arrow C Device data interface on the fake driver (include/dlsync/arrow.h):
 * the producer's sync_event from an eager stream and from a capture, the
 * consumer's wait from each kind of lane, the producer's release run only
 * after the consumer's work (eager: after its event; captured: after the
 * graph is gone), and bad arrays refused with nothing queued. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "dlsync/arrow.h"
#include "fixture.h"

static atomic_int released;

/* Waits (up to 10 s) until `want` releases ran. */
static bool wait_released(int want) {
  for (int i = 0; i < 10000 && atomic_load(&released) < want; i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return atomic_load(&released) == want;
}

static void array_release(struct ArrowArray *a) {
  atomic_fetch_add(&released, 1);
  a->release = NULL;
}

/* A CUDA array of one buffer, not released. */
static struct ArrowDeviceArray make_array(void) {
  struct ArrowDeviceArray a;
  memset(&a, 0, sizeof a);
  a.array.length = 4;
  a.array.n_buffers = 1;
  a.array.release = array_release;
  a.device_type = ARROW_DEVICE_CUDA;
  return a;
}

static int setup(void **state) {
  (void)state;
  atomic_store(&released, 0);
  fixture_open(NULL);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  pop_all_contexts();
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  fixture_close();
  return 0;
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("message \"%s\" lacks \"%s\"", dlsync_last_error(), what);
}

static void layouts_are_the_interface_s(void **state) {
  (void)state;
  assert_int_equal(sizeof(struct ArrowArray), 80);
  assert_int_equal(sizeof(struct ArrowDeviceArray), 128);
  assert_int_equal(offsetof(struct ArrowDeviceArray, device_id), 80);
  assert_int_equal(offsetof(struct ArrowDeviceArray, device_type), 88);
  assert_int_equal(offsetof(struct ArrowDeviceArray, sync_event), 96);
  assert_int_equal(offsetof(struct ArrowDeviceArray, reserved), 104);
}

/* Eager producer, eager consumer; the release after the consumer's work. */
static void eager_producer_eager_consumer(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  struct ArrowDeviceArray a = make_array();
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  CUevent ev = NULL;
  uint64_t produce, consume;
  (void)state;
  produce = fake_work(P, "write the buffers", NULL);
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_SUCCESS);
  assert_ptr_equal(a.sync_event, &sync.event);
  assert_int_equal(dlsync_fence_export_event(&ev, sync.fence), DLSYNC_SUCCESS);
  assert_ptr_equal(sync.event, ev);
  assert_int_equal(fake_event_get_state(ev), FAKE_EVENT_EAGER);
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0), DLSYNC_SUCCESS);
  consume = fake_work(C, "read the buffers", NULL);
  assert_true(fake_happens_before(produce, consume));
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_SUCCESS);
  assert_null(a.array.release); /* moved */
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&released), 1);
  dlsync_arrow_sync_release(&sync);
  assert_null(sync.fence);
  dlsync_arrow_sync_release(&sync); /* holding nothing: a no-op */
}

/* A producer's capture: the event of a record node, armed at launch; the
 * consumer waits eagerly after the launch (EXTERNAL_RECORD). */
static void captured_producer_eager_consumer_after_launch(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  CUstream X = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  struct ArrowDeviceArray a = make_array();
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  CUgraph g;
  CUgraphExec x = NULL;
  uint64_t l1, consume;
  (void)state;
  assert_int_equal(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  fake_work(P, "write the buffers", NULL);
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_SUCCESS);
  /* Before the launch an eager wait is refused by the driver's rule in the
   * header; after it, ordered. */
  g = end_capture_ok(P);
  assert_int_equal(D->GraphInstantiateWithFlags(&x, g, 0), CUDA_SUCCESS);
  assert_int_equal(D->GraphLaunch(x, X), CUDA_SUCCESS);
  l1 = fake_stream_last_op(X);
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EXTERNAL_RECORD, 0),
                   DLSYNC_SUCCESS);
  consume = fake_work(C, "read the buffers", NULL);
  assert_true(fake_happens_before(l1, consume));
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&released), 1);
  dlsync_arrow_sync_release(&sync);
  assert_int_equal(D->GraphExecDestroy(x), CUDA_SUCCESS);
  destroy_graph(g);
  fake_stream_destroy(X);
}

/* An eager producer, a capturing consumer: a wait node; the producer's
 * release runs only once the consumer's graph is gone. */
static void eager_producer_capturing_consumer_release_after_the_graph(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  struct ArrowDeviceArray a = make_array();
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  CUgraph g;
  (void)state;
  fake_work(P, "write the buffers", NULL);
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(D->StreamBeginCapture(C, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0), DLSYNC_SUCCESS);
  fake_work(C, "read the buffers", NULL);
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_SUCCESS);
  g = end_capture_ok(C);
  assert_int_equal(fake_graph_count_nodes(g, CU_GRAPH_NODE_TYPE_WAIT_EVENT), 1);
  dlsync_arrow_sync_release(&sync); /* the graph holds the event */
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&released), 0); /* the graph still owns it */
  destroy_graph(g);                            /* the reclaimer runs it now */
  assert_true(wait_released(1));
}

/* A NULL sync_event: nothing to wait on, nothing queued. */
static void null_sync_event_is_nothing_to_wait_on(void **state) {
  dlsync_lane lc = dlsync_lane_stream(C);
  struct ArrowDeviceArray a = make_array();
  (void)state;
  fake_log_reset();
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0), DLSYNC_SUCCESS);
  assert_string_equal(fake_call_log(), "");
  a.array.release(&a.array);
}

static void bad_arrays_are_refused_with_nothing_queued(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  struct ArrowDeviceArray a = make_array();
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  CUevent none = NULL;
  (void)state;
  fake_log_reset();
  a.device_type = ARROW_DEVICE_CPU;
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("device type 1 is not a CUDA device type");
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(a.array.release); /* still the caller's */
  a.device_type = ARROW_DEVICE_CUDA;
  a.reserved[2] = 5;
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("reserved[2] is 5");
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_ERROR_INVALID_ARGUMENT);
  a.reserved[2] = 0;
  a.sync_event = &none;
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("points to a NULL event");
  a.sync_event = NULL;
  a.array.release = NULL;
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("released");
  assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("release is NULL");
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, NULL, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("array is NULL");
  assert_int_equal(dlsync_arrow_wait(NULL, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_arrow_sync_event(&a, NULL, ctx, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_string_equal(fake_call_log(), ""); /* no driver call at all */
  /* A sync already holding a fence. */
  a.array.release = array_release;
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("already holds fence");
  dlsync_arrow_sync_release(&sync);
  assert_int_equal(atomic_load(&released), 0);
}

/* CUDA_HOST and CUDA_MANAGED arrays: their sync_event is a cudaEvent_t* as
 * CUDA's is (the interface's rule for the three CUDA device types). */
static void cuda_host_and_managed_arrays_are_ordered(void **state) {
  static const ArrowDeviceType types[] = {ARROW_DEVICE_CUDA_HOST, ARROW_DEVICE_CUDA_MANAGED};
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  (void)state;
  for (int i = 0; i < 2; i++) {
    struct ArrowDeviceArray a = make_array();
    dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
    a.device_type = types[i];
    assert_int_equal(dlsync_arrow_sync_event(&a, &sync, ctx, &lp), DLSYNC_SUCCESS);
    assert_non_null(a.sync_event);
    fake_log_reset();
    assert_int_equal(dlsync_arrow_wait(ctx, &lc, &a, DLSYNC_PROVENANCE_EAGER, 0), DLSYNC_SUCCESS);
    assert_non_null(strstr(fake_call_log(), "cuStreamWaitEvent"));
    assert_int_equal(dlsync_arrow_release(ctx, &lc, &a), DLSYNC_SUCCESS);
    assert_null(a.array.release);
    assert_true(wait_released(i + 1));
    dlsync_arrow_sync_release(&sync);
  }
  /* ROCm's host memory is no CUDA device type. */
  struct ArrowDeviceArray b = make_array();
  b.device_type = ARROW_DEVICE_ROCM_HOST;
  assert_int_equal(dlsync_arrow_wait(ctx, &lc, &b, DLSYNC_PROVENANCE_EAGER, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("device type 11 is not a CUDA device type");
}

/* A release that dlsync_release refuses leaves the array the caller's. */
static void failed_release_leaves_the_array(void **state) {
  dlsync_lane bad = dlsync_lane_stream(NULL);
  struct ArrowDeviceArray a = make_array();
  (void)state;
  bad.kind = (dlsync_lane_kind)7;
  assert_int_not_equal(dlsync_arrow_release(ctx, &bad, &a), DLSYNC_SUCCESS);
  assert_non_null(a.array.release);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&released), 0);
  a.array.release(&a.array);
}

int main(void) {
  const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
      T(layouts_are_the_interface_s),
      T(eager_producer_eager_consumer),
      T(captured_producer_eager_consumer_after_launch),
      T(eager_producer_capturing_consumer_release_after_the_graph),
      T(null_sync_event_is_nothing_to_wait_on),
      T(bad_arrays_are_refused_with_nothing_queued),
      T(failed_release_leaves_the_array),
      T(cuda_host_and_managed_arrays_are_ordered),
#undef T
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
