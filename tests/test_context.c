/* SPDX-License-Identifier: Apache-2.0 */
/* Contexts on the fake driver: creation, configuration, capabilities,
 * devices, the default context, and every driver failure on those paths. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "order/internal.h"
#include "fake/fake_driver.h"

static int setup(void **state) {
  (void)state;
  fake_reset(2);
  return 0;
}

static int teardown(void **state) {
  char leaks[256];
  (void)state;
  fake_fail_clear();
  assert_int_equal(fake_leak_report(leaks, sizeof leaks), 0);
  return 0;
}

static void create_and_destroy(void **state) {
  dlsync_context *ctx = NULL;
  int v = 0;
  uint32_t caps = 0;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, fake_driver()), DLSYNC_SUCCESS);
  assert_non_null(ctx);
  assert_int_equal(dlsync_context_driver_version(&v, ctx), DLSYNC_SUCCESS);
  assert_int_equal(v, 13000);
  assert_int_equal(dlsync_context_capabilities(&caps, ctx), DLSYNC_SUCCESS);
  assert_int_equal(caps, DLSYNC_CAP_CAPTURE_EDGE_DATA | DLSYNC_CAP_CAPTURE_TO_USER_GRAPH |
                             DLSYNC_CAP_USER_OBJECTS | DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA);
  assert_int_equal(dlsync_context_require(ctx, DLSYNC_CAP_USER_OBJECTS), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(NULL), DLSYNC_SUCCESS);
}

static void bad_arguments_are_errors_with_messages(void **state) {
  dlsync_context *ctx = (dlsync_context *)0x1;
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(NULL, NULL, fake_driver()),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "out is NULL"));
  cfg.size = 4;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, &cfg, fake_driver()),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(ctx);
  assert_non_null(strstr(dlsync_last_error(), "DLSYNC_CONTEXT_CONFIG_INIT"));
  cfg = (dlsync_context_config)DLSYNC_CONTEXT_CONFIG_INIT;
  cfg.version = 99;
  assert_int_equal(dlsync_context_create(&ctx, &cfg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_non_null(strstr(dlsync_last_error(), "version is 99"));
  assert_int_equal(dlsync_context_driver_version(NULL, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_context_capabilities(NULL, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_context_require(NULL, DLSYNC_CAP_USER_OBJECTS),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_device_count(NULL, NULL), DLSYNC_ERROR_INVALID_ARGUMENT);
}

static void no_driver_says_what_was_tried(void **state) {
  dlsync_context *ctx = (dlsync_context *)0x1;
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  (void)state;
  cfg.driver_path = "libdlsync-no-such-driver.so.1";
  assert_int_equal(dlsync_context_create(&ctx, &cfg), DLSYNC_ERROR_NO_DRIVER);
  assert_null(ctx);
  assert_non_null(strstr(dlsync_last_error(), "libdlsync-no-such-driver.so.1"));
  assert_non_null(strstr(dlsync_last_error(), "dlopen"));
}

static void old_driver_is_refused_naming_versions(void **state) {
  dlsync_context *ctx = NULL;
  (void)state;
  /* 10.0 lacks core entries (cuThreadExchangeStreamCaptureMode is 10.1,
   * cuGraphAddEventRecordNode 11.1). */
  fake_set_driver_version(10000);
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, fake_driver()),
                   DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_null(ctx);
  assert_non_null(strstr(dlsync_last_error(), "10.0"));
}

/* The library requires only what it calls: a table without the entries
 * that only the GPU tests, the bench and the fake's tests use (SUPPORT) still makes a context that
 * orders two streams. */
static void only_the_entries_the_library_calls_are_required(void **state) {
  dlsync__driver t = *fake_driver();
  dlsync_context *ctx = NULL;
  CUstream a, b;
  dlsync_lane la, lb;
  size_t missing = 0;
  (void)state;
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++) {
    if (dlsync__driver_entries[i].need == DLSYNC__NEED_SUPPORT) {
      *(void **)((char *)&t + dlsync__driver_entries[i].offset) = NULL;
      missing++;
    }
  }
  assert_true(missing >= 30); /* the GPU tests', the bench's and the fake's tests' */
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, &t), DLSYNC_SUCCESS);
  a = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  b = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  la = dlsync_lane_stream(a);
  lb = dlsync_lane_stream(b);
  assert_int_equal(dlsync_order(ctx, &la, &lb), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  fake_stream_destroy(a);
  fake_stream_destroy(b);
  /* One core entry missing: refused, naming it. */
  t.StreamWaitEvent = NULL;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, &t), DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamWaitEvent"));
}

