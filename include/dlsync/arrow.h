/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync for the Arrow C Device data interface (optional; no Arrow
 * dependency: the structures below are the interface's own, guarded by its
 * macros, so Arrow's headers may come before or after this one).
 *
 * An ArrowDeviceArray hands CUDA buffers over with a `sync_event`: NULL, or
 * a pointer to a cudaEvent_t (CUevent) that the consumer must wait on before
 * it touches the buffers (for each of the CUDA device types: ARROW_DEVICE_CUDA,
 * ARROW_DEVICE_CUDA_HOST, ARROW_DEVICE_CUDA_MANAGED). The interface says nothing about graph
 * capture, and its `release` is not stream-ordered. These calls add both:
 *
 * Producer, after a lane wrote the array's buffers:
 *
 *   dlsync_arrow_sync sync = DLSYNC_ARROW_SYNC_INIT;   // kept with the array
 *   dlsync_arrow_sync_event(&out, &sync, ctx, &lane);  // out.sync_event = &sync.event
 *   ... the array's release calls dlsync_arrow_sync_release(&sync) ...
 *
 *   The event is that of a fence signalled on the lane (fence.h, foreign.h):
 *   on an eager stream an event recorded now; in a capture or a graph built
 *   by hand the event of an event-record node, armed at each launch of that
 *   graph, so the consumer must wait after the launch (or from another graph
 *   with an external wait, launched after it). The event stays valid until
 *   dlsync_arrow_sync_release.
 *
 * Consumer, on its lane (eager, capturing or built), whatever its state:
 *
 *   dlsync_arrow_wait(ctx, &lane, &in, DLSYNC_PROVENANCE_EAGER, 0);
 *   ... work on the lane reading the buffers ...
 *   dlsync_arrow_release(ctx, &lane, &in);  // in.array.release runs after that work
 *
 *   The wait imports *sync_event with the provenance the producer's runtime
 *   gives it (foreign.h: an Arrow producer that records eagerly is EAGER;
 *   one whose graph records it with CU_EVENT_RECORD_EXTERNAL is
 *   EXTERNAL_RECORD) and waits on it as dlsync_fence_wait does. The release
 *   moves the array (array.release is NULL afterwards, as the interface's
 *   move semantics say) and calls the producer's release on dlsync's
 *   reclaimer thread once the work queued so far on the lane is done, or
 *   (capture, built graph) once that graph and its executables are gone
 *   (release.h).
 */
#ifndef DLSYNC_ARROW_H
#define DLSYNC_ARROW_H

#include <stdint.h>

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/fence.h"
#include "dlsync/foreign.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the Arrow C data interface's structures ---- */
#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE 2
#define ARROW_FLAG_MAP_KEYS_SORTED 4

struct ArrowSchema {
  const char *format;
  const char *name;
  const char *metadata;
  int64_t flags;
  int64_t n_children;
  struct ArrowSchema **children;
  struct ArrowSchema *dictionary;
  void (*release)(struct ArrowSchema *);
  void *private_data;
};

struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void **buffers;
  struct ArrowArray **children;
  struct ArrowArray *dictionary;
  void (*release)(struct ArrowArray *);
  void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

/* ---- the Arrow C Device data interface's structures ---- */
#ifndef ARROW_C_DEVICE_DATA_INTERFACE
#define ARROW_C_DEVICE_DATA_INTERFACE

typedef int32_t ArrowDeviceType;

#define ARROW_DEVICE_CPU 1
#define ARROW_DEVICE_CUDA 2
#define ARROW_DEVICE_CUDA_HOST 3
#define ARROW_DEVICE_OPENCL 4
#define ARROW_DEVICE_VULKAN 7
#define ARROW_DEVICE_METAL 8
#define ARROW_DEVICE_VPI 9
#define ARROW_DEVICE_ROCM 10
#define ARROW_DEVICE_ROCM_HOST 11
#define ARROW_DEVICE_EXT_DEV 12
#define ARROW_DEVICE_CUDA_MANAGED 13
#define ARROW_DEVICE_ONEAPI 14
#define ARROW_DEVICE_WEBGPU 15
#define ARROW_DEVICE_HEXAGON 16

struct ArrowDeviceArray {
  struct ArrowArray array;
  int64_t device_id;
  ArrowDeviceType device_type;
  void *sync_event; /* CUDA: NULL or a cudaEvent_t* */
  int64_t reserved[3];
};

#endif /* ARROW_C_DEVICE_DATA_INTERFACE */

/* What a producer keeps with an exported array: the fence whose event
 * sync_event points to. */
typedef struct dlsync_arrow_sync {
  dlsync_fence *fence;
  struct CUevent_st *event; /* the array's sync_event points here */
} dlsync_arrow_sync;

#define DLSYNC_ARROW_SYNC_INIT \
  { NULL, NULL }

/* Producer: fills array->sync_event (&sync->event) with an event that marks
 * the work queued so far on `lane` (the array's buffers written).
 * Returns: DLSYNC_SUCCESS; sync holds a fence until dlsync_arrow_sync_release.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (a NULL argument; a device type that
 *   is none of ARROW_DEVICE_CUDA, _CUDA_HOST and _CUDA_MANAGED; non-zero
 *   reserved bytes; sync already holding a fence), the errors of
 *   dlsync_fence_signal; array and sync are left as they were and nothing
 *   is queued.
 * Threads: any thread. Capture: legal in every mode; it never breaks a
 *   capture. */
DLSYNC_API dlsync_status dlsync_arrow_sync_event(struct ArrowDeviceArray *array,
                                                 dlsync_arrow_sync *sync, dlsync_context *ctx,
                                                 dlsync_lane *lane);

/* Producer: drops the fence behind the event (call it from the array's
 * release, or when the array was never handed over). NULL, or a sync holding
 * nothing: a no-op.
 * Threads: any thread; not racing a consumer's wait on the event.
 * Capture: legal in every mode. */
DLSYNC_API void dlsync_arrow_sync_release(dlsync_arrow_sync *sync);

/* Consumer: orders `lane`'s later work after the array's sync_event,
 * recorded as `provenance` says (capture_id: for CAPTURED, see foreign.h). A
 * NULL sync_event means nothing to wait on: DLSYNC_SUCCESS, nothing queued.
 * Returns: DLSYNC_SUCCESS, the order in place.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL ctx, lane or array; a device
 *   type that is none of ARROW_DEVICE_CUDA, _CUDA_HOST and _CUDA_MANAGED;
 *   non-zero reserved bytes; an array already released (release NULL);
 *   sync_event pointing to a NULL event),
 *   the errors of dlsync_fence_import and dlsync_fence_wait; nothing is
 *   queued then.
 * Threads: any thread. Capture: legal in every mode; it never breaks a
 *   capture. */
DLSYNC_API dlsync_status dlsync_arrow_wait(dlsync_context *ctx, dlsync_lane *lane,
                                           const struct ArrowDeviceArray *array,
                                           dlsync_provenance provenance, uint64_t capture_id);

/* Consumer: moves the array out of *array (its release becomes NULL) and
 * calls the producer's release once the work queued so far on `lane` is
 * done (release.h: on dlsync's reclaimer thread, which may call CUDA).
 * Returns: DLSYNC_SUCCESS; the release will run exactly once.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL ctx, lane or array; a device
 *   type that is none of ARROW_DEVICE_CUDA, _CUDA_HOST and _CUDA_MANAGED;
 *   non-zero reserved bytes; a NULL release: released already), DLSYNC_ERROR_OUT_OF_MEMORY, the
 * errors of dlsync_release; the array is then still the caller's, untouched. Threads: any thread;
 * never blocks. Capture: legal in every mode. */
DLSYNC_API dlsync_status dlsync_arrow_release(dlsync_context *ctx, dlsync_lane *lane,
                                              struct ArrowDeviceArray *array);

#ifdef __cplusplus
}
#endif

#endif
