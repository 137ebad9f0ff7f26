/* SPDX-License-Identifier: Apache-2.0 */
/* One producer, many consumers: dlsync_exchange_begin_fanout and the end of
 * its record (dlsync__end_fan, called by dlsync_exchange_end). A fan-out of
 * plain stream lanes takes one record and asks each lane once (fan_fast);
 * every other takes a record per consumer through the general path.
 * include/dlsync/exchange.h has the contract; docs/design.md "One producer,
 * many consumers" the why. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/fast.h"

/* A consumer of a fan-out as begin read it, its row, and its part (the
 * record its end uses, published once it is ordered). */
typedef struct fan_consumer {
  dlsync__lane_now now;
  dlsync__row row;
  dlsync_exchange *rec; /* allocated before anything is queued */
  char role[32];
} fan_consumer;

/* One fan-out being begun: the caller's arguments, the consumers as read
 * (fan[0..n)), the producer as read (pn), and the consumers' parts published
 * so far (parts[0..nparts)). */
typedef struct fan_job {
  dlsync_context *ctx;
  dlsync_lane *producer;
  dlsync_lane *consumers;
  size_t n;
  uint32_t flags;
  fan_consumer *fan;
  dlsync__lane_now *pn;
  dlsync_exchange **parts;
  size_t nparts;
} fan_job;

#define FAN_INLINE 8

/* What begin_fanout's fast path (fan_fast) read of the lanes, handed to the
 * general path when it goes that way, so that no stream is asked about
 * twice: consumers [0, eager_upto) eager by their status queries; the
 * producer's full query (when producer_read); consumers [eager_upto, nread)
 * by their full queries, ci. And, for the fast path itself, each consumer
 * in the producer's capture (in_capture, nsame of them), and whether the
 * producer captures. */
typedef struct fan_seen {
  size_t eager_upto, nread;
  bool producer_read;
  dlsync__capture_info pi;
  dlsync__capture_info ci[EX_FAN_MAX];
  bool in_capture[EX_FAN_MAX];
  size_t nsame;
  bool producer_captures;
} fan_seen;

/* Two lanes of a fan-out that are one: the same stream (legacy handles
 * alike), the same dlsync_lane, or graph lanes of one graph sharing their
 * frontier's array (each would write its new frontier over the other's). */
static bool same_fan_lane(const dlsync_lane *a, const dlsync_lane *b) {
  if (a->kind == DLSYNC_LANE_GRAPH && b->kind == DLSYNC_LANE_GRAPH && a->graph == b->graph &&
      a->deps != NULL && a->deps == b->deps)
    return true;
  return dlsync__same_producer(a, b);
}

/* The lanes' fields, the producer among the consumers, and two consumers
 * that are one lane: refused before any driver call. */
static dlsync_status fanout_check(dlsync_lane *producer, dlsync_lane *consumers, size_t n) {
  dlsync_status st = DLSYNC_SUCCESS;
  char role[32];
  DLSYNC_TRY(dlsync__lane_check(producer, "producer"));
  for (size_t i = 0; i < n; i++) {
    if (dlsync__plain_stream_lane(&consumers[i]))
      continue; /* nothing to check (its name is made only for a message) */
    snprintf(role, sizeof role, "consumer %zu", i);
    DLSYNC_TRY(dlsync__lane_check(&consumers[i], role));
  }
  for (size_t i = 0; i < n; i++) {
    if (same_fan_lane(producer, &consumers[i]))
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "dlsync_exchange_begin_fanout: consumer %zu is the producer (%s %p): a "
                          "lane is already ordered after itself; leave it out",
                          i, consumers[i].kind == DLSYNC_LANE_STREAM ? "stream" : "graph lane",
                          consumers[i].kind == DLSYNC_LANE_STREAM ? (void *)consumers[i].stream
                                                                  : (void *)&consumers[i]);
    for (size_t j = 0; j < i; j++)
      if (same_fan_lane(&consumers[j], &consumers[i]))
        return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                            "dlsync_exchange_begin_fanout: consumers %zu and %zu are the same "
                            "lane (%s %p): give each consumer once",
                            j, i, consumers[i].kind == DLSYNC_LANE_STREAM ? "stream" : "graph lane",
                            consumers[i].kind == DLSYNC_LANE_STREAM ? (void *)consumers[i].stream
                                                                    : (void *)&consumers[i]);
  }
cleanup:
  return st;
}

/* Consumer i's part published: its end orders the producer after it. */
static void fan_publish(fan_job *job, size_t i, dlsync__row row) {
  fan_consumer *fc = &job->fan[i];
  exchange_sides sides = {job->producer, &job->consumers[i], job->pn, &fc->now};
  dlsync__exchange_fill(fc->rec, &sides, row, job->flags);
  job->parts[job->nparts++] = exchange_publish(fc->rec, job->ctx);
  fc->rec = NULL;
}

