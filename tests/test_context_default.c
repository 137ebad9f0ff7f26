/* SPDX-License-Identifier: Apache-2.0 */
/* The default context, made the way a user's call makes it:
 * dlsync_context_default dlopens "libcuda.so.1", here the fake driver built
 * as one (fake/fake_libcuda.c, found through LD_LIBRARY_PATH). The default
 * context belongs to the process, so each test needs a process of its own:
 * the binary runs the one test its argument names, and ctest runs each
 * (tests/CMakeLists.txt finds them in the table of main). Allocation faults
 * are armed in the library linked here (dlsync__alloc_fail_nth), driver
 * faults in the fake inside libcuda.so.1, through its fake_libcuda_*
 * controls: it is a copy of its own, not the fake linked into other tests. */
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "order/internal.h"

/* The controls of the fake inside libcuda.so.1 (fake/fake_libcuda.c). */
static struct {
  void *lib;
  void (*hide)(const char *symbol);
  void (*reset)(int ndevices);
  void (*set_driver_version)(int v);
  void (*fail_nth)(const char *symbol, unsigned nth, CUresult r);
  unsigned (*call_count)(const char *symbol);
  unsigned long (*calls_total)(void);
} fk;

static bool control(void *fn_slot, const char *name) {
  *(void **)fn_slot = dlsym(fk.lib, name);
  if (*(void **)fn_slot == NULL)
    fprintf(stderr, "libcuda.so.1 has no %s: it is not the test's fake (LD_LIBRARY_PATH?)\n", name);
  return *(void **)fn_slot != NULL;
}

/* The test opens the fake first and keeps it open: dlsync's dlopen of the
 * same name gets this library, with the state the test set. */
static int setup(void **state) {
  (void)state;
  fk.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (fk.lib == NULL) {
    fprintf(stderr, "dlopen(\"libcuda.so.1\"): %s (LD_LIBRARY_PATH?)\n", dlerror());
    return -1;
  }
  if (!control(&fk.hide, "fake_libcuda_hide") || !control(&fk.reset, "fake_libcuda_reset") ||
      !control(&fk.set_driver_version, "fake_libcuda_set_driver_version") ||
      !control(&fk.fail_nth, "fake_libcuda_fail_nth") ||
      !control(&fk.call_count, "fake_libcuda_call_count") ||
      !control(&fk.calls_total, "fake_libcuda_calls_total"))
    return -1;
  return 0;
}

static void assert_message_has(const char *what) {
  if (strstr(dlsync_last_error(), what) == NULL)
    fail_msg("the message lacks \"%s\": %s", what, dlsync_last_error());
}

/* Made: every later call gives the same context, with no allocation (one
 * is armed to fail) and no driver call; it is the fake's (driver 13.0) and
 * the library's (destroy refuses it). */
static void assert_kept(dlsync_context *made) {
  dlsync_context *again = NULL;
  unsigned long calls = fk.calls_total();
  int v = 0;
  dlsync__alloc_fail_nth(1);
  assert_int_equal(dlsync_context_default(&again), DLSYNC_SUCCESS);
  assert_true(dlsync__alloc_fail_pending());
  dlsync__alloc_fail_nth(0);
  assert_ptr_equal(again, made);
  assert_int_equal(fk.calls_total(), calls);
  assert_int_equal(dlsync_context_driver_version(&v, made), DLSYNC_SUCCESS);
  assert_int_equal(v, 13000);
  assert_int_equal(dlsync_context_destroy(made), DLSYNC_ERROR_INVALID_ARGUMENT);
  assert_message_has("default context");
  again = NULL;
  assert_int_equal(dlsync_context_default(&again), DLSYNC_SUCCESS);
  assert_ptr_equal(again, made);
}

/* ---- failures that are tried again ---- */

