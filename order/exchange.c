/* SPDX-License-Identifier: Apache-2.0 */
/* The exchange's entry points: dlsync_order, dlsync_exchange_begin(_flags,
 * _many) and dlsync_exchange_end. Each reads as its steps: the fast path
 * (fast.h) where it applies, else the lanes opened, the row classified and
 * carried out by its function (general.c, rows.h), and for begin and end the
 * exchange record (handles.c); a fan-out's begin and end are fanout.c's.
 * include/dlsync/exchange.h has the table and the contract; docs/design.md
 * section 3 the why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/fast.h"

void dlsync__order_hints_reset(void) {
  dlsync__thread *t = dlsync__thread_get();
  dlsync__order_thread_of(t)->end_capture = false;
  dlsync__order_thread_of(t)->then_capture = false;
  dlsync__order_thread_of(t)->first_capture = false;
}

/* Two stream lanes' streams. */
static DLSYNC__INLINE dlsync__pair streams_pair(const dlsync_lane *first, const dlsync_lane *then) {
  dlsync__pair p;
  p.first = first->stream;
  p.then = then->stream;
  return p;
}

/* A fast_pre of the caller's lanes (names from the op) and begin's record
 * (else NULL), nothing read yet. */
static DLSYNC__INLINE void pre_init(fast_pre *pre, dlsync__op op, dlsync_lane *first,
                                    dlsync_lane *then, dlsync_exchange *ex) {
  pre->first = first;
  pre->then = then;
  pre->op = op;
  pre->have = false;
  pre->ex = ex;
}

/* The general path of dlsync_order and begin (pre->op): the lanes opened
 * (what the fast path read is not read again), the hint for the fast path's queries
 * noted, the row classified and carried out; step (may be NULL) says which
 * row it was. */
static dlsync_status order_general(dlsync__thread *t, dlsync_context *ctx, fast_pre *pre,
                                   dlsync__order_step *step, bool keep_edges) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__op op = pre->op;
  dlsync__order_step local;
  pool_pick pool;
  if (step == NULL)
    step = &local;
  pre->opened.read = pre->have;
  DLSYNC_TRY(dlsync__order_lanes(ctx, op, pre->first, pre->then, &pre->opened));
  if (pre->then->kind == DLSYNC_LANE_STREAM) /* the hint for the fast path's queries */
    dlsync__order_thread_of(t)->then_capture = pre->opened.b.kind != DLSYNC_LANE_EAGER;
  if (pre->opened.same)
    goto cleanup;
  step->op = op;
  step->first_pending = false;
  step->keep_edges = keep_edges;
  pool = dlsync__pick_of(&pre->opened);
  DLSYNC_TRY(dlsync__order_row(ctx, step, &pool, &pre->opened.a, &pre->opened.b));
cleanup:
  return st;
}

dlsync_status dlsync_order(dlsync_context *ctx, dlsync_lane *first, dlsync_lane *then) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_order");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__thread *t;
  fast_pre pre;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_order: ctx is NULL");
  t = dlsync__thread_get();
  if (dlsync__plain_stream_lane(first) && dlsync__plain_stream_lane(then)) {
    pre_init(&pre, DLSYNC__OP_ORDER, first, then, NULL);
    st = order_fast(
        t, ctx, streams_pair(first, then),
        dlsync__order_thread_of(t)->then_capture ? FAST_QUERY_THEN_FULL : FAST_QUERY_THEN, &pre);
    if (st != DLSYNC__GENERAL)
      return st;
  } else {
    st = dlsync__order_graph_fast(ctx, t, first, then);
    if (st != DLSYNC__GENERAL)
      return st;
    pre_init(&pre, DLSYNC__OP_ORDER, first, then, NULL); /* nothing read */
  }
  st = order_general(t, ctx, &pre, NULL, false);
  return st;
}