/* EAGER_EAGER and JOIN consumers: one event of the producer's pool recorded
 * (plain) on the producer once, and each consumer's plain wait on it (a
 * capturing producer's: each consumer joins its capture). The pool may come
 * from the memo unchecked: the record says whether the event is of the
 * producer's context; then the memo is forgotten and an event of the right
 * pool taken, as in dlsync__row_record_wait. */
static dlsync_status fan_plain(fan_job *job) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_context *ctx = job->ctx;
  dlsync_lane *producer = job->producer, *consumers = job->consumers;
  const fan_consumer *fan = job->fan;
  size_t n = job->n;
  const dlsync__driver *d = ctx->drv;
  pool_pick pk;
  CUevent ev = NULL;
  bool lent = false;
  CUresult r;
  dlsync__pair p;
  dlsync__roles rl;
  pk.pool = NULL;
  pk.from_memo = false;
  pk.stream = producer->stream;
  pk.role = "producer";
  pk.t = NULL;
  DLSYNC_TRY(
      dlsync__pool_for_stream(&pk.pool, &pk.from_memo, &ctx->pools, producer->stream, "producer"));
  DLSYNC_TRY(dlsync__pool_borrow(&ev, &lent, &ctx->pools, pk.pool));
  r = d->EventRecord(ev, producer->stream);
  if (r != CUDA_SUCCESS && pk.from_memo && context_mismatch(r)) {
    dlsync__pool_unborrow(pk.pool, ev, lent);
    ev = NULL;
    DLSYNC_TRY(dlsync__repick_pool(ctx, &pk));
    DLSYNC_TRY(dlsync__pool_borrow(&ev, &lent, &ctx->pools, pk.pool));
    r = d->EventRecord(ev, producer->stream);
  }
  if (r != CUDA_SUCCESS) {
    p.first = producer->stream;
    p.then = NULL;
    rl.first = "producer";
    rl.then = NULL;
    st = dlsync__fail_record(d, r, p, &rl);
    goto cleanup;
  }
  for (size_t i = 0; i < n; i++) {
    if (fan[i].row != DLSYNC__ROW_EAGER_EAGER && fan[i].row != DLSYNC__ROW_JOIN)
      continue;
    r = d->StreamWaitEvent(consumers[i].stream, ev, 0);
    if (r != CUDA_SUCCESS) {
      p.first = producer->stream;
      p.then = consumers[i].stream;
      rl.first = "producer";
      rl.then = fan[i].role;
      st = dlsync__fail_wait(ctx, r, p, &rl);
      goto cleanup;
    }
    fan_publish(job, i, fan[i].row);
  }
cleanup:
  if (ev != NULL)
    dlsync__pool_unborrow(pk.pool, ev, lent);
  return st;
}

/* Two stream lanes, neither a special handle. */
static bool fan_streams(const dlsync_lane *a, const dlsync_lane *b) {
  return a->kind == DLSYNC_LANE_STREAM && b->kind == DLSYNC_LANE_STREAM &&
         !dlsync__is_special_stream(a->stream) && !dlsync__is_special_stream(b->stream);
}

/* The order of two distinct stream lanes (fan_streams) read already
 * (opened->a, opened->b, each valid: no call on its stream since), as the
 * general path makes it: the pool from the thread's memo (else looked up,
 * and a long dependency array read again), the row classified and carried
 * out (step->row says which). */
static dlsync_status fan_order_read(dlsync_context *ctx, dlsync__order_step *step,
                                    dlsync_lane *first, dlsync_lane *then,
                                    dlsync__lanes_opened *opened) {
  dlsync_status st = DLSYNC_SUCCESS;
  pool_pick pk;
  opened->pool = dlsync__thread_memo_pool(dlsync__thread_get(), &ctx->pools, first->stream);
  opened->read = true;
  DLSYNC_TRY(dlsync__order_lanes(ctx, step->op, first, then, opened));
  pk = dlsync__pick_of(opened);
  DLSYNC_TRY(dlsync__order_row(ctx, step, &pk, &opened->a, &opened->b));
cleanup:
  return st;
}

/* A consumer whose row adds nodes (or a graph lane's SAME_BUILT): its own
 * order, by the general path, the lanes read again (the producer's frontier
 * moves with each node added), except two stream lanes of which the
 * producer is eager: fan_read's reads are still those lanes (an eager
 * stream has no frontier, and no call came on the consumer's stream since).
 * A consumer in a graph that an earlier one's order gave its wait node
 * takes edges from that consumer instead (dlsync_order's row; for two
 * stream lanes that consumer alone is read again). */
