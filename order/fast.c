/* SPDX-License-Identifier: Apache-2.0 */
/* The fast path's steps out of line (fast.h has its inline part): what it
 * does when a lane captures. Each row goes through its function or its calls
 * in rows.h, with what the fast path has read. */
#include "order/rows.h"

dlsync_status dlsync__fast_query_failed(const dlsync__driver *d, CUresult r, bool full, CUstream s,
                                        const char *role) {
  dlsync_status st =
      dlsync__fail_driver(d, r, full ? "cuStreamGetCaptureInfo" : "cuStreamIsCapturing",
                          "%s stream %p", role, (void *)s);
  dlsync__fail_nothing_queued();
  return st;
}

bool dlsync__fast_record_failed(dlsync_context *ctx, CUresult r, CUstream first,
                                const char *first_role, dlsync_status *st) {
  dlsync__pair p;
  dlsync__roles rl;
  if (context_mismatch(r)) {
    /* A stream handle reused in another context: the general path asks the
     * driver which pool is the stream's now. */
    dlsync__pool_memo_forget(&ctx->pools, first);
    return false;
  }
  p.first = first;
  p.then = NULL;
  rl.first = first_role;
  rl.then = NULL;
  *st = dlsync__fail_record(ctx->drv, r, p, &rl);
  return true;
}

/* The pair of a fast_pre's lanes. */
static DLSYNC__INLINE dlsync__pair pre_pair(const fast_pre *pre) {
  dlsync__pair p;
  p.first = pre->first->stream;
  p.then = pre->then->stream;
  return p;
}

/* dlsync_order, both lanes read (then's in full, first's in full or, eager,
 * by its status) and not plain: the table's rows that two stream lanes make
 * and a graph takes part in (EAGER_TO_CAPTURE, TWO_CAPTURES) are carried out
 * here by their functions, with the memo's pool, checked as the general
 * path checks it; the general path takes the others, and a stream whose
 * pool the memo does not know. */
static DLSYNC__INLINE bool fast_graph_rows(dlsync_context *ctx, dlsync__thread *th, fast_pre *pre,
                                           dlsync_status *st) {
  dlsync__lane_now *f = &pre->opened.a, *t = &pre->opened.b;
  pool_pick pk;
  dlsync__row row;
  if (pre->op != DLSYNC__OP_ORDER || pre->opened.pool == NULL)
    return false;
  row = classify_now(DLSYNC__OP_ORDER, f, t, false);
  if (row != DLSYNC__ROW_EAGER_TO_CAPTURE && row != DLSYNC__ROW_TWO_CAPTURES)
    return false;
  pk.pool = pre->opened.pool;
  pk.from_memo = true;
  pk.stream = pre->first->stream;
  pk.role = pre_roles(pre)->first;
  pk.t = th;
  *st = row == DLSYNC__ROW_EAGER_TO_CAPTURE ? row_eager_to_capture(ctx, &pk, f, t)
                                            : row_two_captures(ctx, &pk, f, t);
  return true;
}

/* dlsync_order's EAGER_TO_CAPTURE (`first` eager, `then` in capture ct)
 * with an event of the memo's pool at hand in the thread's reserve for that
 * capture (dlsync__graph_capture_event_reserved): the row's calls
 * (row_eager_to_capture_calls), without writing the lanes or classifying.
 * False, nothing queued: no event at hand (row_eager_to_capture goes on,
 * which takes some under the pool's lock), or the record says the memo's
 * pool is not first's (a stream handle reused in another context: the event
 * stays with the capture, unused; the memo is forgotten and the general path
 * looks the pool up). */
static DLSYNC__INLINE bool fast_eager_to_capture(dlsync_context *ctx, dlsync__thread *th,
                                                 fast_pre *pre, const dlsync__capture_info *ct,
                                                 dlsync_status *st) {
  const dlsync__driver *d = ctx->drv;
  dlsync__pair p = pre_pair(pre);
  CUevent ev;
  CUresult r, wr = CUDA_SUCCESS;
  /* No conditional-body check here (BODY_GUARD): an event is reserved for a
   * capture only by an order into it that passed the check (the first
   * takes the reserve), and a graph declared a body after such an order
   * holds its wait node already. */
  if (DLSYNC__UNLIKELY(pre->opened.pool == NULL))
    return false;
  ev = dlsync__graph_capture_event_reserved(th, &ctx->pools, pre->opened.pool, ct->id);
  if (DLSYNC__UNLIKELY(ev == NULL))
    return false;
  /* *st is DLSYNC_SUCCESS (fast_then_full): written only on failure, which
   * keeps the way out of success in line. */
  r = row_eager_to_capture_calls(d, ev, p, &wr);
  if (DLSYNC__UNLIKELY(wr != CUDA_SUCCESS))
    *st = dlsync__fail_external_wait(d, wr, p, pre_roles(pre), ct->id);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    if (!context_mismatch(r)) {
      *st = dlsync__fail_record(d, r, p, pre_roles(pre));
      return true;
    }
    /* A stream handle reused in another context: the general path asks the
     * driver which pool is first's now. */
    dlsync__pool_memo_forget(&ctx->pools, p.first);
    pre->opened.pool = NULL;
    return false;
  }
  return true;
}

