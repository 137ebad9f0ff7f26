/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync-info --selftest: each row of the decision table on the GPU, with a
 * data check and a negative control. Public API of dlsync, and the driver
 * through its own dlopen (the library's driver table is private). */
#ifndef DLSYNC_INFO_SELFTEST_H
#define DLSYNC_INFO_SELFTEST_H

#include <stdio.h>

/* The exit status when there is no driver or no GPU: nothing was tested. */
#define SELFTEST_NO_GPU 77

/* Runs every row and prints a table on f. Returns 0 when each row ordered
 * its data and each control could fail (showed stale data), 1 otherwise,
 * SELFTEST_NO_GPU (after saying so) where there is nothing to test. */
int selftest_run(FILE *f);

#endif
