/* SPDX-License-Identifier: Apache-2.0 */
/* A lane's state as the driver reports it (include/dlsync/lane.h); the read
 * itself is stream/stream.h's dlsync__lane_read. */
#include "order/order.h"

dlsync_status dlsync_lane_query(dlsync_lane_state *out, dlsync_context *ctx,
                                const dlsync_lane *lane) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_lane_query");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now now;
  if (out == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_lane_query: %s is NULL",
                        out == NULL ? "out" : "ctx");
  DLSYNC_TRY(dlsync__lane_check(lane, "queried"));
  /* Reading does not modify the lane. */
  DLSYNC_TRY(dlsync__lane_read(&now, ctx->drv, (dlsync_lane *)(uintptr_t)lane, "queried"));
  out->kind = now.kind;
  out->capture_id = now.capture_id;
  out->graph = now.graph;
cleanup:
  return st;
}
