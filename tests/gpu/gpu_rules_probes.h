/* SPDX-License-Identifier: Apache-2.0 */
/* The rules of docs/design.md that the fake driver does not model, checked
 * on the real driver by gpu_rules after the fake's own (driver_rules.h):
 * same entry type, tags [R14 ...] on ([R32] too). */
#ifndef DLSYNC_TESTS_GPU_RULES_PROBES_H
#define DLSYNC_TESTS_GPU_RULES_PROBES_H

#include "../rules/driver_rules.h"

extern const driver_rule gpu_probe_rules[];
extern const size_t gpu_probe_rule_count;

#endif
