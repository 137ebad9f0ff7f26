/* SPDX-License-Identifier: Apache-2.0 */
/* The calling thread's block (private/base.h): one thread-local object whose
 * slots belong to the modules above, and the pointer to it that the hot
 * paths read. */
#include "dlsync/private/base.h"

static _Thread_local dlsync__thread hot;

#if defined(__GNUC__) && !defined(__cplusplus)
_Thread_local dlsync__thread *dlsync__thread_self = NULL;

dlsync__thread *dlsync__thread_first(void) {
  dlsync__thread_self = &hot;
  return &hot;
}
#else
dlsync__thread *dlsync__thread_first(void) {
  return &hot;
}
#endif
