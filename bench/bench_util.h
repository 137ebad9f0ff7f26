/* SPDX-License-Identifier: Apache-2.0 */
/* What the benches share: the median of a sample (sorted in place), the
 * check that ends a bench run with the library's message, an operation's
 * type. */
#ifndef DLSYNC_BENCH_UTIL_H
#define DLSYNC_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include "dlsync/dlsync.h"

static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of v[0..n); v is left sorted (v[0] its minimum, v[n-1] its
 * maximum: the range the benches print). */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
  return v[n / 2];
}

#define CHECK(cond, what)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      printf("FAIL: %s (line %d): %s\n", what, __LINE__, dlsync_last_error()); \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

typedef void (*op_fn)(void);

#endif
