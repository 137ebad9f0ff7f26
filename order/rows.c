/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table's rows (rows.h): their cold parts (failures, refusals,
 * the decision log) and the rows that only the general path carries out. */
#include <stdlib.h>
#include <string.h>

#include "order/rows.h"

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

/* The devices are looked up only here, on the way out, and only for a
 * refusal (never for capture errors, a lack of memory, or the legacy and
 * per-thread handles). */
dlsync_status dlsync__fail_wait(dlsync_context *ctx, CUresult r, dlsync__pair p,
                                const dlsync__roles *roles) {
  const dlsync__driver *d = ctx->drv;
  dlsync__pool *pf = NULL, *pt = NULL;
  int df = -1, dt = -1;
  if (refusal_result(r) && !dlsync__is_special_stream(p.first) &&
      !dlsync__is_special_stream(p.then) &&
      dlsync__pool_for_stream(&pf, NULL, &ctx->pools, p.first, roles->first) == DLSYNC_SUCCESS &&
      dlsync__pool_for_stream(&pt, NULL, &ctx->pools, p.then, roles->then) == DLSYNC_SUCCESS) {
    df = dlsync__pool_device(pf);
    dt = dlsync__pool_device(pt);
  }
  if (df >= 0 && dt >= 0 && df != dt) {
    return dlsync__fail_driver_as(
        DLSYNC_ERROR_CROSS_DEVICE, &(dlsync__driver_call){d, r, "cuStreamWaitEvent"},
        "%s stream %p on device %d waiting for %s stream %p on device %d: the driver refused to "
        "order work across the two devices",
        roles->then, (void *)p.then, dt, roles->first, (void *)p.first, df);
  }
  return dlsync__fail_driver(d, r, "cuStreamWaitEvent", "%s stream %p waiting for %s stream %p",
                             roles->then, (void *)p.then, roles->first, (void *)p.first);
}

dlsync_status dlsync__fail_record(const dlsync__driver *d, CUresult r, dlsync__pair p,
                                  const dlsync__roles *roles) {
  return dlsync__fail_driver(
      d, r, "cuEventRecord", "%s stream %p%s", roles->first, (void *)p.first,
      r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? ": its capture has been invalidated" : "");
}

dlsync_status dlsync__fail_add(const dlsync__driver *d, CUresult r, dlsync__pair p,
                               const dlsync__roles *roles, size_t n) {
  /* The row's one call: refused, it added nothing. */
  dlsync_status st = dlsync__fail_driver(
      d, r, "cuStreamUpdateCaptureDependencies",
      "%s stream %p (capturing) taking the %zu dependencies of %s stream "
      "%p, in its capture%s",
      roles->then, (void *)p.then, n, roles->first, (void *)p.first,
      r == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ? ": the capture has been invalidated" : "");
  dlsync__fail_nothing_queued();
  return st;
}

dlsync_status dlsync__fail_external_wait(const dlsync__driver *d, CUresult r, dlsync__pair p,
                                         const dlsync__roles *roles, uint64_t id) {
  return dlsync__fail_driver(d, r, "cuStreamWaitEvent",
                             "%s stream %p is capturing (capture %llu); adding an external wait "
                             "for eager %s stream %p",
                             roles->then, (void *)p.then, (unsigned long long)id, roles->first,
                             (void *)p.first);
}

dlsync_status dlsync__fail_external_record_for_graph(const dlsync__driver *d, CUresult r,
                                                     const dlsync__lane_now *first,
                                                     const dlsync__lane_now *then) {
  return dlsync__fail_driver(d, r, "cuEventRecordWithFlags",
                             "%s stream %p is capturing (capture %llu); adding an event-record "
                             "node for the %s lane's graph %p",
                             first->role, (void *)first->stream,
                             (unsigned long long)first->capture_id, then->role,
                             (void *)then->graph);
}

/* The memo's pool is not the stream's (the driver refused its event: a
 * stream handle reused in another context): forget the memo and look up the
 * stream's pool with the driver. */
dlsync_status dlsync__repick_pool(dlsync_context *ctx, pool_pick *pk) {
  dlsync__pool_memo_forget(&ctx->pools, pk->stream);
  pk->from_memo = false;
  return dlsync__pool_for_stream(&pk->pool, NULL, &ctx->pools, pk->stream, pk->role);
}

/* A plain record and wait leave the event free at once, so the pool's
 * event is given back at once. When the pool came from the per-thread memo
 * and the driver says the event is not of the stream's context (a stream
 * handle reused in another context), the memo is forgotten, an event of the
 * right pool taken and the calls made again. */