static void capture_features_report_themselves_unavailable(void **state) {
  dlsync_context *ctx = NULL;
  uint32_t caps = 0;
  (void)state;
  /* 12.2: everything core, nothing of 12.3 (capture info with edge data). */
  fake_set_driver_version(12020);
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, fake_driver()), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_context_capabilities(&caps, ctx), DLSYNC_SUCCESS);
  assert_int_equal(caps, DLSYNC_CAP_USER_OBJECTS);
  assert_int_equal(dlsync_context_require(ctx, DLSYNC_CAP_CAPTURE_EDGE_DATA),
                   DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_non_null(strstr(dlsync_last_error(), "12.3"));
  assert_non_null(strstr(dlsync_last_error(), "12.2"));
  assert_int_equal(dlsync_context_require(ctx, DLSYNC_CAP_CAPTURE_TO_USER_GRAPH),
                   DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_non_null(strstr(dlsync_last_error(), "cuStreamBeginCaptureToGraph"));
  /* An exchange needs capture queries: refused, naming them. */
  {
    CUstream a = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    CUstream b = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
    dlsync_lane la = dlsync_lane_stream(a), lb = dlsync_lane_stream(b);
    dlsync_exchange *ex = NULL;
    assert_int_equal(dlsync_exchange_begin(&ex, ctx, &la, &lb), DLSYNC_ERROR_DRIVER_TOO_OLD);
    assert_null(ex);
    assert_non_null(strstr(dlsync_last_error(), "cuStreamGetCaptureInfo"));
    fake_stream_destroy(a);
    fake_stream_destroy(b);
  }
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
}

static void every_failure_while_creating_is_a_status(void **state) {
  unsigned n;
  (void)state;
  for (n = 1; n < 100; n++) {
    dlsync_context *ctx = (dlsync_context *)0x1;
    dlsync_status st;
    fake_fail_call(n, CUDA_ERROR_UNKNOWN);
    st = dlsync__context_create_with_driver(&ctx, NULL, fake_driver());
    if (!fake_fail_pending() && st == DLSYNC_SUCCESS)
      fail_msg("call %u failed but creation succeeded", n);
    if (fake_fail_pending()) {
      /* Creation made fewer than n calls: done. */
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
      break;
    }
    assert_true(st == DLSYNC_ERROR_NO_DRIVER || st == DLSYNC_ERROR_DRIVER);
    assert_null(ctx);
    assert_non_null(strstr(dlsync_last_error(), "CUDA_ERROR_UNKNOWN"));
    assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_UNKNOWN);
  }
  assert_true(n >= 3); /* cuInit and cuDriverGetVersion were both failed */
}

static void every_allocation_failure_while_creating_is_a_status(void **state) {
  unsigned n;
  (void)state;
  for (n = 1; n < 100; n++) {
    dlsync_context *ctx = (dlsync_context *)0x1;
    dlsync_status st;
    fake_fail_alloc(n);
    st = dlsync__context_create_with_driver(&ctx, NULL, fake_driver());
    if (fake_fail_pending()) {
      /* Creation made fewer than n allocations: done. */
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
      break;
    }
    if (st == DLSYNC_SUCCESS) {
      assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
      continue;
    }
    assert_int_equal(st, DLSYNC_ERROR_OUT_OF_MEMORY);
    assert_null(ctx);
    assert_true(fake_fault_reported(FAKE_FAULT_ALLOC));
  }
  assert_true(n >= 2); /* the context itself, its release book */
}

static void devices_are_reported(void **state) {
  dlsync_context *ctx = NULL;
  int n = 0;
  dlsync_device_info info = DLSYNC_DEVICE_INFO_INIT;
  dlsync_device_info bad = DLSYNC_DEVICE_INFO_INIT;
  (void)state;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, NULL, fake_driver()), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_device_count(&n, ctx), DLSYNC_SUCCESS);
  assert_int_equal(n, 2);
  assert_int_equal(dlsync_device_get_info(&info, ctx, 1), DLSYNC_SUCCESS);
  assert_int_equal(info.ordinal, 1);
  assert_string_equal(info.name, "Fake GPU 1");
  assert_int_equal(info.cc_major, 9);
  assert_int_equal(info.cc_minor, 0);
  assert_true(info.total_memory > 0);
  assert_true(strlen(info.pci_bus_id) > 0);
  bad.version = 7;
  assert_int_equal(dlsync_device_get_info(&bad, ctx, 0), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_int_equal(dlsync_device_get_info(&info, ctx, 5), DLSYNC_ERROR_DRIVER);
  assert_non_null(strstr(dlsync_last_error(), "cuDeviceGet failed"));
  /* Every driver call of the query, failed in turn. */
  for (unsigned k = 1; k < 50; k++) {
    dlsync_device_info i2 = DLSYNC_DEVICE_INFO_INIT;
    dlsync_status st;
    fake_fail_call(k, CUDA_ERROR_INVALID_DEVICE);
    st = dlsync_device_get_info(&i2, ctx, 0);
    if (fake_fail_pending()) {
      fake_fail_clear();
      assert_int_equal(st, DLSYNC_SUCCESS);
      break;
    }
    assert_int_equal(st, DLSYNC_ERROR_DRIVER);
    assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_INVALID_DEVICE);
    assert_int_equal(i2.name[0], '\0'); /* nothing half-filled */
  }
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
}