static dlsync_status fan_graph(const fan_job *job, size_t i, dlsync__row *row) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_context *ctx = job->ctx;
  dlsync_lane *producer = job->producer, *consumers = job->consumers;
  const fan_consumer *fan = job->fan;
  uint32_t flags = job->flags;
  dlsync__lanes_opened opened;
  dlsync__order_step step;
  pool_pick pk;
  if (dlsync__row_nodes(fan[i].row) > 0) {
    dlsync__where wi = dlsync__lane_where(&fan[i].now);
    for (size_t j = 0; j < i; j++) {
      dlsync__where wj = dlsync__lane_where(&fan[j].now);
      if (dlsync__row_nodes(fan[j].row) > 0 && dlsync__where_same(&wj, &wi)) {
        *row = fan[i].row;
        if (!fan_streams(&consumers[j], &consumers[i]))
          return dlsync_order(ctx, &consumers[j], &consumers[i]);
        /* Consumer j read again (its wait node moved its frontier), this
         * one as fan_read read it: dlsync_order's row without asking
         * about this one twice. */
        DLSYNC_TRY(dlsync__lane_read_stream_full(&opened.a, ctx->drv, &consumers[j], "first"));
        opened.b = fan[i].now;
        opened.b.role = "then";
        step.op = DLSYNC__OP_ORDER;
        step.first_pending = false;
        step.keep_edges = false;
        return fan_order_read(ctx, &step, &consumers[j], &consumers[i], &opened);
      }
    }
  }
  step.op = DLSYNC__OP_BEGIN;
  step.first_pending = false;
  step.keep_edges = (flags & DLSYNC_EXCHANGE_KEEP_EDGE_DATA) != 0;
  step.row = fan[i].row;
  if (job->pn->kind == DLSYNC_LANE_EAGER && fan_streams(producer, &consumers[i])) {
    opened.a = *job->pn;
    opened.b = fan[i].now;
    DLSYNC_TRY(fan_order_read(ctx, &step, producer, &consumers[i], &opened));
    *row = step.row;
    goto cleanup;
  }
  opened.read = false;
  DLSYNC_TRY(dlsync__order_lanes(ctx, DLSYNC__OP_BEGIN, producer, &consumers[i], &opened));
  pk = dlsync__pick_of(&opened);
  DLSYNC_TRY(dlsync__order_row(ctx, &step, &pk, &opened.a, &opened.b));
  *row = step.row;
cleanup:
  return st;
}

/* Reads the producer and every consumer (what the fast path read, seen,
 * taken as it was read), classifies each pair, refuses (nothing queued) a
 * row that cannot be carried out, and checks the room of built lanes that
 * get a node. */
static dlsync_status fan_read(const fan_job *job, const fan_seen *seen) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_context *ctx = job->ctx;
  dlsync_lane *producer = job->producer, *consumers = job->consumers;
  fan_consumer *fan = job->fan;
  size_t n = job->n;
  dlsync__lane_now *pn = job->pn;
  const dlsync__driver *d = ctx->drv;
  bool record_node = false;
  if (seen->producer_read)
    DLSYNC_TRY(dlsync__lane_take(pn, d, producer, "producer", &seen->pi));
  else
    DLSYNC_TRY(dlsync__lane_read(pn, d, producer, "producer"));
  for (size_t i = 0; i < n; i++) {
    if (i < seen->eager_upto)
      dlsync__lane_read_eager(&fan[i].now, &consumers[i], fan[i].role);
    else if (i < seen->nread)
      DLSYNC_TRY(dlsync__lane_take(&fan[i].now, d, &consumers[i], fan[i].role, &seen->ci[i]));
    else
      DLSYNC_TRY(dlsync__lane_read(&fan[i].now, d, &consumers[i], fan[i].role));
  }
  for (size_t i = 0; i < n; i++) {
    fan[i].row = classify_now(DLSYNC__OP_BEGIN, pn, &fan[i].now, false);
    if (fan[i].row == DLSYNC__ROW_REFUSE_BUILT_TO_EAGER) {
      st = dlsync__row_refuse_built_to_eager(pn, &fan[i].now);
      goto cleanup;
    }
    if (dlsync__row_nodes(fan[i].row) > 0) {
      record_node = record_node || dlsync__row_nodes(fan[i].row) == 2;
      if (fan[i].now.kind == DLSYNC_LANE_BUILT)
        DLSYNC_TRY(dlsync__lane_fit(&consumers[i], 1, fan[i].role, "the wait node"));
    }
  }
  if (record_node && pn->kind == DLSYNC_LANE_BUILT)
    DLSYNC_TRY(dlsync__lane_fit(producer, 1, "producer", "the record node"));
cleanup:
  return st;
}

