/* SPDX-License-Identifier: Apache-2.0 */
/* The launcher's kernel library without CUDA, for test_cpu.py on the fake
 * driver: counts launches (ln_launches), never touches memory. */
#include <stddef.h>

static int launches;

int ln_spin_scale(float *dst, const float *src, size_t n, float a, long long spin, void *stream) {
  (void)dst, (void)src, (void)n, (void)a, (void)spin, (void)stream;
  launches++;
  return 0;
}

int ln_stream_sync(void *stream) {
  (void)stream;
  return 0;
}

const char *ln_error_string(int rc) {
  (void)rc;
  return "stub";
}

int ln_launches(void) {
  return launches;
}