dlsync_status dlsync__row_record_wait(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                                      dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__pair p = dlsync__pair_of(first, then);
  dlsync__roles rl = dlsync__roles_of_lanes(first, then);
  CUevent ev = NULL;
  bool lent = false;
  CUresult r;
  DLSYNC_TRY(dlsync__pool_borrow(&ev, &lent, &ctx->pools, pk->pool));
  r = row_plain_calls(ctx, ev, p, &rl, &st);
  if (r != CUDA_SUCCESS && pk->from_memo && context_mismatch(r)) {
    dlsync__pool_unborrow(pk->pool, ev, lent);
    ev = NULL;
    DLSYNC_TRY(dlsync__repick_pool(ctx, pk));
    DLSYNC_TRY(dlsync__pool_borrow(&ev, &lent, &ctx->pools, pk->pool));
    r = row_plain_calls(ctx, ev, p, &rl, &st);
  }
  if (r != CUDA_SUCCESS)
    st = dlsync__fail_record(ctx->drv, r, p, &rl);
cleanup:
  if (ev != NULL)
    dlsync__pool_unborrow(pk->pool, ev, lent);
  return st;
}

/* Other calls may have been made on first's stream since its read (its
 * pool's lookup): a set too large to have been copied is read again. */
dlsync_status dlsync__row_same_capture(const dlsync__driver *d, dlsync__lane_now *first,
                                       dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__roles rl;
  DLSYNC_TRY(dlsync__lane_refresh(first, d));
  rl = dlsync__roles_of_lanes(first, then);
  st = row_same_capture_calls(d, dlsync__pair_of(first, then), &rl, dlsync__lane_deps(first),
                              first->ndeps);
cleanup:
  return st;
}

/* The driver's answer for first's stream with edge data is valid until the
 * next call on that stream; the update is a call on then's. A capture of
 * first that ended or changed since its read is said so by the query (an
 * update into another capture would be refused anyway: its nodes are not of
 * then's graph). */
dlsync_status dlsync__row_same_capture_keep(const dlsync__driver *d, dlsync__lane_now *first,
                                            dlsync__lane_now *then) {
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  const CUgraphNode *deps = NULL;
  const CUgraphEdgeData *edges = NULL;
  size_t n = 0;
  dlsync__roles rl = dlsync__roles_of_lanes(first, then);
  dlsync_status st;
  CUresult r = d->StreamGetCaptureInfo(first->stream, &cs, &id, NULL, &deps, &edges, &n);
  if (r != CUDA_SUCCESS) {
    st = dlsync__fail_driver(d, r, "cuStreamGetCaptureInfo",
                             "%s stream %p, read again for its edge data", first->role,
                             (void *)first->stream);
    dlsync__fail_nothing_queued();
    return st;
  }
  if (cs != CU_STREAM_CAPTURE_STATUS_ACTIVE || id != first->capture_id)
    return dlsync__fail(
        cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? DLSYNC_ERROR_CAPTURE_INVALIDATED
                                                   : DLSYNC_ERROR_INVALID_LANE,
        "%s stream %p left capture %llu (%s) while %s stream %p was being "
        "ordered after it; nothing was queued",
        first->role, (void *)first->stream, (unsigned long long)first->capture_id,
        cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED ? "invalidated" : "ended on another thread",
        then->role, (void *)then->stream);
  if (n == 0)
    return DLSYNC_SUCCESS;
  /* The driver takes non-const arrays that it only reads. */
  r = d->StreamUpdateCaptureDependencies(then->stream, (CUgraphNode *)(uintptr_t)deps,
                                         (CUgraphEdgeData *)(uintptr_t)edges, n,
                                         CU_STREAM_ADD_CAPTURE_DEPENDENCIES);
  if (r == CUDA_SUCCESS)
    return DLSYNC_SUCCESS;
  return dlsync__fail_add(d, r, dlsync__pair_of(first, then), &rl, n);
}

/* A node of a frontier, and where it stands: a frontier's nodes are kept in
 * their order, duplicates found by sorting (n log n: a frontier may hold
 * tens of thousands of nodes). */
typedef struct frontier_item {
  CUgraphNode node;
  size_t at; /* lane's nodes 0..n-1, then first's n.. */
} frontier_item;