/* ---- a fan-out of stream lanes whose rows are plain: one record ----
 *
 * The producer and every consumer plain stream lanes, each consumer's row
 * EAGER_EAGER, JOIN or SAME_CAPTURE, at most EX_FAN_MAX consumers and no
 * DLSYNC_EXCHANGE_KEEP_EDGE_DATA: begin asks the driver about each lane at
 * most once and makes one record (EX_FAN) with the consumers' streams in
 * it; its end asks about the producer at most once for all consumers, then
 * orders the producer after each consumer as that pair's end would. The
 * calls are those of the general fan-out less its repeated queries, so each
 * state gives the same calls, nodes and edges at every call. */

/* "consumer i", for a failure's message (made only then). */
typedef struct fan_role {
  char s[32];
} fan_role;

static DLSYNC__COLD fan_role fan_role_of(size_t i) {
  fan_role r;
  snprintf(r.s, sizeof r.s, "consumer %zu", i);
  return r;
}

/* How the join asks about each consumer, after the producer: by its status
 * (the producer eager), nothing (DLSYNC_EXCHANGE_CAPTURE_STABLE), in full
 * (the producer in capture dlsync__order_thread_of(t)->end_capture_id: FAST_QUERY_FIRST_IN), or
 * through the general path (the producer in an invalidated capture: it
 * says so). */
typedef enum fan_join_mode {
  FAN_JOIN_STATUS,
  FAN_JOIN_NONE,
  FAN_JOIN_IN,
  FAN_JOIN_GENERAL
} fan_join_mode;

/* A join to make: the producer's stream p after the consumers' cs[0..n)
 * (newest last), with the record's bits and, for EX_ONE_CAPTURE or the
 * producer found in a capture, its id. */
typedef struct fan_join_job {
  dlsync__thread *t;
  dlsync_context *ctx;
  CUstream p;
  const CUstream *cs;
  size_t n;
  unsigned bits;
  uint64_t capture_id;
} fan_join_job;

/* One consumer's stream c joined back into the producer's stream, as that
 * pair's end would; the failure's status with end's hint (end_failed). */