/* `then` read in full (FAST_QUERY_THEN_FULL, or FAST_QUERY_THEN once its
 * status said it captures). Eager: true, *plain (no more queries).
 * Capturing: `first` asked about too (its status while the thread's hint
 * says it is eager, else, or when it captures, its full query); one capture
 * (SAME_CAPTURE): the row's call (first's dependencies added to then's),
 * true, *st says how it went. A failed read: true, *st says why. False: the
 * general path goes on with both reads, reading neither stream again. */
static DLSYNC__INLINE bool fast_then_full(dlsync_context *ctx, dlsync__thread *th, fast_pre *pre,
                                          dlsync_status *st, bool *plain) {
  const dlsync__driver *d = ctx->drv;
  const dlsync__pair pv = pre_pair(pre), *p = &pv;
  dlsync__capture_info ct, cf;
  *plain = false;
  *st = DLSYNC_SUCCESS;
  dlsync__lane_query(&ct, d, p->then);
  if (DLSYNC__LIKELY(dlsync__capture_info_eager(&ct))) {
    dlsync__order_thread_of(th)->then_capture = false;
    *plain = true;
    return true;
  }
  if (DLSYNC__UNLIKELY(!dlsync__capture_info_active(&ct))) {
    *st = dlsync__lane_take(&pre->opened.b, d, pre->then, pre_roles(pre)->then, &ct); /* why not */
    return true;
  }
  dlsync__order_thread_of(th)->then_capture = true;
  /* `first`: while this thread's orders find it eager (the hint), its
   * status is enough to go on (EAGER_TO_CAPTURE), one cuStreamIsCapturing
   * where a full query costs more; when it captures, its full query after
   * all (one call more, once: the hint turns). */
  if (DLSYNC__LIKELY(!dlsync__order_thread_of(th)->first_capture)) {
    CUstreamCaptureStatus fs;
    CUresult r = d->StreamIsCapturing(p->first, &fs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      *st = dlsync__fast_query_failed(d, r, false, p->first, pre_roles(pre)->first);
      return true;
    }
    if (DLSYNC__LIKELY(fs == CU_STREAM_CAPTURE_STATUS_NONE)) {
      if (pre->op == DLSYNC__OP_ORDER && fast_eager_to_capture(ctx, th, pre, &ct, st))
        return true;
      dlsync__lane_read_eager(&pre->opened.a, pre->first, pre_roles(pre)->first);
      (void)dlsync__lane_take(&pre->opened.b, d, pre->then, pre_roles(pre)->then, &ct);
      pre->have = true;
      return fast_graph_rows(ctx, th, pre, st);
    }
    dlsync__order_thread_of(th)->first_capture = true;
  }
  dlsync__lane_query(&cf, d, p->first);
  dlsync__order_thread_of(th)->first_capture = !dlsync__capture_info_eager(&cf);
  if (dlsync__capture_info_active(&cf) && cf.id == ct.id) { /* SAME_CAPTURE */
    if (pre->ex != NULL) {
      pre->ex->bits |= EX_ONE_CAPTURE;
      pre->ex->capture_id = ct.id;
    }
    /* first's array is valid: the query since was of `then`. *st is
     * DLSYNC_SUCCESS: written only on failure, which keeps success (an
     * empty set, no call) out of gcc's .cold section. */
    dlsync_status added = row_same_capture_calls(d, pv, pre_roles(pre), cf.deps, cf.n);
    if (DLSYNC__UNLIKELY(added != DLSYNC_SUCCESS))
      *st = added;
    return true;
  }
  if (DLSYNC__LIKELY(dlsync__capture_info_eager(&cf)) && pre->op == DLSYNC__OP_ORDER &&
      fast_eager_to_capture(ctx, th, pre, &ct, st))
    return true;
  /* Not plain: both lanes written for the graph rows or the general path
   * (then's dependency array is still valid: the query since was of
   * another stream). */
  (void)dlsync__lane_take(&pre->opened.b, d, pre->then, pre_roles(pre)->then, &ct);
  *st = dlsync__lane_take(&pre->opened.a, d, pre->first, pre_roles(pre)->first, &cf);
  if (*st != DLSYNC_SUCCESS)
    return true;
  pre->have = true;
  return fast_graph_rows(ctx, th, pre, st);
}