static int frontier_item_cmp(const void *a, const void *b) {
  const frontier_item *x = a, *y = b;
  if ((uintptr_t)x->node != (uintptr_t)y->node)
    return (uintptr_t)x->node < (uintptr_t)y->node ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

/* Marks in take[0..m) the nodes of `add` to append to `have` (n nodes): the
 * first of each node that `have` lacks. Small sets: compared pairwise. */
static dlsync_status frontier_new_nodes(bool *take, const CUgraphNode *have, size_t n,
                                        const CUgraphNode *add, size_t m) {
  frontier_item *items = NULL;
  size_t small = 0, bytes = 0;
  if (dlsync__mul_size(m, n + m, &small) && small <= 4096) {
    for (size_t i = 0; i < m; i++) {
      bool dup = false;
      for (size_t j = 0; j < n && !dup; j++)
        dup = have[j] == add[i];
      for (size_t j = 0; j < i && !dup; j++)
        dup = add[j] == add[i];
      take[i] = !dup;
    }
    return DLSYNC_SUCCESS;
  }
  if (dlsync__mul_size(n + m, sizeof *items, &bytes))
    items = dlsync__malloc(bytes);
  if (items == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                        "the union of two frontiers of %zu and %zu nodes: out of memory", n, m);
  for (size_t i = 0; i < n; i++) {
    items[i].node = have[i];
    items[i].at = i;
  }
  for (size_t i = 0; i < m; i++) {
    items[n + i].node = add[i];
    items[n + i].at = n + i;
    take[i] = false;
  }
  qsort(items, n + m, sizeof *items, frontier_item_cmp);
  for (size_t i = 0; i < n + m; i++) /* a group's first item is its earliest */
    if ((i == 0 || items[i - 1].node != items[i].node) && items[i].at >= n)
      take[items[i].at - n] = true;
  dlsync__free(items);
  return DLSYNC_SUCCESS;
}

/* then.frontier := then.frontier U first.frontier (both graph lanes, same
 * graph), first's new nodes appended in their order. */
dlsync_status dlsync__row_same_built(dlsync__lane_now *first, dlsync__lane_now *then) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_lane *lane = then->lane;
  size_t n = lane->ndeps, m = first->ndeps, extra = 0;
  bool take_inline[64];
  bool *take = m <= 64 ? take_inline : dlsync__malloc(m * sizeof *take);
  if (take == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                        "the union of two frontiers of %zu and %zu nodes: out of memory", n, m);
  DLSYNC_TRY(frontier_new_nodes(take, lane->deps, n, first->deps, m));
  for (size_t i = 0; i < m; i++)
    extra += take[i];
  DLSYNC_TRY(dlsync__lane_fit(lane, n + extra, then->role,
                              "both lanes are in one graph: the union of their frontiers"));
  for (size_t i = 0; i < m; i++)
    if (take[i])
      lane->deps[lane->ndeps++] = first->deps[i];
  then->deps = (const CUgraphNode *)lane->deps;
  then->ndeps = lane->ndeps;
cleanup:
  if (take != take_inline)
    dlsync__free(take);
  return st;
}

dlsync_status dlsync__row_refuse_built_to_eager(const dlsync__lane_now *first,
                                                const dlsync__lane_now *then) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the %s lane is graph %p (built by hand, not launched yet) and the %s lane "
                      "is eager stream %p: an eager wait now would order nothing; wait for the "
                      "graph after launching it",
                      first->role, (void *)first->graph, then->role, (void *)then->stream);
}

/* REFUSE_END_TO_EAGER: first is the consumer, then the producer. */
dlsync_status dlsync__row_refuse_end_to_eager(const dlsync__lane_now *c,
                                              const dlsync__lane_now *p) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the producer is eager stream %p and the consumer is %s (%p): the "
                      "producer's later work cannot wait now for a graph that is not launched "
                      "yet; nothing was queued. Order the producer after launching the graph, "
                      "or capture the producer too",
                      (void *)p->stream, kind_words(c->kind),
                      c->kind == DLSYNC_LANE_BUILT ? (void *)c->graph : (void *)c->stream);
}

dlsync_status dlsync__row_refuse_end_cross(void) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "begin placed a record node in the producer's graph and a wait node in "
                      "the consumer's (another graph), so the producer's graph must be "
                      "launched first; its later work cannot also wait for the consumer's "
                      "graph. Nothing was queued; order the producer's next graph instead");
}

