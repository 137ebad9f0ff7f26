/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table: dlsync_order and the exchange built on it.
 * include/dlsync/exchange.h has the table; docs/design.md section 3 the why; the rows are
 * classified in table.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order/order.h"
#include "order/table.h"

/* The identity of a lane's graph: the capture id, or the built graph. */
typedef struct domain {
  dlsync_lane_state_kind kind;
  uint64_t capture_id;
  CUgraph graph;
} domain;

/* An exchange record. Records are never freed: they are recycled, and the
 * handle given out names a record and its generation (see "Handles" below),
 * so a handle used after its end is recognised, never a touch of freed
 * memory and never the end of another exchange. */
struct dlsync_exchange {
  /* What begin's and end's fast paths touch: the first 64 bytes (a record
   * is 128 bytes, records are 64-byte aligned: one cache line). */
  /* The record's handle: its generation above its index (EX_INDEX_BITS),
   * odd while begun, even while free. */
  _Alignas(64) atomic_uint_fast64_t handle;
  _Atomic(dlsync_context *) ctx; /* atomic: read by the scan at context destroy */
  CUstream producer_stream;      /* stream lanes */
  CUstream consumer_stream;
  dlsync_lane *producer_ref; /* graph lanes: the caller's (EX_REFS) */
  dlsync_lane *consumer_ref;
  union {
    /* dlsync_exchange_begin_many: the exchanges of the distinct producers,
     * in begin order (EX_MANY). */
    dlsync_exchange **many;
    /* The capture begin found both streams in (EX_ONE_CAPTURE). */
    uint64_t capture_id;
  };
  uint8_t bits; /* EX_*: what end must do; one load on the fast path */
  uint32_t index;
  /* The rest. */
  struct dlsync_exchange *next_free;
  size_t nmany;
  domain producer_domain;
  domain consumer_domain;
};

_Static_assert(sizeof(struct dlsync_exchange) == 128, "an exchange record is two cache lines");

/* An exchange's bits. None of EX_SAME, EX_MANY and EX_REFS: two stream
 * lanes, which end's fast path orders; the fields named after a bit are
 * valid only while it is set, so begin's fast path writes the streams and
 * one byte. */
enum {
  EX_STABLE = 1, /* end may trust what begin found (DLSYNC_EXCHANGE_CAPTURE_STABLE) */
  EX_SAME = 2,   /* one stream: nothing to do at end */
  EX_MANY = 4,   /* dlsync_exchange_begin_many: many, nmany */
  EX_REFS = 8,   /* a graph lane: producer_ref, consumer_ref (either may be NULL) */
  EX_CROSS = 16, /* begin added a record node and a wait node: the domains */
  /* Begin found both streams in one capture (or made the consumer join
   * the producer's), capture_id: end asks the consumer alone. While the
   * consumer is in that capture, so is the producer: a stream leaves a
   * capture only when the capture ends, with all its streams (rule R11,
   * checked on the H200), and capture ids are never reused. */
  EX_ONE_CAPTURE = 32,
};
_Static_assert((unsigned)EX_STABLE == (unsigned)DLSYNC_EXCHANGE_CAPTURE_STABLE,
               "begin's fast path copies the flag into the record's bits");

static domain domain_of(const dlsync__lane_now *l) {
  domain dm;
  dm.kind = l->kind;
  dm.capture_id = l->capture_id;
  dm.graph = l->kind == DLSYNC_LANE_BUILT ? l->graph : NULL;
  return dm;
}

static bool same_domain(const domain *a, const domain *b) {
  if (a->kind != b->kind)
    return false;
  if (a->kind == DLSYNC_LANE_CAPTURING)
    return a->capture_id == b->capture_id;
  if (a->kind == DLSYNC_LANE_BUILT)
    return a->graph == b->graph;
  return false;
}

/* Both lanes in one capture, or both in one built graph. */
static bool same_graph_now(const dlsync__lane_now *a, const dlsync__lane_now *b) {
  domain da = domain_of(a), db = domain_of(b);
  return same_domain(&da, &db);
}

/* The pool to take an event from, as dlsync__lanes_open found it: the
 * context of the first stream lane, or the calling thread's current context
 * when both lanes are graphs (none for one graph). */
typedef struct pool_pick {
  dlsync__pool *pool;
  bool from_memo;  /* not checked against the driver yet */
  CUstream stream; /* the stream whose context it is, if any */
  const char *role;
  dlsync__thread *t; /* the calling thread's block, NULL: not looked up yet */
} pool_pick;

static DLSYNC__INLINE dlsync__thread *pick_thread(pool_pick *pk) {
  if (DLSYNC__UNLIKELY(pk->t == NULL))
    pk->t = dlsync__thread_get();
  return pk->t;
}

/* then.frontier := then.frontier U first.frontier (both graph lanes, same graph). */
static dlsync_status merge_frontiers(dlsync__lane_now *first, dlsync__lane_now *then) {
  dlsync_status st;
  dlsync_lane *lane = then->lane;
  size_t n = lane->ndeps;
  size_t extra = 0;
  for (size_t i = 0; i < first->ndeps; i++) {
    bool dup = false;
    for (size_t j = 0; j < n && !dup; j++)
      dup = lane->deps[j] == first->deps[i];
    for (size_t j = 0; j < i && !dup; j++)
      dup = first->deps[j] == first->deps[i];
    extra += dup ? 0 : 1;
  }
  st = dlsync__lane_fit(lane, n + extra, then->role,
                        "both lanes are in one graph: the union of their frontiers");
  if (st != DLSYNC_SUCCESS)
    return st;
  for (size_t i = 0; i < first->ndeps; i++) {
    bool dup = false;
    for (size_t j = 0; j < lane->ndeps && !dup; j++)
      dup = lane->deps[j] == first->deps[i];
    if (!dup)
      lane->deps[lane->ndeps++] = first->deps[i];
  }
  then->deps = (const CUgraphNode *)lane->deps;
  then->ndeps = lane->ndeps;
  return DLSYNC_SUCCESS;
}

static const char *kind_words(dlsync_lane_state_kind k) {
  switch (k) {
  case DLSYNC_LANE_EAGER:
    return "an eager stream";
  case DLSYNC_LANE_CAPTURING:
    return "a capturing stream";
  default:
    return "a graph lane";
  }
}

static bool context_mismatch(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_CONTEXT;
}

/* Results with which a driver refuses an operation on its arguments (not a
 * capture's rules, not a lack of memory, not a failed driver). */
static bool refusal_result(CUresult r) {
  switch (r) {
  case CUDA_ERROR_INVALID_VALUE:
  case CUDA_ERROR_INVALID_DEVICE:
  case CUDA_ERROR_INVALID_CONTEXT:
  case CUDA_ERROR_INVALID_HANDLE:
  case CUDA_ERROR_NOT_PERMITTED:
  case CUDA_ERROR_NOT_SUPPORTED:
  case CUDA_ERROR_PEER_ACCESS_UNSUPPORTED:
  case CUDA_ERROR_PEER_ACCESS_NOT_ENABLED:
    return true;
  default:
    return false;
  }
}

/* `then` failed to wait (cuStreamWaitEvent) for an event recorded on
 * `first`. When the two streams are of two devices, that is
 * DLSYNC_ERROR_CROSS_DEVICE and the message names both devices; otherwise
 * the driver's status. The devices are looked up only here, on the way out,
 * and only for a refusal (never for capture errors, a lack of memory, or the
 * legacy and per-thread handles). */
static DLSYNC__COLD dlsync_status fail_wait(dlsync_context *ctx, CUresult r, CUstream first,
                                            CUstream then, const char *first_role,
                                            const char *then_role) {
  const dlsync__driver *d = ctx->drv;
  dlsync__pool *pf = NULL, *pt = NULL;
  int df = -1, dt = -1;
  if (refusal_result(r) && !dlsync__is_special_stream(first) && !dlsync__is_special_stream(then) &&
      dlsync__pool_for_stream(&pf, NULL, &ctx->pools, first, first_role) == DLSYNC_SUCCESS &&
      dlsync__pool_for_stream(&pt, NULL, &ctx->pools, then, then_role) == DLSYNC_SUCCESS) {
    df = dlsync__pool_device(pf);
    dt = dlsync__pool_device(pt);
  }
  if (df >= 0 && dt >= 0 && df != dt) {
    return dlsync__fail_driver_as(
        DLSYNC_ERROR_CROSS_DEVICE, d, r, "cuStreamWaitEvent",
        "%s stream %p on device %d waiting for %s stream %p on device %d: the driver refused to "
        "order work across the two devices",
        then_role, (void *)then, dt, first_role, (void *)first, df);
  }
  return dlsync__fail_driver(d, r, "cuStreamWaitEvent", "%s stream %p waiting for %s stream %p",
                             then_role, (void *)then, first_role, (void *)first);
}

/* The memo's pool is not the stream's (the driver refused its event: a
 * stream handle reused in another context): forget the memo and look up the
 * stream's pool with the driver. */
static DLSYNC__COLD dlsync_status repick_pool(dlsync_context *ctx, pool_pick *pk) {
  dlsync__pool_memo_forget(&ctx->pools, pk->stream);
  pk->from_memo = false;
  return dlsync__pool_for_stream(&pk->pool, NULL, &ctx->pools, pk->stream, pk->role);
}

