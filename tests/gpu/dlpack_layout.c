/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync's DLPack mirrors against a real dlpack.h, with the real header
 * included first (dlpack_layout_b.c includes it last). Built only where CMake
 * found a dlpack.h (PyTorch, CuPy or TVM FFI ship one, or
 * DLSYNC_DLPACK_INCLUDE_DIR); needs no GPU. Prints the header's version. */
#include DLSYNC_DLPACK_HEADER

#include "dlsync/dlsync.h"

#include "dlpack_layout.h"

int dlpack_layout_b(void);
int dlpack_layout_cxx(void);

int main(void) {
  int failures = layout_run_checks("real dlpack.h first");
  failures += dlpack_layout_b();
  if (dlpack_layout_cxx() != 0) {
    printf("FAIL C++: real DLPack structs through dlsync's functions\n");
    failures++;
  }
  printf("dlpack.h %d.%d (%s): dlsync's mirror matches DLManagedTensorVersioned%s; %s\n",
         DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION, DLSYNC_DLPACK_HEADER,
#ifdef DLSYNC_DLPACK_HAS_EXCHANGE_API
         " and DLPackExchangeAPI",
#else
         " (this header has no DLPackExchangeAPI)",
#endif
         failures == 0 ? "run-time checks passed" : "run-time checks FAILED");
  return failures == 0 ? 0 : 1;
}
