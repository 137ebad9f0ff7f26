/* SPDX-License-Identifier: Apache-2.0 */
/* The same checks as dlpack_layout.c with dlsync's headers included before
 * the real dlpack.h. */
#include "dlsync/dlsync.h"

#include DLSYNC_DLPACK_HEADER

#include "dlpack_layout.h"

int dlpack_layout_b(void);

int dlpack_layout_b(void) {
  return layout_run_checks("dlsync's headers first");
}