/* cuEventRecord of a pooled event on first's stream. When the pool came from
 * the per-thread memo and the driver says the event is not of the stream's
 * context (a stream handle reused in another context), forget the memo, take
 * an event of the right pool and record again. */
static dlsync_status record_plain(dlsync_context *ctx, pool_pick *pk, CUevent *ev, bool *lent,
                                  dlsync__lane_now *first) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUresult r = d->EventRecord(*ev, first->stream);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS) && pk->from_memo && context_mismatch(r)) {
    dlsync__pool_unborrow(pk->pool, *ev, *lent);
    *ev = NULL;
    DLSYNC_TRY(repick_pool(ctx, pk));
    DLSYNC_TRY(dlsync__pool_borrow(ev, lent, &ctx->pools, pk->pool));
    r = d->EventRecord(*ev, first->stream);
  }
  if (r != CUDA_SUCCESS)
    st = dlsync__fail_driver(d, r, "cuEventRecord", "%s stream %p", first->role,
                             (void *)first->stream);
cleanup:
  return st;
}

/* Before an event goes into a graph node, make sure the pool is the one of the
 * stream's context: a memo answer is checked with cuStreamGetCtx (the driver
 * does not check an event node's context, nor an external record's). */
static dlsync_status check_memo_pool(dlsync_context *ctx, pool_pick *pk) {
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
 * is only valid until the next call on its stream): for rows that hand the
 * lanes' dependencies to a node. */
static dlsync_status verify_pool(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                                 dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  if (!pk->from_memo)
    return DLSYNC_SUCCESS;
  DLSYNC_TRY(check_memo_pool(ctx, pk));
  DLSYNC_TRY(dlsync__lane_refresh(first, ctx->drv));
  DLSYNC_TRY(dlsync__lane_refresh(then, ctx->drv));
cleanup:
  return st;
}

/* ---- one function per row (include/order/table.h) ----
 * `first` and `then` have been read (dlsync__lane_read); pk is the pool the
 * event comes from. */

/* EAGER_EAGER, JOIN: a plain record and wait leave the event free at once,
 * so the thread's own scratch event does. JOIN: `then` joins first's
 * capture (a dependency update cannot: an eager stream's is refused). */
static dlsync_status row_record_wait(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                                     dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUevent ev = NULL;
  bool lent = false;
  CUresult r;
  DLSYNC_TRY(dlsync__pool_borrow(&ev, &lent, &ctx->pools, pk->pool));
  DLSYNC_TRY(record_plain(ctx, pk, &ev, &lent, first));
  r = ctx->drv->StreamWaitEvent(then->stream, ev, 0);
  if (r != CUDA_SUCCESS)
    st = fail_wait(ctx, r, first->stream, then->stream, first->role, then->role);
cleanup:
  if (ev != NULL)
    dlsync__pool_unborrow(pk->pool, ev, lent);
  return st;
}

/* A failed dependency update of `then` (cold). */
static DLSYNC__COLD dlsync_status fail_add(const dlsync__driver *d, CUresult r, CUstream first,
                                           CUstream then, size_t n, const char *first_role,
                                           const char *then_role) {
  return dlsync__fail_driver(
      d, r, "cuStreamUpdateCaptureDependencies",
      "%s stream %p (capturing) taking the %zu dependencies of %s stream "
      "%p, in its capture%s",
      then_role, (void *)then, n, first_role, (void *)first,
      r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? ": the capture has been invalidated" : "");
}

/* SAME_CAPTURE's edges: `then`'s next node must come after what `first`
 * captured so far. Adding first's dependencies to then's
 * (cuStreamUpdateCaptureDependencies, ADD: rule R12) makes the edges a
 * record on first and a wait on then make, in one call and without an event
 * (a record inside a capture copies the stream's dependencies into the event,
 * the wait copies them out again); nodes then already depends on are not
 * added twice. An empty set (first has captured nothing since it began or
 * joined) orders nothing: no call. `deps` may be the driver's array: valid,
 * for no call on first's stream came since it was read. */
static DLSYNC__INLINE dlsync_status add_deps(const dlsync__driver *d, CUstream first, CUstream then,
                                             const CUgraphNode *deps, size_t n,
                                             const char *first_role, const char *then_role) {
  CUresult r;
  if (n == 0)
    return DLSYNC_SUCCESS;
  /* The driver takes a non-const array that it only reads. */
  r = d->StreamUpdateCaptureDependencies(then, (CUgraphNode *)(uintptr_t)deps, NULL, n,
                                         CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (DLSYNC__LIKELY(r == CUDA_SUCCESS))
    return DLSYNC_SUCCESS;
  return fail_add(d, r, first, then, n, first_role, then_role);
}

/* SAME_CAPTURE: first's dependencies added to then's (add_deps). Other
 * calls may have been made on first's stream since its read (its pool's
 * lookup): a set too large to have been copied is read again. */
static dlsync_status row_same_capture(const dlsync__driver *d, dlsync__lane_now *first,
                                      dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  DLSYNC_TRY(dlsync__lane_refresh(first, d));
  st = add_deps(d, first->stream, then->stream, dlsync__lane_deps(first), first->ndeps, first->role,
                then->role);
cleanup:
  return st;
}

/* EAGER_TO_CAPTURE's external wait failed (cold). */
static DLSYNC__COLD dlsync_status fail_external_wait(const dlsync__driver *d, CUresult r,
                                                     CUstream first, CUstream then, uint64_t id,
                                                     const char *first_role,
                                                     const char *then_role) {
  return dlsync__fail_driver(d, r, "cuStreamWaitEvent",
                             "%s stream %p is capturing (capture %llu); adding an external wait "
                             "for eager %s stream %p",
                             then_role, (void *)then, (unsigned long long)id, first_role,
                             (void *)first);
}

/* EAGER_TO_CAPTURE: an event that then's capture holds (its hold takes it
 * from the pool), recorded eagerly on first, then an external wait node in
 * then's capture. The record comes before the wait also because the driver
 * refuses an external wait on a pooled event whose last record was made in an
 * earlier capture (CUDA_ERROR_INVALID_VALUE, seen on the H200). The pool may
 * come from the memo unchecked: the record itself says whether the event is
 * of first's context (a stream handle reused in another context fails it with
 * INVALID_HANDLE / INVALID_CONTEXT); then the memo is forgotten and an event
 * of the right pool taken (the first one stays with the capture, unused, and
 * comes back with its graph). */
static DLSYNC__INLINE dlsync_status row_eager_to_capture(dlsync_context *ctx, pool_pick *pk,
                                                         dlsync__lane_now *first,
                                                         dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  CUresult r;
  DLSYNC_TRY(dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, then, NULL));
  r = d->EventRecord(ev, first->stream);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS) && pk->from_memo && context_mismatch(r)) {
    DLSYNC_TRY(repick_pool(ctx, pk));
    DLSYNC_TRY(
        dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, then, NULL));
    r = d->EventRecord(ev, first->stream);
  }
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = dlsync__fail_driver(d, r, "cuEventRecord", "%s stream %p", first->role,
                             (void *)first->stream);
    goto cleanup;
  }
  r = d->StreamWaitEvent(then->stream, ev, CU_EVENT_WAIT_EXTERNAL);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    st = fail_external_wait(d, r, first->stream, then->stream, then->capture_id, first->role,
                            then->role);
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
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, &then, 1));
  r = d->EventRecord(ev, first->stream);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS) && pk->from_memo && context_mismatch(r)) {
    DLSYNC_TRY(repick_pool(ctx, pk));
    DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, &then, 1));
    r = d->EventRecord(ev, first->stream);
  }
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = dlsync__fail_driver(d, r, "cuEventRecord", "%s stream %p", first->role,
                             (void *)first->stream);
    goto cleanup;
  }
  DLSYNC_TRY(dlsync__graph_append_event(d, then, ev, false));
cleanup:
  return st;
}

/* TWO_CAPTURES: an external record in first's capture (an event-record
 * node) and an external wait in then's (an event-wait node), both holding
 * the event (their holds take it from the pool at once). Two calls where
 * nodes added by hand take four (rule R13: the driver takes an external wait
 * on the record node of another capture still active). The driver does not
 * check the event's context there (a probe on the H200 saw an event of
 * another context taken), so a pool from the memo is checked first
 * (check_memo_pool). A
 * failed wait leaves a record node no one waits for: harmless. */
static DLSYNC__INLINE dlsync_status row_two_captures(dlsync_context *ctx, pool_pick *pk,
                                                     dlsync__lane_now *first,
                                                     dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  DLSYNC_TRY(check_memo_pool(ctx, pk)); /* no dependencies handed over: none read again */
  DLSYNC_TRY(dlsync__graph_capture_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, first, then));
  DLSYNC_CU(d, cuEventRecordWithFlags,
            d->EventRecordWithFlags(ev, first->stream, CU_EVENT_RECORD_EXTERNAL),
            "%s stream %p is capturing (capture %llu); adding an event-record node for %s "
            "stream %p (capture %llu)",
            first->role, (void *)first->stream, (unsigned long long)first->capture_id, then->role,
            (void *)then->stream, (unsigned long long)then->capture_id);
  dlsync__lane_deps_moved(first);
  DLSYNC_CU(d, cuStreamWaitEvent, d->StreamWaitEvent(then->stream, ev, CU_EVENT_WAIT_EXTERNAL),
            "%s stream %p is capturing (capture %llu); adding an event-wait node on %s stream "
            "%p's record (capture %llu)",
            then->role, (void *)then->stream, (unsigned long long)then->capture_id, first->role,
            (void *)first->stream, (unsigned long long)first->capture_id);
  dlsync__lane_deps_moved(then);