static dlsync_status fan_join_one(const fan_join_job *j, CUstream c, fan_join_mode mode) {
  dlsync__thread *t = j->t;
  dlsync_context *ctx = j->ctx;
  CUstream p = j->p;
  dlsync_status st = DLSYNC__GENERAL;
  fast_query q = FAST_QUERY_NONE;
  dlsync__pair pair;
  pair.first = c;
  pair.then = p;
  if (mode == FAN_JOIN_STATUS) {
    CUstreamCaptureStatus cs;
    CUresult r = ctx->drv->StreamIsCapturing(c, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
      return dlsync__end_failed(dlsync__fast_query_failed(ctx->drv, r, false, c, "consumer"), 0);
    if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
      mode = FAN_JOIN_GENERAL; /* a consumer capturing, the producer eager: the general path */
  } else if (mode == FAN_JOIN_IN) {
    q = FAST_QUERY_FIRST_IN;
    dlsync__order_thread_of(t)->end_capture_id = j->capture_id;
  }
  if (mode != FAN_JOIN_GENERAL)
    st = order_fast(t, ctx, pair, q, NULL);
  if (st == DLSYNC__GENERAL) {
    dlsync_lane lc = dlsync_lane_stream(c), lp = dlsync_lane_stream(p);
    st = dlsync__end_lanes(ctx, &lc, &lp, 0, NULL);
  }
  return st == DLSYNC_SUCCESS ? st : dlsync__end_failed(st, 0);
}

#define FAN_JOIN_DEPS 32

/* FAN_JOIN_IN: the producer in capture capture_id. Each consumer's full
 * query, newest first; those still in that capture (SAME_CAPTURE) give
 * their dependencies, which ONE update adds to the producer's (their union,
 * each node once: the set that an update per consumer would leave, so the
 * same edges), or, more than FAN_JOIN_DEPS nodes, an update each; any other
 * consumer is joined by its pair's end. The consumers' arrays stay valid:
 * no call on their streams comes after their queries. Failures kept in
 * *first (keep_first). */
static void fan_join_in(const fan_join_job *j, kept_error *first) {
  const dlsync__driver *d = j->ctx->drv;
  CUstream p = j->p;
  const CUstream *cs = j->cs;
  size_t n = j->n;
  CUgraphNode all[FAN_JOIN_DEPS];
  const CUgraphNode *deps[EX_FAN_MAX];
  size_t ndeps[EX_FAN_MAX], nall = 0;
  bool in[EX_FAN_MAX], fits = true;
  CUresult r;
  for (size_t i = n; i-- > 0;) {
    dlsync__capture_info ci;
    in[i] = false;
    dlsync__lane_query(&ci, d, cs[i]);
    if (DLSYNC__UNLIKELY(ci.r != CUDA_SUCCESS)) {
      dlsync__keep_first(
          first,
          dlsync__end_failed(dlsync__fast_query_failed(d, ci.r, true, cs[i], "consumer"), 0));
      continue;
    }
    if (!dlsync__capture_info_active(&ci) || ci.id != j->capture_id) {
      dlsync__keep_first(first, fan_join_one(j, cs[i], FAN_JOIN_GENERAL));
      continue;
    }
    in[i] = true;
    deps[i] = ci.deps;
    ndeps[i] = ci.n;
    for (size_t k = 0; k < ci.n && fits; k++) {
      bool seen = false;
      for (size_t m = 0; m < nall && !seen; m++)
        seen = all[m] == ci.deps[k];
      if (seen)
        continue;
      if (nall == FAN_JOIN_DEPS)
        fits = false;
      else
        all[nall++] = ci.deps[k];
    }
  }
  if (!fits) {
    for (size_t i = n; i-- > 0;) {
      dlsync__pair pair;
      dlsync_status st;
      if (!in[i])
        continue;
      pair.first = cs[i];
      pair.then = p;
      st = row_same_capture_calls(d, pair, dlsync__roles_of(DLSYNC__OP_END), deps[i], ndeps[i]);
      dlsync__keep_first(first, st == DLSYNC_SUCCESS ? st : dlsync__end_failed(st, 0));
    }
    return;
  }
  if (nall == 0)
    return; /* the consumers captured nothing: nothing to order */
  r = d->StreamUpdateCaptureDependencies(p, all, NULL, nall, CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    dlsync_status st = dlsync__fail_driver(
        d, r, "cuStreamUpdateCaptureDependencies",
        "producer stream %p (capturing) taking the %zu dependencies of its consumers' streams, "
        "in its capture%s",
        (void *)p, nall,
        r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? ": the capture has been invalidated" : "");
    dlsync__fail_nothing_queued();
    dlsync__keep_first(first, dlsync__end_failed(st, 0));
  }
}

/* The join of an EX_FAN record's consumers cs[0..n) (bits: its EX_STABLE,
 * EX_ONE_CAPTURE with capture_id), newest first: the producer asked about
 * once (its status, or in full while this thread's ends find captures), then
 * each consumer as its pair's end would. Every consumer is joined whatever
 * fails; the first failure is returned (a driver's before a refusal, as
 * end_parts). */
static DLSYNC__NOINLINE dlsync_status fan_join(fan_join_job j) {
  const dlsync__driver *d = j.ctx->drv;
  CUstream p = j.p;
  fan_join_mode mode = FAN_JOIN_STATUS;
  kept_error first;
  if (j.bits & EX_ONE_CAPTURE) {
    mode = FAN_JOIN_IN; /* the consumers' queries say whether they are still in it */
  } else if (j.bits & EX_STABLE) {
    mode = FAN_JOIN_NONE;
  } else {
    bool full = dlsync__order_thread_of(j.t)->end_capture;
    if (!full) {
      CUstreamCaptureStatus ps;
      CUresult r = d->StreamIsCapturing(p, &ps);
      if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
        return dlsync__end_failed(dlsync__fast_query_failed(d, r, false, p, "producer"), 0);
      full = ps != CU_STREAM_CAPTURE_STATUS_NONE;
    }
    if (full) {
      dlsync__capture_info pi;
      dlsync__lane_query(&pi, d, p);
      if (DLSYNC__UNLIKELY(pi.r != CUDA_SUCCESS))
        return dlsync__end_failed(dlsync__fast_query_failed(d, pi.r, true, p, "producer"), 0);
      dlsync__order_thread_of(j.t)->end_capture = pi.status != CU_STREAM_CAPTURE_STATUS_NONE;
      if (pi.status == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        mode = FAN_JOIN_IN;
        j.capture_id = pi.id;
      } else if (pi.status != CU_STREAM_CAPTURE_STATUS_NONE) {
        mode = FAN_JOIN_GENERAL;
      }
    }
  }
  first.status = DLSYNC_SUCCESS;
  if (mode == FAN_JOIN_IN)
    fan_join_in(&j, &first);
  else
    for (size_t i = j.n; i-- > 0;)
      dlsync__keep_first(&first, fan_join_one(&j, j.cs[i], mode));
  return first.status == DLSYNC_SUCCESS ? DLSYNC_SUCCESS : dlsync__kept_restore(&first);
}

/* The producer and every consumer plain stream lanes, no special handle,
 * few enough consumers for one record. */
static bool fan_plain_streams(const dlsync_lane *producer, const dlsync_lane *consumers, size_t n,
                              uint32_t flags) {
  if (n > EX_FAN_MAX || (flags & DLSYNC_EXCHANGE_KEEP_EDGE_DATA) ||
      !dlsync__plain_stream_lane(producer) || dlsync__is_special_stream(producer->stream) ||
      dlsync__log_on(DLSYNC__LOG_TRACE))
    return false;
  for (size_t i = 0; i < n; i++)
    if (!dlsync__plain_stream_lane(&consumers[i]) || dlsync__is_special_stream(consumers[i].stream))
      return false;
  return true;
}

/* The full queries: the producer's, then each consumer's from
 * seen->eager_upto on (those before it are eager by their status).
 * DLSYNC__GENERAL (nothing queued; every lane read, in seen) for a row that
 * is not plain, or a JOIN and a SAME_CAPTURE together (the record on the
 * producer would come between the producer's query and the updates that use
 * its dependencies). */
static dlsync_status fan_fast_full(const fan_job *job, dlsync__thread *t, fan_seen *seen) {
  const dlsync__driver *d = job->ctx->drv;
  CUstream p = job->producer->stream;
  const dlsync_lane *consumers = job->consumers;
  size_t n = job->n;
  bool any_capture = false, plain = true;
  dlsync__lane_query(&seen->pi, d, p);
  if (DLSYNC__UNLIKELY(seen->pi.r != CUDA_SUCCESS))
    return dlsync__fast_query_failed(d, seen->pi.r, true, p, "producer");
  seen->producer_read = true;
  if (!dlsync__capture_info_eager(&seen->pi) && !dlsync__capture_info_active(&seen->pi))
    return DLSYNC__GENERAL; /* invalidated: the general path says so */
  seen->producer_captures = dlsync__capture_info_active(&seen->pi);
  seen->nread = seen->eager_upto;
  for (size_t i = seen->eager_upto; i < n; i++) {
    dlsync__capture_info *ci = &seen->ci[i];
    dlsync__lane_query(ci, d, consumers[i].stream);
    if (DLSYNC__UNLIKELY(ci->r != CUDA_SUCCESS))
      return dlsync__fast_query_failed(d, ci->r, true, consumers[i].stream, fan_role_of(i).s);
    seen->nread = i + 1;
    if (dlsync__capture_info_eager(ci))
      continue;
    any_capture = true;
    if (!seen->producer_captures || !dlsync__capture_info_active(ci) || ci->id != seen->pi.id) {
      plain = false; /* the rest read all the same, for the general path */
      continue;
    }
    seen->in_capture[i] = true;
    seen->nsame++;
  }
  dlsync__order_thread_of(t)->then_capture = any_capture;
  if (!plain || (seen->nsame > 0 && seen->nsame < n))
    return DLSYNC__GENERAL;
  return DLSYNC_SUCCESS;
}

/* begin_fanout's fast path (fan_plain_streams holds): the lanes asked
 * about (each consumer's status while this thread's begins find eager
 * consumers; else, or when one captures, the producer's and the consumers'
 * full queries), then, all eager, one plain record of the thread's scratch
 * event on the producer and a wait each (EAGER_EAGER or JOIN: the same
 * calls), or, all in the producer's capture, its dependencies added to
 * each (SAME_CAPTURE). DLSYNC__GENERAL, nothing queued, for anything else. A
 * failed wait after others joins those back (fan_join), as end would. */
static DLSYNC__NOINLINE dlsync_status fan_fast(dlsync_exchange **out, const fan_job *job,
                                               dlsync__thread *t, fan_seen *seen) {
  dlsync_context *ctx = job->ctx;
  dlsync_lane *producer = job->producer, *consumers = job->consumers;
  size_t n = job->n;
  uint32_t flags = job->flags;
  const dlsync__driver *d = ctx->drv;
  CUstream p = producer->stream;
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_exchange *ex;
  dlsync__pool *memo_pool;
  CUevent ev;
  CUresult r;
  bool full = dlsync__order_thread_of(t)->then_capture;
  unsigned bits = EX_FAN | ((flags & DLSYNC_EXCHANGE_CAPTURE_STABLE) ? EX_STABLE : 0);
  size_t done = 0;
  /* The thread's scratch event of the producer's pool, for the record: a
   * thread without one takes the general path there, which makes it. */
  ev = dlsync__thread_scratch(t, &ctx->pools, p, &memo_pool);
  ex = exchange_alloc(t);
  if (ex == NULL)
    return DLSYNC__GENERAL; /* the general path says so */
  if (!full) {
    /* Each consumer's status; one that captures turns to the full queries
     * (of the producer and of the consumers from it on: the hint missed,
     * and turns for the next call). */
    for (size_t i = 0; i < n && !full; i++) {
      CUstreamCaptureStatus cs;
      r = d->StreamIsCapturing(consumers[i].stream, &cs);
      if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
        st = dlsync__fast_query_failed(d, r, false, consumers[i].stream, fan_role_of(i).s);
        goto cleanup;
      }
      full = cs != CU_STREAM_CAPTURE_STATUS_NONE;
      if (!full)
        seen->eager_upto = i + 1;
    }
    if (full)
      dlsync__order_thread_of(t)->then_capture = true;
  }
  if (full) {
    st = fan_fast_full(job, t, seen);
    if (st != DLSYNC_SUCCESS)
      goto cleanup;
    if (seen->producer_captures) {
      bits |= EX_ONE_CAPTURE; /* every consumer is in it, or joins it now */
      ex->capture_id = seen->pi.id;
    }
  }
  if (seen->nsame == n) {
    /* SAME_CAPTURE: the producer's dependencies (its array is valid: no
     * call on its stream since its query) added to each consumer's. */
    for (size_t i = 0; i < n; i++) {
      dlsync__pair pair;
      dlsync__roles rl;
      pair.first = p;
      pair.then = consumers[i].stream;
      rl.first = "producer";
      rl.then = "consumer";
      if (seen->pi.n > 0) {
        r = d->StreamUpdateCaptureDependencies(pair.then, (CUgraphNode *)(uintptr_t)seen->pi.deps,
                                               NULL, seen->pi.n,
                                               CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
        if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
          fan_role role = fan_role_of(i);
          rl.then = role.s;
          st = dlsync__fail_add(d, r, pair, &rl, seen->pi.n);
          goto cleanup;
        }
      }
      ex->fan[done++] = pair.then;
    }
  } else {
    /* EAGER_EAGER or JOIN: one plain record, a wait each. */
    if (ev == NULL) {
      st = DLSYNC__GENERAL; /* nothing queued; what was read is in seen */
      goto cleanup;
    }
    r = d->EventRecord(ev, p);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      if (!dlsync__fast_record_failed(ctx, r, p, "producer", &st)) {
        /* The memo's pool was not the producer's: nothing queued; the
         * general path reads every lane again (a call on the producer's
         * stream came since its query). */
        st = DLSYNC__GENERAL;
        seen->eager_upto = seen->nread = 0;
        seen->producer_read = false;
      }
      goto cleanup;
    }
    for (size_t i = 0; i < n; i++) {
      r = d->StreamWaitEvent(consumers[i].stream, ev, 0);
      if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
        dlsync__pair pair;
        dlsync__roles rl;
        fan_role role = fan_role_of(i);
        pair.first = p;
        pair.then = consumers[i].stream;
        rl.first = "producer";
        rl.then = role.s;
        st = dlsync__fail_wait(ctx, r, pair, &rl);
        goto cleanup;
      }
      ex->fan[done++] = consumers[i].stream;
    }
  }
  ex->bits = (uint8_t)bits;
  ex->producer_stream = p;
  ex->nmany = n;
  *out = exchange_publish(ex, ctx);
  return DLSYNC_SUCCESS;