/* Unknown flag bits: DLSYNC_ERROR_INVALID_ARGUMENT naming the call. */
dlsync_status dlsync__refuse_flags_slow(const char *fn, uint32_t flags) {
  return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "%s: unknown flags 0x%x (known: DLSYNC_EXCHANGE_CAPTURE_STABLE = 0x%x, "
                      "DLSYNC_EXCHANGE_KEEP_EDGE_DATA = 0x%x)",
                      fn, (unsigned)(flags & ~DLSYNC_EXCHANGE_FLAGS_ALL),
                      (unsigned)DLSYNC_EXCHANGE_CAPTURE_STABLE,
                      (unsigned)DLSYNC_EXCHANGE_KEEP_EDGE_DATA);
}

/* A begun exchange's record, as begin found the lanes and carried out the
 * row. */
void dlsync__exchange_fill(dlsync_exchange *ex, const exchange_sides *sides, dlsync__row row,
                           uint32_t flags) {
  dlsync_lane *producer = sides->producer, *consumer = sides->consumer;
  const dlsync__lane_now *p = sides->p, *c = sides->c;
  ex->bits = 0;
  ex->producer_stream = producer->stream;
  ex->consumer_stream = consumer->stream;
  if (producer->kind == DLSYNC_LANE_GRAPH || consumer->kind == DLSYNC_LANE_GRAPH) {
    ex->bits |= EX_REFS;
    ex->producer_ref = producer->kind == DLSYNC_LANE_GRAPH ? producer : NULL;
    ex->consumer_ref = consumer->kind == DLSYNC_LANE_GRAPH ? consumer : NULL;
  }
  if (dlsync__row_nodes(row) == 2) /* a record node and a wait node */
    ex->bits |= EX_CROSS;
  ex->producer_where = dlsync__lane_where(p);
  ex->consumer_where = dlsync__lane_where(c);
  /* What end may trust: two eager streams, a consumer that joined the
   * producer's capture, or two streams of one capture; each way end's plain
   * record and wait are right. */
  if ((flags & DLSYNC_EXCHANGE_CAPTURE_STABLE) &&
      (row == DLSYNC__ROW_EAGER_EAGER || row == DLSYNC__ROW_JOIN ||
       row == DLSYNC__ROW_SAME_CAPTURE))
    ex->bits |= EX_STABLE;
  /* A consumer that joined the producer's capture, or two streams of one
   * capture: both in the producer's capture now, so end asks the consumer
   * alone, and adds its dependencies to the producer's. */
  if (row == DLSYNC__ROW_JOIN || row == DLSYNC__ROW_SAME_CAPTURE) {
    ex->bits |= EX_ONE_CAPTURE;
    ex->capture_id = p->capture_id;
  }
  if (flags & DLSYNC_EXCHANGE_KEEP_EDGE_DATA)
    ex->bits |= EX_KEEP_EDGES;
}

/* Everything but the fast path (kept out of line so that the fast path's
 * frame stays small). pre: the caller's lanes, and, when pre->have, both
 * read by the fast path. */
static DLSYNC__NOINLINE dlsync_status begin_general(dlsync_exchange **out, dlsync_context *ctx,
                                                    fast_pre *pre, uint32_t flags) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_exchange *ex = NULL;
  dlsync__thread *t;
  dlsync_lane *producer = pre->first, *consumer = pre->then;
  dlsync__lane_now *p = &pre->opened.a, *c = &pre->opened.b;
  dlsync__order_step step;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin: out is NULL");
  *out = NULL;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin: ctx is NULL");
  st = dlsync__refuse_flags("dlsync_exchange_begin_flags", flags);
  if (st != DLSYNC_SUCCESS)
    return st;
  t = dlsync__thread_get();
  ex = exchange_alloc(t);
  if (ex == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin: out of memory");
    goto cleanup;
  }
  ex->bits = 0;
  step.row = DLSYNC__ROW_SAME_STREAM;
  DLSYNC_TRY(order_general(t, ctx, pre, &step, (flags & DLSYNC_EXCHANGE_KEEP_EDGE_DATA) != 0));
  if (pre->opened.same) {
    ex->bits = EX_SAME; /* its end has nothing to do */
    *out = exchange_publish(ex, ctx);
    ex = NULL;
    goto cleanup;
  }
  dlsync__exchange_fill(ex, &(exchange_sides){producer, consumer, p, c}, step.row, flags);
  *out = exchange_publish(ex, ctx);
  ex = NULL;
