/* SPDX-License-Identifier: Apache-2.0 */
/* The capture rules of fake_driver.h ([R1]..[R10]) checked on the fake with
 * driver calls only (tests/rules/driver_rules.c); tests/gpu/gpu_rules.c runs
 * the same checks on the real driver. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include <cmocka.h>

#include "fake/fake_driver.h"
#include "rules/driver_rules.h"

static void every_rule_holds_on_the_fake(void **state) {
  const dlsync__driver *d;
  CUdeviceptr buf = 0;
  CUcontext popped;
  char leaks[256] = {0};
  int failed = 0;
  (void)state;
  fake_reset(2);
  d = fake_driver();
  assert_int_equal(d->CtxPushCurrent(fake_primary_ctx(0)), CUDA_SUCCESS);
  assert_int_equal(d->MemAlloc(&buf, 4), CUDA_SUCCESS);
  assert_true(driver_rule_count >= 10);
  for (size_t i = 0; i < driver_rule_count; i++) {
    char why[256];
    const char *res = driver_rules[i].check(d, buf, why, sizeof why);
    printf("[%s] %s: %s\n", driver_rules[i].tag, driver_rules[i].what, res == NULL ? "holds" : res);
    failed += res != NULL;
  }
  assert_int_equal(d->MemFree(buf), CUDA_SUCCESS);
  assert_int_equal(d->CtxPopCurrent(&popped), CUDA_SUCCESS);
  fake_run_destructors();
  if (fake_leak_report(leaks, sizeof leaks) != 0)
    fail_msg("the checks leaked: %s", leaks);
  assert_int_equal(failed, 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(every_rule_holds_on_the_fake)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