static void out_of_memory_is_not_remembered(void **state) {
  dlsync_context *ctx = (dlsync_context *)0x1;
  (void)state;
  dlsync__alloc_fail_nth(1);
  assert_int_equal(dlsync_context_default(&ctx), DLSYNC_ERROR_OUT_OF_MEMORY);
  assert_false(dlsync__alloc_fail_pending());
  assert_null(ctx);
  assert_int_equal(dlsync_last_status(), DLSYNC_ERROR_OUT_OF_MEMORY);
  assert_message_has("the default context could not be created");
  assert_message_has("out of memory");
  /* Allocations work again: the next call makes it. */
  assert_int_equal(dlsync_context_default(&ctx), DLSYNC_SUCCESS);
  assert_non_null(ctx);
  assert_kept(ctx);
}

/* Allocation n of the creation fails, for n = 1, 2, ...: each call says so
 * and leaves nothing behind, and the next tries again, until one makes it.
 * The attempt that loads the driver keeps its table, so later attempts make
 * fewer allocations: n starts again from 1 after it. */
static void every_allocation_failure_is_tried_again(void **state) {
  dlsync_context *ctx = NULL;
  dlsync_status st = DLSYNC_ERROR_OUT_OF_MEMORY;
  unsigned n, failed = 0;
  (void)state;
  dlsync__alloc_count_start();
  for (n = 1; n < 100; n++) {
    size_t before = dlsync__alloc_live_bytes();
    unsigned inits = fk.call_count("cuInit");
    bool loaded;
    ctx = (dlsync_context *)0x1;
    dlsync__alloc_fail_nth(n);
    st = dlsync_context_default(&ctx);
    if (dlsync__alloc_fail_pending()) {
      /* Made with fewer than n allocations: done. */
      dlsync__alloc_fail_nth(0);
      break;
    }
    if (st != DLSYNC_ERROR_OUT_OF_MEMORY)
      fail_msg("allocation %u failed: %s: %s", n, dlsync_status_name(st), dlsync_last_error());
    assert_null(ctx);
    assert_message_has("the default context could not be created");
    assert_message_has("out of memory");
    assert_int_equal(dlsync_last_driver_result(), 0);
    /* Only the attempt that loaded the driver (its first cuInit) keeps
     * something: the driver table, which every later attempt uses. */
    loaded = inits == 0 && fk.call_count("cuInit") > 0;
    if (!loaded && dlsync__alloc_live_bytes() != before)
      fail_msg("allocation %u failed: %zu bytes were left", n, dlsync__alloc_live_bytes() - before);
    failed++;
    if (loaded)
      n = 0;
  }
  assert_int_equal(st, DLSYNC_SUCCESS);
  assert_non_null(ctx);
  /* The driver table and its path, then (the table kept) the context and its
   * release book, the context once more before the table was kept. */
  assert_true(failed >= 5);
  assert_kept(ctx);
}

static void a_driver_error_is_not_remembered(void **state) {
  dlsync_context *ctx = (dlsync_context *)0x1;
  (void)state;
  fk.fail_nth("cuDriverGetVersion", 1, CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_context_default(&ctx), DLSYNC_ERROR_DRIVER);
  assert_null(ctx);
  assert_message_has("the default context could not be created");
  assert_message_has("cuDriverGetVersion failed: CUDA_ERROR_UNKNOWN");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_UNKNOWN);
  assert_int_equal(dlsync_context_default(&ctx), DLSYNC_SUCCESS);
  assert_non_null(ctx);
  assert_kept(ctx);
}

/* ---- many threads at once ---- */

#define THREADS 16

typedef struct answer {
  dlsync_status st;
  dlsync_context *ctx;
} answer;

static pthread_barrier_t all_ready;

static void *call_default(void *arg) {
  answer *a = arg;
  pthread_barrier_wait(&all_ready);
  a->st = dlsync_context_default(&a->ctx);
  return NULL;
}

/* The first allocation fails, whichever thread makes it: one thread is told
 * OUT_OF_MEMORY, every other gets the one context made. */
