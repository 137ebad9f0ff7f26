/* SPDX-License-Identifier: Apache-2.0 */
/* fork() on the fake driver: a child of fork() has no usable CUDA and none
 * of dlsync's threads. With a release pending in the parent (its deleter
 * running on the reclaimer, another queued behind it), the child calls every
 * public entry point: each one that returns a status refuses with
 * DLSYNC_ERROR_NO_DRIVER and a message naming the fork, none hangs (an alarm
 * ends a child that does), none crashes; the others do nothing harmful. The
 * parent's releases still run, and its flush returns. tests/CMakeLists.txt
 * checks that every DLSYNC_API name of include/dlsync/ is called here. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "interop/dlpack_abi.h"
#include "dlsync/arrow.h"
#include "fixture.h"

#define TIMEOUT_MS 5000

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static atomic_int gate;    /* 1: the blocking deleter may return */
static atomic_int started; /* the blocking deleter is running */
static atomic_int deleted;

static void blocking_deleter(void *arg) {
  (void)arg;
  atomic_store(&started, 1);
  for (int i = 0; i < 4 * TIMEOUT_MS && atomic_load(&gate) == 0; i++)
    sleep_ms(1);
  atomic_fetch_add(&deleted, 1);
}

static void count_deleter(void *arg) {
  (void)arg;
  atomic_fetch_add(&deleted, 1);
}

static int child_failures;

/* In the child: no cmocka (its state is the parent's); failures counted,
 * the exit status says how many. */
static void child_check(bool ok, const char *what) {
  if (!ok) {
    child_failures++;
    fprintf(stderr, "fork child: %s (last error: %s)\n", what, dlsync_last_error());
  }
}

static void child_refused(dlsync_status st, const char *fn) {
  char what[160];
  snprintf(what, sizeof what, "%s returned %s, not DLSYNC_ERROR_NO_DRIVER", fn,
           dlsync_status_name(st));
  child_check(st == DLSYNC_ERROR_NO_DRIVER, what);
  snprintf(what, sizeof what, "%s: the message does not name fork() and the function", fn);
  child_check(strstr(dlsync_last_error(), "fork()") != NULL &&
                  strstr(dlsync_last_error(), fn) != NULL,
              what);
}

static int tensor_deleted;

static void tensor_deleter(struct DLManagedTensorVersioned *t) {
  (void)t;
  tensor_deleted++;
}

static int current_work_stream(int32_t device_type, int32_t device_id, void **out) {
  (void)device_type;
  (void)device_id;
  *out = NULL;
  return 0;
}

