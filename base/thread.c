/* SPDX-License-Identifier: Apache-2.0 */
/* The calling thread's block (base/base.h): one thread-local object whose
 * slots belong to the modules above. */
#include "base/base.h"

static _Thread_local dlsync__thread hot;

dlsync__thread *dlsync__thread_get(void) {
  return &hot;
}
