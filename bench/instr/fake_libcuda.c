/* SPDX-License-Identifier: Apache-2.0 */
/* A libcuda.so.1 made of the fake driver (tests/fake), for counting the
 * instructions libdlsync spends per operation without a GPU
 * (scripts/instr-count.sh). It exports what dlsync's loader asks for
 * (cuGetProcAddress_v2, which hands out the fake's table) and a few helpers
 * for the harness (instr_rows.c). Graph destructors run inline, so a row's
 * events come back to the pool when its graph is destroyed. Not installed,
 * not a test: a measuring instrument. */
#include <pthread.h>
#include <string.h>

#include "fake_driver.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void start(void) {
  fake_reset(1);
  fake_set_destructors_inline(true);
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
  const dlsync__driver *d;
  (void)version;
  (void)flags;
  pthread_once(&once, start);
  d = fake_driver();
  *pfn = NULL;
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++) {
    if (strcmp(dlsync__driver_entries[i].symbol, symbol) == 0) {
      memcpy(pfn, (const char *)d + dlsync__driver_entries[i].offset, sizeof *pfn);
      break;
    }
  }
  if (status != NULL)
    *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

/* A non-blocking stream of device 0. */
EXPORT CUstream instr_stream_create(void) {
  pthread_once(&once, start);
  return fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

/* The driver calls since the last reset, comma-separated. */
EXPORT const char *instr_call_log(void) {
  return fake_call_log();
}

EXPORT void instr_call_log_reset(void) {
  fake_log_reset();
}