void dlsync__trace_row(dlsync__op op, dlsync__row row, const dlsync__lane_now *first,
                       const dlsync__lane_now *then, dlsync_status st) {
  char a[96], b[96];
  dlsync__lane_describe(a, sizeof a, first);
  dlsync__lane_describe(b, sizeof b, then);
  dlsync__log(
      DLSYNC__LOG_TRACE, "%s %s: %s %s -> %s %s, nodes added %d%s%s", dlsync__op_name(op),
      dlsync__row_name(row), first->role, a, then->role, b,
      st == DLSYNC_SUCCESS ? dlsync__row_nodes(row) : 0,
      st == DLSYNC_SUCCESS ? "" : ", failed: ", st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
}

/* ---- the guard on declared conditional bodies, and the hoist ---- */

/* The graph an event node for body g goes to instead, and the conditional
 * node it is placed around: g's parent, or the parent's parent while the
 * parent is a body itself, each declared with its node
 * (dlsync_conditional_node_declare). False when some body on the way up was
 * declared alone, in another context, or the chain loops. */
static bool hoist_target(const dlsync__bodies *b, CUgraph g, CUgraph *graph, CUgraphNode *node) {
  for (int depth = 0; depth <= DLSYNC_CONDITIONAL_BODIES; depth++) {
    CUgraph p;
    CUgraphNode n;
    if (dlsync__bodies_find(b, g) != DLSYNC__BODY_HERE || !dlsync__bodies_parent(b, g, &p, &n))
      return false;
    if (dlsync__bodies_find(b, p) == DLSYNC__BODY_NOT) {
      *graph = p;
      *node = n;
      return true;
    }
    g = p;
  }
  return false;
}

/* A graph the hoisted node goes to, as a built lane for the event's batch
 * (its graph retains it). */
static dlsync__lane_now hoist_lane(CUgraph g, const char *role) {
  dlsync__lane_now l;
  memset(&l, 0, sizeof l);
  l.kind = DLSYNC_LANE_BUILT;
  l.graph = g;
  l.role = role;
  return l;
}

typedef struct hoist_plan {
  bool first, then;       /* which side is hoisted */
  CUgraph first_graph;    /* first: the record node's graph ... */
  CUgraphNode first_node; /* ... after this conditional node */
  CUgraph then_graph;     /* then: the wait node's graph ... */
  CUgraphNode then_node;  /* ... ahead of this conditional node */
  const char *row;        /* the row's name, for messages */
} hoist_plan;

/* The row with its event node(s) moved out of the body: a record node
 * after the conditional node in its outermost admitting graph (first), a
 * wait node there with an edge to the conditional node (then); the side
 * that is not in a body as the row does it. One event, from a batch that
 * every graph given a node retains. */
static dlsync_status hoist(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                           dlsync__lane_now *then, const hoist_plan *h) {
  dlsync_status st = DLSYNC_SUCCESS;
  const char *row = h->row;
  const dlsync__driver *d = ctx->drv;
  dlsync__lane_now pf, pt, *lanes[2];
  int nl = 0;
  CUevent ev = NULL;
  CUgraphNode rec = NULL, w = NULL;
  DLSYNC_TRY(verify_pool(ctx, pk, first, then));
  if (h->first) {
    pf = hoist_lane(h->first_graph, first->role);
    lanes[nl++] = &pf;
  } else if (first->kind != DLSYNC_LANE_EAGER) {
    lanes[nl++] = first;
  }
  if (h->then) {
    pt = hoist_lane(h->then_graph, then->role);
    lanes[nl++] = &pt;
  } else {
    lanes[nl++] = then;
  }
  DLSYNC_TRY(dlsync__graph_built_event(&ev, pick_thread(pk), &ctx->pools, pk->pool,
                                       (dlsync__lane_list){lanes, nl}));
  if (h->first) {
    DLSYNC_CU(d, GraphAddEventRecordNode, (&rec, h->first_graph, &h->first_node, 1, ev),
              "%s: the %s lane's graph %p is a conditional node's body; adding its record node "
              "to graph %p after conditional node %p",
              row, first->role, (void *)first->graph, (void *)h->first_graph,
              (void *)h->first_node);
  } else if (first->kind == DLSYNC_LANE_EAGER) {
    DLSYNC_CU(d, EventRecord, (ev, first->stream), "%s: %s stream %p", row, first->role,
              (void *)first->stream);
  } else if (first->kind == DLSYNC_LANE_CAPTURING) {
    DLSYNC_CU(d, EventRecordWithFlags, (ev, first->stream, CU_EVENT_RECORD_EXTERNAL),
              "%s: %s stream %p is capturing (capture %llu); adding an event-record node", row,
              first->role, (void *)first->stream, (unsigned long long)first->capture_id);
    dlsync__lane_deps_moved(first);
  } else {
    DLSYNC_TRY(dlsync__graph_append_event(d, first, ev, true));
  }
  if (h->then) {
    DLSYNC_CU(d, GraphAddEventWaitNode, (&w, h->then_graph, NULL, 0, ev),
              "%s: the %s lane's graph %p is a conditional node's body; adding its wait node to "
              "graph %p ahead of conditional node %p",
              row, then->role, (void *)then->graph, (void *)h->then_graph, (void *)h->then_node);
    DLSYNC_CU(d, GraphAddDependencies, (h->then_graph, &w, &h->then_node, NULL, 1),
              "%s: the edge from the hoisted wait node %p to conditional node %p in graph %p "
              "(the wait node stays, ordering nothing: a graph already instantiated, or a node "
              "that has started?)",
              row, (void *)w, (void *)h->then_node, (void *)h->then_graph);
  } else {
    DLSYNC_TRY(dlsync__graph_append_event(d, then, ev, false));
  }
  DLSYNC__LOG(DLSYNC__LOG_INFO, "%s hoisted out of a conditional body: record %p, wait %p", row,
              (void *)rec, (void *)w);
cleanup:
  return st;
}

/* The graph an un-hoisted lane's node goes to (NULL: eager). */
static CUgraph lane_graph(const dlsync__lane_now *l) {
  return l->kind == DLSYNC_LANE_EAGER ? NULL : l->graph;
}

dlsync_status dlsync__body_guard_slow(dlsync_context *ctx, pool_pick *pk, dlsync__lane_now *first,
                                      dlsync__lane_now *then, bool *done) {
  const dlsync__bodies *b = &ctx->bodies;
  /* The row that adds nodes for these two kinds (rows.h's functions). */
  dlsync__row row = first->kind != DLSYNC_LANE_EAGER
                        ? dlsync__table_two_graphs(first->kind, then->kind)
                    : then->kind == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_EAGER_TO_CAPTURE
                                                          : DLSYNC__ROW_EAGER_TO_BUILT;
  const char *name = dlsync__row_name(row);
  dlsync__body_where wf =
      first->kind == DLSYNC_LANE_EAGER ? DLSYNC__BODY_NOT : dlsync__bodies_find(b, first->graph);
  dlsync__body_where wt =
      then->kind == DLSYNC_LANE_EAGER ? DLSYNC__BODY_NOT : dlsync__bodies_find(b, then->graph);
  hoist_plan h;
  CUgraph gf, gt;
  dlsync_status st;
  if (wf == DLSYNC__BODY_NOT && wt == DLSYNC__BODY_NOT)
    return DLSYNC_SUCCESS;
  memset(&h, 0, sizeof h);
  h.then = wt != DLSYNC__BODY_NOT && hoist_target(b, then->graph, &h.then_graph, &h.then_node);
  h.first = wf != DLSYNC__BODY_NOT && hoist_target(b, first->graph, &h.first_graph, &h.first_node);
  if (wt != DLSYNC__BODY_NOT && !h.then)
    return dlsync__body_refuse_row(b, name, then, false);
  if (wf != DLSYNC__BODY_NOT && !h.first)
    return dlsync__body_refuse_row(b, name, first, true);
  gf = h.first ? h.first_graph : lane_graph(first);
  gt = h.then ? h.then_graph : lane_graph(then);
  if (gf == gt)
    return dlsync__fail(DLSYNC_ERROR_CONDITIONAL_BODY,
                        "%s: the %s lane (graph %p) or the %s lane (graph %p) is in a conditional "
                        "node's body, and its event node would go to graph %p, where the other "
                        "side's node goes too: one graph orders with edges, not events. Nothing "
                        "was queued; order on the parent graph's lane instead: before the "
                        "conditional node is added, or after it (the conditional node in the "
                        "lane's frontier)",
                        name, first->role, (void *)first->graph, then->role, (void *)then->graph,
                        (void *)gf);
  if (h.then) {
    st = dlsync__driver_require_entry(ctx->drv, DLSYNC__DRIVER_INDEX_GraphAddDependencies,
                                      "a wait hoisted out of a conditional node's body");
    if (st != DLSYNC_SUCCESS)
      return st;
  }
  *done = true;
  h.row = name;
  return hoist(ctx, pk, first, then, &h);
}
