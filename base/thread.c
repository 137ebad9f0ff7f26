/* SPDX-License-Identifier: Apache-2.0 */
/* The calling thread's block (base/base.h): one thread-local object whose
 * slots belong to the modules above; and what a child of fork() is told. */
#include <pthread.h>

#include "base/base.h"

static _Thread_local dlsync__thread hot;

dlsync__thread *dlsync__thread_get(void) {
  return &hot;
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