static void default_context_without_driver_remembers_why(void **state) {
  dlsync_context *ctx = (dlsync_context *)0x1, *again = (dlsync_context *)0x1;
  dlsync_status first, second;
  char why[512];
  int result;
  (void)state;
  /* This machine may or may not have libcuda; both answers must be stable:
   * the context, or a failure that stays (NO_DRIVER without libcuda.so.1),
   * returned again whole. test_context_default.c covers the rest, on a fake
   * libcuda.so.1. */
  first = dlsync_context_default(&ctx);
  snprintf(why, sizeof why, "%s", dlsync_last_error());
  result = dlsync_last_driver_result();
  second = dlsync_context_default(&again);
  assert_int_equal(first, second);
  assert_ptr_equal(ctx, again);
  if (first == DLSYNC_SUCCESS) {
    assert_non_null(ctx);
    assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_ERROR_INVALID_ARGUMENT);
  } else {
    assert_true(first == DLSYNC_ERROR_NO_DRIVER || first == DLSYNC_ERROR_DRIVER_TOO_OLD);
    assert_null(ctx);
    assert_non_null(strstr(dlsync_last_error(), "default context"));
    assert_string_equal(dlsync_last_error(), why);
    assert_int_equal(dlsync_last_driver_result(), result);
  }
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

static void require_of_two_capabilities_needs_both(void **state) {
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

static void empty_driver_path_is_invalid_argument(void **state) {
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *c2 = NULL;
  (void)state;
  cfg.driver_path = "";
  assert_int_equal(dlsync_context_create(&c2, &cfg), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("driver_path");
  assert_null(c2);
}

/* ---- the event pool after a burst ---- */

/* A burst of events given back past events_kept (as releases do: the pool
 * keeps them for the releases that follow) is trimmed back toward
 * events_kept once the events stay unused: after the burst has been given
 * back, at most two trimming periods' worth stays past the limit; after
 * more traffic, the working set alone. A steady load reuses its events
 * (none destroyed and made again). */
static void a_burst_of_events_is_trimmed_toward_events_kept(void **state) {
  enum { KEPT = 16, BURST = 5000, WORKING = 40 };
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *ctx = NULL;
  dlsync__pool *pool = NULL;
  dlsync__pool_stats ps;
  CUevent *evs = calloc(BURST, sizeof *evs);
  CUstream s;
  size_t given = 0, created;
  uint64_t period = dlsync__pool_trim_period_ns;
  (void)state;
  assert_non_null(evs);
  dlsync__pool_trim_period_ns = 0; /* the op count alone: no clock in the test */
  cfg.events_kept = KEPT;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, &cfg, fake_driver()), DLSYNC_SUCCESS);
  s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_int_equal(dlsync__pool_for_stream(&pool, NULL, &ctx->pools, s, "test"), DLSYNC_SUCCESS);
  for (size_t i = 0; i < BURST; i++)
    assert_int_equal(dlsync__pool_get(&evs[i], pool), DLSYNC_SUCCESS);
  assert_int_equal(fake_live_events(), BURST);
  /* Given back in batches, each keeping everything given so far (extra). */
  for (size_t i = 0; i < BURST; i += 64) {
    size_t n = BURST - i < 64 ? BURST - i : 64;
    given += n;
    dlsync__pool_put_many(pool, &evs[i], n, given);
  }
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.created - ps.destroyed, ps.free_events);
  assert_int_equal(fake_live_events(), ps.free_events);
  /* at most what was given back in the last two periods */
  assert_true(ps.free_events <= KEPT + 2 * DLSYNC__POOL_TRIM_OPS(KEPT) + 64);
  /* A steady load of WORKING events at a time, given back as releases give
   * them (extra: all given so far). */
  created = ps.created;
  for (int round = 0; round < 200; round++) {
    for (size_t i = 0; i < WORKING; i++)
      assert_int_equal(dlsync__pool_get(&evs[i], pool), DLSYNC_SUCCESS);
    given += WORKING;
    dlsync__pool_put_many(pool, evs, WORKING, given);
  }
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_int_equal(ps.created, created); /* the working set was never trimmed */
  assert_true(ps.free_events <= KEPT + WORKING);
  assert_true(ps.free_events >= WORKING);
  assert_int_equal(fake_live_events(), ps.free_events);
  /* Single events taken and given back (events_kept applies at once). */
  for (size_t i = 0; i < 2 * DLSYNC__POOL_TRIM_OPS(KEPT); i++) {
    CUevent ev;
    assert_int_equal(dlsync__pool_get(&ev, pool), DLSYNC_SUCCESS);
    dlsync__pool_put(pool, ev);
  }
  dlsync__pool_stats_get(&ps, &ctx->pools);
  assert_true(ps.free_events <= KEPT);
  assert_int_equal(fake_live_events(), ps.free_events);
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  assert_int_equal(fake_live_events(), 0);
  fake_stream_destroy(s);
  free(evs);
  dlsync__pool_trim_period_ns = period;
}

