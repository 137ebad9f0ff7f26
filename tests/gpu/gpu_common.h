/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers of the GPU programs (tests/gpu, bench): the real driver
 * through dlsync's own table, a context, and checks that report and bail. */
#ifndef DLSYNC_GPU_COMMON_H
#define DLSYNC_GPU_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "order/internal.h"

#define GPU_SKIP 77

typedef struct gpu_env {
  const dlsync__driver *d;
  dlsync_context *ctx;
  CUdevice dev;
  CUcontext cuctx;
  char name[256];
} gpu_env;

static inline const char *gpu_err(const dlsync__driver *d, CUresult r) {
  return dlsync__driver_error_name(d, r);
}

/* Loads the real driver and makes device 0's primary context current.
 * Returns 0, or GPU_SKIP (printed why) when there is no driver or GPU. */
static inline int gpu_env_init(gpu_env *e) {
  int n = 0;
  memset(e, 0, sizeof *e);
  if (dlsync__driver_load_all(&e->d, NULL) != DLSYNC_SUCCESS) {
    printf("SKIP: %s\n", dlsync_last_error());
    return GPU_SKIP;
  }
  if (e->d->DeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    printf("SKIP: the driver reports no GPU\n");
    return GPU_SKIP;
  }
  if (e->d->DeviceGet(&e->dev, 0) != CUDA_SUCCESS ||
      e->d->DevicePrimaryCtxRetain(&e->cuctx, e->dev) != CUDA_SUCCESS ||
      e->d->CtxPushCurrent(e->cuctx) != CUDA_SUCCESS) {
    printf("FAIL: cannot make device 0's context current\n");
    return 1;
  }
  e->d->DeviceGetName(e->name, (int)sizeof e->name, e->dev);
  if (dlsync_context_create(&e->ctx, NULL) != DLSYNC_SUCCESS) {
    printf("FAIL: dlsync_context_create: %s\n", dlsync_last_error());
    return 1;
  }
  return 0;
}

static inline double gpu_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

#endif