cleanup:
  return st;
}

/* CAPTURE_TO_BUILT's external record failed (cold). */
static DLSYNC__COLD dlsync_status fail_external_record_for_graph(const dlsync__driver *d,
                                                                 CUresult r,
                                                                 const dlsync__lane_now *first,
                                                                 const dlsync__lane_now *then) {
  return dlsync__fail_driver(d, r, "cuEventRecordWithFlags",
                             "%s stream %p is capturing (capture %llu); adding an event-record "
                             "node for the %s lane's graph %p",
                             first->role, (void *)first->stream,
                             (unsigned long long)first->capture_id, then->role,
                             (void *)then->graph);
}

/* BUILT_TO_CAPTURE, TWO_BUILT: a record node in first's graph, a wait node
 * in then's, both retaining the event's batch. A capturing `then` (BUILT_TO_CAPTURE)
 * gets its wait node by hand: an external wait is refused on an event whose
 * last record was made in an ended capture (seen on the H200), which a pooled
 * one may be. */
static DLSYNC__INLINE dlsync_status row_two_graphs(dlsync_context *ctx, pool_pick *pk,
                                                   dlsync__lane_now *first,
                                                   dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUevent ev = NULL;
  dlsync__lane_now *lanes[2];
  DLSYNC_TRY(verify_pool(ctx, pk, first, then));
  lanes[0] = first;
  lanes[1] = then;
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, lanes, 2));
  DLSYNC_TRY(dlsync__graph_append_event(ctx->drv, first, ev, true));
  DLSYNC_TRY(dlsync__graph_append_event(ctx->drv, then, ev, false));
cleanup:
  return st;
}

/* CAPTURE_TO_BUILT: as row_two_graphs, with the capture's record node made
 * by an external record (one call where a node added by hand takes two, and
 * no dependency array handed over, so none read again; the driver takes any
 * pooled event there, as rule R13's probe saw). */
static DLSYNC__INLINE dlsync_status row_capture_to_built(dlsync_context *ctx, pool_pick *pk,
                                                         dlsync__lane_now *first,
                                                         dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  CUevent ev = NULL;
  dlsync__lane_now *lanes[2];
  CUresult r;
  DLSYNC_TRY(check_memo_pool(ctx, pk)); /* then is built: no dependencies read again */
  lanes[0] = first;
  lanes[1] = then;
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool, lanes, 2));
  r = d->EventRecordWithFlags(ev, first->stream, CU_EVENT_RECORD_EXTERNAL);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = fail_external_record_for_graph(d, r, first, then);
    goto cleanup;
  }
  dlsync__lane_deps_moved(first);
  DLSYNC_TRY(dlsync__graph_append_event(d, then, ev, false));
cleanup:
  return st;
}

/* REFUSE_BUILT_TO_EAGER. */
static dlsync_status row_refuse_built_to_eager(const dlsync__lane_now *first,
                                               const dlsync__lane_now *then) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the %s lane is graph %p (built by hand, not launched yet) and the %s lane "
                      "is eager stream %p: an eager wait now would order nothing; wait for the "
                      "graph after launching it",
                      first->role, (void *)first->graph, then->role, (void *)then->stream);
}

/* REFUSE_END_TO_EAGER: first is the consumer, then the producer. */
static dlsync_status row_refuse_end_to_eager(const dlsync__lane_now *c, const dlsync__lane_now *p) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the producer is eager stream %p and the consumer is %s (%p): the "
                      "producer's later work cannot wait now for a graph that is not launched "
                      "yet; nothing was queued. Order the producer after launching the graph, "
                      "or capture the producer too",
                      (void *)p->stream, kind_words(c->kind),
                      c->kind == DLSYNC_LANE_BUILT ? (void *)c->graph : (void *)c->stream);
}

/* REFUSE_END_CROSS. */
static dlsync_status row_refuse_end_cross(void) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "begin placed a record node in the producer's graph and a wait node in "
                      "the consumer's (another graph), so the producer's graph must be "
                      "launched first; its later work cannot also wait for the consumer's "
                      "graph. Nothing was queued; order the producer's next graph instead");
}

/* One line of the decision log for a decision. */
static DLSYNC__NOINLINE void trace_row(dlsync__op op, dlsync__row row,
                                       const dlsync__lane_now *first, const dlsync__lane_now *then,
                                       dlsync_status st) {
  char a[96], b[96];
  dlsync__lane_describe(a, sizeof a, first);
  dlsync__lane_describe(b, sizeof b, then);
  dlsync__log(
      DLSYNC__LOG_TRACE, "%s %s: %s %s -> %s %s, nodes added %d%s%s", dlsync__op_name(op),
      dlsync__row_name(row), first->role, a, then->role, b,
      st == DLSYNC_SUCCESS ? dlsync__row_nodes(row) : 0,
      st == DLSYNC_SUCCESS ? "" : ", failed: ", st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
}

/* The table's row for two lanes as they are now (two distinct streams, or
 * lanes that are not one stream: order_lanes handles SAME_STREAM). The fast
 * path's graph rows classify with it too. */
static DLSYNC__INLINE dlsync__row classify_now(dlsync__op op, const dlsync__lane_now *first,
                                               const dlsync__lane_now *then, bool first_pending) {
  dlsync__table_in in;
  in.op = op;
  in.first = first->kind;
  in.then = then->kind;
  in.same_stream = false;
  in.same_graph = same_graph_now(first, then);
  in.first_pending = first_pending;
  return dlsync__table_classify(&in);
}

/* The table: classify, then carry out the row. Inline into the graph
 * lanes' path (order_graph_fast), where the op is known; order_now below
 * for the general path. */
static DLSYNC__INLINE dlsync_status order_now_inline(dlsync_context *ctx, dlsync__op op,
                                                     pool_pick *pk, dlsync__lane_now *first,
                                                     dlsync__lane_now *then, bool first_pending,
                                                     dlsync__row *row_out) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__row row = classify_now(op, first, then, first_pending);
  *row_out = row;
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
    st = row_record_wait(ctx, pk, first, then);
    break;
  case DLSYNC__ROW_SAME_CAPTURE:
    st = row_same_capture(ctx->drv, first, then);
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
    st = merge_frontiers(first, then);
    break;
  case DLSYNC__ROW_REFUSE_BUILT_TO_EAGER:
    st = row_refuse_built_to_eager(first, then);
    break;
  case DLSYNC__ROW_REFUSE_END_TO_EAGER:
    st = row_refuse_end_to_eager(first, then);
    break;
  case DLSYNC__ROW_REFUSE_END_CROSS:
    st = row_refuse_end_cross();
    break;
  default: /* SAME_STREAM (order_lanes), and the fence's rows: not here */
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "internal: row %s in %s",
                      dlsync__row_name(row), dlsync__op_name(op));
    break;
  }
cleanup:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    trace_row(op, row, first, then, st);
  return st;
}

static DLSYNC__NOINLINE dlsync_status order_now(dlsync_context *ctx, dlsync__op op, pool_pick *pk,
                                                dlsync__lane_now *first, dlsync__lane_now *then,
                                                bool first_pending, dlsync__row *row_out) {
  return order_now_inline(ctx, op, pk, first, then, first_pending, row_out);
}

/* Checks both lanes and reads their states; *same when they are one stream
 * (the table's SAME_STREAM row: nothing to do). *pool is the pool order_now
 * takes an event from. The lanes' states are opened->a and ->b; `read`: the
 * fast path has read both into them already (not read again). */
static DLSYNC__INLINE dlsync_status order_lanes(dlsync_context *ctx, dlsync__op op,
                                                dlsync_lane *first, const char *first_role,
                                                dlsync_lane *then, const char *then_role,
                                                dlsync__lanes_opened *opened, bool read,
                                                pool_pick *pool, bool *same) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now *a = &opened->a, *b = &opened->b;
  *same = false;
  if (read) /* two distinct stream lanes, neither special: checked by the fast path */
    goto open;
  memset(pool, 0, sizeof *pool);
  DLSYNC_TRY(dlsync__lane_check(first, first_role));
  DLSYNC_TRY(dlsync__lane_check(then, then_role));
  if (first->kind == DLSYNC_LANE_STREAM && then->kind == DLSYNC_LANE_STREAM &&
      dlsync__same_stream(first->stream, then->stream)) {
    /* One stream: already ordered. One query, for its errors. */
    DLSYNC_TRY(dlsync__lane_read(a, ctx->drv, first, first_role));
    *b = *a;
    b->role = then_role;
    *same = true;
    if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
      trace_row(op, DLSYNC__ROW_SAME_STREAM, a, b, DLSYNC_SUCCESS);
    goto cleanup;
  }
open:
  DLSYNC_TRY(dlsync__lanes_open(opened, ctx, first, first_role, then, then_role,
                                "both lanes are graph lanes", true, read));
  pool->t = NULL;
  pool->pool = opened->pool;
  pool->from_memo = opened->from_memo;
  pool->stream = opened->pool_stream;
  pool->role = opened->pool_role;
