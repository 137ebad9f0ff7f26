/* SPDX-License-Identifier: Apache-2.0 */
/* The general path: lanes checked, opened and read, the row classified and
 * carried out by its function (rows.h); and the graph lanes' path, which is
 * the same without what the general path does for every kind of lane. */
#include <string.h>

#include "order/rows.h"

dlsync_status dlsync__order_row(dlsync_context *ctx, dlsync__order_step *step, pool_pick *pk,
                                dlsync__lane_now *first, dlsync__lane_now *then) {
  return order_row_inline(ctx, step, pk, (row_lanes){first, then}, true);
}

dlsync_status dlsync__order_lanes(dlsync_context *ctx, dlsync__op op, dlsync_lane *first,
                                  dlsync_lane *then, dlsync__lanes_opened *opened) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__roles *roles = dlsync__roles_of(op);
  dlsync__lane_now *a = &opened->a, *b = &opened->b;
  opened->same = false;
  if (opened->read) /* two distinct stream lanes, neither special: checked by the fast path */
    goto open;
  DLSYNC_TRY(dlsync__lane_check(first, roles->first));
  DLSYNC_TRY(dlsync__lane_check(then, roles->then));
  if (first->kind == DLSYNC_LANE_STREAM && then->kind == DLSYNC_LANE_STREAM &&
      dlsync__same_stream(first->stream, then->stream)) {
    /* One stream: already ordered. One query, for its errors. */
    DLSYNC_TRY(dlsync__lane_read(a, ctx->drv, first, roles->first));
    *b = *a;
    b->role = roles->then;
    opened->same = true;
    if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
      dlsync__trace_row(op, DLSYNC__ROW_SAME_STREAM, a, b, DLSYNC_SUCCESS);
    goto cleanup;
  }
open : {
  const dlsync__lanes_ask ask = {roles->first, roles->then, "both lanes are graph lanes", true};
  DLSYNC_TRY(dlsync__lanes_open(opened, ctx, first, then, &ask));
}
cleanup:
  return st;
}

/* The rows of the table that put nodes in a built graph, for a thread whose
 * memo knows the stream lane's pool: EAGER_TO_BUILT, CAPTURE_TO_BUILT,
 * BUILT_TO_CAPTURE (a stream lane and a graph lane) and TWO_BUILT (two graph
 * lanes: the pool of the thread's current context, as the general path
 * finds it), and the graph lanes' other rows (SAME_BUILT,
 * REFUSE_BUILT_TO_EAGER). The same checks as dlsync__order_lanes, without
 * what it does for every kind of lane (the lanes are checked, the stream
 * asked about once in full, the built lanes read), then the row classified
 * and carried out by its function, as on the general path. The memo's pool
 * is checked as the row functions check it. DLSYNC__GENERAL, nothing done:
 * the general path must (two stream lanes, a special stream handle, a stream
 * the memo does not know, the decision log at TRACE, which names each row). */
dlsync_status dlsync__order_graph_fast(dlsync_context *ctx, dlsync__thread *t, dlsync_lane *first,
                                       dlsync_lane *then) {
  const dlsync__driver *d = ctx->drv;
  dlsync_status st;
  dlsync__lane_now a, b;
  dlsync_lane *stream_lane = NULL;
  dlsync__lane_now *stream_now = NULL;
  const char *stream_role = NULL;
  pool_pick pk;
  dlsync__order_step step;
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)) || first == NULL || then == NULL)
    return DLSYNC__GENERAL;
  if (first->kind == DLSYNC_LANE_GRAPH && then->kind == DLSYNC_LANE_STREAM) {
    stream_lane = then;
    stream_now = &b;
    stream_role = "then";
  } else if (first->kind == DLSYNC_LANE_STREAM && then->kind == DLSYNC_LANE_GRAPH) {
    stream_lane = first;
    stream_now = &a;
    stream_role = "first";
  } else if (first->kind != DLSYNC_LANE_GRAPH || then->kind != DLSYNC_LANE_GRAPH) {
    return DLSYNC__GENERAL;
  }
  pk.pool = NULL;
  pk.from_memo = false;
  pk.stream = NULL;
  pk.role = NULL;
  pk.t = t;
  if (stream_lane != NULL) {
    if (stream_lane->graph != NULL || dlsync__is_special_stream(stream_lane->stream))
      return DLSYNC__GENERAL; /* the general path names what is wrong, or reads it its way */
    (void)dlsync__thread_scratch(t, &ctx->pools, stream_lane->stream, &pk.pool);
    if (pk.pool == NULL)
      return DLSYNC__GENERAL;
    pk.from_memo = true;
    pk.stream = stream_lane->stream;
    pk.role = stream_role;
  }
  st = first->kind == DLSYNC_LANE_GRAPH ? dlsync__lane_check_graph(first, "first")
                                        : dlsync__lane_check(first, "first");
  if (st == DLSYNC_SUCCESS)
    st = then->kind == DLSYNC_LANE_GRAPH ? dlsync__lane_check_graph(then, "then")
                                         : dlsync__lane_check(then, "then");
  if (st != DLSYNC_SUCCESS)
    return st;
  if (stream_lane != NULL) {
    dlsync__capture_info ci;
    dlsync__lane_query(&ci, d, stream_lane->stream);
    st = dlsync__lane_take(stream_now, d, stream_lane, stream_role, &ci);
    if (st != DLSYNC_SUCCESS)
      return st;
    if (stream_lane == then) /* the hint for the fast path's queries */
      dlsync__order_thread_of(t)->then_capture = b.kind != DLSYNC_LANE_EAGER;
  } else if (first->graph != then->graph) {
    /* Two graphs: an event of the thread's current context; one graph
     * (SAME_BUILT) takes edges and no event. */
    st = dlsync__pool_for_current(&pk.pool, &ctx->pools, "both lanes are graph lanes");
    if (st != DLSYNC_SUCCESS)
      return st;
  }
  if (first->kind == DLSYNC_LANE_GRAPH)
    dlsync__lane_read_built(&a, first, "first");
  if (then->kind == DLSYNC_LANE_GRAPH)
    dlsync__lane_read_built(&b, then, "then");
  /* The table's row and its function, as on the general path. */
  step.op = DLSYNC__OP_ORDER;
  step.first_pending = false;
  step.keep_edges = false;
  /* TRACE: not here (above) */
  return order_row_inline(ctx, &step, &pk, (row_lanes){&a, &b}, false);
}
