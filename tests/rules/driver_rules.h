/* SPDX-License-Identifier: Apache-2.0 */
/* The capture rules of tests/fake/fake_driver.h ([R1]..[R13]) as checks that
 * make driver calls only, so that the same checks run on the fake
 * (tests/test_driver_rules.c) and on the real libcuda (tests/gpu/gpu_rules.c):
 * where both pass, the fake and the driver agree rule by rule. */
#ifndef DLSYNC_TESTS_DRIVER_RULES_H
#define DLSYNC_TESTS_DRIVER_RULES_H

#include <stddef.h>

#include "driver/driver.h"

typedef struct driver_rule {
  const char *tag;  /* "R1 JOIN", as in fake_driver.h and the fake */
  const char *what; /* the rule in words */
  /* Runs the rule with the driver table d, in the calling thread's current
   * context, with `buf` 4 bytes of device memory for work. Returns NULL
   * when the driver behaves as the rule says, else what it did instead (a
   * static string or `why`). Cleans up either way. */
  const char *(*check)(const dlsync__driver *d, CUdeviceptr buf, char *why, size_t why_size);
} driver_rule;

extern const driver_rule driver_rules[];
extern const size_t driver_rule_count;

#endif
