/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private, order/ only: the decision table's rows, one function each
 * (the table: include/dlsync/exchange.h; the classifier: table.h; why each
 * row does what it does: docs/design.md sections 3 and 4).
 *
 * Each row exists once, here. The rows that the fast path also carries out
 * are split into their driver calls (row_*_calls: what the fast path makes
 * with what it has read, an event in hand, no lane written) and the row
 * function around them (the event taken, the pool's memo answer checked);
 * both paths call the same calls. The hot ones are inline so that a path
 * carries a row out without a call frame of its own (scripts/instr-count.sh
 * counts it); the cold parts, failures and refusals live in rows.c.
 *
 * A row function takes the two lanes as read (dlsync__lane_read or the fast
 * path's reads) and pk, the pool its event comes from. */
#ifndef DLSYNC_ORDER_ROWS_H
#define DLSYNC_ORDER_ROWS_H

#include "order/exchange_int.h"

/* ---- rows.c: the cold parts ---- */

/* `then` failed to wait (cuStreamWaitEvent) for an event recorded on
 * `first`: DLSYNC_ERROR_CROSS_DEVICE naming both devices when they differ,
 * else the driver's status. */
DLSYNC__COLD dlsync_status dlsync__fail_wait(dlsync_context *ctx, CUresult r, dlsync__pair p,
                                             const dlsync__roles *roles);
/* A failed cuEventRecord of an event on p.first. */
DLSYNC__COLD dlsync_status dlsync__fail_record(const dlsync__driver *d, CUresult r, dlsync__pair p,
                                               const dlsync__roles *roles);
/* A failed dependency update of p.then taking n dependencies. */
DLSYNC__COLD dlsync_status dlsync__fail_add(const dlsync__driver *d, CUresult r, dlsync__pair p,
                                            const dlsync__roles *roles, size_t n);
/* EAGER_TO_CAPTURE's external wait in capture `id` failed. */
DLSYNC__COLD dlsync_status dlsync__fail_external_wait(const dlsync__driver *d, CUresult r,
                                                      dlsync__pair p, const dlsync__roles *roles,
                                                      uint64_t id);
/* CAPTURE_TO_BUILT's external record failed. */
DLSYNC__COLD dlsync_status dlsync__fail_external_record_for_graph(const dlsync__driver *d,
                                                                  CUresult r,
                                                                  const dlsync__lane_now *first,
                                                                  const dlsync__lane_now *then);
/* The memo's pool is not the stream's: forget the memo, look the pool up. */
DLSYNC__COLD dlsync_status dlsync__repick_pool(dlsync_context *ctx, pool_pick *pk);

/* EAGER_EAGER, JOIN (the general path's way: a pooled event). */
dlsync_status dlsync__row_record_wait(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                                      dlsync__lane_now *then);
/* SAME_CAPTURE (the general path's way: first's dependencies read again
 * when too many to have been copied). */
dlsync_status dlsync__row_same_capture(const dlsync__driver *d, dlsync__lane_now *first,
                                       dlsync__lane_now *then);
/* SAME_CAPTURE keeping first's edge data (DLSYNC_EXCHANGE_KEEP_EDGE_DATA):
 * first's dependencies read again with their edge data, handed to then's
 * with it. */
dlsync_status dlsync__row_same_capture_keep(const dlsync__driver *d, dlsync__lane_now *first,
                                            dlsync__lane_now *then);
/* SAME_BUILT: then's frontier takes first's (a union, no duplicates). */
dlsync_status dlsync__row_same_built(dlsync__lane_now *first, dlsync__lane_now *then);
/* The refusals: DLSYNC_ERROR_CAPTURE_ORDER, nothing queued. */
dlsync_status dlsync__row_refuse_built_to_eager(const dlsync__lane_now *first,
                                                const dlsync__lane_now *then);
dlsync_status dlsync__row_refuse_end_to_eager(const dlsync__lane_now *c, const dlsync__lane_now *p);
dlsync_status dlsync__row_refuse_end_cross(void);
/* One line of the decision log for a decision. */
DLSYNC__NOINLINE void dlsync__trace_row(dlsync__op op, dlsync__row row,
                                        const dlsync__lane_now *first, const dlsync__lane_now *then,
                                        dlsync_status st);

/* The rows that add nodes (their functions below), before anything is
 * queued: a lane in a declared body (graph/body.h) gets its event node
 * hoisted into the body's parent (rows.c: *done then true, the row carried
 * out) or the row is refused. One load while no context has a body; the rest
 * out of line (rows.c), which names the row by the lanes' kinds. */
DLSYNC__COLD dlsync_status dlsync__body_guard_slow(dlsync_context *ctx, pool_pick *pk,
                                                   dlsync__lane_now *first, dlsync__lane_now *then,
                                                   bool *done);
#define BODY_GUARD(ctx, pk, first, then)                                      \
  do {                                                                        \
    if (DLSYNC__UNLIKELY(dlsync__bodies_any(&(ctx)->bodies))) {               \
      bool body_done_ = false;                                                \
      DLSYNC_TRY(dlsync__body_guard_slow(ctx, pk, first, then, &body_done_)); \
      if (body_done_)                                                         \
        goto cleanup;                                                         \
    }                                                                         \
  } while (0)

/* The driver refused an event of another context (a stream handle reused
 * in another context, found through the memo). */
static inline bool context_mismatch(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_CONTEXT;
}

/* Before an event goes into a graph node, make sure the pool is the one of the
 * stream's context: a memo answer is checked with cuStreamGetCtx (the driver
 * does not check an event node's context, nor an external record's). Inline
 * (as verify_pool) into the rows that add nodes: a call of its own costs more
 * than the check, which is one test when the pool is not from the memo. */
static DLSYNC__INLINE dlsync_status check_memo_pool(dlsync_context *ctx, pool_pick *pk) {
  dlsync_status st = DLSYNC_SUCCESS;
  if (!pk->from_memo)
    return DLSYNC_SUCCESS;
  DLSYNC_TRY(dlsync__pool_check(&pk->pool, &ctx->pools, pk->stream, pk->role));
  pk->from_memo = false;
cleanup:
  return st;
}

/* check_memo_pool, then, since its call was on a stream, a capturing lane
 * whose dependencies were too many to copy is read again (the driver's array
 * is only valid until the next call on its stream). */
static DLSYNC__INLINE dlsync_status verify_pool(dlsync_context *ctx, pool_pick *pk,
                                                dlsync__lane_now *first, dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  if (!pk->from_memo)
    return DLSYNC_SUCCESS;
  DLSYNC_TRY(check_memo_pool(ctx, pk));
  DLSYNC_TRY(dlsync__lane_refresh(first, ctx->drv));
  DLSYNC_TRY(dlsync__lane_refresh(then, ctx->drv));
cleanup:
  return st;
}

/* ---- the rows ---- */

/* EAGER_EAGER's and JOIN's two calls, with an event of first's context in
 * hand: a plain record on first, a plain wait on then (JOIN: then joins
 * first's capture; a dependency update cannot, an eager stream's is
 * refused). A failed record returns its result and leaves *st alone: each
 * path has its own answer (the fast path hands over to the general path,
 * which takes an event of the right pool); a failed wait sets *st. */
static DLSYNC__INLINE CUresult row_plain_calls(dlsync_context *ctx, CUevent ev, dlsync__pair p,
                                               const dlsync__roles *roles, dlsync_status *st) {
  const dlsync__driver *d = ctx->drv;
  CUresult r = d->EventRecord(ev, p.first);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return r;
  r = d->StreamWaitEvent(p.then, ev, 0);
  *st = DLSYNC__LIKELY(r == CUDA_SUCCESS) ? DLSYNC_SUCCESS : dlsync__fail_wait(ctx, r, p, roles);
  return CUDA_SUCCESS;
}

/* SAME_CAPTURE's call: `then`'s next node must come after what `first`
 * captured so far. Adding first's dependencies to then's
 * (cuStreamUpdateCaptureDependencies, ADD: docs/design.md R12) makes the
 * edges a record on first and a wait on then make, in one call and without
 * an event (a record inside a capture copies the stream's dependencies into
 * the event, the wait copies them out again); nodes then already depends on
 * are not added twice. An empty set (first has captured nothing since it
 * began or joined) orders nothing: no call. `deps` may be the driver's
 * array: valid, for no call on first's stream came since it was read. */
static DLSYNC__INLINE dlsync_status row_same_capture_calls(const dlsync__driver *d, dlsync__pair p,
                                                           const dlsync__roles *roles,
                                                           const CUgraphNode *deps, size_t n) {
  CUresult r;
  if (n == 0)
    return DLSYNC_SUCCESS;
  /* The driver takes a non-const array that it only reads. */
  r = d->StreamUpdateCaptureDependencies(p.then, (CUgraphNode *)(uintptr_t)deps, NULL, n,
                                         CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (DLSYNC__LIKELY(r == CUDA_SUCCESS))
    return DLSYNC_SUCCESS;
  return dlsync__fail_add(d, r, p, roles, n);
}

/* EAGER_TO_CAPTURE's two calls, with an event that then's capture holds in
 * hand: recorded eagerly on first, then an external wait node in then's
 * capture. The record comes before the wait also because the driver refuses
 * an external wait on a pooled event whose last record was made in an
 * earlier capture (CUDA_ERROR_INVALID_VALUE: docs/design.md R14). Returns the
 * record's result (a failed record: the wait is not made); *wait_r is the
 * wait's, when the record was made. */
static DLSYNC__INLINE CUresult row_eager_to_capture_calls(const dlsync__driver *d, CUevent ev,
                                                          dlsync__pair p, CUresult *wait_r) {
  CUresult r = d->EventRecord(ev, p.first);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return r;
  *wait_r = d->StreamWaitEvent(p.then, ev, CU_EVENT_WAIT_EXTERNAL);
  return CUDA_SUCCESS;
}

/* EAGER_TO_CAPTURE: an event that then's capture holds (its hold takes it
 * from the pool), then row_eager_to_capture_calls. The pool may come from
 * the memo unchecked: the record itself says whether the event is of
 * first's context (a stream handle reused in another context fails it with
 * INVALID_HANDLE / INVALID_CONTEXT); then the memo is forgotten and an event
 * of the right pool taken (the first one stays with the capture, unused, and
 * comes back with its graph). */
static DLSYNC__INLINE dlsync_status row_eager_to_capture(dlsync_context *ctx, pool_pick *pk,
                                                         dlsync__lane_now *first,
                                                         dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  dlsync__pair p = dlsync__pair_of(first, then);
  CUevent ev = NULL;
  CUresult r, wr = CUDA_SUCCESS;
  BODY_GUARD(ctx, pk, first, then);
  DLSYNC_TRY(dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                         (dlsync__lane_pair){then, NULL}));
  r = row_eager_to_capture_calls(d, ev, p, &wr);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS) && pk->from_memo && context_mismatch(r)) {
    DLSYNC_TRY(dlsync__repick_pool(ctx, pk));
    DLSYNC_TRY(dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                           (dlsync__lane_pair){then, NULL}));
    r = row_eager_to_capture_calls(d, ev, p, &wr);
  }
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS || wr != CUDA_SUCCESS)) {
    dlsync__roles rl = dlsync__roles_of_lanes(first, then);
    st = r != CUDA_SUCCESS ? dlsync__fail_record(d, r, p, &rl)
                           : dlsync__fail_external_wait(d, wr, p, &rl, then->capture_id);
  }