static void threads_calling_at_once_get_one_context(void **state) {
  pthread_t t[THREADS];
  answer a[THREADS];
  dlsync_context *made = NULL;
  unsigned out_of_memory = 0;
  (void)state;
  memset(a, 0, sizeof a);
  assert_int_equal(pthread_barrier_init(&all_ready, NULL, THREADS), 0);
  dlsync__alloc_fail_nth(1);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_create(&t[i], NULL, call_default, &a[i]), 0);
  for (int i = 0; i < THREADS; i++)
    assert_int_equal(pthread_join(t[i], NULL), 0);
  pthread_barrier_destroy(&all_ready);
  assert_false(dlsync__alloc_fail_pending());
  for (int i = 0; i < THREADS; i++) {
    if (a[i].st == DLSYNC_ERROR_OUT_OF_MEMORY) {
      assert_null(a[i].ctx);
      out_of_memory++;
      continue;
    }
    assert_int_equal(a[i].st, DLSYNC_SUCCESS);
    assert_non_null(a[i].ctx);
    if (made == NULL)
      made = a[i].ctx;
    assert_ptr_equal(a[i].ctx, made);
  }
  assert_int_equal(out_of_memory, 1);
  assert_non_null(made);
  /* Made once: cuDriverGetVersion is called by the driver's load and by
   * each context made. */
  assert_int_equal(fk.call_count("cuDriverGetVersion"), 2);
  assert_kept(made);
}

/* ---- failures that stay ---- */

typedef struct failure {
  dlsync_status st;
  int driver_result;
  char message[512];
  dlsync_context *ctx;
} failure;

static void call_and_note(failure *f) {
  f->ctx = (dlsync_context *)0x1;
  f->st = dlsync_context_default(&f->ctx);
  f->driver_result = dlsync_last_driver_result();
  snprintf(f->message, sizeof f->message, "%s", dlsync_last_error());
}

static void *call_and_note_thread(void *arg) {
  call_and_note(arg);
  return NULL;
}

/* The first failure is kept: later calls (after other failures on this
 * thread changed its last error, on another thread, with allocations
 * failing) return it whole, and try nothing: no driver call, no allocation. */
static void assert_failure_kept(const failure *first) {
  dlsync_context_config cfg = DLSYNC_CONTEXT_CONFIG_INIT;
  dlsync_context *other = (dlsync_context *)0x1;
  unsigned long calls = fk.calls_total();
  failure later, elsewhere;
  pthread_t t;
  assert_null(first->ctx);
  assert_non_null(strstr(first->message, "the default context could not be created"));
  /* Other failures change this thread's last error. */
  cfg.version = 99;
  assert_int_equal(dlsync_context_create(&other, &cfg), DLSYNC_ERROR_INVALID_ARGUMENT);
  (void)dlsync__fail_result(DLSYNC_ERROR_DRIVER, CUDA_ERROR_ILLEGAL_ADDRESS, "another failure");
  assert_int_equal(dlsync_last_driver_result(), CUDA_ERROR_ILLEGAL_ADDRESS);
  dlsync__alloc_fail_nth(1);
  call_and_note(&later);
  assert_true(dlsync__alloc_fail_pending());
  dlsync__alloc_fail_nth(0);
  assert_int_equal(later.st, first->st);
  assert_int_equal(dlsync_last_status(), first->st);
  assert_int_equal(later.driver_result, first->driver_result);
  assert_string_equal(later.message, first->message);
  assert_null(later.ctx);
  assert_int_equal(pthread_create(&t, NULL, call_and_note_thread, &elsewhere), 0);
  assert_int_equal(pthread_join(t, NULL), 0);
  assert_int_equal(elsewhere.st, first->st);
  assert_int_equal(elsewhere.driver_result, first->driver_result);
  assert_string_equal(elsewhere.message, first->message);
  assert_null(elsewhere.ctx);
  assert_int_equal(fk.calls_total(), calls);
}

/* A driver without a GPU: cuInit says CUDA_ERROR_NO_DEVICE. */
static void no_driver_is_remembered_with_its_driver_result(void **state) {
  failure first;
  (void)state;
  fk.reset(0);
  call_and_note(&first);
  assert_int_equal(first.st, DLSYNC_ERROR_NO_DRIVER);
  assert_int_equal(first.driver_result, CUDA_ERROR_NO_DEVICE);
  assert_non_null(strstr(first.message, "cuInit failed: CUDA_ERROR_NO_DEVICE"));
  assert_failure_kept(&first);
}

