/* SPDX-License-Identifier: Apache-2.0 */
/* A library's own graph launched on any lane (include/dlsync/graph.h); the
 * launch itself is graph/graph.h's dlsync__graph_launch_at. */
#include "order/order.h"

dlsync_status dlsync_graph_launch(dlsync_context *ctx, struct CUgraph_st *graph,
                                  struct CUgraphExec_st *exec, dlsync_lane *lane) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_graph_launch");
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_graph_launch: ctx is NULL");
  return dlsync__graph_launch_at(ctx->drv, &ctx->bodies, graph, exec, lane);
}