cleanup:
  return st;
}

/* EAGER_TO_BUILT: an event that then's graph retains (the thread's batch
 * for built graphs, graph.h), recorded eagerly on first, then a wait node in
 * the built graph, which reads the event when the graph is launched. The
 * pool may come from the memo unchecked: the record says whether the event
 * is of first's context (a stream handle reused in another context fails it
 * with INVALID_HANDLE / INVALID_CONTEXT); then the memo is forgotten and an
 * event of the right pool taken (the first stays in its batch, unused, and
 * comes back with it). */
static DLSYNC__INLINE dlsync_status row_eager_to_built(dlsync_context *ctx, pool_pick *pk,
                                                       dlsync__lane_now *first,
                                                       dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  CUresult r;
  BODY_GUARD(ctx, pk, first, then);
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                       (dlsync__lane_list){&then, 1}));
  r = d->EventRecord(ev, first->stream);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS) && pk->from_memo && context_mismatch(r)) {
    DLSYNC_TRY(dlsync__repick_pool(ctx, pk));
    DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                         (dlsync__lane_list){&then, 1}));
    r = d->EventRecord(ev, first->stream);
  }
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    dlsync__roles rl = dlsync__roles_of_lanes(first, then);
    st = dlsync__fail_record(d, r, dlsync__pair_of(first, then), &rl);
    goto cleanup;
  }
  DLSYNC_TRY(dlsync__graph_append_event(d, then, ev, false));