cleanup:
  exchange_free(t, ex);
  return st;
}

/* begin_general before the fast path has read anything. */
static DLSYNC__INLINE dlsync_status begin_unread(dlsync_exchange **out, dlsync_context *ctx,
                                                 dlsync_lane *producer, dlsync_lane *consumer,
                                                 uint32_t flags) {
  fast_pre pre;
  pre_init(&pre, DLSYNC__OP_BEGIN, producer, consumer, NULL);
  return begin_general(out, ctx, &pre, flags);
}

dlsync_status dlsync_exchange_begin_flags(dlsync_exchange **out, dlsync_context *ctx,
                                          dlsync_lane *producer, dlsync_lane *consumer,
                                          uint32_t flags) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_exchange_begin_flags");
  dlsync_status st;
  dlsync__thread *t;
  dlsync_exchange *ex;
  dlsync__pair pair;
  /* The fast path: two distinct stream lanes, a warm thread, an eager
   * consumer; anything else (or anything wrong) goes the general way. */
  fast_pre pre; /* written only on the way it is used: fewer stores on the eager path */
  if (DLSYNC__UNLIKELY(
          out == NULL || ctx == NULL || (flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE) != 0 ||
          !dlsync__plain_stream_lane(producer) || !dlsync__plain_stream_lane(consumer)))
    return begin_unread(out, ctx, producer, consumer, flags);
  t = dlsync__thread_get();
  ex = dlsync__order_thread_of(t)->spare;
  if (DLSYNC__UNLIKELY(ex == NULL)) {
    /* The thread's record is in use (dlsync_exchange_begin_many, or an
     * exchange not ended yet): one from the shared list, same fast path. */
    exchange_free(t, dlsync__exchange_make()); /* the thread's spare from now on */
    ex = dlsync__order_thread_of(t)->spare;
    if (ex == NULL)
      return begin_unread(out, ctx, producer, consumer, flags);
  }
  if (DLSYNC__UNLIKELY(producer->stream == consumer->stream)) {
    /* SAME_STREAM: already ordered; one status query, for its errors. */
    CUstreamCaptureStatus cs;
    CUresult r;
    if (dlsync__is_special_stream(producer->stream) || dlsync__log_on(DLSYNC__LOG_TRACE))
      return begin_unread(out, ctx, producer, consumer, flags);
    r = ctx->drv->StreamIsCapturing(producer->stream, &cs);
    *out = NULL;
    if (r != CUDA_SUCCESS)
      return dlsync__fail_driver(ctx->drv, r, "cuStreamIsCapturing",
                                 "producer (and consumer) "
                                 "stream %p",
                                 (void *)producer->stream);
    dlsync__order_thread_of(t)->spare = NULL;
    ex->bits = EX_SAME;
    *out = exchange_publish(ex, ctx);
    return DLSYNC_SUCCESS;
  }
  /* EX_STABLE is the flag's bit; with it, end trusts begin (and looks at
   * nothing else). The fast path may add EX_ONE_CAPTURE. */
  pre_init(&pre, DLSYNC__OP_BEGIN, producer, consumer, ex);
  ex->bits = (uint8_t)flags;
  /* From here on the streams ordered (pair), not the lanes, which pre
   * holds for the general path: fewer values kept across the driver calls. */
  pair = streams_pair(producer, consumer);
  st = order_fast(t, ctx, pair,
                  dlsync__order_thread_of(t)->then_capture ? FAST_QUERY_THEN_FULL : FAST_QUERY_THEN,
                  &pre);
  if (st == DLSYNC__GENERAL)
    return begin_general(out, ctx, &pre, flags);
  *out = NULL;
  if (DLSYNC__UNLIKELY(st != DLSYNC_SUCCESS))
    return st;
  dlsync__order_thread_of(t)->spare = NULL;
  ex->producer_stream = pair.first;
  ex->consumer_stream = pair.then;
  *out = exchange_publish(ex, ctx);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_exchange_begin(dlsync_exchange **out, dlsync_context *ctx,
                                    dlsync_lane *producer, dlsync_lane *consumer) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_exchange_begin");
  return dlsync_exchange_begin_flags(out, ctx, producer, consumer, 0);
}

