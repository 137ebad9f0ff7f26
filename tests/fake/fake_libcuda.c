/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync tests: the fake driver (fake_*.c) as a libcuda.so.1, so that
 * what only the default path reaches (dlsync_context_default dlopens
 * "libcuda.so.1" by name) runs without a GPU. test_context_default finds it
 * through LD_LIBRARY_PATH (tests/CMakeLists.txt); nothing else is given that
 * folder. It exports what dlsync's loader asks for (cuGetProcAddress_v2,
 * which hands out the fake's table) and a few fake_libcuda_* controls, which
 * the test reaches with dlopen and dlsym: this library holds its own copy of
 * the fake (and of the parts of dlsync the fake uses), separate from any
 * linked into the test. One device, as fake_reset(1) leaves it, until a
 * control says otherwise. (bench/instr/fake_libcuda.c is this file with
 * graph destructors run inline and a few helpers more, built by
 * scripts/instr-count.sh to count instructions.) */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "fake_driver.h"

#define EXPORT __attribute__((visibility("default")))

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* An entry cuGetProcAddress_v2 says it does not have (NULL: none). */
static _Atomic(const char *) hidden;

/* bench/instr/fake_libcuda.c, which builds on this file, adds to the start. */
#ifndef FAKE_LIBCUDA_ON_START
#define FAKE_LIBCUDA_ON_START() ((void)0)
#endif

static void start(void) {
  fake_reset(1);
  FAKE_LIBCUDA_ON_START();
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status);
EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
  const dlsync__driver *d;
  (void)version;
  (void)flags;
  pthread_once(&once, start);
  d = fake_driver();
  *pfn = NULL;
  for (size_t i = 0; i < DLSYNC__DRIVER_ENTRY_COUNT; i++) {
    const char *h = atomic_load(&hidden);
    if (strcmp(dlsync__driver_entries[i].symbol, symbol) == 0 &&
        (h == NULL || strcmp(h, symbol) != 0)) {
      memcpy(pfn, (const char *)d + dlsync__driver_entries[i].offset, sizeof *pfn);
      break;
    }
  }
  if (status != NULL)
    *status = *pfn != NULL ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return CUDA_SUCCESS;
}

/* The controls: fake_reset, fake_set_driver_version, fake_fail_nth and
 * fake_call_count of this copy of the fake. fake_libcuda_reset(0) makes
 * cuInit answer CUDA_ERROR_NO_DEVICE (a driver without a GPU).
 * fake_libcuda_hide(symbol) makes cuGetProcAddress_v2 answer "not found" for
 * that entry ("cuDriverGetVersion", a string that lives as long as the
 * library); NULL hides none. fake_libcuda_run_destructors runs the user
 * objects' destructors that destroyed graphs left pending (the driver's own
 * thread would), on the caller's thread: how many ran. */
EXPORT void fake_libcuda_hide(const char *symbol);
EXPORT void fake_libcuda_reset(int ndevices);
EXPORT void fake_libcuda_set_driver_version(int v);
EXPORT void fake_libcuda_fail_nth(const char *symbol, unsigned nth, CUresult r);
EXPORT unsigned fake_libcuda_call_count(const char *symbol);
EXPORT unsigned long fake_libcuda_calls_total(void);
EXPORT unsigned fake_libcuda_run_destructors(void);

void fake_libcuda_hide(const char *symbol) {
  atomic_store(&hidden, symbol);
}

void fake_libcuda_reset(int ndevices) {
  pthread_once(&once, start);
  fake_reset(ndevices);
}

void fake_libcuda_set_driver_version(int v) {
  pthread_once(&once, start);
  fake_set_driver_version(v);
}

void fake_libcuda_fail_nth(const char *symbol, unsigned nth, CUresult r) {
  pthread_once(&once, start);
  fake_fail_nth(symbol, nth, r);
}

unsigned fake_libcuda_call_count(const char *symbol) {
  pthread_once(&once, start);
  return fake_call_count(symbol);
}

unsigned long fake_libcuda_calls_total(void) {
  pthread_once(&once, start);
  return fake_calls_total();
}

unsigned fake_libcuda_run_destructors(void) {
  pthread_once(&once, start);
  return fake_run_destructors();
}
