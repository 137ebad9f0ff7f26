/* SPDX-License-Identifier: Apache-2.0 */
/* Env streams: set/get/restore per (device type, device id), per thread,
 * growth of the table, its errors (out of memory included), and the
 * producer's stream from a DLPackExchangeAPI built here on dlsync's private
 * mirror (success, failure, NULL stream, versions, the prev_api chain). No
 * driver: these functions never call it. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "interop/dlpack_abi.h"
#include "interop/env_hooks.h"
#include "order/internal.h"

#define CUDA DLSYNC_DLPACK_DEVICE_CUDA
#define ROCM DLSYNC_DLPACK_DEVICE_ROCM
#define CPU DLSYNC_DLPACK_DEVICE_CPU

static void *S(uintptr_t v) {
  return (void *)v;
}

static void *get(int32_t type, int32_t id) {
  void *s = S(0xdead);
  assert_int_equal(dlsync_env_stream_get(&s, type, id), DLSYNC_SUCCESS);
  return s;
}

static void *set(int32_t type, int32_t id, void *stream) {
  void *prev = S(0xdead);
  assert_int_equal(dlsync_env_stream_set(&prev, type, id, stream), DLSYNC_SUCCESS);
  return prev;
}

#define assert_message_has(part)                                                        \
  do {                                                                                  \
    if (strstr(dlsync_last_error(), (part)) == NULL)                                    \
      fail_msg("message \"%s\" lacks \"%s\"", dlsync_last_error(), (const char *)part); \
  } while (0)

static int teardown(void **state) {
  (void)state;
  dlsync__env_set_realloc(NULL);
  dlsync_env_stream_clear();
  assert_int_equal(dlsync__env_capacity(), 0);
  return 0;
}

/* ---- set, get, restore ---- */

static void unset_is_null(void **state) {
  (void)state;
  assert_null(get(CUDA, 0));
  assert_null(get(ROCM, 7));
  assert_null(get(CPU, 0));
  /* Reading makes no table. */
  assert_int_equal(dlsync__env_capacity(), 0);
}

static void set_returns_previous_and_restores(void **state) {
  (void)state;
  assert_null(set(CUDA, 0, S(0x100)));
  assert_ptr_equal(get(CUDA, 0), S(0x100));
  assert_ptr_equal(set(CUDA, 0, S(0x200)), S(0x100));
  assert_ptr_equal(get(CUDA, 0), S(0x200));
  /* Restore what was there. */
  assert_ptr_equal(set(CUDA, 0, S(0x100)), S(0x200));
  assert_ptr_equal(get(CUDA, 0), S(0x100));
  /* Unset with NULL; unset twice. */
  assert_ptr_equal(set(CUDA, 0, NULL), S(0x100));
  assert_null(get(CUDA, 0));
  assert_null(set(CUDA, 0, NULL));
  /* previous may be NULL. */
  assert_int_equal(dlsync_env_stream_set(NULL, CUDA, 0, S(0x300)), DLSYNC_SUCCESS);
  assert_ptr_equal(get(CUDA, 0), S(0x300));
}

static void nested_scopes_restore_in_order(void **state) {
  void *outer, *inner;
  (void)state;
  assert_null(set(CUDA, 1, S(0x10)));
  outer = set(CUDA, 1, S(0x20));
  inner = set(CUDA, 1, S(0x30));
  assert_ptr_equal(get(CUDA, 1), S(0x30));
  assert_ptr_equal(set(CUDA, 1, inner), S(0x30));
  assert_ptr_equal(get(CUDA, 1), S(0x20));
  assert_ptr_equal(set(CUDA, 1, outer), S(0x20));
  assert_ptr_equal(get(CUDA, 1), S(0x10));
}