/* Every public entry point, in the child. ex and f were made in the parent. */
static void child_calls_everything(dlsync_exchange *ex, dlsync_fence *f) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C), out;
  dlsync_lane producers[2] = {dlsync_lane_stream(P), dlsync_lane_stream(C)};
  dlsync_context *c = NULL;
  dlsync_exchange *ex2 = NULL;
  dlsync_fence *f2 = NULL;
  dlsync_fence_kind kind;
  dlsync_provenance prov;
  CUevent ev = NULL;
  struct ArrowDeviceArray arr;
  dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;
  dlsync_lane_state ls;
  dlsync_release_stats rs = DLSYNC_RELEASE_STATS_INIT;
  dlsync_device_info info = DLSYNC_DEVICE_INFO_INIT;
  dlsync__dlpack_managed t;
  dlsync__dlpack_exchange_api api;
  uint32_t major = 0, minor = 0, caps = 0;
  int v = 0;
  bool ordered = false;
  void *s = NULL;

  child_refused(dlsync_context_create(&c, NULL), "dlsync_context_create");
  child_check(c == NULL, "dlsync_context_create: *out not NULL");
  child_refused(dlsync_context_default(&c), "dlsync_context_default");
  child_refused(dlsync_context_driver_version(&v, ctx), "dlsync_context_driver_version");
  child_refused(dlsync_context_capabilities(&caps, ctx), "dlsync_context_capabilities");
  child_refused(dlsync_context_require(ctx, DLSYNC_CAP_USER_OBJECTS), "dlsync_context_require");
  child_check(strcmp(dlsync_capability_name(DLSYNC_CAP_USER_OBJECTS), "user-objects") == 0,
              "dlsync_capability_name");
  child_refused(dlsync_device_count(&v, ctx), "dlsync_device_count");
  child_refused(dlsync_device_get_info(&info, ctx, 0), "dlsync_device_get_info");
  child_refused(dlsync_lane_query(&ls, ctx, &lp), "dlsync_lane_query");
  child_refused(dlsync_order(ctx, &lp, &lc), "dlsync_order");
  child_refused(dlsync_conditional_body_add(ctx, (CUgraph)0x40), "dlsync_conditional_body_add");
  child_refused(dlsync_conditional_body_remove(ctx, (CUgraph)0x40),
                "dlsync_conditional_body_remove");
  child_check(dlsync_conditional_body_is_declared(ctx, (CUgraph)0x40) == 0,
              "dlsync_conditional_body_is_declared");
  {
    CUgraph bodies[1] = {(CUgraph)0x42};
    child_refused(dlsync_conditional_node_declare(ctx, (CUgraph)0x40, (CUgraphNode)0x43, bodies, 1),
                  "dlsync_conditional_node_declare");
  }
  child_refused(dlsync_graph_launch(ctx, (CUgraph)0x40, (CUgraphExec)0x41, &lp),
                "dlsync_graph_launch");
  child_refused(dlsync_exchange_begin(&ex2, ctx, &lp, &lc), "dlsync_exchange_begin");
  child_refused(dlsync_exchange_begin_flags(&ex2, ctx, &lp, &lc, 0), "dlsync_exchange_begin_flags");
  child_refused(dlsync_exchange_begin_many(&ex2, ctx, producers, 2, &lc, 0),
                "dlsync_exchange_begin_many");
  child_refused(dlsync_exchange_begin_fanout(&ex2, ctx, &lc, producers, 1, 0),
                "dlsync_exchange_begin_fanout");
  child_check(ex2 == NULL, "an exchange was begun in the child");
  child_refused(dlsync_exchange_end(ex), "dlsync_exchange_end");
  child_refused(dlsync_fence_signal(&f2, ctx, &lp), "dlsync_fence_signal");
  child_check(f2 == NULL, "a fence was signalled in the child");
  child_refused(dlsync_fence_wait(f, &lc), "dlsync_fence_wait");
  child_check(dlsync_fence_retain(f) == NULL, "dlsync_fence_retain retained in the child");
  child_check(strstr(dlsync_last_error(), "dlsync_fence_retain") != NULL,
              "dlsync_fence_retain: no message");
  dlsync_fence_release(f); /* the parent's: left alone */
  child_check(strstr(dlsync_last_error(), "dlsync_fence_release") != NULL,
              "dlsync_fence_release: no message");
  child_refused(dlsync_fence_get_kind(&kind, f), "dlsync_fence_get_kind");
  child_refused(dlsync_fence_import(&f2, ctx, (CUevent)0x42, DLSYNC_PROVENANCE_EAGER, 0, 0),
                "dlsync_fence_import");
  child_check(f2 == NULL, "a fence was imported in the child");
  child_refused(dlsync_fence_export_event(&ev, f), "dlsync_fence_export_event");
  child_refused(dlsync_fence_get_provenance(&prov, f), "dlsync_fence_get_provenance");
  memset(&arr, 0, sizeof arr);
  arr.device_type = ARROW_DEVICE_CUDA;
  child_refused(dlsync_arrow_sync_event(&arr, &sync, ctx, &lp), "dlsync_arrow_sync_event");
  child_refused(dlsync_arrow_wait(ctx, &lc, &arr, DLSYNC_PROVENANCE_EAGER, 0), "dlsync_arrow_wait");
  child_refused(dlsync_arrow_release(ctx, &lc, &arr), "dlsync_arrow_release");
  sync.fence = f;
  dlsync_arrow_sync_release(&sync); /* the parent's fence: left alone */
  child_check(strstr(dlsync_last_error(), "dlsync_arrow_sync_release") != NULL,
              "dlsync_arrow_sync_release: no message");
  child_check(sync.fence == f, "dlsync_arrow_sync_release let go in the child");
  child_refused(dlsync_release(ctx, &lp, count_deleter, NULL), "dlsync_release");
  child_refused(dlsync_release_flush(ctx), "dlsync_release_flush"); /* before: never returned */
  child_refused(dlsync_release_get_stats(&rs, ctx), "dlsync_release_get_stats");

  memset(&t, 0, sizeof t);
  t.version.major = DLSYNC_DLPACK_MAJOR_VERSION;
  t.deleter = tensor_deleter;
  child_refused(dlsync_dlpack_release(ctx, &lp, (struct DLManagedTensorVersioned *)(void *)&t),
                "dlsync_dlpack_release");
  child_refused(
      dlsync_dlpack_version(&major, &minor, (const struct DLManagedTensorVersioned *)(void *)&t),
      "dlsync_dlpack_version");
  child_refused(dlsync_dlpack_stream(&out, &ordered, ctx, 2, &lp), "dlsync_dlpack_stream");
  /* The caller's own deleter: called (no CUDA of dlsync's in it). */
  dlsync_dlpack_call_deleter((struct DLManagedTensorVersioned *)(void *)&t);
  child_check(tensor_deleted == 1, "dlsync_dlpack_call_deleter did not call the deleter");
  child_refused(dlsync_env_stream_set(&s, DLSYNC_DLPACK_DEVICE_CUDA, 0, P),
                "dlsync_env_stream_set");
  child_refused(dlsync_env_stream_get(&s, DLSYNC_DLPACK_DEVICE_CUDA, 0), "dlsync_env_stream_get");
  dlsync_env_stream_clear();
  memset(&api, 0, sizeof api);
  api.header.version.major = DLSYNC_DLPACK_MAJOR_VERSION;
  api.current_work_stream = current_work_stream;
  child_refused(dlsync_env_stream_from_exchange_api(&s,
                                                    (const struct DLPackExchangeAPI *)(void *)&api,
                                                    DLSYNC_DLPACK_DEVICE_CUDA, 0),
                "dlsync_env_stream_from_exchange_api");
  child_refused(dlsync_context_destroy(ctx), "dlsync_context_destroy");

  /* No driver, no thread: these still work. */
  child_check(dlsync_last_status() == DLSYNC_ERROR_NO_DRIVER, "dlsync_last_status");
  child_check(dlsync_last_driver_result() == 0, "dlsync_last_driver_result");
  child_check(strcmp(dlsync_status_name(DLSYNC_ERROR_BUSY), "DLSYNC_ERROR_BUSY") == 0,
              "dlsync_status_name");
  child_check(dlsync_status_string(DLSYNC_ERROR_BUSY)[0] != '\0', "dlsync_status_string");
  child_check(dlsync_version() != 0 && dlsync_version_string()[0] != '\0', "dlsync_version");
}

