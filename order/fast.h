/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private, order/ only: the fast path's inline part, inlined into
 * each entry point (exchange.c); its steps out of line are in fast.c. */
#ifndef DLSYNC_ORDER_FAST_H
#define DLSYNC_ORDER_FAST_H

#include "order/rows.h"

/* The fast path: a plain row of the table (dlsync__row_is_plain: EAGER_EAGER,
 * JOIN, SAME_CAPTURE) and a warm thread. It carries out the plain rows by their calls
 * (row_plain_calls, row_same_capture_calls) without the general machinery: a plain record on
 * `first` and a wait on `then`, with the thread's scratch event of first's
 * context and no lock, or, when both streams are in one capture
 * (SAME_CAPTURE), first's dependencies added to then's. Asking the driver
 * about `then` is enough when it is eager: whether `first` is eager
 * (EAGER_EAGER) or capturing (JOIN), the row is plain, and the same two calls
 * carry it out (a capture of `first` that is invalidated fails the record,
 * which says so); tests/test_decision_table.c checks that both rows are
 * plain. `query` says which streams to ask about: FAST_QUERY_THEN (its
 * status; when it captures, it in full and `first` too, or only first's
 * status while dlsync__order_thread_of(t)->first_capture says it is eager; FAST_QUERY_THEN_FULL:
 * its full query at once, the cheaper order while this thread's begins find capturing consumers,
 * noted in dlsync__order_thread_of(t)->then_capture), both (FAST_QUERY_BOTH: both eager, or both in
 * one capture, SAME_CAPTURE, as at the end of a join: first's full query, then then's status or
 * full query; FAST_QUERY_BOTH_EAGER: the same rows, asked in the order cheapest when both are
 * eager: first's status query, and only when it captures the full queries of FAST_QUERY_BOTH) or
 * none (FAST_QUERY_NONE: the caller knows they are eager or share a capture). The two BOTH modes
 * note in dlsync__order_thread_of(t)->end_capture whether `first` was capturing: the end picks its
 * mode by it (every mode checks what it must, only the number of queries differs).
 *
 * Returns how the order went when it carried it out, DLSYNC__GENERAL when
 * the general path must (a stream that is capturing when it must not be, a
 * special stream handle, a first use on this thread, an event of another
 * context); nothing is queued then. */
static DLSYNC__INLINE dlsync_status order_fast(dlsync__thread *t, dlsync_context *ctx,
                                               dlsync__pair pair, fast_query query, fast_pre *pre) {
  const dlsync__driver *d = ctx->drv;
  /* The lanes' names, for messages: the op's (an end has no fast_pre). */
  const dlsync__roles *roles = dlsync__roles_of(pre != NULL ? pre->op : DLSYNC__OP_END);
  CUstream first = pair.first, then = pair.then;
  /* st: the plain row's (in a register); qst: the out-of-line steps' (set
   * when they say FAST_DONE), apart, for its address is taken. */
  dlsync_status st, qst;
  CUstreamCaptureStatus cs;
  CUevent ev;
  CUresult r;
  dlsync__pool *memo_pool;
  fast_next next = FAST_GO;
  if (dlsync__is_special_stream(first) || dlsync__is_special_stream(then) || first == then)
    return DLSYNC__GENERAL;
  /* With the decision log at TRACE, the general path runs, which names each
   * row (it asks the driver about both lanes). */
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    return DLSYNC__GENERAL;
  /* The thread's scratch event of first's pool; a thread that has none yet
   * (it has made no plain record and wait there) takes the general path,
   * which makes it: at once while its begins find eager consumers, after
   * the queries while they find captures, or when an end expects one
   * capture: no row inside a capture needs the scratch event (and after
   * FAST_QUERY_THEN_FULL's reads the general path goes on with them). */
  ev = dlsync__thread_scratch(t, &ctx->pools, first, &memo_pool);
  if (pre != NULL) /* for the general path, should it take over */
    pre->opened.pool = memo_pool;
  if (DLSYNC__UNLIKELY(ev == NULL) && query != FAST_QUERY_THEN_FULL && query != FAST_QUERY_FIRST_IN)
    return DLSYNC__GENERAL;
  /* Inline: the status queries of eager lanes; whatever captures goes out
   * of line. */
  if (query == FAST_QUERY_BOTH_EAGER) {
    r = d->StreamIsCapturing(first, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      return dlsync__fast_query_failed(d, r, false, first, roles->first);
    }
    if (DLSYNC__LIKELY(cs == CU_STREAM_CAPTURE_STATUS_NONE)) {
      query = FAST_QUERY_THEN;
    } else {
      dlsync__order_thread_of(t)->end_capture = true;
      query = FAST_QUERY_BOTH;
    }
  }
  if (query == FAST_QUERY_THEN) {
    r = d->StreamIsCapturing(then, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      return dlsync__fast_query_failed(d, r, false, then, roles->then);
    }
    if (DLSYNC__UNLIKELY(cs != CU_STREAM_CAPTURE_STATUS_NONE)) {
      /* FAST_QUERY_THEN comes from a begin or order whose thread found
       * eager consumers (dlsync__order_thread_of(t)->then_capture false) or from an end (no lanes):
       * only a capture changes the hint. */
      if (pre != NULL)
        dlsync__order_thread_of(t)->then_capture = true;
      /* Both in one capture (SAME_CAPTURE, as every exchange after the
       * first inside a capture) is plain too. */
      if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return DLSYNC__GENERAL;
      next = pre != NULL ? dlsync__fast_then_queries(t, ctx, pre, &qst) : FAST_GENERAL;
    }
  } else if (query == FAST_QUERY_THEN_FULL) {
    next = pre != NULL ? dlsync__fast_then_queries(t, ctx, pre, &qst) : FAST_GENERAL;
  } else if (query != FAST_QUERY_NONE) {
    next = query == FAST_QUERY_FIRST_IN ? dlsync__fast_first_in_queries(t, d, first, then, &qst)
                                        : dlsync__fast_both_queries(t, d, first, then, &qst);
  }
  if (DLSYNC__UNLIKELY(next != FAST_GO))
    return next == FAST_DONE ? qst : DLSYNC__GENERAL;
  if (DLSYNC__UNLIKELY(ev == NULL))
    return DLSYNC__GENERAL; /* pre->have: both lanes read */
  /* EAGER_EAGER or JOIN: the row's two calls with the thread's scratch event. */
  r = row_plain_calls(ctx, ev, pair, roles, &st);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return dlsync__fast_record_failed(ctx, r, first, roles->first, &qst) ? qst : DLSYNC__GENERAL;
  return st;
}

#endif