/* ---- many producers ---- */

void dlsync__kept_save(kept_error *k, dlsync_status st) {
  k->status = st;
  k->driver_result = dlsync_last_driver_result();
  snprintf(k->msg, sizeof k->msg, "%s", dlsync_last_error());
}

dlsync_status dlsync__kept_restore(const kept_error *k) {
  return dlsync__fail_result(k->status, k->driver_result, "%s", k->msg);
}

/* Ends parts[0..n) newest first; the first failure's status, message and
 * driver result (the first other than a refusal, DLSYNC_ERROR_CAPTURE_ORDER,
 * when there is one). */
dlsync_status dlsync__end_parts(dlsync_exchange **parts, size_t n) {
  kept_error first;
  first.status = DLSYNC_SUCCESS;
  for (size_t i = n; i-- > 0;)
    dlsync__keep_first(&first, dlsync_exchange_end(parts[i]));
  return first.status == DLSYNC_SUCCESS ? DLSYNC_SUCCESS : dlsync__kept_restore(&first);
}

/* Appends ", producer i (stream s)" to a list of at most four, then ", ...". */
static void name_producer(char *buf, size_t size, size_t *count, size_t i, CUstream s) {
  size_t len = strlen(buf);
  if (*count < 4)
    snprintf(buf + len, size - len, "%sproducer %zu (stream %p)", *count == 0 ? "" : ", ", i,
             (void *)s);
  else if (*count == 4)
    snprintf(buf + len, size - len, ", ...");
  (*count)++;
}

/* Capturing and eager stream producers together are refused before anything
 * is queued: begin would join the consumer to the capture, and its end could
 * not order the eager producers' later work after a graph that is not
 * launched yet (every end would fail with DLSYNC_ERROR_CAPTURE_ORDER). One
 * status query per distinct stream producer. */
static dlsync_status refuse_mixed_producers(dlsync_context *ctx, dlsync_lane *producers, size_t n) {
  dlsync_status st = DLSYNC_SUCCESS;
  char capturing[200] = "", eager[200] = "", role[40];
  size_t ncap = 0, neager = 0;
  for (size_t i = 0; i < n; i++) {
    dlsync__lane_now now;
    bool seen = false;
    if (producers[i].kind != DLSYNC_LANE_STREAM)
      continue;
    for (size_t j = 0; j < i && !seen; j++)
      seen = dlsync__same_producer(&producers[j], &producers[i]);
    if (seen)
      continue;
    snprintf(role, sizeof role, "producer %zu", i);
    DLSYNC_TRY(dlsync__lane_read(&now, ctx->drv, &producers[i], role));
    if (now.kind == DLSYNC_LANE_CAPTURING)
      name_producer(capturing, sizeof capturing, &ncap, i, producers[i].stream);
    else if (now.kind == DLSYNC_LANE_EAGER)
      name_producer(eager, sizeof eager, &neager, i, producers[i].stream);
  }
  if (ncap > 0 && neager > 0)
    st = dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "dlsync_exchange_begin_many: %s %s capturing and %s %s eager: the end "
                      "could not order the eager producers' later work after a capture that is "
                      "not launched yet; nothing was queued. Capture the eager producers too, or "
                      "order the consumer after them with dlsync_order and their later work "
                      "after launching the graph",
                      capturing, ncap == 1 ? "is" : "are", eager, neager == 1 ? "is" : "are");
cleanup:
  return st;
}

