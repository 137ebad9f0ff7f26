/* SPDX-License-Identifier: Apache-2.0 */
/* DLPack: tensor fields dlsync reads, and __dlpack__ stream values.
 * include/dlsync/dlpack.h has the contract; interop/dlpack_abi.h the layout. */
#include <string.h>

#include "interop/dlpack_abi.h"
#include "order/order.h"

typedef void (*deleter_fn)(struct DLManagedTensorVersioned *self);

void dlsync_dlpack_call_deleter(struct DLManagedTensorVersioned *t) {
  deleter_fn deleter = NULL;
  if (t == NULL)
    return;
  memcpy(&deleter, (const unsigned char *)t + offsetof(dlsync__dlpack_managed, deleter),
         sizeof deleter);
  if (deleter != NULL)
    deleter(t);
}

static void release_thunk(void *arg) {
  dlsync_dlpack_call_deleter(arg);
}

dlsync_status dlsync_dlpack_release(dlsync_context *ctx, dlsync_lane *lane,
                                    struct DLManagedTensorVersioned *t) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_dlpack_release");
  if (t == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_dlpack_release: the tensor is NULL (nothing to release)");
  return dlsync_release(ctx, lane, release_thunk, t);
}

dlsync_status dlsync_dlpack_version(uint32_t *major, uint32_t *minor,
                                    const struct DLManagedTensorVersioned *t) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_dlpack_version");
  dlsync__dlpack_version v;
  if (major == NULL || minor == NULL || t == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_dlpack_version: %s is NULL",
                        major == NULL   ? "major"
                        : minor == NULL ? "minor"
                                        : "the tensor");
  memcpy(&v, (const unsigned char *)t + offsetof(dlsync__dlpack_managed, version), sizeof v);
  *major = v.major;
  *minor = v.minor;
  return DLSYNC_SUCCESS;
}

static dlsync_lane no_lane(void) {
  dlsync_lane lane;
  memset(&lane, 0, sizeof lane);
  lane.kind = DLSYNC_LANE_NONE;
  return lane;
}

/* For stream=1: the legacy stream cannot wait for a capturing producer. */
static dlsync_status check_legacy_consumer(dlsync_context *ctx, const dlsync_lane *producer) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_lane_state now;
  if (ctx == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "dlsync_dlpack_stream: ctx is NULL but a producer lane was given (its "
                      "capture state is read for stream=1)");
    goto cleanup;
  }
  DLSYNC_TRY(dlsync_lane_query(&now, ctx, producer));
  if (now.kind == DLSYNC_LANE_CAPTURING) {
    st = dlsync__fail(
        DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE,
        "__dlpack__(stream=1) asks for the legacy default stream, but the producer stream %p is "
        "being captured (capture id %llu): the legacy stream waiting for it would invalidate "
        "the capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). Pass the consumer's own stream "
        "handle instead (the stream it captures on, so its work joins the same graph), or -1 "
        "for no ordering",
        (void *)producer->stream, (unsigned long long)now.capture_id);
  }
cleanup:
  return st;
}

dlsync_status dlsync_dlpack_stream(dlsync_lane *out, bool *ordered, dlsync_context *ctx,
                                   int64_t stream_value, const dlsync_lane *producer) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_dlpack_stream");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_lane lane = no_lane();
  bool want = false;
  if (out == NULL || ordered == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_dlpack_stream: %s is NULL",
                      out == NULL ? "out" : "ordered");
    goto cleanup;
  }
  if (producer != NULL)
    DLSYNC_TRY(dlsync__lane_check(producer, "producer"));
  if (stream_value == DLSYNC_DLPACK_STREAM_NO_SYNC)
    goto cleanup; /* the consumer asked for no ordering */
  if (stream_value == 0) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "__dlpack__ stream value 0 is disallowed for CUDA by the DLPack "
                      "specification (it is ambiguous between the legacy and the per-thread "
                      "default stream): pass 1 for the legacy default stream, 2 for the "
                      "per-thread default stream, a stream handle, or -1 for no ordering");
    goto cleanup;
  }
  if (stream_value < 0) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "__dlpack__ stream value %lld is not valid: -1 (no ordering), 1 (legacy "
                      "default stream), 2 (per-thread default stream) or a stream handle",
                      (long long)stream_value);
    goto cleanup;
  }
  if (stream_value == DLSYNC_DLPACK_STREAM_LEGACY) {
    if (producer != NULL)
      DLSYNC_TRY(check_legacy_consumer(ctx, producer));
    lane = dlsync_lane_stream(DLSYNC_STREAM_LEGACY);
  } else if (stream_value == DLSYNC_DLPACK_STREAM_PER_THREAD) {
    lane = dlsync_lane_stream(DLSYNC_STREAM_PER_THREAD);
  } else {
    lane = dlsync_lane_stream((struct CUstream_st *)(uintptr_t)stream_value);
  }
  want = true;
cleanup:
  if (out != NULL)
    *out = st == DLSYNC_SUCCESS ? lane : no_lane();
  if (ordered != NULL)
    *ordered = st == DLSYNC_SUCCESS && want;
  return st;
}