cleanup:
  if (done > 0) {
    /* Order back what was ordered; the error stays the first failure's. */
    kept_error k;
    dlsync__kept_save(&k, st);
    fan_join_job j = {t, ctx, p, ex->fan, done, bits, (bits & EX_ONE_CAPTURE) ? ex->capture_id : 0};
    (void)fan_join(j);
    dlsync__kept_restore(&k);
  }
  exchange_free(t, ex);
  return st;
}

dlsync_status dlsync_exchange_begin_fanout(dlsync_exchange **out, dlsync_context *ctx,
                                           dlsync_lane *producer, dlsync_lane *consumers, size_t n,
                                           uint32_t flags) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_exchange_begin_fanout");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__thread *t = NULL;
  dlsync_exchange *ex = NULL;
  dlsync_exchange **parts = NULL;
  size_t nplain = 0;
  fan_consumer fan_inline[FAN_INLINE], *fan = NULL;
  dlsync__lane_now pn;
  fan_job job = {ctx, producer, consumers, n, flags, NULL, &pn, NULL, 0};
  fan_seen seen;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin_fanout: out is NULL");
  *out = NULL;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin_fanout: ctx is NULL");
  if (n == 0 || n > DLSYNC_EXCHANGE_MANY_MAX)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_fanout: %zu consumers (1 to %d)", n,
                        DLSYNC_EXCHANGE_MANY_MAX);
  if (consumers == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_fanout: consumers is NULL (n = %zu)", n);
  st = dlsync__refuse_flags("dlsync_exchange_begin_fanout", flags);
  if (st == DLSYNC_SUCCESS)
    st = fanout_check(producer, consumers, n);
  if (st != DLSYNC_SUCCESS)
    return st;
  if (n == 1)
    return dlsync_exchange_begin_flags(out, ctx, producer, &consumers[0], flags);
  /* Nothing read yet (the queries' results are written as they are made). */
  seen.eager_upto = seen.nread = seen.nsame = 0;
  seen.producer_read = seen.producer_captures = false;
  memset(seen.in_capture, 0, sizeof seen.in_capture);
  if (fan_plain_streams(producer, consumers, n, flags)) {
    st = fan_fast(out, &job, dlsync__thread_get(), &seen);
    if (st != DLSYNC__GENERAL)
      return st;
    st = DLSYNC_SUCCESS;
  }
  /* Everything allocated before anything is queued: the consumers' reads,
   * their parts (records) and the array that keeps them. */
  fan = n <= FAN_INLINE ? fan_inline : dlsync__calloc(n, sizeof *fan);
  parts = dlsync__calloc(n, sizeof *parts); /* n <= DLSYNC_EXCHANGE_MANY_MAX */
  if (fan == NULL || parts == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin_fanout: out of memory");
    goto cleanup;
  }
  t = dlsync__thread_get();
  for (size_t i = 0; i < n; i++) {
    fan[i].rec = NULL;
    snprintf(fan[i].role, sizeof fan[i].role, "consumer %zu", i);
  }
  ex = exchange_alloc(t);
  for (size_t i = 0; i < n && ex != NULL; i++)
    if ((fan[i].rec = exchange_alloc(t)) == NULL) {
      exchange_free(t, ex);
      ex = NULL;
    }
  if (ex == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin_fanout: out of memory");
    goto cleanup;
  }
  /* Every lane read and every pair classified; the refusals say so before
   * anything is queued. */
  job.fan = fan;
  job.parts = parts;
  DLSYNC_TRY(fan_read(&job, &seen));
  /* Consumers in the producer's capture: edges only, the producer's
   * dependencies added to each (before any call on the producer's stream,
   * so its array, when too long to have been copied, is still valid). */
  for (size_t i = 0; i < n; i++) {
    if (fan[i].row != DLSYNC__ROW_SAME_CAPTURE)
      continue;
    st = (flags & DLSYNC_EXCHANGE_KEEP_EDGE_DATA)
             ? dlsync__row_same_capture_keep(ctx->drv, &pn, &fan[i].now)
             : dlsync__row_same_capture(ctx->drv, &pn, &fan[i].now);
    if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
      dlsync__trace_row(DLSYNC__OP_BEGIN, fan[i].row, &pn, &fan[i].now, st);
    if (st != DLSYNC_SUCCESS)
      goto cleanup;
    fan_publish(&job, i, fan[i].row);
  }
  /* Eager consumers (and eager ones of a capture, which join it): one
   * record, a wait each. */
  for (size_t i = 0; i < n; i++)
    nplain += fan[i].row == DLSYNC__ROW_EAGER_EAGER || fan[i].row == DLSYNC__ROW_JOIN;
  if (nplain > 0) {
    st = fan_plain(&job);
    if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
      for (size_t i = 0; i < n; i++)
        if (fan[i].row == DLSYNC__ROW_EAGER_EAGER || fan[i].row == DLSYNC__ROW_JOIN)
          dlsync__trace_row(DLSYNC__OP_BEGIN, fan[i].row, &pn, &fan[i].now, st);
    if (st != DLSYNC_SUCCESS)
      goto cleanup;
  }
  /* The rows with nodes, one consumer graph at a time. */
  for (size_t i = 0; i < n; i++) {
    dlsync__row row = fan[i].row;
    if (row == DLSYNC__ROW_SAME_CAPTURE || row == DLSYNC__ROW_EAGER_EAGER ||
        row == DLSYNC__ROW_JOIN)
      continue;
    DLSYNC_TRY(fan_graph(&job, i, &row));
    fan_publish(&job, i, row);
  }
  ex->bits = EX_MANY;
  ex->many = parts;
  ex->nmany = job.nparts;
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    dlsync__log(DLSYNC__LOG_TRACE, "begin_fanout: %zu consumers (%zu by one event)", n, nplain);
  *out = exchange_publish(ex, ctx);
  ex = NULL;
  parts = NULL;
  job.nparts = 0;
cleanup:
  if (job.nparts > 0) {
    /* Order back what was ordered; the error stays the first failure's. */
    kept_error k;
    dlsync__kept_save(&k, st);
    (void)dlsync__end_parts(parts, job.nparts);
    dlsync__kept_restore(&k);
  }
  if (t != NULL) {
    exchange_free(t, ex);
    for (size_t i = 0; fan != NULL && i < n; i++)
      exchange_free(t, fan[i].rec);
  }
  if (fan != fan_inline)
    dlsync__free(fan);
  dlsync__free(parts);
  return st;
}

/* The end of an EX_FAN record: the streams taken, the record freed, the
 * consumers joined back. */
dlsync_status dlsync__end_fan(dlsync__thread *t, dlsync_exchange *ex, dlsync_context *ctx) {
  CUstream cs[EX_FAN_MAX], p = ex->producer_stream;
  size_t n = ex->nmany;
  unsigned bits = ex->bits;
  uint64_t capture_id = (bits & EX_ONE_CAPTURE) ? ex->capture_id : 0;
  memcpy(cs, ex->fan, n * sizeof *cs);
  ex->nmany = 0;
  exchange_free(t, ex);
  fan_join_job j = {t, ctx, p, cs, n, bits, capture_id};
  return fan_join(j);
}