/* A 10.0 driver lacks entry points dlsync needs. (Its table is loaded and
 * kept by the loader, so trying again would give the same answer at no
 * cost; the next test is the one a retry would fail.) */
static void old_driver_is_remembered(void **state) {
  failure first;
  (void)state;
  fk.set_driver_version(10000);
  call_and_note(&first);
  assert_int_equal(first.st, DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_int_equal(first.driver_result, 0);
  assert_non_null(strstr(first.message, "is 10.0"));
  assert_failure_kept(&first);
}

/* A driver without cuDriverGetVersion is refused while loading, which keeps
 * nothing: only the default context's memory of the failure stops a later
 * call from loading it again (allocating the table). */
static void driver_refused_while_loading_is_remembered(void **state) {
  failure first;
  (void)state;
  fk.hide("cuDriverGetVersion");
  call_and_note(&first);
  assert_int_equal(first.st, DLSYNC_ERROR_DRIVER_TOO_OLD);
  assert_int_equal(first.driver_result, 0);
  assert_non_null(strstr(first.message, "lacks cuInit or cuDriverGetVersion"));
  assert_failure_kept(&first);
}

/* The library loads only the entries it calls: a context's table has every
 * SUPPORT entry NULL and every other one set (the fake has them all), and
 * dlsync__driver_load_all, which the GPU tests and the bench use, has them
 * all. */
static void the_library_loads_only_what_it_calls(void **state) {
  dlsync_context *ctx = NULL;
  const dlsync__driver *all = NULL;
  size_t support = 0;
  (void)state;
  assert_int_equal(dlsync_context_default(&ctx), DLSYNC_SUCCESS);
  assert_int_equal(dlsync__driver_load_all(&all, NULL), DLSYNC_SUCCESS);
  assert_true(all != ctx->drv);
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++) {
    const dlsync__driver_entry_info *e = &dlsync__driver_entries[i];
    void *in_ctx = *(void *const *)((const char *)ctx->drv + e->offset);
    void *in_all = *(void *const *)((const char *)all + e->offset);
    if (e->need == DLSYNC__NEED_SUPPORT) {
      support++;
      if (in_ctx != NULL)
        fail_msg("%s is a SUPPORT entry, yet the context's table has it", e->symbol);
    } else if (in_ctx == NULL) {
      fail_msg("%s is missing from the context's table", e->symbol);
    }
    if (in_all == NULL)
      fail_msg("%s is missing from dlsync__driver_load_all's table", e->symbol);
  }
  assert_true(support > 0);
}

int main(int argc, char **argv) {
  /* One line each: tests/CMakeLists.txt reads the names here. */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup(out_of_memory_is_not_remembered, setup),
      cmocka_unit_test_setup(every_allocation_failure_is_tried_again, setup),
      cmocka_unit_test_setup(a_driver_error_is_not_remembered, setup),
      cmocka_unit_test_setup(threads_calling_at_once_get_one_context, setup),
      cmocka_unit_test_setup(no_driver_is_remembered_with_its_driver_result, setup),
      cmocka_unit_test_setup(old_driver_is_remembered, setup),
      cmocka_unit_test_setup(driver_refused_while_loading_is_remembered, setup),
      cmocka_unit_test_setup(the_library_loads_only_what_it_calls, setup),
  };
  if (argc == 2) {
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++) {
      if (strcmp(tests[i].name, argv[1]) == 0) {
        const struct CMUnitTest one[] = {tests[i]};
        return cmocka_run_group_tests_name(tests[i].name, one, NULL, NULL);
      }
    }
  }
  fprintf(stderr, "usage: %s TEST (one test a process: the default context is the process's)\n",
          argv[0]);
  for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
    fprintf(stderr, "  %s\n", tests[i].name);
  return 2;
}