cleanup:
  return st;
}

/* TWO_CAPTURES: an external record in first's capture (an event-record
 * node) and an external wait in then's (an event-wait node), both holding
 * the event (their holds take it from the pool at once). Two calls where
 * nodes added by hand take four (docs/design.md R13: the driver takes an
 * external wait on the record node of another capture still active). The
 * driver does not check the event's context there (R13), so a pool from the
 * memo is checked first (check_memo_pool). A failed wait leaves a record
 * node no one waits for: harmless. */
static DLSYNC__INLINE dlsync_status row_two_captures(dlsync_context *ctx, pool_pick *pk,
                                                     dlsync__lane_now *first,
                                                     dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  BODY_GUARD(ctx, pk, first, then);
  DLSYNC_TRY(check_memo_pool(ctx, pk)); /* no dependencies handed over: none read again */
  DLSYNC_TRY(dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                         (dlsync__lane_pair){first, then}));
  DLSYNC_CU(d, EventRecordWithFlags, (ev, first->stream, CU_EVENT_RECORD_EXTERNAL),
            "%s stream %p is capturing (capture %llu); adding an event-record node for %s "
            "stream %p (capture %llu)",
            first->role, (void *)first->stream, (unsigned long long)first->capture_id, then->role,
            (void *)then->stream, (unsigned long long)then->capture_id);
  dlsync__lane_deps_moved(first);
  DLSYNC_CU(d, StreamWaitEvent, (then->stream, ev, CU_EVENT_WAIT_EXTERNAL),
            "%s stream %p is capturing (capture %llu); adding an event-wait node on %s stream "
            "%p's record (capture %llu)",
            then->role, (void *)then->stream, (unsigned long long)then->capture_id, first->role,
            (void *)first->stream, (unsigned long long)first->capture_id);
  dlsync__lane_deps_moved(then);