cleanup:
  return st;
}

/* The fast path: a plain row of the table (dlsync__row_is_plain: EAGER_EAGER,
 * JOIN, SAME_CAPTURE) and a warm thread. It is row_record_wait (and
 * row_same_capture) without the general machinery: a plain record on
 * `first` and a wait on `then`, with the thread's scratch event of first's
 * context and no lock, or, when both streams are in one capture
 * (SAME_CAPTURE), first's dependencies added to then's. Asking the driver
 * about `then` is enough when it is eager: whether `first` is eager
 * (EAGER_EAGER) or capturing (JOIN), the row is plain, and the same two calls
 * carry it out (a capture of `first` that is invalidated fails the record,
 * which says so); tests/test_decision_table.c checks that both rows are
 * plain. `query` says which streams to ask about: FAST_QUERY_THEN (its
 * status; when it captures, it in full and `first` too, or only first's
 * status while t->first_capture says it is eager; FAST_QUERY_THEN_FULL: its full
 * query at once, the cheaper order while this thread's begins find
 * capturing consumers, noted in t->then_capture), both
 * (FAST_QUERY_BOTH: both eager, or both in one capture, SAME_CAPTURE, as at
 * the end of a join: first's full query, then then's status or full query;
 * FAST_QUERY_BOTH_EAGER: the same rows, asked in the order cheapest when
 * both are eager: first's status query, and only when it captures the full
 * queries of FAST_QUERY_BOTH) or none (FAST_QUERY_NONE: the caller knows
 * they are eager or share a capture). The two BOTH modes note in
 * t->end_capture whether `first` was capturing: the end picks its mode by
 * it (every mode checks what it must, only the number of queries differs).
 *
 * Returns true when it handled the order (*st says how it went), false when
 * the general path must (a stream that is capturing when it must not be, a
 * special stream handle, a first use on this thread, an event of another
 * context); nothing is queued then. */
typedef enum fast_query {
  FAST_QUERY_NONE,
  FAST_QUERY_THEN,
  FAST_QUERY_THEN_FULL,
  FAST_QUERY_BOTH,
  FAST_QUERY_BOTH_EAGER,
  FAST_QUERY_FIRST_IN /* FAST_QUERY_BOTH after EX_ONE_CAPTURE: `first` in that capture is enough */
} fast_query;

/* What FAST_QUERY_THEN read when `then` was capturing: both lanes in full
 * (have), handed to the general path, which then reads neither again. */
/* The two lanes' names in messages, for each entry point. */
typedef struct fast_roles {
  const char *first, *then;
} fast_roles;
static const fast_roles ROLES_ORDER = {"first", "then"};
static const fast_roles ROLES_BEGIN = {"producer", "consumer"};
static const fast_roles ROLES_END = {"consumer", "producer"};

typedef struct fast_pre {
  dlsync_lane *first, *then;
  bool have;
  bool graph_rows; /* dlsync_order: the graph rows of two streams go on here */
  /* begin's record (else NULL): both streams in one capture
   * (SAME_CAPTURE) mark it EX_ONE_CAPTURE, with the id. */
  struct dlsync_exchange *ex;
  dlsync__lanes_opened opened; /* .a: first, .b: then */
} fast_pre;

/* dlsync_order, both lanes read (then's in full, first's in full or, eager,
 * by its status) and not plain: the table's rows
 * that two stream lanes make and a graph takes part in (EAGER_TO_CAPTURE,
 * TWO_CAPTURES) are carried out here, with the memo's pool, checked as the
 * general path checks it (the same row functions); the general path takes
 * the others, and a stream whose pool the memo does not know. */
static DLSYNC__INLINE bool fast_graph_rows(dlsync_context *ctx, dlsync__thread *th, fast_pre *pre,
                                           const char *first_role, dlsync_status *st) {
  dlsync__lane_now *f = &pre->opened.a, *t = &pre->opened.b;
  pool_pick pk;
  dlsync__row row;
  if (!pre->graph_rows || pre->opened.pool == NULL)
    return false;
  row = classify_now(DLSYNC__OP_ORDER, f, t, false);
  if (row != DLSYNC__ROW_EAGER_TO_CAPTURE && row != DLSYNC__ROW_TWO_CAPTURES)
    return false;
  pk.pool = pre->opened.pool;
  pk.from_memo = true;
  pk.stream = pre->first->stream;
  pk.role = first_role;
  pk.t = th;
  *st = row == DLSYNC__ROW_EAGER_TO_CAPTURE ? row_eager_to_capture(ctx, &pk, f, t)
                                            : row_two_captures(ctx, &pk, f, t);
  return true;
}

/* dlsync_order's EAGER_TO_CAPTURE (`first` eager, `then` in capture ct)
 * with an event of the memo's pool at hand in the thread's reserve for that
 * capture (dlsync__graph_capture_event_reserved): row_eager_to_capture's two
 * calls, without writing the lanes or classifying. False, nothing queued:
 * no event at hand (row_eager_to_capture goes on, which takes some under
 * the pool's lock), or the record says the memo's pool is not first's (a
 * stream handle reused in another context: the event stays with the
 * capture, unused; the memo is forgotten and the general path looks the
 * pool up). */
static DLSYNC__INLINE bool fast_eager_to_capture(dlsync_context *ctx, dlsync__thread *th,
                                                 fast_pre *pre, const dlsync__capture_info *ct,
                                                 const char *first_role, const char *then_role,
                                                 dlsync_status *st) {
  const dlsync__driver *d = ctx->drv;
  CUstream first = pre->first->stream, then = pre->then->stream;
  CUevent ev;
  CUresult r;
  if (DLSYNC__UNLIKELY(pre->opened.pool == NULL))
    return false;
  ev = dlsync__graph_capture_event_reserved(th, &ctx->pools, pre->opened.pool, ct->id);
  if (DLSYNC__UNLIKELY(ev == NULL))
    return false;
  r = d->EventRecord(ev, first);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    if (!context_mismatch(r)) {
      *st = dlsync__fail_driver(d, r, "cuEventRecord", "%s stream %p", first_role, (void *)first);
      return true;
    }
    /* A stream handle reused in another context: the general path asks the
     * driver which pool is first's now. */
    dlsync__pool_memo_forget(&ctx->pools, first);
    pre->opened.pool = NULL;
    return false;
  }
  /* *st is DLSYNC_SUCCESS (fast_then_full): written only on failure, which
   * keeps the way out of success in line (with the store merged into the
   * failure's, gcc 13 sent it through the cold section). */
  r = d->StreamWaitEvent(then, ev, CU_EVENT_WAIT_EXTERNAL);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    *st = fail_external_wait(d, r, first, then, ct->id, first_role, then_role);
  return true;
}

/* What the fast path's out-of-line steps say. */
typedef enum fast_next {
  FAST_GO,      /* plain: record and wait */
  FAST_DONE,    /* *st says how it went (a failed query, or SAME_CAPTURE's update) */
  FAST_GENERAL, /* the general path must (nothing queued) */
} fast_next;

/* A failed status or capture query of `s`: *st (cold). */
static DLSYNC__COLD fast_next fast_query_failed(const dlsync__driver *d, CUresult r, bool full,
                                                CUstream s, const char *role, dlsync_status *st) {
  *st = dlsync__fail_driver(d, r, full ? "cuStreamGetCaptureInfo" : "cuStreamIsCapturing",
                            "%s stream %p", role, (void *)s);
  return FAST_DONE;
}

/* `then` read in full (FAST_QUERY_THEN_FULL, or FAST_QUERY_THEN once its
 * status said it captures). Eager: true, *plain (no more queries).
 * Capturing: `first` asked about too (its status while the thread's hint
 * says it is eager, else, or when it captures, its full query); one capture
 * (SAME_CAPTURE): first's dependencies added to then's, true, *st says how
 * it went. A failed read:
 * true, *st says why. False: the general path goes on
 * with both reads, reading neither stream again. */