dlsync_status dlsync_exchange_begin_many(dlsync_exchange **out, dlsync_context *ctx,
                                         dlsync_lane *producers, size_t n, dlsync_lane *consumer,
                                         uint32_t flags) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_exchange_begin_many");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__thread *t;
  dlsync_exchange *ex = NULL;
  dlsync_exchange **parts = NULL;
  size_t nparts = 0;
  char role[40];
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin_many: out is NULL");
  *out = NULL;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin_many: ctx is NULL");
  if (n == 0 || n > DLSYNC_EXCHANGE_MANY_MAX)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_many: %zu producers (1 to %d)", n,
                        DLSYNC_EXCHANGE_MANY_MAX);
  if (producers == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_many: producers is NULL (n = %zu)", n);
  if (n == 1)
    return dlsync_exchange_begin_flags(out, ctx, &producers[0], consumer, flags);
  DLSYNC_TRY(dlsync__refuse_flags("dlsync_exchange_begin_many", flags));
  /* Every lane checked before anything is queued. */
  DLSYNC_TRY(dlsync__lane_check(consumer, "consumer"));
  for (size_t i = 0; i < n; i++) {
    snprintf(role, sizeof role, "producer %zu", i);
    DLSYNC_TRY(dlsync__lane_check(&producers[i], role));
  }
  DLSYNC_TRY(refuse_mixed_producers(ctx, producers, n));
  parts = dlsync__calloc(n, sizeof *parts); /* n <= DLSYNC_EXCHANGE_MANY_MAX */
  if (parts == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin_many: out of memory");
    goto cleanup;
  }
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = dlsync__same_producer(&producers[j], &producers[i]);
    if (seen)
      continue;
    DLSYNC_TRY(dlsync_exchange_begin_flags(&parts[nparts], ctx, &producers[i], consumer, flags));
    nparts++;
  }
  t = dlsync__thread_get();
  ex = exchange_alloc(t);
  if (ex == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin_many: out of memory");
    goto cleanup;
  }
  ex->bits = EX_MANY;
  ex->many = parts;
  ex->nmany = nparts;
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    dlsync__log(DLSYNC__LOG_TRACE, "begin_many: %zu producers, %zu distinct", n, nparts);
  *out = exchange_publish(ex, ctx);
  parts = NULL;
  nparts = 0;
cleanup:
  if (nparts > 0) {
    /* Order back what was ordered; the error stays the first failure's. */
    kept_error k;
    dlsync__kept_save(&k, st);
    (void)dlsync__end_parts(parts, nparts);
    dlsync__kept_restore(&k);
  }
  dlsync__free(parts);
  return st;
}

/* ---- end ---- */

/* An end whose failure came from a driver call that queues nothing, before
 * anything was queued, says how to finish it: the handle is ended, but
 * dlsync_order(ctx, consumer, producer) does what the end would have done
 * (exchange.h). Not after a begin that put a record node in the producer's
 * graph and a wait node in the consumer's (EX_CROSS): that end refuses, and
 * the order would make each graph wait for the other. */
DLSYNC__NOINLINE dlsync_status dlsync__end_failed(dlsync_status st, unsigned bits) {
  if ((st == DLSYNC_ERROR_DRIVER || st == DLSYNC_ERROR_OUT_OF_MEMORY) && (bits & EX_CROSS) == 0 &&
      dlsync__last_error_nothing_queued()) {
    dlsync__last_error_append("; nothing was queued: dlsync_order(ctx, consumer, producer) does "
                              "what this end would have done (in a capture, it joins the consumer "
                              "back)");
    dlsync__fail_nothing_queued();
  }
  return st;
}

static DLSYNC__NOINLINE dlsync_status end_many(dlsync__thread *t, dlsync_exchange *ex) {
  dlsync_exchange **parts = ex->many;
  size_t n = ex->nmany;
  dlsync_status st;
  ex->many = NULL;
  ex->nmany = 0;
  exchange_free(t, ex);
  st = dlsync__end_parts(parts, n);
  dlsync__free(parts);
  return st;
}

/* An end by the general path: the lanes read, the row classified and
 * carried out. ex: the record, for EX_CROSS's wheres (NULL: none). */
dlsync_status dlsync__end_lanes(dlsync_context *ctx, dlsync_lane *consumer, dlsync_lane *producer,
                                unsigned bits, const dlsync_exchange *ex) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lanes_opened opened;
  dlsync__lane_now *c = &opened.a, *p = &opened.b;
  dlsync__order_step step;
  pool_pick pool;
  opened.read = false;
  DLSYNC_TRY(dlsync__order_lanes(ctx, DLSYNC__OP_END, consumer, producer, &opened));
  if (opened.same)
    goto cleanup;
  step.op = DLSYNC__OP_END;
  step.first_pending = false;
  step.keep_edges = (bits & EX_KEEP_EDGES) != 0;
  if (ex != NULL && (bits & EX_CROSS)) {
    dlsync__where pw = dlsync__lane_where(p), cw = dlsync__lane_where(c);
    step.first_pending = dlsync__where_same(&pw, &ex->producer_where) &&
                         dlsync__where_same(&cw, &ex->consumer_where);
  }
  pool = dlsync__pick_of(&opened);
  DLSYNC_TRY(dlsync__order_row(ctx, &step, &pool, c, p));