static void devices_are_separate(void **state) {
  (void)state;
  set(CUDA, 0, S(0x1000));
  set(CUDA, 1, S(0x1001));
  set(CUDA, 3, S(0x1003));
  set(ROCM, 0, S(0x2000));
  set(CPU, 0, S(0x3000));
  assert_ptr_equal(get(CUDA, 0), S(0x1000));
  assert_ptr_equal(get(CUDA, 1), S(0x1001));
  assert_null(get(CUDA, 2));
  assert_ptr_equal(get(CUDA, 3), S(0x1003));
  assert_ptr_equal(get(ROCM, 0), S(0x2000));
  assert_null(get(ROCM, 1));
  assert_ptr_equal(get(CPU, 0), S(0x3000));
  /* Extremes of the key. */
  set(INT32_MAX, INT32_MAX, S(0x4000));
  set(1, INT32_MAX, S(0x4001));
  set(INT32_MAX, 0, S(0x4002));
  assert_ptr_equal(get(INT32_MAX, INT32_MAX), S(0x4000));
  assert_ptr_equal(get(1, INT32_MAX), S(0x4001));
  assert_ptr_equal(get(INT32_MAX, 0), S(0x4002));
  assert_ptr_equal(get(CPU, 0), S(0x3000));
  /* Unsetting one leaves the others. */
  assert_ptr_equal(set(CUDA, 1, NULL), S(0x1001));
  assert_ptr_equal(get(CUDA, 0), S(0x1000));
  assert_ptr_equal(get(CUDA, 3), S(0x1003));
  assert_ptr_equal(get(INT32_MAX, INT32_MAX), S(0x4000));
}

static void the_table_grows_without_dropping(void **state) {
  enum { TYPES = 20, IDS = 150 };
  (void)state;
  /* Insert in an order that is neither ascending nor descending. */
  for (int k = 0; k < TYPES * IDS; k++) {
    int j = (k * 7919) % (TYPES * IDS);
    int32_t type = 1 + j / IDS, id = j % IDS;
    assert_null(set(type, id, S(0x10000 + (uintptr_t)j)));
  }
  assert_true(dlsync__env_capacity() >= TYPES * IDS);
  for (int j = 0; j < TYPES * IDS; j++)
    assert_ptr_equal(get(1 + j / IDS, j % IDS), S(0x10000 + (uintptr_t)j));
  assert_null(get(TYPES + 1, 0));
  assert_null(get(1, IDS));
  /* Unset every other one. */
  for (int j = 0; j < TYPES * IDS; j += 2)
    assert_ptr_equal(set(1 + j / IDS, j % IDS, NULL), S(0x10000 + (uintptr_t)j));
  for (int j = 0; j < TYPES * IDS; j++) {
    if (j % 2 == 0)
      assert_null(get(1 + j / IDS, j % IDS));
    else
      assert_ptr_equal(get(1 + j / IDS, j % IDS), S(0x10000 + (uintptr_t)j));
  }
}

static void clear_forgets_everything(void **state) {
  (void)state;
  set(CUDA, 0, S(0x1));
  set(CUDA, 5, S(0x2));
  assert_true(dlsync__env_capacity() > 0);
  dlsync_env_stream_clear();
  assert_int_equal(dlsync__env_capacity(), 0);
  assert_null(get(CUDA, 0));
  assert_null(get(CUDA, 5));
  dlsync_env_stream_clear();
  /* Usable again afterwards. */
  assert_null(set(CUDA, 5, S(0x3)));
  assert_ptr_equal(get(CUDA, 5), S(0x3));
}