static DLSYNC__INLINE bool fast_then_full(dlsync_context *ctx, dlsync__thread *th, fast_pre *pre,
                                          const char *first_role, const char *then_role,
                                          dlsync_status *st, bool *plain) {
  const dlsync__driver *d = ctx->drv;
  dlsync__capture_info ct, cf;
  *plain = false;
  *st = DLSYNC_SUCCESS;
  dlsync__lane_query(&ct, d, pre->then->stream);
  if (DLSYNC__LIKELY(dlsync__capture_info_eager(&ct))) {
    th->then_capture = false;
    *plain = true;
    return true;
  }
  if (DLSYNC__UNLIKELY(!dlsync__capture_info_active(&ct))) {
    *st = dlsync__lane_take(&pre->opened.b, d, pre->then, then_role, &ct); /* why not */
    return true;
  }
  th->then_capture = true;
  /* `first`: while this thread's orders find it eager (the hint), its
   * status is enough to go on (EAGER_TO_CAPTURE), one cuStreamIsCapturing
   * where a full query costs more; when it captures, its full query after
   * all (one call more, once: the hint turns). */
  if (DLSYNC__LIKELY(!th->first_capture)) {
    CUstreamCaptureStatus fs;
    CUresult r = d->StreamIsCapturing(pre->first->stream, &fs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      (void)fast_query_failed(d, r, false, pre->first->stream, first_role, st);
      return true;
    }
    if (DLSYNC__LIKELY(fs == CU_STREAM_CAPTURE_STATUS_NONE)) {
      if (pre->graph_rows && fast_eager_to_capture(ctx, th, pre, &ct, first_role, then_role, st))
        return true;
      dlsync__lane_read_eager(&pre->opened.a, pre->first, first_role);
      (void)dlsync__lane_take(&pre->opened.b, d, pre->then, then_role, &ct);
      pre->have = true;
      return fast_graph_rows(ctx, th, pre, first_role, st);
    }
    th->first_capture = true;
  }
  dlsync__lane_query(&cf, d, pre->first->stream);
  th->first_capture = !dlsync__capture_info_eager(&cf);
  if (dlsync__capture_info_active(&cf) && cf.id == ct.id) { /* SAME_CAPTURE */
    if (pre->ex != NULL) {
      pre->ex->bits |= EX_ONE_CAPTURE;
      pre->ex->capture_id = ct.id;
    }
    /* first's array is valid: the query since was of `then`. *st is
     * DLSYNC_SUCCESS: written only on failure, which keeps success (an
     * empty set, no call) out of gcc's .cold section. */
    dlsync_status added =
        add_deps(d, pre->first->stream, pre->then->stream, cf.deps, cf.n, first_role, then_role);
    if (DLSYNC__UNLIKELY(added != DLSYNC_SUCCESS))
      *st = added;
    return true;
  }
  if (DLSYNC__LIKELY(dlsync__capture_info_eager(&cf)) && pre->graph_rows &&
      fast_eager_to_capture(ctx, th, pre, &ct, first_role, then_role, st))
    return true;
  /* Not plain: both lanes written for the graph rows or the general path
   * (then's dependency array is still valid: the query since was of
   * another stream). */
  (void)dlsync__lane_take(&pre->opened.b, d, pre->then, then_role, &ct);
  *st = dlsync__lane_take(&pre->opened.a, d, pre->first, first_role, &cf);
  if (*st != DLSYNC_SUCCESS)
    return true;
  pre->have = true;
  return fast_graph_rows(ctx, th, pre, first_role, st);
}

/* The fast path's queries when a lane captures, or may (the modes other
 * than FAST_QUERY_THEN and FAST_QUERY_NONE with both eager): out of line, so
 * that the eager path stays short, in two functions of few arguments (all
 * in registers). For FAST_QUERY_BOTH_EAGER `first` was found capturing by
 * its status query already. */
static DLSYNC__NOINLINE fast_next fast_then_queries(dlsync__thread *t, dlsync_context *ctx,
                                                    const fast_roles *roles, dlsync_status *st,
                                                    fast_pre *pre) {
  /* FAST_QUERY_THEN: its status query said `then` captures. */
  bool plain;
  if (!fast_then_full(ctx, t, pre, roles->first, roles->then, st, &plain))
    return FAST_GENERAL;
  return plain ? FAST_GO : FAST_DONE;
}

/* FAST_QUERY_BOTH (and BOTH_EAGER with `first` capturing): the full query
 * of `first`; when it captures, its id tells whether `then` is in the same
 * capture (SAME_CAPTURE, the end of a join: first's dependencies, from that
 * query, are added to then's), for one more query of `then`. With
 * one_capture (FAST_QUERY_FIRST_IN: an end whose begin found both streams in
 * capture t->end_capture_id, EX_ONE_CAPTURE), `first` still in that capture
 * is enough: so is `then` (rule R11), and it is not asked. */
static DLSYNC__NOINLINE fast_next fast_both_queries(dlsync__thread *t, const dlsync__driver *d,
                                                    CUstream first, CUstream then, bool one_capture,
                                                    dlsync_status *st) {
  const fast_roles *roles = &ROLES_END; /* only end asks about both */
  CUstreamCaptureStatus cs;
  CUresult r;
  cuuint64_t id_first = 0, id_then = 0;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL; /* asked for, or an edge with data fails the query */
  size_t n = 0;
  r = d->StreamGetCaptureInfo(first, &cs, &id_first, NULL, &deps, &edges, &n);
  if (r != CUDA_SUCCESS)
    return fast_query_failed(d, r, true, first, roles->first, st);
  t->end_capture = cs != CU_STREAM_CAPTURE_STATUS_NONE;
  if (cs == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
    if (!one_capture || id_first != t->end_capture_id) {
      r = d->StreamGetCaptureInfo(then, &cs, &id_then, NULL, NULL, NULL, NULL);
      if (r != CUDA_SUCCESS)
        return fast_query_failed(d, r, true, then, roles->then, st);
      if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || id_then != id_first)
        return FAST_GENERAL;
    }
    /* SAME_CAPTURE; first's array is valid (the query since was of then). */
    *st = add_deps(d, first, then, deps, n, roles->first, roles->then);
    return FAST_DONE;
  }
  if (cs != CU_STREAM_CAPTURE_STATUS_NONE)
    return FAST_GENERAL; /* invalidated: the general path says so */
  /* `first` eager: `then` must be (its status). */
  r = d->StreamIsCapturing(then, &cs);
  if (r != CUDA_SUCCESS)
    return fast_query_failed(d, r, false, then, roles->then, st);
  return cs == CU_STREAM_CAPTURE_STATUS_NONE ? FAST_GO : FAST_GENERAL;
}

/* A failed record or wait of the fast path (cold). */
static DLSYNC__COLD bool fast_record_failed(dlsync_context *ctx, CUresult r, CUstream first,
                                            const char *first_role, dlsync_status *st) {
  if (context_mismatch(r)) {
    /* A stream handle reused in another context: the general path asks the
     * driver which pool is the stream's now. */
    dlsync__pool_memo_forget(&ctx->pools, first);
    return false;
  }
  *st = dlsync__fail_driver(
      ctx->drv, r, "cuEventRecord", "%s stream %p%s", first_role, (void *)first,
      r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? ": its capture has been invalidated" : "");
  return true;
}

static DLSYNC__INLINE bool order_fast(dlsync__thread *t, dlsync_context *ctx, CUstream first,
                                      CUstream then, fast_query query, const fast_roles *roles,
                                      dlsync_status *st, fast_pre *pre) {
  const dlsync__driver *d = ctx->drv;
  const char *first_role = roles->first, *then_role = roles->then;
  CUstreamCaptureStatus cs;
  CUevent ev;
  CUresult r;
  dlsync__pool *memo_pool;
  fast_next next = FAST_GO;
  if (dlsync__is_special_stream(first) || dlsync__is_special_stream(then) || first == then)
    return false;
  /* With the decision log at TRACE, the general path runs, which names each
   * row (it asks the driver about both lanes). */
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    return false;
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
    return false;
  /* Inline: the status queries of eager lanes; whatever captures goes out
   * of line. */
  if (query == FAST_QUERY_BOTH_EAGER) {
    r = d->StreamIsCapturing(first, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      fast_query_failed(d, r, false, first, first_role, st);
      return true;
    }
    if (DLSYNC__LIKELY(cs == CU_STREAM_CAPTURE_STATUS_NONE)) {
      query = FAST_QUERY_THEN;
    } else {
      t->end_capture = true;
      query = FAST_QUERY_BOTH;
    }
  }
  if (query == FAST_QUERY_THEN) {
    r = d->StreamIsCapturing(then, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      fast_query_failed(d, r, false, then, then_role, st);
      return true;
    }
    if (DLSYNC__UNLIKELY(cs != CU_STREAM_CAPTURE_STATUS_NONE)) {
      /* FAST_QUERY_THEN comes from a begin or order whose thread found
       * eager consumers (t->then_capture false) or from an end (pre NULL):
       * only a capture changes the hint. */
      if (pre != NULL)
        t->then_capture = true;
      /* Both in one capture (SAME_CAPTURE, as every exchange after the
       * first inside a capture) is plain too. */
      if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return false;
      next = pre != NULL ? fast_then_queries(t, ctx, roles, st, pre) : FAST_GENERAL;
    }
  } else if (query == FAST_QUERY_THEN_FULL) {
    next = pre != NULL ? fast_then_queries(t, ctx, roles, st, pre) : FAST_GENERAL;
  } else if (query != FAST_QUERY_NONE) {
    next = fast_both_queries(t, d, first, then, query == FAST_QUERY_FIRST_IN, st);
  }
  if (DLSYNC__UNLIKELY(next != FAST_GO))
    return next == FAST_DONE;
  if (DLSYNC__UNLIKELY(ev == NULL))
    return false; /* pre->have: both lanes read */
  r = d->EventRecord(ev, first);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return fast_record_failed(ctx, r, first, first_role, st);
  r = d->StreamWaitEvent(then, ev, 0);
  *st = DLSYNC__LIKELY(r == CUDA_SUCCESS) ? DLSYNC_SUCCESS
                                          : fail_wait(ctx, r, first, then, first_role, then_role);
  return true;
}

/* ---- dlsync_order with a graph built by hand ----
 *
 * The rows of the table that put nodes in a built graph, for a thread whose
 * memo knows the stream lane's pool: EAGER_TO_BUILT, CAPTURE_TO_BUILT,
 * BUILT_TO_CAPTURE (a stream lane and a graph lane) and TWO_BUILT (two graph
 * lanes: the pool of the thread's current context, as the general path
 * finds it), and the graph lanes' other rows (SAME_BUILT,
 * REFUSE_BUILT_TO_EAGER). The same checks as the general path's order_lanes,
 * without what it does for every kind of lane (the lanes are checked, the
 * stream asked about once in full, the built lanes read), then order_now, as
 * the general path: the row classified and carried out by its function. The
 * memo's pool is checked as the row functions check it. False, nothing done:
 * the general path must (two stream lanes, a special stream handle, a stream
 * the memo does not know, the decision log at TRACE, which names each row). */
