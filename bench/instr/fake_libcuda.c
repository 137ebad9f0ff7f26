/* SPDX-License-Identifier: Apache-2.0 */
/* A libcuda.so.1 made of the fake driver (tests/fake), for counting the
 * instructions libdlsync spends per operation without a GPU
 * (scripts/instr-count.sh): the tests' fake libcuda.so.1
 * (tests/fake/fake_libcuda.c) with graph destructors run inline, so a row's
 * events come back to the pool when its graph is destroyed, and a few
 * helpers for the harness (instr_rows.c). Not installed, not a test: a
 * measuring instrument. */
#define FAKE_LIBCUDA_ON_START() fake_set_destructors_inline(true)
#include "../../tests/fake/fake_libcuda.c"

EXPORT CUstream instr_stream_create(void);
EXPORT const char *instr_call_log(void);
EXPORT void instr_call_log_reset(void);

/* A non-blocking stream of device 0. */
CUstream instr_stream_create(void) {
  pthread_once(&once, start);
  return fake_stream_create(0, CU_STREAM_NON_BLOCKING);
}

/* The driver calls since the last reset, comma-separated. */
const char *instr_call_log(void) {
  return fake_call_log();
}

void instr_call_log_reset(void) {
  fake_log_reset();
}
