/* SPDX-License-Identifier: Apache-2.0 */
/* The fake driver's capture rules ([R1]..[R13] of tests/fake/fake_driver.h)
 * checked on the real driver with the same code as on the fake
 * (tests/rules/driver_rules.c): where both pass, the fake and CUDA agree rule
 * by rule. Then the rules the fake does not model ([R14].., docs/design.md;
 * gpu_rules_probes.c). Exits 77 (skipped) without a driver or GPU, 1 when a rule does
 * not hold on this driver. */
#include <stdio.h>

#include "../rules/driver_rules.h"
#include "gpu_common.h"
#include "gpu_rules_probes.h"

int main(void) {
  gpu_env e;
  CUdeviceptr buf = 0;
  int driver_version = 0, failed = 0;
  int rc = gpu_env_init(&e);
  if (rc != 0)
    return rc;
  if (e.d->MemAlloc(&buf, 4) != CUDA_SUCCESS) {
    printf("FAIL: cuMemAlloc\n");
    return 1;
  }
  e.d->DriverGetVersion(&driver_version);
  printf("fake driver rules on %s, driver %d.%d\n", e.name, driver_version / 1000,
         (driver_version % 1000) / 10);
  for (size_t i = 0; i < driver_rule_count; i++) {
    char why[256];
    const char *res = driver_rules[i].check(e.d, buf, why, sizeof why);
    printf("  [%-28s] %-6s %s%s%s\n", driver_rules[i].tag, res == NULL ? "AGREES" : "DIFFERS",
           driver_rules[i].what, res == NULL ? "" : ": ", res == NULL ? "" : res);
    failed += res != NULL;
  }
  printf("%zu of %zu rules agree with the fake\n", driver_rule_count - (size_t)failed,
         driver_rule_count);
  /* The rules the fake does not model (gpu_rules_probes.c). */
  int probes_failed = 0;
  for (size_t i = 0; i < gpu_probe_rule_count; i++) {
    char why[256] = "";
    const char *res = gpu_probe_rules[i].check(e.d, buf, why, sizeof why);
    /* A rule that holds may say what it saw, in why: printed in parentheses. */
    printf("  [%-28s] %-6s %s%s%s%s\n", gpu_probe_rules[i].tag, res == NULL ? "HOLDS" : "FAILS",
           gpu_probe_rules[i].what, res == NULL ? (why[0] != '\0' ? " (" : "") : ": ",
           res == NULL ? why : res, res == NULL && why[0] != '\0' ? ")" : "");
    probes_failed += res != NULL;
  }
  printf("%zu of %zu rules the fake does not model hold\n",
         gpu_probe_rule_count - (size_t)probes_failed, gpu_probe_rule_count);
  failed += probes_failed;
  e.d->MemFree(buf);
  dlsync_context_destroy(e.ctx);
  return failed == 0 ? 0 : 1;
}