static DLSYNC__NOINLINE bool order_graph_fast(dlsync_context *ctx, dlsync__thread *t,
                                              dlsync_lane *first, dlsync_lane *then,
                                              dlsync_status *st) {
  const dlsync__driver *d = ctx->drv;
  dlsync__lane_now a, b;
  dlsync_lane *stream_lane = NULL;
  dlsync__lane_now *stream_now = NULL;
  const char *stream_role = NULL;
  pool_pick pk;
  dlsync__row row;
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)) || first == NULL || then == NULL)
    return false;
  if (first->kind == DLSYNC_LANE_GRAPH && then->kind == DLSYNC_LANE_STREAM) {
    stream_lane = then;
    stream_now = &b;
    stream_role = "then";
  } else if (first->kind == DLSYNC_LANE_STREAM && then->kind == DLSYNC_LANE_GRAPH) {
    stream_lane = first;
    stream_now = &a;
    stream_role = "first";
  } else if (first->kind != DLSYNC_LANE_GRAPH || then->kind != DLSYNC_LANE_GRAPH) {
    return false;
  }
  pk.pool = NULL;
  pk.from_memo = false;
  pk.stream = NULL;
  pk.role = NULL;
  pk.t = t;
  if (stream_lane != NULL) {
    if (stream_lane->graph != NULL || dlsync__is_special_stream(stream_lane->stream))
      return false; /* the general path names what is wrong, or reads it its way */
    (void)dlsync__thread_scratch(t, &ctx->pools, stream_lane->stream, &pk.pool);
    if (pk.pool == NULL)
      return false;
    pk.from_memo = true;
    pk.stream = stream_lane->stream;
    pk.role = stream_role;
  }
  *st = first->kind == DLSYNC_LANE_GRAPH ? dlsync__lane_check_graph(first, "first")
                                         : dlsync__lane_check(first, "first");
  if (*st == DLSYNC_SUCCESS)
    *st = then->kind == DLSYNC_LANE_GRAPH ? dlsync__lane_check_graph(then, "then")
                                          : dlsync__lane_check(then, "then");
  if (*st != DLSYNC_SUCCESS)
    return true;
  if (stream_lane != NULL) {
    dlsync__capture_info ci;
    dlsync__lane_query(&ci, d, stream_lane->stream);
    *st = dlsync__lane_take(stream_now, d, stream_lane, stream_role, &ci);
    if (*st != DLSYNC_SUCCESS)
      return true;
    if (stream_lane == then) /* the hint for the fast path's queries */
      t->then_capture = b.kind != DLSYNC_LANE_EAGER;
  } else {
    *st = dlsync__pool_for_current(&pk.pool, &ctx->pools, "both lanes are graph lanes");
    if (*st != DLSYNC_SUCCESS)
      return true;
  }
  if (first->kind == DLSYNC_LANE_GRAPH)
    dlsync__lane_read_built(&a, first, "first");
  if (then->kind == DLSYNC_LANE_GRAPH)
    dlsync__lane_read_built(&b, then, "then");
  /* The table's row and its function, as on the general path. */
  *st = order_now_inline(ctx, DLSYNC__OP_ORDER, &pk, &a, &b, false, &row);
  return true;
}

/* ---- Handles ----
 *
 * Exchange records live in chunks that are never freed (recycled, for the
 * life of the process), found by index. A handle is the record's index and
 * its generation (modulo 2^40), packed into the pointer value, and the
 * record keeps the handle of its last begin; end checks it with one
 * compare-and-swap, so a second end, or an end after the record was reused
 * by a later begin, is DLSYNC_ERROR_INVALID_ARGUMENT.
 * Each thread keeps one free record (no lock on the usual begin/end pair); an
 * end on another thread gives the record to that thread, or to the shared
 * free list; a thread's record goes back to the list when the thread exits. */
#define EX_INDEX_BITS 24
#define EX_CHUNK 1024u
#define EX_CHUNKS ((1u << EX_INDEX_BITS) / EX_CHUNK)
#define EX_GEN_ONE (UINT64_C(1) << EX_INDEX_BITS) /* the generation's lowest bit */

_Static_assert(sizeof(uintptr_t) == 8,
               "exchange handles pack an index and a generation in 64 bits");

static _Atomic(dlsync_exchange *) ex_chunks[EX_CHUNKS];
static atomic_uint ex_made; /* records made so far */
static pthread_mutex_t ex_lock = PTHREAD_MUTEX_INITIALIZER;
static dlsync_exchange *ex_free; /* shared free list, under ex_lock */

static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static pthread_key_t spare_key;
static atomic_bool spare_key_ok;

static void shared_put(dlsync_exchange *ex) {
  pthread_mutex_lock(&ex_lock);
  ex->next_free = ex_free;
  ex_free = ex;
  pthread_mutex_unlock(&ex_lock);
}

static void spare_release(void *p) {
  dlsync__thread *t = p;
  if (t->spare != NULL)
    shared_put(t->spare);
  t->spare = NULL;
  t->spare_keyed = false;
}

static void spare_key_init(void) {
  atomic_store(&spare_key_ok, pthread_key_create(&spare_key, spare_release) == 0);
}

/* As graph.c's built_unload: the key dropped when this copy's destructors
 * run (at exit, or at the dlclose of a library embedding libdlsync.a). */
#if defined(__GNUC__)
__attribute__((destructor)) static void spare_unload(void) {
  if (atomic_exchange(&spare_key_ok, false))
    pthread_key_delete(spare_key);
}
#endif

static dlsync_exchange *record_make(void) {
  dlsync_exchange *ex = NULL, *chunk;
  unsigned i;
  pthread_mutex_lock(&ex_lock);
  if (ex_free != NULL) {
    ex = ex_free;
    ex_free = ex->next_free;
    goto cleanup;
  }
  i = atomic_load_explicit(&ex_made, memory_order_relaxed);
  if (i >= EX_CHUNK * EX_CHUNKS)
    goto cleanup;
  chunk = atomic_load_explicit(&ex_chunks[i / EX_CHUNK], memory_order_relaxed);
  if (chunk == NULL) {
    /* Never freed; aligned by hand (64 bytes more than needed). */
    unsigned char *raw = dlsync__calloc(1, EX_CHUNK * sizeof *chunk + 64);
    if (raw == NULL)
      goto cleanup;
    chunk = (dlsync_exchange *)(void *)(raw + (64 - (uintptr_t)raw % 64) % 64);
    for (unsigned j = 0; j < EX_CHUNK; j++) {
      atomic_init(&chunk[j].handle, i + j); /* generation 0 */
      atomic_init(&chunk[j].ctx, NULL);
      chunk[j].index = i + j;
    }
    atomic_store_explicit(&ex_chunks[i / EX_CHUNK], chunk, memory_order_release);
  }
  ex = &chunk[i % EX_CHUNK];
  atomic_store_explicit(&ex_made, i + 1, memory_order_release);
cleanup:
  pthread_mutex_unlock(&ex_lock);
  return ex;
}

static dlsync_exchange *exchange_alloc(dlsync__thread *t) {
  if (DLSYNC__LIKELY(t->spare != NULL)) {
    dlsync_exchange *ex = t->spare;
    t->spare = NULL;
    return ex;
  }
  return record_make();
}

/* Back to the thread's slot or the shared list; ex's generation is even. */
static DLSYNC__NOINLINE void exchange_free_slow(dlsync__thread *t, dlsync_exchange *ex) {
  if (t->spare == NULL) {
    pthread_once(&spare_once, spare_key_init);
    if (atomic_load(&spare_key_ok) && pthread_setspecific(spare_key, t) == 0) {
      t->spare_keyed = true;
      t->spare = ex;
      return;
    }
  }
  shared_put(ex);
}

static DLSYNC__INLINE void exchange_free(dlsync__thread *t, dlsync_exchange *ex) {
  if (ex == NULL)
    return;
  if (DLSYNC__LIKELY(t->spare == NULL && t->spare_keyed)) {
    t->spare = ex;
    return;
  }
  exchange_free_slow(t, ex);
}

/* A begun record: fields set, then the generation made odd; the handle.
 * The generation is odd, so a handle is never NULL; it counts in the bits
 * above the index and wraps into them without touching the index. */
static DLSYNC__INLINE dlsync_exchange *exchange_publish(dlsync_exchange *ex, dlsync_context *ctx) {
  uint64_t h = atomic_load_explicit(&ex->handle, memory_order_relaxed) + EX_GEN_ONE;
  atomic_store_explicit(&ex->ctx, ctx, memory_order_relaxed);
  atomic_store_explicit(&ex->handle, h, memory_order_release);
  return (dlsync_exchange *)(uintptr_t)h;
}

static DLSYNC__COLD dlsync_exchange *claim_refused(dlsync_exchange *handle, dlsync_status *st) {
  if (handle == NULL)
    *st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_end: exchange is NULL");
  else
    *st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                       "dlsync_exchange_end: %p is not an exchange that is begun: it was ended "
                       "already (each begin is ended once), its context was destroyed, or it was "
                       "never a handle from dlsync_exchange_begin",
                       (void *)handle);
  return NULL;
}