cleanup:
  return st;
}

/* BUILT_TO_CAPTURE, TWO_BUILT: a record node in first's graph, a wait node
 * in then's, both retaining the event's batch. A capturing `then`
 * (BUILT_TO_CAPTURE) gets its wait node by hand: an external wait is
 * refused on an event whose last record was made in an ended capture
 * (docs/design.md R14), which a pooled one may be. */
static DLSYNC__INLINE dlsync_status row_two_graphs(dlsync_context *ctx, pool_pick *pk,
                                                   dlsync__lane_now *first,
                                                   dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUevent ev = NULL;
  dlsync__lane_now *lanes[2];
  BODY_GUARD(ctx, pk, first, then);
  DLSYNC_TRY(verify_pool(ctx, pk, first, then));
  lanes[0] = first;
  lanes[1] = then;
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                       (dlsync__lane_list){lanes, 2}));
  DLSYNC_TRY(dlsync__graph_append_event(ctx->drv, first, ev, true));
  DLSYNC_TRY(dlsync__graph_append_event(ctx->drv, then, ev, false));
cleanup:
  return st;
}

/* CAPTURE_TO_BUILT: as row_two_graphs, with the capture's record node made
 * by an external record (one call where a node added by hand takes two, and
 * no dependency array handed over, so none read again; the driver takes any
 * pooled event there: docs/design.md R13). */
static DLSYNC__INLINE dlsync_status row_capture_to_built(dlsync_context *ctx, pool_pick *pk,
                                                         dlsync__lane_now *first,
                                                         dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  dlsync__lane_now *lanes[2];
  CUresult r;
  BODY_GUARD(ctx, pk, first, then);
  DLSYNC_TRY(check_memo_pool(ctx, pk)); /* then is built: no dependencies read again */
  lanes[0] = first;
  lanes[1] = then;
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                       (dlsync__lane_list){lanes, 2}));
  r = d->EventRecordWithFlags(ev, first->stream, CU_EVENT_RECORD_EXTERNAL);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = dlsync__fail_external_record_for_graph(d, r, first, then);
    goto cleanup;
  }
  dlsync__lane_deps_moved(first);
  DLSYNC_TRY(dlsync__graph_append_event(d, then, ev, false));