static void bad_arguments_are_refused(void **state) {
  void *s = S(0x77), *prev = S(0x77);
  (void)state;
  set(CUDA, 0, S(0x5));
  assert_int_equal(dlsync_env_stream_get(NULL, CUDA, 0), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("out is NULL");
  assert_int_equal(dlsync_env_stream_get(&s, 0, 0), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("device_type 0 is not a DLPack device type");
  s = S(0x77);
  assert_int_equal(dlsync_env_stream_get(&s, CUDA, -1), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("device_id -1 is negative");
  assert_int_equal(dlsync_env_stream_set(&prev, -3, 0, S(0x9)), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(prev);
  assert_message_has("dlsync_env_stream_set: device_type -3");
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, INT32_MIN, S(0x9)),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("negative");
  assert_ptr_equal(get(CUDA, 0), S(0x5));
}

/* ---- out of memory ---- */

static void *failing_realloc(void *p, size_t n) {
  (void)p;
  (void)n;
  return NULL;
}

static void out_of_memory_changes_nothing(void **state) {
  size_t cap;
  void *prev = S(0x77);
  int n = 0;
  (void)state;
  set(CUDA, 0, S(0xa0));
  cap = dlsync__env_capacity();
  /* Fill the table to its capacity, then make growing fail. */
  for (n = 1; (size_t)n < cap; n++)
    set(CUDA, n, S(0xa0 + (uintptr_t)n));
  dlsync__env_set_realloc(failing_realloc);
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, n, S(0xbb)), DLSYNC_ERROR_OUT_OF_MEMORY);
  assert_null(prev); /* the value in effect: none */
  assert_message_has("out of memory growing the table");
  assert_null(get(CUDA, n));
  /* Replacing and unsetting need no memory. */
  assert_ptr_equal(set(CUDA, 0, S(0xcc)), S(0xa0));
  assert_ptr_equal(set(CUDA, 1, NULL), S(0xa1));
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, n, S(0xbb)), DLSYNC_SUCCESS);
  assert_null(prev);
  dlsync__env_set_realloc(failing_realloc);
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, n + 1, S(0xbc)), DLSYNC_ERROR_OUT_OF_MEMORY);
  for (int i = 2; i < n; i++)
    assert_ptr_equal(get(CUDA, i), S(0xa0 + (uintptr_t)i));
  assert_ptr_equal(get(CUDA, 0), S(0xcc));
  assert_int_equal(dlsync__env_capacity(), cap);
  dlsync__env_set_realloc(NULL);
}

static void out_of_memory_on_the_first_set(void **state) {
  void *prev = S(0x77);
  (void)state;
  dlsync__env_set_realloc(failing_realloc);
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, 0, S(0x1)), DLSYNC_ERROR_OUT_OF_MEMORY);
  assert_null(prev);
  assert_null(get(CUDA, 0));
  dlsync__env_set_realloc(NULL);
  assert_null(set(CUDA, 0, S(0x1)));
  assert_ptr_equal(get(CUDA, 0), S(0x1));
}

/* ---- threads ---- */

#define THREADS 8
#define DEVICES 64

typedef struct thread_arg {
  int index;
  pthread_barrier_t *barrier;
  int wrong;
  bool clear_at_end;
} thread_arg;

static void *thread_main(void *p) {
  thread_arg *a = p;
  void *s = NULL;
  for (int d = 0; d < DEVICES; d++) {
    void *prev = S(0x77);
    if (dlsync_env_stream_set(&prev, CUDA, d, S(((uintptr_t)a->index << 16) | (uintptr_t)d)) !=
            DLSYNC_SUCCESS ||
        prev != NULL)
      a->wrong++;
  }
  /* Everyone has set theirs: each still sees its own. */
  pthread_barrier_wait(a->barrier);
  for (int round = 0; round < 100; round++) {
    for (int d = 0; d < DEVICES; d++) {
      if (dlsync_env_stream_get(&s, CUDA, d) != DLSYNC_SUCCESS ||
          s != S(((uintptr_t)a->index << 16) | (uintptr_t)d))
        a->wrong++;
    }
    /* A scoped change, restored. */
    {
      void *prev = NULL;
      dlsync_env_stream_set(&prev, CUDA, round % DEVICES, S(0xfeed));
      dlsync_env_stream_set(NULL, CUDA, round % DEVICES, prev);
    }
  }
  if (dlsync_env_stream_get(&s, ROCM, 0) != DLSYNC_SUCCESS || s != NULL)
    a->wrong++;
  pthread_barrier_wait(a->barrier);
  /* Half the threads leave their table to the thread-exit destructor. */
  if (a->clear_at_end)
    dlsync_env_stream_clear();
  return NULL;
}

static void each_thread_sees_its_own(void **state) {
  pthread_t th[THREADS];
  thread_arg args[THREADS];
  pthread_barrier_t barrier;
  (void)state;
  set(CUDA, 0, S(0x5151));
  assert_int_equal(pthread_barrier_init(&barrier, NULL, THREADS), 0);
  for (int i = 0; i < THREADS; i++) {
    args[i].index = i + 1;
    args[i].barrier = &barrier;
    args[i].wrong = 0;
    args[i].clear_at_end = i % 2 == 0;
    assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]), 0);
  }
  for (int i = 0; i < THREADS; i++) {
    assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(args[i].wrong, 0);
  }
  pthread_barrier_destroy(&barrier);
  /* This thread's value is untouched. */
  assert_ptr_equal(get(CUDA, 0), S(0x5151));
  assert_null(get(CUDA, 1));
}