/* The record a handle names, ended (its generation made even) by this call;
 * NULL with DLSYNC_ERROR_INVALID_ARGUMENT when it is not a begun exchange.
 * Any index a handle holds is in range (EX_INDEX_BITS); an even generation
 * (NULL among them) is never begun; a record of a chunk that was made but
 * not handed out yet is at generation 0. The compare-and-swap is the whole
 * check: the record's handle must be this one (so begun, by this handle's
 * begin, and not ended since), and one end alone moves it on. */
static DLSYNC__INLINE dlsync_exchange *exchange_claim(dlsync_exchange *handle, dlsync_status *st) {
  uint64_t h = (uint64_t)(uintptr_t)handle;
  uint64_t idx = h & (EX_GEN_ONE - 1);
  dlsync_exchange *chunk, *ex;
  if (DLSYNC__UNLIKELY((h & EX_GEN_ONE) == 0))
    return claim_refused(handle, st);
  chunk = atomic_load_explicit(&ex_chunks[idx / EX_CHUNK], memory_order_acquire);
  if (DLSYNC__UNLIKELY(chunk == NULL))
    return claim_refused(handle, st);
  ex = &chunk[idx % EX_CHUNK];
  if (DLSYNC__UNLIKELY(!atomic_compare_exchange_strong_explicit(
          &ex->handle, &h, h + EX_GEN_ONE, memory_order_acq_rel, memory_order_relaxed)))
    return claim_refused(handle, st);
  *st = DLSYNC_SUCCESS;
  return ex;
}

/* Context destroy: ends (without ordering anything) the exchanges of ctx
 * that are still begun; returns how many. Must not race with begin or end on
 * ctx (context.h). */
size_t dlsync__exchanges_abandon(const dlsync_context *ctx) {
  size_t n = 0;
  unsigned made = atomic_load_explicit(&ex_made, memory_order_acquire);
  for (unsigned i = 0; i < made; i++) {
    dlsync_exchange *chunk = atomic_load_explicit(&ex_chunks[i / EX_CHUNK], memory_order_acquire);
    dlsync_exchange *ex = &chunk[i % EX_CHUNK];
    uint64_t now = atomic_load_explicit(&ex->handle, memory_order_acquire);
    if ((now & EX_GEN_ONE) == 0 || atomic_load_explicit(&ex->ctx, memory_order_relaxed) != ctx)
      continue;
    if (atomic_compare_exchange_strong_explicit(&ex->handle, &now, now + EX_GEN_ONE,
                                                memory_order_acq_rel, memory_order_acquire)) {
      if (ex->bits & EX_MANY)
        dlsync__free(ex->many); /* its parts are records of ctx too: abandoned by this scan */
      ex->many = NULL;
      ex->nmany = 0;
      shared_put(ex);
      n++;
    }
  }
  return n;
}

void dlsync__order_hints_reset(void) {
  dlsync__thread *t = dlsync__thread_get();
  t->end_capture = false;
  t->then_capture = false;
  t->first_capture = false;
}

static bool plain_stream_lane(const dlsync_lane *l) {
  return l != NULL && l->kind == DLSYNC_LANE_STREAM && l->graph == NULL;
}

/* dlsync_order's fast_pre: nothing read yet, the graph rows on. */
static DLSYNC__INLINE void order_pre_init(fast_pre *pre, dlsync_lane *first, dlsync_lane *then) {
  pre->first = first;
  pre->then = then;
  pre->have = false;
  pre->graph_rows = true;
  pre->ex = NULL;
}

dlsync_status dlsync_order(dlsync_context *ctx, dlsync_lane *first, dlsync_lane *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__thread *t;
  dlsync__row row;
  pool_pick pool;
  bool same = false;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_order: ctx is NULL");
  fast_pre pre;
  t = dlsync__thread_get();
  if (plain_stream_lane(first) && plain_stream_lane(then)) {
    order_pre_init(&pre, first, then);
    if (order_fast(t, ctx, first->stream, then->stream,
                   t->then_capture ? FAST_QUERY_THEN_FULL : FAST_QUERY_THEN, &ROLES_ORDER, &st,
                   &pre))
      return st;
  } else {
    if (order_graph_fast(ctx, t, first, then, &st))
      return st;
    order_pre_init(&pre, first, then); /* nothing read */
  }
  DLSYNC_TRY(order_lanes(ctx, DLSYNC__OP_ORDER, first, "first", then, "then", &pre.opened, pre.have,
                         &pool, &same));
  if (then->kind == DLSYNC_LANE_STREAM) /* the hint for the fast path's queries */
    t->then_capture = pre.opened.b.kind != DLSYNC_LANE_EAGER;
  if (!same)
    DLSYNC_TRY(order_now(ctx, DLSYNC__OP_ORDER, &pool, &pre.opened.a, &pre.opened.b, false, &row));
cleanup:
  return st;
}

/* Everything but the fast path (kept out of line so that the fast path's
 * frame stays small). */
static DLSYNC__NOINLINE dlsync_status begin_general(dlsync_exchange **out, dlsync_context *ctx,
                                                    dlsync_lane *producer, dlsync_lane *consumer,
                                                    uint32_t flags, dlsync__lanes_opened *read) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_exchange *ex = NULL;
  dlsync__thread *t;
  dlsync__lanes_opened local;
  dlsync__lanes_opened *opened = read != NULL ? read : &local;
  dlsync__lane_now *p = &opened->a, *c = &opened->b;
  dlsync__row row = DLSYNC__ROW_SAME_STREAM;
  pool_pick pool;
  bool same = false;
  bool stable = (flags & DLSYNC_EXCHANGE_CAPTURE_STABLE) != 0;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin: out is NULL");
  *out = NULL;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_begin: ctx is NULL");
  if ((flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE) != 0)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_flags: unknown flags 0x%x (known: "
                        "DLSYNC_EXCHANGE_CAPTURE_STABLE = 0x%x)",
                        (unsigned)(flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE),
                        (unsigned)DLSYNC_EXCHANGE_CAPTURE_STABLE);
  t = dlsync__thread_get();
  ex = exchange_alloc(t);
  if (ex == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin: out of memory");
    goto cleanup;
  }
  ex->bits = 0;
  DLSYNC_TRY(order_lanes(ctx, DLSYNC__OP_BEGIN, producer, "producer", consumer, "consumer", opened,
                         read != NULL, &pool, &same));
  if (consumer->kind == DLSYNC_LANE_STREAM) /* the hint for the fast path's queries */
    t->then_capture = c->kind != DLSYNC_LANE_EAGER;
  if (same) {
    ex->bits = EX_SAME; /* its end has nothing to do */
    *out = exchange_publish(ex, ctx);
    ex = NULL;
    goto cleanup;
  }
  DLSYNC_TRY(order_now(ctx, DLSYNC__OP_BEGIN, &pool, p, c, false, &row));
  ex->producer_stream = producer->stream;
  ex->consumer_stream = consumer->stream;
  if (producer->kind == DLSYNC_LANE_GRAPH || consumer->kind == DLSYNC_LANE_GRAPH) {
    ex->bits |= EX_REFS;
    ex->producer_ref = producer->kind == DLSYNC_LANE_GRAPH ? producer : NULL;
    ex->consumer_ref = consumer->kind == DLSYNC_LANE_GRAPH ? consumer : NULL;
  }
  if (dlsync__row_nodes(row) == 2) /* a record node and a wait node */
    ex->bits |= EX_CROSS;
  ex->producer_domain = domain_of(p);
  ex->consumer_domain = domain_of(c);
  /* What end may trust: two eager streams, a consumer that joined the
   * producer's capture, or two streams of one capture; each way end's plain
   * record and wait are right. */
  if (stable && (row == DLSYNC__ROW_EAGER_EAGER || row == DLSYNC__ROW_JOIN ||
                 row == DLSYNC__ROW_SAME_CAPTURE))
    ex->bits |= EX_STABLE;
  /* A consumer that joined the producer's capture, or two streams of one
   * capture: both in the producer's capture now, so end asks the consumer
   * alone, and adds its dependencies to the producer's. */
  if (row == DLSYNC__ROW_JOIN || row == DLSYNC__ROW_SAME_CAPTURE) {
    ex->bits |= EX_ONE_CAPTURE;
    ex->capture_id = p->capture_id;
  }
  *out = exchange_publish(ex, ctx);
  ex = NULL;
cleanup:
  exchange_free(t, ex);
  return st;
}

