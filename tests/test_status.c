/* SPDX-License-Identifier: Apache-2.0 */
/* Status names, strings and the per-thread last error. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "order/internal.h"

static void every_status_has_a_name_and_text(void **state) {
  (void)state;
#define CHECK_ONE(name, value, text)                                       \
  assert_string_equal(dlsync_status_name(DLSYNC_##name), "DLSYNC_" #name); \
  assert_string_equal(dlsync_status_string(DLSYNC_##name), text);
  DLSYNC_STATUS_LIST(CHECK_ONE)
#undef CHECK_ONE
  assert_string_equal(dlsync_status_name((dlsync_status)999), "DLSYNC_STATUS_UNKNOWN");
  assert_string_equal(dlsync_status_string((dlsync_status)-1), "unknown dlsync status");
}

static void fail_sets_status_and_message(void **state) {
  (void)state;
  assert_int_equal(dlsync__fail(DLSYNC_ERROR_INVALID_LANE, "lane %d is %s", 3, "odd"),
                   DLSYNC_ERROR_INVALID_LANE);
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_INVALID_LANE);
  assert_string_equal(dlsync_last_error(), "lane 3 is odd");
  assert_int_equal(dlsync_last_driver_result(), 0);
}

static void driver_failure_names_call_and_result(void **state) {
  (void)state;
  /* No table: the name comes from the built-in fallback. */
  assert_int_equal(dlsync__fail_driver(NULL, CUDA_ERROR_INVALID_VALUE, "cuStreamWaitEvent",
                                       "consumer stream %p", (void *)0x10),
                   DLSYNC_ERROR_DRIVER);
  assert_string_equal(dlsync_last_error(),
                      "cuStreamWaitEvent failed: CUDA_ERROR_INVALID_VALUE (consumer stream 0x10)");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_INVALID_VALUE);
  /* Results with a precise status. */
  assert_int_equal(dlsync__fail_driver(NULL, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "cuX", NULL),
                   DLSYNC_ERROR_CAPTURE_INVALIDATED);
  assert_int_equal(dlsync__fail_driver(NULL, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "cuX", NULL),
                   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE);
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
}

static void long_messages_are_truncated_not_overflowed(void **state) {
  char big[2000];
  (void)state;
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  dlsync__fail(DLSYNC_ERROR_INTERNAL, "%s", big);
  assert_true(strlen(dlsync_last_error()) < 1000);
  assert_true(strlen(dlsync_last_error()) > 100);
  dlsync__fail_driver(NULL, CUDA_ERROR_INVALID_VALUE, "cuX", "%s", big);
  assert_true(strncmp(dlsync_last_error(), "cuX failed: CUDA_ERROR_INVALID_VALUE (", 38) == 0);
}

static void *other_thread(void *arg) {
  (void)arg;
  dlsync__fail(DLSYNC_ERROR_BUSY, "from another thread");
  return NULL;
}

static void last_error_is_per_thread(void **state) {
  pthread_t t;
  (void)state;
  dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "mine");
  assert_int_equal(pthread_create(&t, NULL, other_thread, NULL), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_string_equal(dlsync_last_error(), "mine");
}

static void version_matches_header(void **state) {
  (void)state;
  assert_int_equal(dlsync_version(), DLSYNC_VERSION);
  assert_string_equal(dlsync_version_string(), DLSYNC_VERSION_STRING);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_status_has_a_name_and_text),
      cmocka_unit_test(fail_sets_status_and_message),
      cmocka_unit_test(driver_failure_names_call_and_result),
      cmocka_unit_test(long_messages_are_truncated_not_overflowed),
      cmocka_unit_test(last_error_is_per_thread),
      cmocka_unit_test(version_matches_header),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
