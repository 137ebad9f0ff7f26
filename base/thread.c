/* SPDX-License-Identifier: Apache-2.0 */
/* The calling thread's block (base/base.h): one thread-local object whose
 * slots belong to the modules above; and what a child of fork() is told. */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__linux__)
#include <linux/membarrier.h>
#endif

#include "base/base.h"

static _Thread_local dlsync__thread hot;

dlsync__thread *dlsync__thread_get(void) {
  return &hot;
}

/* ---- thread exit and unload (the order: base/base.h) ---- */

typedef struct hook_pair {
  _Atomic(dlsync__thread_exit_fn) at_thread_exit;
  _Atomic(dlsync__unload_fn) at_unload;
} hook_pair;

static hook_pair hooks[DLSYNC__HOOKS];
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t key;
static atomic_bool key_ok; /* created, and not deleted yet */

/* exit() or dlclose: exit() runs the exit handlers before any library
 * destructor, and a handler registered for this object (__cxa_atexit with
 * its __dso_handle) runs at its dlclose only after its destructors
 * (crtbegin's __do_global_dtors_aux, which calls __cxa_finalize, is the
 * first .fini_array entry and runs last). So the handler has run by the
 * unload at exit, not yet at a dlclose. __cxa_atexit, not atexit: a
 * sanitizer's atexit interceptor (ThreadSanitizer's) drops the object, and
 * the handler would then run at exit in an object already unmapped. Where
 * registering fails the unload counts as a dlclose. */
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);
/* crtbegin's: this shared object's own address, 0 in an executable (as atexit passes it) */
extern void *__dso_handle __attribute__((visibility("hidden")));
static atomic_bool exiting;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;

static void exit_seen(void *arg) {
  (void)arg;
  atomic_store(&exiting, true);
}

static void exit_watch(void) {
  (void)__cxa_atexit(exit_seen, NULL, __dso_handle);
}

bool dlsync__unload_at_exit(void) {
  return atomic_load(&exiting);
}

void dlsync__hooks_set(dlsync__hook_slot slot, dlsync__thread_exit_fn at_thread_exit,
                       dlsync__unload_fn at_unload) {
  (void)pthread_once(&exit_once, exit_watch);
  atomic_store(&hooks[slot].at_thread_exit, at_thread_exit);
  atomic_store(&hooks[slot].at_unload, at_unload);
}

/* The key's destructor: runs on the exiting thread (its thread-local
 * storage still there), with the key's value already NULL. */
static void thread_exit(void *p) {
  dlsync__thread *t = p;
  t->exit_armed = false;
  for (int i = 0; i < DLSYNC__HOOKS; i++) {
    dlsync__thread_exit_fn fn = atomic_load(&hooks[i].at_thread_exit);
    if (fn != NULL)
      fn(t);
  }
}

static void key_create(void) {
  atomic_store(&key_ok, pthread_key_create(&key, thread_exit) == 0);
}

bool dlsync__thread_exit_arm(dlsync__thread *t) {
  if (t->exit_armed)
    return true;
  (void)pthread_once(&key_once, key_create);
  if (!atomic_load(&key_ok) || pthread_setspecific(key, t) != 0)
    return false;
  t->exit_armed = true;
  return true;
}

#if defined(__GNUC__)
/* The library's only destructor: at exit, or at the dlclose of a library
 * that embeds libdlsync.a. */
__attribute__((destructor)) static void unload(void) {
  for (int i = 0; i < DLSYNC__HOOKS; i++) {
    dlsync__unload_fn fn = atomic_load(&hooks[i].at_unload);
    if (fn != NULL)
      fn();
  }
  if (atomic_exchange(&key_ok, false))
    (void)pthread_key_delete(key);
}
#endif

/* ---- the asymmetric fence (base/base.h) ---- */

static pthread_once_t heavy_once = PTHREAD_ONCE_INIT;
static atomic_bool heavy_ok;

static void heavy_register(void) {
#if defined(__linux__) && defined(SYS_membarrier)
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds >= 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0)
    atomic_store(&heavy_ok, true);
#endif
}

bool dlsync__fence_heavy_ready(void) {
  (void)pthread_once(&heavy_once, heavy_register);
  return atomic_load(&heavy_ok);
}

bool dlsync__fence_heavy(void) {
#if defined(__linux__) && defined(SYS_membarrier)
  return atomic_load(&heavy_ok) &&
         syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
#else
  return false;
#endif
}

/* ---- fork() ----
 * A child of fork() has one thread, a copy of the parent's memory, and no
 * usable CUDA (the driver does not support it), and none of dlsync's threads
 * (the reclaimers): a release queued there would never run, and a flush would
 * wait for ever. So from the fork on, every call in the child is refused with
 * a message, and dlsync's unload hooks there touch no thread. */
bool dlsync__forked; /* why not an atomic: base/base.h */

static void forked_child(void) {
  dlsync__forked = true;
}

#if defined(__GNUC__)
/* Registered once per copy of the library; glibc drops the handler when the
 * copy is unloaded (a library embedding libdlsync.a being dlclosed). */
__attribute__((constructor)) static void fork_hook(void) {
  (void)pthread_atfork(NULL, NULL, forked_child);
}
#endif

dlsync_status dlsync__fail_forked(const char *fn) {
  return dlsync__fail(DLSYNC_ERROR_NO_DRIVER,
                      "%s: called in a child of fork(); CUDA cannot be used there, and dlsync "
                      "refuses every call (use dlsync in the parent, or start the child with "
                      "exec or the multiprocessing 'spawn' method)",
                      fn);
}