dlsync_status dlsync_exchange_begin_flags(dlsync_exchange **out, dlsync_context *ctx,
                                          dlsync_lane *producer, dlsync_lane *consumer,
                                          uint32_t flags) {
  dlsync_status st;
  dlsync__thread *t;
  dlsync_exchange *ex;
  /* The fast path: two distinct stream lanes, a warm thread, an eager
   * consumer; anything else (or anything wrong) goes the general way. */
  fast_pre pre;
  if (DLSYNC__UNLIKELY(out == NULL || ctx == NULL ||
                       (flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE) != 0 ||
                       !plain_stream_lane(producer) || !plain_stream_lane(consumer)))
    return begin_general(out, ctx, producer, consumer, flags, NULL);
  t = dlsync__thread_get();
  ex = t->spare;
  if (DLSYNC__UNLIKELY(ex == NULL)) {
    /* The thread's record is in use (dlsync_exchange_begin_many, or an
     * exchange not ended yet): one from the shared list, same fast path. */
    exchange_free(t, record_make()); /* the thread's spare from now on */
    ex = t->spare;
    if (ex == NULL)
      return begin_general(out, ctx, producer, consumer, flags, NULL);
  }
  if (DLSYNC__UNLIKELY(producer->stream == consumer->stream)) {
    /* SAME_STREAM: already ordered; one status query, for its errors. */
    CUstreamCaptureStatus cs;
    CUresult r;
    if (dlsync__is_special_stream(producer->stream) || dlsync__log_on(DLSYNC__LOG_TRACE))
      return begin_general(out, ctx, producer, consumer, flags, NULL);
    r = ctx->drv->StreamIsCapturing(producer->stream, &cs);
    *out = NULL;
    if (r != CUDA_SUCCESS)
      return dlsync__fail_driver(ctx->drv, r, "cuStreamIsCapturing",
                                 "producer (and consumer) "
                                 "stream %p",
                                 (void *)producer->stream);
    t->spare = NULL;
    ex->bits = EX_SAME;
    *out = exchange_publish(ex, ctx);
    return DLSYNC_SUCCESS;
  }
  pre.first = producer;
  pre.then = consumer;
  pre.have = false;
  pre.graph_rows = false;
  /* EX_STABLE is the flag's bit; with it, end trusts begin (and looks at
   * nothing else). The fast path may add EX_ONE_CAPTURE. */
  pre.ex = ex;
  ex->bits = (uint8_t)flags;
  if (!order_fast(t, ctx, producer->stream, consumer->stream,
                  t->then_capture ? FAST_QUERY_THEN_FULL : FAST_QUERY_THEN, &ROLES_BEGIN, &st,
                  &pre))
    return begin_general(out, ctx, producer, consumer, flags, pre.have ? &pre.opened : NULL);
  *out = NULL;
  if (DLSYNC__UNLIKELY(st != DLSYNC_SUCCESS))
    return st;
  t->spare = NULL;
  ex->producer_stream = producer->stream;
  ex->consumer_stream = consumer->stream;
  *out = exchange_publish(ex, ctx);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_exchange_begin(dlsync_exchange **out, dlsync_context *ctx,
                                    dlsync_lane *producer, dlsync_lane *consumer) {
  return dlsync_exchange_begin_flags(out, ctx, producer, consumer, 0);
}

/* ---- many producers ---- */

static bool same_producer(const dlsync_lane *a, const dlsync_lane *b) {
  if (a->kind == DLSYNC_LANE_STREAM && b->kind == DLSYNC_LANE_STREAM)
    return dlsync__same_stream(a->stream, b->stream);
  return a == b;
}

/* A failure kept aside while more calls are made: status, message and the
 * driver's result, set again as the thread's last error by kept_restore. */
typedef struct kept_error {
  dlsync_status status;
  int driver_result;
  char msg[512];
} kept_error;

static void kept_save(kept_error *k, dlsync_status st) {
  k->status = st;
  k->driver_result = dlsync_last_driver_result();
  snprintf(k->msg, sizeof k->msg, "%s", dlsync_last_error());
}

static dlsync_status kept_restore(const kept_error *k) {
  return dlsync__fail_result(k->status, k->driver_result, "%s", k->msg);
}

/* Ends parts[0..n) newest first; the first failure's status, message and
 * driver result. */
static dlsync_status end_parts(dlsync_exchange **parts, size_t n) {
  kept_error first;
  first.status = DLSYNC_SUCCESS;
  for (size_t i = n; i-- > 0;) {
    dlsync_status st = dlsync_exchange_end(parts[i]);
    if (st != DLSYNC_SUCCESS && first.status == DLSYNC_SUCCESS)
      kept_save(&first, st);
  }
  return first.status == DLSYNC_SUCCESS ? DLSYNC_SUCCESS : kept_restore(&first);
}

dlsync_status dlsync_exchange_begin_many(dlsync_exchange **out, dlsync_context *ctx,
                                         dlsync_lane *producers, size_t n, dlsync_lane *consumer,
                                         uint32_t flags) {
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
  if ((flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE) != 0)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_exchange_begin_many: unknown flags 0x%x (known: "
                        "DLSYNC_EXCHANGE_CAPTURE_STABLE = 0x%x)",
                        (unsigned)(flags & ~(uint32_t)DLSYNC_EXCHANGE_CAPTURE_STABLE),
                        (unsigned)DLSYNC_EXCHANGE_CAPTURE_STABLE);
  /* Every lane checked before anything is queued. */
  DLSYNC_TRY(dlsync__lane_check(consumer, "consumer"));
  for (size_t i = 0; i < n; i++) {
    snprintf(role, sizeof role, "producer %zu", i);
    DLSYNC_TRY(dlsync__lane_check(&producers[i], role));
  }
  parts = dlsync__malloc(n * sizeof *parts);
  if (parts == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_exchange_begin_many: out of memory");
    goto cleanup;
  }
  for (size_t i = 0; i < n; i++) {
    bool seen = false;
    for (size_t j = 0; j < i && !seen; j++)
      seen = same_producer(&producers[j], &producers[i]);
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
    kept_save(&k, st);
    (void)end_parts(parts, nparts);
    kept_restore(&k);
  }
  dlsync__free(parts);
  return st;
}

static DLSYNC__NOINLINE dlsync_status end_many(dlsync__thread *t, dlsync_exchange *ex) {
  dlsync_exchange **parts = ex->many;
  size_t n = ex->nmany;
  dlsync_status st;
  ex->many = NULL;
  ex->nmany = 0;
  exchange_free(t, ex);
  st = end_parts(parts, n);
  dlsync__free(parts);
  return st;
}

static DLSYNC__NOINLINE dlsync_status end_general(dlsync__thread *t, dlsync_exchange *ex,
                                                  dlsync_context *ctx) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lanes_opened opened;
  dlsync__lane_now *c = &opened.a, *p = &opened.b;
  dlsync__row row;
  pool_pick pool;
  bool same = false;
  bool cross_holds = false;
  dlsync_lane *producer, *consumer, lp, lc;
  lp = dlsync_lane_stream(ex->producer_stream);
  lc = dlsync_lane_stream(ex->consumer_stream);
  producer = (ex->bits & EX_REFS) && ex->producer_ref != NULL ? ex->producer_ref : &lp;
  consumer = (ex->bits & EX_REFS) && ex->consumer_ref != NULL ? ex->consumer_ref : &lc;
  DLSYNC_TRY(order_lanes(ctx, DLSYNC__OP_END, consumer, "consumer", producer, "producer", &opened,
                         false, &pool, &same));
  if (same)
    goto cleanup;
  if (ex->bits & EX_CROSS) {
    domain pd = domain_of(p), cd = domain_of(c);
    cross_holds = same_domain(&pd, &ex->producer_domain) && same_domain(&cd, &ex->consumer_domain);
  }
  DLSYNC_TRY(order_now(ctx, DLSYNC__OP_END, &pool, c, p, cross_holds, &row));
cleanup:
  exchange_free(t, ex);
  return st;
}

dlsync_status dlsync_exchange_end(dlsync_exchange *handle) {
  dlsync_status st;
  dlsync__thread *t;
  dlsync_context *ctx;
  unsigned bits;
  dlsync_exchange *ex = exchange_claim(handle, &st);
  if (DLSYNC__UNLIKELY(ex == NULL))
    return st;
  t = dlsync__thread_get();
  bits = ex->bits;
  ctx = atomic_load_explicit(&ex->ctx, memory_order_relaxed);
  /* Stream lanes: both eager now, or in one capture (two queries: status
   * queries while this thread's ends find eager consumers, full queries
   * while they find captures; one full query of the consumer when begin
   * found both in one capture, EX_ONE_CAPTURE), or, when begin may be
   * trusted (DLSYNC_EXCHANGE_CAPTURE_STABLE), eager or one capture as begin
   * found them (no query). */
  if (DLSYNC__LIKELY((bits & (EX_SAME | EX_MANY | EX_REFS)) == 0)) {
    fast_query q;
    if (DLSYNC__LIKELY((bits & (EX_STABLE | EX_ONE_CAPTURE)) == 0)) {
      q = t->end_capture ? FAST_QUERY_BOTH : FAST_QUERY_BOTH_EAGER;
    } else if (bits & EX_ONE_CAPTURE) {
      /* With CAPTURE_STABLE too: the query gives the consumer's
       * dependencies, which the producer takes (cheaper than a record and
       * a wait, which need no query). */
      q = FAST_QUERY_FIRST_IN;
      t->end_capture_id = ex->capture_id;
    } else {
      q = FAST_QUERY_NONE;
    }
    if (order_fast(t, ctx, ex->consumer_stream, ex->producer_stream, q, &ROLES_END, &st, NULL)) {
      exchange_free(t, ex);
      return st;
    }
  } else if (bits & EX_MANY) {
    return end_many(t, ex);
  } else if (bits & EX_SAME) {
    exchange_free(t, ex);
    return DLSYNC_SUCCESS; /* one stream: its own order is enough */
  }
  return end_general(t, ex, ctx);
}