cleanup:
  return st;
}

/* ---- the table: a row for two lanes, carried out ---- */

/* The table's row for two lanes as they are now (two distinct streams, or
 * lanes that are not one stream: order_lanes handles SAME_STREAM). */
static DLSYNC__INLINE dlsync__row classify_now(dlsync__op op, const dlsync__lane_now *first,
                                               const dlsync__lane_now *then, bool first_pending) {
  dlsync__table_in in;
  dlsync__where wf = dlsync__lane_where(first), wt = dlsync__lane_where(then);
  in.op = op;
  in.first = first->kind;
  in.then = then->kind;
  in.same_stream = false;
  in.same_graph = dlsync__where_same(&wf, &wt);
  in.first_pending = first_pending;
  return dlsync__table_classify(&in);
}

/* The two lanes of a row, first and then. */
typedef struct row_lanes {
  dlsync__lane_now *first, *then;
} row_lanes;

/* Classify, then carry out the row by its function. Inline into the graph
 * lanes' path (dlsync__order_graph_fast), where the op is known, and into
 * dlsync__order_row for the general path (lanes: first and then, by value:
 * inline, they stay in registers). may_trace: false where the caller
 * found the decision log below TRACE already (its level is set once,
 * base/log.c), which spares a second look. */
static DLSYNC__INLINE dlsync_status order_row_inline(dlsync_context *ctx, dlsync__order_step *step,
                                                     pool_pick *pk, row_lanes lanes,
                                                     bool may_trace) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now *first = lanes.first, *then = lanes.then;
  dlsync__row row = classify_now(step->op, first, then, step->first_pending);
  step->row = row;
  if (dlsync__row_nodes(row) > 0) {
    /* A built lane that gets a node must have room for its new frontier:
     * checked before anything is given to a graph. */
    if (first->kind == DLSYNC_LANE_BUILT)
      DLSYNC_TRY(dlsync__lane_fit(first->lane, 1, first->role, "the record node"));
    if (then->kind == DLSYNC_LANE_BUILT)
      DLSYNC_TRY(dlsync__lane_fit(then->lane, 1, then->role, "the wait node"));
  }
  switch (row) {
  case DLSYNC__ROW_EAGER_EAGER:
  case DLSYNC__ROW_JOIN:
    st = dlsync__row_record_wait(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_SAME_CAPTURE:
    st = step->keep_edges ? dlsync__row_same_capture_keep(ctx->drv, first, then)
                          : dlsync__row_same_capture(ctx->drv, first, then);
    break;
  case DLSYNC__ROW_EAGER_TO_CAPTURE:
    st = row_eager_to_capture(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_EAGER_TO_BUILT:
    st = row_eager_to_built(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_TWO_CAPTURES:
    st = row_two_captures(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_CAPTURE_TO_BUILT:
    st = row_capture_to_built(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_BUILT_TO_CAPTURE:
  case DLSYNC__ROW_TWO_BUILT:
    st = row_two_graphs(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_SAME_BUILT:
    st = dlsync__row_same_built(first, then);
    break;
  case DLSYNC__ROW_REFUSE_BUILT_TO_EAGER:
    st = dlsync__row_refuse_built_to_eager(first, then);
    break;
  case DLSYNC__ROW_REFUSE_END_TO_EAGER:
    st = dlsync__row_refuse_end_to_eager(first, then);
    break;
  case DLSYNC__ROW_REFUSE_END_CROSS:
    st = dlsync__row_refuse_end_cross();
    break;
  default: /* SAME_STREAM (order_lanes), and the fence's rows: not here */
    st = dlsync__fail(DLSYNC_ERROR_INTERNAL, "internal: row %s in %s (a bug in dlsync)",
                      dlsync__row_name(row), dlsync__op_name(step->op));
    break;
  }
cleanup:
  if (may_trace && DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    dlsync__trace_row(step->op, row, first, then, st);
  return st;
}

#endif
