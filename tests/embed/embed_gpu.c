/* SPDX-License-Identifier: Apache-2.0 */
/* tests/embed/embed_cycle.c on the real driver (gpu_unload in
 * tests/gpu/CMakeLists.txt, run by tests/test_dlclose.c): each load makes a
 * context, a stream with a few milliseconds of memsets queued, and eager
 * releases on it, so that the library is unloaded while its reclaimer waits
 * for the GPU (or, with wait, while it is idle). Returns 77 where no GPU is
 * found. */
#include <stdatomic.h>
#include <time.h>

#include "order/internal.h"

__attribute__((visibility("default"))) int embed_cycle_start(int nreleases);
__attribute__((visibility("default"))) int embed_cycle_wait(void);

#define BYTES (64u << 20)

static _Atomic(dlsync_context *) ctx;
static const dlsync__driver *d;
static CUstream stream;
static CUdeviceptr buf;
static CUdevice dev;
static bool pushed;
static atomic_int left;
static atomic_int destroy_status;

static void last_destroys(void *arg) {
  (void)arg;
  if (atomic_fetch_sub(&left, 1) == 1) {
    dlsync_context *c = atomic_exchange(&ctx, NULL);
    if (c != NULL)
      atomic_store(&destroy_status, (int)dlsync_context_destroy(c));
  }
}

int embed_cycle_start(int nreleases) {
  dlsync_context *c = NULL;
  dlsync_lane lane;
  CUcontext cu = NULL;
  atomic_store(&destroy_status, -1);
  if (dlsync_context_create(&c, NULL) != DLSYNC_SUCCESS)
    return dlsync_last_status() == DLSYNC_ERROR_NO_DRIVER ? 77 : -1;
  atomic_store(&ctx, c);
  /* The context's table leaves the entries only tests call NULL. */
  if (dlsync__driver_load_all(&d, NULL) != DLSYNC_SUCCESS)
    return -1;
  if (d->DeviceGet(&dev, 0) != CUDA_SUCCESS || d->DevicePrimaryCtxRetain(&cu, dev) != CUDA_SUCCESS)
    return 77;
  if (d->CtxPushCurrent(cu) != CUDA_SUCCESS)
    return -2;
  pushed = true;
  if (d->StreamCreate(&stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS ||
      d->MemAlloc(&buf, BYTES) != CUDA_SUCCESS)
    return -3;
  for (int i = 0; i < 20; i++) /* some milliseconds of work */
    if (d->MemsetD32Async(buf, (unsigned)i, BYTES / 4, stream) != CUDA_SUCCESS)
      return -4;
  lane = dlsync_lane_stream(stream);
  atomic_store(&left, nreleases);
  for (int i = 0; i < nreleases; i++)
    if (dlsync_release(c, &lane, last_destroys, NULL) != DLSYNC_SUCCESS)
      return -5;
  return 0;
}

int embed_cycle_wait(void) {
  struct timespec ts = {0, 1000 * 1000};
  for (int i = 0; i < 10000 && atomic_load(&destroy_status) < 0; i++)
    nanosleep(&ts, NULL);
  return atomic_load(&destroy_status);
}

/* After dlsync's destructors (which joined its threads): what a deleter
 * left undone when its work was still running at the unload. */
__attribute__((destructor(101))) static void embed_gpu_unload(void) {
  dlsync_context *c = atomic_exchange(&ctx, NULL);
  CUcontext popped;
  if (d == NULL)
    return;
  if (stream != NULL) {
    (void)d->StreamSynchronize(stream);
    if (buf != 0)
      (void)d->MemFree(buf);
    (void)d->StreamDestroy(stream);
  }
  if (c != NULL)
    (void)dlsync_context_destroy(c);
  if (pushed)
    (void)d->CtxPopCurrent(&popped);
  (void)d->DevicePrimaryCtxRelease(dev);
}