/* Within a trimming period (time, not only takes and returns) a burst's
 * working set is kept: releases that keep BURST events in flight, taken
 * and given back over many more than DLSYNC__POOL_TRIM_OPS operations,
 * create no event after the first burst and destroy none. (The period is
 * set very long here, so that the test does not depend on the clock.) */
static void a_burst_in_its_period_is_not_trimmed(void **state) {
  enum { KEPT = 16, BURST = 2000 };
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *ctx = NULL;
  dlsync__pool *pool = NULL;
  dlsync__pool_stats ps;
  CUevent *evs = calloc(BURST, sizeof *evs);
  CUstream s;
  size_t given = 0, created = 0;
  uint64_t period = dlsync__pool_trim_period_ns;
  (void)state;
  assert_non_null(evs);
  dlsync__pool_trim_period_ns = UINT64_MAX / 2;
  cfg.events_kept = KEPT;
  assert_int_equal(dlsync__context_create_with_driver(&ctx, &cfg, fake_driver()), DLSYNC_SUCCESS);
  s = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  assert_int_equal(dlsync__pool_for_stream(&pool, NULL, &ctx->pools, s, "test"), DLSYNC_SUCCESS);
  for (int round = 0; round < 20; round++) {
    for (size_t i = 0; i < BURST; i++)
      assert_int_equal(dlsync__pool_get(&evs[i], pool), DLSYNC_SUCCESS);
    for (size_t i = 0; i < BURST; i += 64) {
      size_t n = BURST - i < 64 ? BURST - i : 64;
      given += n;
      dlsync__pool_put_many(pool, &evs[i], n, given);
    }
    dlsync__pool_stats_get(&ps, &ctx->pools);
    if (round == 0)
      created = ps.created;
    assert_int_equal(ps.created, created); /* no event made again */
    assert_int_equal(ps.destroyed, 0);     /* none trimmed within the period */
    assert_int_equal(ps.free_events, BURST);
  }
  assert_int_equal(dlsync_context_destroy(ctx), DLSYNC_SUCCESS);
  assert_int_equal(fake_live_events(), 0);
  fake_stream_destroy(s);
  free(evs);
  dlsync__pool_trim_period_ns = period;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(create_and_destroy, setup, teardown),
      cmocka_unit_test_setup_teardown(bad_arguments_are_errors_with_messages, setup, teardown),
      cmocka_unit_test_setup_teardown(no_driver_says_what_was_tried, setup, teardown),
      cmocka_unit_test_setup_teardown(old_driver_is_refused_naming_versions, setup, teardown),
      cmocka_unit_test_setup_teardown(capture_features_report_themselves_unavailable, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(every_failure_while_creating_is_a_status, setup, teardown),
      cmocka_unit_test_setup_teardown(only_the_entries_the_library_calls_are_required, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(every_allocation_failure_while_creating_is_a_status, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(devices_are_reported, setup, teardown),
      cmocka_unit_test_setup_teardown(default_context_without_driver_remembers_why, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(require_of_two_capabilities_needs_both, setup, teardown),
      cmocka_unit_test_setup_teardown(empty_driver_path_is_invalid_argument, setup, teardown),
      cmocka_unit_test_setup_teardown(a_burst_of_events_is_trimmed_toward_events_kept, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(a_burst_in_its_period_is_not_trimmed, setup, teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