/* Threads that come and go, each leaving a table behind for its destructor:
 * a leak here is reported by LeakSanitizer. */
static void *short_lived(void *p) {
  (void)p;
  for (int d = 0; d < 40; d++)
    dlsync_env_stream_set(NULL, CUDA, d, S(0x1 + (uintptr_t)d));
  return NULL;
}

static void exited_threads_free_their_tables(void **state) {
  (void)state;
  for (int round = 0; round < 16; round++) {
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, short_lived, NULL), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
  }
  assert_null(get(CUDA, 0));
}

/* ---- the producer's stream from its DLPackExchangeAPI ---- */

typedef struct producer_calls {
  int calls;
  int32_t device_type;
  int32_t device_id;
  void *answer;
  int rc;
} producer_calls;

static producer_calls pc;

static int producer_stream(int32_t device_type, int32_t device_id, void **out) {
  pc.calls++;
  pc.device_type = device_type;
  pc.device_id = device_id;
  if (pc.rc != 0)
    return pc.rc;
  *out = pc.answer;
  return 0;
}

static int other_producer_stream(int32_t device_type, int32_t device_id, void **out) {
  (void)device_type;
  (void)device_id;
  *out = S(0x0bad);
  return 0;
}

static void dummy_fn(void) {}

static dlsync__dlpack_exchange_api make_api(uint32_t major, uint32_t minor) {
  dlsync__dlpack_exchange_api api;
  memset(&api, 0, sizeof api);
  api.header.version.major = major;
  api.header.version.minor = minor;
  api.header.prev_api = NULL;
  api.managed_tensor_allocator = dummy_fn;
  api.managed_tensor_from_py_object_no_sync = dummy_fn;
  api.managed_tensor_to_py_object_no_sync = dummy_fn;
  api.dltensor_from_py_object_no_sync = NULL; /* optional in DLPack */
  api.current_work_stream = producer_stream;
  return api;
}

static const struct DLPackExchangeAPI *as_api(const dlsync__dlpack_exchange_api *a) {
  return (const struct DLPackExchangeAPI *)(const void *)a;
}

static int api_setup(void **state) {
  (void)state;
  memset(&pc, 0, sizeof pc);
  return 0;
}

static void api_stream_is_the_producers(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = NULL;
  (void)state;
  pc.answer = S(0xc0ffee);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 3), DLSYNC_SUCCESS);
  assert_ptr_equal(s, S(0xc0ffee));
  assert_int_equal(pc.calls, 1);
  assert_int_equal(pc.device_type, CUDA);
  assert_int_equal(pc.device_id, 3);
  /* It does not set the env stream. */
  assert_null(get(CUDA, 3));
  /* Any minor version of major 1 is read (the struct appeared in 1.2/1.3;
   * minor versions only add). */
  api.header.version.minor = 2;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0), DLSYNC_SUCCESS);
  api.header.version.minor = 9;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0), DLSYNC_SUCCESS);
  assert_int_equal(pc.calls, 3);
}

static void api_null_stream_is_the_default(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = S(0x77);
  (void)state;
  pc.answer = NULL;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0), DLSYNC_SUCCESS);
  assert_null(s);
  /* The legacy default stream, as a lane. */
  {
    dlsync_lane l = dlsync_lane_stream((struct CUstream_st *)s);
    assert_true(dlsync__is_legacy_stream((CUstream)l.stream));
  }
  s = S(0x77);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CPU, 0), DLSYNC_SUCCESS);
  assert_null(s);
  assert_int_equal(pc.calls, 2);
}

static void api_failure_is_reported(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = S(0x77);
  (void)state;
  pc.rc = -1;
  pc.answer = S(0x1234);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 2),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_int_equal(pc.calls, 1);
  assert_message_has("current_work_stream(device_type 2, device_id 2) failed (returned -1)");
  assert_message_has("Python exception");
}

