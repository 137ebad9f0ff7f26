/* SPDX-License-Identifier: Apache-2.0 */
/* The Arrow C Device data interface: a fence's event as an array's
 * sync_event, an incoming sync_event waited on, the producer's release
 * stream-ordered. include/dlsync/arrow.h has the contract. */
#include <string.h>

#include "dlsync/arrow.h"
#include "order/order.h"

_Static_assert(sizeof(struct ArrowArray) == 80, "ArrowArray is 80 bytes (the interface's layout)");
_Static_assert(sizeof(struct ArrowDeviceArray) == 128,
               "ArrowDeviceArray is 128 bytes (the interface's layout)");

/* A device array dlsync can order: one of the three CUDA device types (the
 * interface gives each a cudaEvent_t* sync_event), reserved bytes zero. */
static dlsync_status check_array(const struct ArrowDeviceArray *a, const char *fn) {
  if (a == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "%s: array is NULL", fn);
  if (a->device_type != ARROW_DEVICE_CUDA && a->device_type != ARROW_DEVICE_CUDA_HOST &&
      a->device_type != ARROW_DEVICE_CUDA_MANAGED)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "%s: device type %d is not a CUDA device type (ARROW_DEVICE_CUDA %d, "
                        "ARROW_DEVICE_CUDA_HOST %d, ARROW_DEVICE_CUDA_MANAGED %d): dlsync orders "
                        "CUDA work only",
                        fn, (int)a->device_type, ARROW_DEVICE_CUDA, ARROW_DEVICE_CUDA_HOST,
                        ARROW_DEVICE_CUDA_MANAGED);
  for (int i = 0; i < 3; i++)
    if (a->reserved[i] != 0)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "%s: reserved[%d] is %lld, not 0 (the interface says the producer "
                          "zeroes them)",
                          fn, i, (long long)a->reserved[i]);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_arrow_sync_event(struct ArrowDeviceArray *array, dlsync_arrow_sync *sync,
                                      dlsync_context *ctx, dlsync_lane *lane) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_arrow_sync_event");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_fence *f = NULL;
  CUevent ev = NULL;
  if (sync == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_arrow_sync_event: %s is NULL",
                        sync == NULL ? "sync" : "ctx");
  DLSYNC_TRY(check_array(array, "dlsync_arrow_sync_event"));
  if (sync->fence != NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_arrow_sync_event: sync already holds fence %p (release it with "
                        "dlsync_arrow_sync_release first)",
                        (void *)sync->fence);
  DLSYNC_TRY(dlsync_fence_signal(&f, ctx, lane));
  DLSYNC_TRY(dlsync_fence_export_event(&ev, f)); /* a fence signalled here: never refused */
  sync->fence = f;
  sync->event = ev;
  array->sync_event = &sync->event;
  f = NULL;
cleanup:
  dlsync_fence_release(f);
  return st;
}

void dlsync_arrow_sync_release(dlsync_arrow_sync *sync) {
  if (DLSYNC__IN_FORKED_CHILD()) {
    (void)dlsync__fail_forked("dlsync_arrow_sync_release"); /* the parent's: left alone */
    return;
  }
  if (sync == NULL || sync->fence == NULL)
    return;
  dlsync_fence_release(sync->fence);
  sync->fence = NULL;
  sync->event = NULL;
}

dlsync_status dlsync_arrow_wait(dlsync_context *ctx, dlsync_lane *lane,
                                const struct ArrowDeviceArray *array, dlsync_provenance provenance,
                                uint64_t capture_id) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_arrow_wait");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_fence *f = NULL;
  CUevent ev;
  if (ctx == NULL || lane == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_arrow_wait: %s is NULL",
                        ctx == NULL ? "ctx" : "lane");
  DLSYNC_TRY(check_array(array, "dlsync_arrow_wait"));
  if (array->array.release == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_arrow_wait: the array was released (its release is NULL)");
  if (array->sync_event == NULL)
    return DLSYNC_SUCCESS; /* the producer says: nothing to wait on */
  memcpy(&ev, array->sync_event, sizeof ev);
  if (ev == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_arrow_wait: sync_event points to a NULL event (a producer with "
                        "nothing to wait on sets sync_event itself to NULL)");
  DLSYNC_TRY(dlsync_fence_import(&f, ctx, ev, provenance, capture_id, 0));
  DLSYNC_TRY(dlsync_fence_wait(f, lane));
cleanup:
  dlsync_fence_release(f);
  return st;
}

/* The moved array, released on the reclaimer thread. */
static void release_moved(void *p) {
  struct ArrowArray *moved = p;
  moved->release(moved);
  dlsync__free(moved);
}

dlsync_status dlsync_arrow_release(dlsync_context *ctx, dlsync_lane *lane,
                                   struct ArrowDeviceArray *array) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_arrow_release");
  dlsync_status st = DLSYNC_SUCCESS;
  struct ArrowArray *moved = NULL;
  if (ctx == NULL || lane == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_arrow_release: %s is NULL",
                        ctx == NULL ? "ctx" : "lane");
  DLSYNC_TRY(check_array(array, "dlsync_arrow_release"));
  if (array->array.release == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_arrow_release: the array's release is NULL (released already)");
  moved = dlsync__malloc(sizeof *moved);
  if (moved == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_arrow_release: out of memory");
  *moved = array->array;
  DLSYNC_TRY(dlsync_release(ctx, lane, release_moved, moved));
  moved = NULL;
  array->array.release = NULL; /* moved: the interface's mark of a released array */
cleanup:
  dlsync__free(moved);
  return st;
}