cleanup:
  return st;
}

static DLSYNC__NOINLINE dlsync_status end_general(dlsync__thread *t, dlsync_exchange *ex,
                                                  dlsync_context *ctx) {
  dlsync_status st;
  unsigned bits = ex->bits;
  dlsync_lane *producer, *consumer, lp, lc;
  lp = dlsync_lane_stream(ex->producer_stream);
  lc = dlsync_lane_stream(ex->consumer_stream);
  producer = (bits & EX_REFS) && ex->producer_ref != NULL ? ex->producer_ref : &lp;
  consumer = (bits & EX_REFS) && ex->consumer_ref != NULL ? ex->consumer_ref : &lc;
  st = dlsync__end_lanes(ctx, consumer, producer, bits, ex);
  exchange_free(t, ex);
  return st == DLSYNC_SUCCESS ? st : dlsync__end_failed(st, bits);
}

dlsync_status dlsync_exchange_end(dlsync_exchange *handle) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_exchange_end");
  dlsync_status st, refused; /* refused: claim's, apart, so that st can stay in a register */
  dlsync__thread *t;
  dlsync_context *ctx;
  unsigned bits;
  dlsync_exchange *ex = exchange_claim(handle, &refused);
  if (DLSYNC__UNLIKELY(ex == NULL))
    return refused;
  t = dlsync__thread_get();
  bits = ex->bits;
  ctx = atomic_load_explicit(&ex->ctx, memory_order_relaxed);
  /* Stream lanes: both eager now, or in one capture (two queries: status
   * queries while this thread's ends find eager consumers, full queries
   * while they find captures; one full query of the consumer when begin
   * found both in one capture, EX_ONE_CAPTURE), or, when begin may be
   * trusted (DLSYNC_EXCHANGE_CAPTURE_STABLE), eager or one capture as begin
   * found them (no query). */
  if (DLSYNC__LIKELY((bits & (EX_SAME | EX_MANY | EX_REFS | EX_KEEP_EDGES | EX_FAN)) == 0)) {
    fast_query q;
    if (DLSYNC__LIKELY((bits & (EX_STABLE | EX_ONE_CAPTURE)) == 0)) {
      q = dlsync__order_thread_of(t)->end_capture ? FAST_QUERY_BOTH : FAST_QUERY_BOTH_EAGER;
    } else if (bits & EX_ONE_CAPTURE) {
      /* With CAPTURE_STABLE too: the query gives the consumer's
       * dependencies, which the producer takes (cheaper than a record and
       * a wait, which need no query). */
      q = FAST_QUERY_FIRST_IN;
      dlsync__order_thread_of(t)->end_capture_id = ex->capture_id;
    } else {
      q = FAST_QUERY_NONE;
    }
    dlsync__pair p;
    p.first = ex->consumer_stream;
    p.then = ex->producer_stream;
    st = order_fast(t, ctx, p, q, NULL); /* an end has the streams only: no lanes to read */
    if (DLSYNC__LIKELY(st == DLSYNC_SUCCESS)) {
      exchange_free(t, ex);
      return st;
    }
    if (st != DLSYNC__GENERAL) {
      /* The bits read again here, not kept from above: the fast path's
       * registers are not spent on a failure's message. */
      bits = ex->bits;
      exchange_free(t, ex);
      return dlsync__end_failed(st, bits);
    }
  } else if (bits & EX_FAN) {
    return dlsync__end_fan(t, ex, ctx);
  } else if (bits & EX_MANY) {
    return end_many(t, ex);
  } else if (bits & EX_SAME) {
    exchange_free(t, ex);
    return DLSYNC_SUCCESS; /* one stream: its own order is enough */
  }
  return end_general(t, ex, ctx);
}