static void test_every_call_in_a_forked_child_is_refused_and_none_hangs(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P), lc = dlsync_lane_stream(C);
  dlsync_exchange *ex = NULL;
  dlsync_fence *f = NULL;
  pid_t pid;
  int wstatus = 0;
  (void)state;
  atomic_store(&gate, 0);
  atomic_store(&started, 0);
  atomic_store(&deleted, 0);
  /* A release running (its deleter blocked) and one queued behind it. */
  assert_int_equal(dlsync_release(ctx, &lp, blocking_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release(ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  for (int i = 0; i < TIMEOUT_MS && atomic_load(&started) == 0; i++)
    sleep_ms(1);
  assert_int_equal(atomic_load(&started), 1);
  assert_int_equal(dlsync_exchange_begin(&ex, ctx, &lp, &lc), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_fence_signal(&f, ctx, &lp), DLSYNC_SUCCESS);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20); /* a call that hangs ends the child (SIGALRM): the parent sees it */
    child_calls_everything(ex, f);
    _exit(child_failures > 100 ? 100 : child_failures);
  }
  assert_int_equal(waitpid(pid, &wstatus, 0), pid);
  if (WIFSIGNALED(wstatus))
    fail_msg("the child of fork() died of signal %d%s", WTERMSIG(wstatus),
             WTERMSIG(wstatus) == SIGALRM ? " (a call hung)" : "");
  assert_true(WIFEXITED(wstatus));
  if (WEXITSTATUS(wstatus) != 0)
    fail_msg("%d call(s) in the child of fork() were not refused as they should",
             WEXITSTATUS(wstatus));
  /* The parent goes on: its releases run, its flush returns. */
  atomic_store(&gate, 1);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 2);
  assert_int_equal(dlsync_exchange_end(ex), DLSYNC_SUCCESS);
  dlsync_fence_release(f);
}

/* A child that only exits (exit(), its unload hooks run) while the parent
 * has dlsync threads: no hang, and the parent's threads keep working. */
static void test_a_forked_child_exits_cleanly(void **state) {
  dlsync_lane lp = dlsync_lane_stream(P);
  pid_t pid;
  int wstatus = 0;
  (void)state;
  atomic_store(&deleted, 0);
  assert_int_equal(dlsync_release(ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20);
    /* exit() runs the library's destructors, which join dlsync's threads
     * in the parent; here there are none to join. _exit status 0 only if
     * it got that far. */
    _exit(dlsync_release_flush(ctx) == DLSYNC_ERROR_NO_DRIVER ? 0 : 1);
  }
  assert_int_equal(waitpid(pid, &wstatus, 0), pid);
  assert_true(WIFEXITED(wstatus));
  assert_int_equal(WEXITSTATUS(wstatus), 0);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    alarm(20);
    exit(0); /* the destructors run: they must not wait for threads the child lacks */
  }
  assert_int_equal(waitpid(pid, &wstatus, 0), pid);
  if (WIFSIGNALED(wstatus))
    fail_msg("the child's exit() died of signal %d%s", WTERMSIG(wstatus),
             WTERMSIG(wstatus) == SIGALRM ? " (it hung)" : "");
  assert_true(WIFEXITED(wstatus));
  assert_int_equal(dlsync_release(ctx, &lp, count_deleter, NULL), DLSYNC_SUCCESS);
  assert_int_equal(dlsync_release_flush(ctx), DLSYNC_SUCCESS);
  assert_int_equal(atomic_load(&deleted), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_every_call_in_a_forked_child_is_refused_and_none_hangs,
                                      fixture_setup, fixture_teardown),
      cmocka_unit_test_setup_teardown(test_a_forked_child_exits_cleanly, fixture_setup,
                                      fixture_teardown),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  fake_shutdown();
  return rc;
}