/* The fast path's queries when a lane captures, or may (the modes other
 * than FAST_QUERY_THEN and FAST_QUERY_NONE with both eager): out of line, so
 * that the eager path stays short, in two functions of few arguments (all
 * in registers). */
fast_next dlsync__fast_then_queries(dlsync__thread *t, dlsync_context *ctx, fast_pre *pre,
                                    dlsync_status *st) {
  /* FAST_QUERY_THEN: its status query said `then` captures. */
  bool plain;
  if (!fast_then_full(ctx, t, pre, st, &plain))
    return FAST_GENERAL;
  return plain ? FAST_GO : FAST_DONE;
}

/* FAST_QUERY_BOTH (and BOTH_EAGER with `first` capturing): the full query
 * of `first`; when it captures, its id tells whether `then` is in the same
 * capture (SAME_CAPTURE, the end of a join: first's dependencies, from that
 * query, are added to then's by the row's call), for one more query of
 * `then`. With one_capture (FAST_QUERY_FIRST_IN: an end whose begin found
 * both streams in capture dlsync__order_thread_of(t)->end_capture_id, EX_ONE_CAPTURE), `first`
 * still in that capture is enough: so is `then` (docs/design.md R11), and it is not asked. For
 * FAST_QUERY_BOTH_EAGER `first` was found capturing by its status query already. */
static DLSYNC__INLINE fast_next end_queries(dlsync__thread *t, const dlsync__driver *d,
                                            dlsync__pair pv, bool one_capture, dlsync_status *st) {
  const dlsync__pair *p = &pv;
  const dlsync__roles *roles = dlsync__roles_of(DLSYNC__OP_END);
  CUstreamCaptureStatus cs;
  CUresult r;
  cuuint64_t id_first = 0, id_then = 0;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL; /* asked for, or an edge with data fails the query */
  size_t n = 0;
  r = d->StreamGetCaptureInfo(p->first, &cs, &id_first, NULL, &deps, &edges, &n);
  if (r != CUDA_SUCCESS) {
    *st = dlsync__fast_query_failed(d, r, true, p->first, roles->first);
    return FAST_DONE;
  }
  dlsync__order_thread_of(t)->end_capture = cs != CU_STREAM_CAPTURE_STATUS_NONE;
  if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    if (!one_capture || id_first != dlsync__order_thread_of(t)->end_capture_id) {
      r = d->StreamGetCaptureInfo(p->then, &cs, &id_then, NULL, NULL, NULL, NULL);
      if (r != CUDA_SUCCESS) {
        *st = dlsync__fast_query_failed(d, r, true, p->then, roles->then);
        return FAST_DONE;
      }
      if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || id_then != id_first)
        return FAST_GENERAL;
    }
    /* SAME_CAPTURE; first's array is valid (the query since was of then). */
    *st = row_same_capture_calls(d, pv, roles, deps, n);
    return FAST_DONE;
  }
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
    return FAST_GENERAL; /* invalidated: the general path says so */
  /* `first` eager: `then` must be (its status). */
  r = d->StreamIsCapturing(p->then, &cs);
  if (r != CUDA_SUCCESS) {
    *st = dlsync__fast_query_failed(d, r, false, p->then, roles->then);
    return FAST_DONE;
  }
  return cs == CU_STREAM_CAPTURE_STATUS_NONE ? FAST_GO : FAST_GENERAL;
}

/* The consumer's and the producer's streams, named so. */
static DLSYNC__INLINE dlsync__pair end_pair(CUstream first, CUstream then) {
  dlsync__pair p;
  p.first = first;
  p.then = then;
  return p;
}

fast_next dlsync__fast_both_queries(dlsync__thread *t, const dlsync__driver *d, CUstream first,
                                    CUstream then, dlsync_status *st) {
  return end_queries(t, d, end_pair(first, then), false, st);
}

fast_next dlsync__fast_first_in_queries(dlsync__thread *t, const dlsync__driver *d, CUstream first,
                                        CUstream then, dlsync_status *st) {
  return end_queries(t, d, end_pair(first, then), true, st);
}