static void api_of_unknown_major_version_is_refused(void **state) {
  dlsync__dlpack_exchange_api api = make_api(2, 0);
  void *s = S(0x77);
  (void)state;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_int_equal(pc.calls, 0);
  assert_message_has("DLPack version 2.0;");
  assert_message_has("major version 1 only");
  api.header.version.major = 0;
  api.header.version.minor = 8;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("version 0.8");
  assert_int_equal(pc.calls, 0);
}

static void api_chain_is_walked_to_major_1(void **state) {
  dlsync__dlpack_exchange_api v1 = make_api(1, 3), v2 = make_api(2, 1), v3 = make_api(3, 0);
  void *s = NULL;
  (void)state;
  v3.header.prev_api = &v2.header;
  v2.header.prev_api = &v1.header;
  v2.current_work_stream = other_producer_stream; /* a 2.x struct: never called */
  v3.current_work_stream = other_producer_stream;
  pc.answer = S(0x1111);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&v3), CUDA, 1), DLSYNC_SUCCESS);
  assert_ptr_equal(s, S(0x1111));
  assert_int_equal(pc.calls, 1);
  /* No major 1 anywhere: the versions seen are named. */
  v2.header.prev_api = NULL;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&v3), CUDA, 1),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("version 3.0, 2.1 along its prev_api chain");
  assert_int_equal(pc.calls, 1);
}

static void api_chain_cycle_is_refused(void **state) {
  dlsync__dlpack_exchange_api a = make_api(2, 0), b = make_api(4, 0);
  void *s = NULL;
  (void)state;
  a.header.prev_api = &b.header;
  b.header.prev_api = &a.header;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&a), CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("goes on past 16 links");
  assert_int_equal(pc.calls, 0);
}

static void api_without_current_work_stream_is_refused(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = S(0x77);
  (void)state;
  api.current_work_stream = NULL;
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("has no current_work_stream");
}

static void api_bad_arguments_are_refused(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = S(0x77);
  (void)state;
  assert_int_equal(dlsync_env_stream_from_exchange_api(NULL, as_api(&api), CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("out is NULL");
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, NULL, CUDA, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("DLPackExchangeAPI is NULL");
  s = S(0x77);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), 0, 0),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_null(s);
  assert_message_has("device_type 0");
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, -2),
                   DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("device_id -2");
  assert_int_equal(pc.calls, 0);
}

/* The usual pattern: take the producer's stream, make it the env stream for
 * the call, restore. */
static void api_stream_into_env_and_back(void **state) {
  dlsync__dlpack_exchange_api api = make_api(1, 3);
  void *s = NULL, *prev = NULL;
  (void)state;
  set(CUDA, 0, S(0xaaaa));
  pc.answer = S(0xbbbb);
  assert_int_equal(dlsync_env_stream_from_exchange_api(&s, as_api(&api), CUDA, 0), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_env_stream_set(&prev, CUDA, 0, s), DLSYNC_SUCCESS);
  assert_ptr_equal(get(CUDA, 0), S(0xbbbb));
  assert_int_equal(dlsync_env_stream_set(NULL, CUDA, 0, prev), DLSYNC_SUCCESS);
  assert_ptr_equal(get(CUDA, 0), S(0xaaaa));
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, api_setup, teardown)
  const struct CMUnitTest tests[] = {
      T(unset_is_null),
      T(set_returns_previous_and_restores),
      T(nested_scopes_restore_in_order),
      T(devices_are_separate),
      T(the_table_grows_without_dropping),
      T(clear_forgets_everything),
      T(bad_arguments_are_refused),
      T(out_of_memory_changes_nothing),
      T(out_of_memory_on_the_first_set),
      T(each_thread_sees_its_own),
      T(exited_threads_free_their_tables),
      T(api_stream_is_the_producers),
      T(api_null_stream_is_the_default),
      T(api_failure_is_reported),
      T(api_of_unknown_major_version_is_refused),
      T(api_chain_is_walked_to_major_1),
      T(api_chain_cycle_is_refused),
      T(api_without_current_work_stream_is_refused),
      T(api_bad_arguments_are_refused),
      T(api_stream_into_env_and_back),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
