/* SPDX-License-Identifier: Apache-2.0 */
/* Fences: an event recorded on a lane, waited on from any lane later.
 * include/dlsync/fence.h has the contract. */
#include <stdlib.h>
#include <string.h>

#include "order/order.h"
#include "order/table.h"

struct dlsync_fence {
  atomic_uint refs; /* 0: released (the memory waits in the free list) */
  struct dlsync_fence *next_free;
  dlsync_context *ctx;
  dlsync_fence_kind kind;
  dlsync__held_event *he; /* the event, held while the fence lives */
  CUstream stream;        /* CAPTURED: the stream it was signalled on */
  pthread_t thread;       /* CAPTURED: the signalling thread (per-thread stream) */
  dlsync__where where;    /* CAPTURED, BUILT: where the record node is */
  CUgraph graph;          /* CAPTURED, BUILT: the graph holding the record node */
  CUgraphNode node;       /* CAPTURED, BUILT: the record node */
  dlsync_provenance prov; /* IMPORTED: where the event was recorded */
};

/* The decision log's line for a signal: the lane's state names what was
 * done (eager record, or a record node in the lane's graph). */
static DLSYNC__NOINLINE void trace_signal(const dlsync_context *ctx, const dlsync__lane_now *l,
                                          dlsync_status st, const dlsync_fence *f) {
  char a[96] = "?";
  if (st == DLSYNC_SUCCESS)
    dlsync__lane_describe(a, sizeof a, l);
  dlsync__log(DLSYNC__LOG_TRACE,
              "fence signal %s: context %p, signalling %s -> fence %p, nodes added %d%s%s",
              st != DLSYNC_SUCCESS           ? "failed"
              : l->kind == DLSYNC_LANE_EAGER ? "eager record"
                                             : "record node",
              (const void *)ctx, a, (const void *)f,
              st == DLSYNC_SUCCESS && l->kind != DLSYNC_LANE_EAGER ? 1 : 0,
              st == DLSYNC_SUCCESS ? "" : ": ", st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
}

/* ---- fence memory: recycled, freed at the unload ----
 *
 * A released fence goes to the back of a FIFO and is reused only once
 * FENCE_QUARANTINE others have been released after it, so a fence used after
 * its last release is found released (refs 0: DLSYNC_ERROR_INVALID_ARGUMENT)
 * rather than read from freed memory, unless that many fences were released
 * since; then it is another fence (fence.h says so). */
#define FENCE_QUARANTINE 64

static pthread_mutex_t fence_lock = PTHREAD_MUTEX_INITIALIZER;
static dlsync_fence *fence_head, *fence_tail;
static size_t fence_nfree;

/* The unload hook (base/base.h): the released fences freed (those still
 * referenced are the program's; the library's threads are joined by then). */
static void fences_unload(void) {
  if (dlsync__unload_at_exit())
    return; /* another thread may be in a call with a fence (base/base.h) */
  pthread_mutex_lock(&fence_lock);
  while (fence_head != NULL) {
    dlsync_fence *f = fence_head;
    fence_head = f->next_free;
    dlsync__free(f);
  }
  fence_tail = NULL;
  fence_nfree = 0;
  pthread_mutex_unlock(&fence_lock);
}

static dlsync_fence *fence_alloc(void) {
  dlsync_fence *f = NULL;
  pthread_mutex_lock(&fence_lock);
  if (fence_nfree > FENCE_QUARANTINE) {
    f = fence_head;
    fence_head = f->next_free;
    if (fence_head == NULL)
      fence_tail = NULL;
    fence_nfree--;
  }
  pthread_mutex_unlock(&fence_lock);
  if (f == NULL) {
    dlsync__hooks_set(DLSYNC__HOOK_FENCES, NULL, fences_unload);
    f = dlsync__calloc(1, sizeof *f);
    if (f == NULL)
      return NULL;
  } else {
    memset((char *)f + sizeof f->refs, 0, sizeof *f - sizeof f->refs);
  }
  atomic_store_explicit(&f->refs, 1, memory_order_relaxed);
  return f;
}

static void fence_recycle(dlsync_fence *f) {
  atomic_store_explicit(&f->refs, 0, memory_order_release);
  f->next_free = NULL;
  pthread_mutex_lock(&fence_lock);
  if (fence_tail != NULL)
    fence_tail->next_free = f;
  else
    fence_head = f;
  fence_tail = f;
  fence_nfree++;
  pthread_mutex_unlock(&fence_lock);
}

static dlsync_status fence_released(const dlsync_fence *f, const char *fn) {
  return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "%s: fence %p was released (its last reference is gone); retain a fence "
                      "for as long as it is used",
                      fn, (const void *)f);
}

static const dlsync__lanes_ask signal_ask = {"signalling", NULL,
                                             "the signalling lane is a graph lane", false};

dlsync_status dlsync_fence_signal(dlsync_fence **out, dlsync_context *ctx, dlsync_lane *lane) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_signal");
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d;
  dlsync_fence *f = NULL;
  dlsync__lane_now l;
  dlsync__lanes_opened opened;
  dlsync__pool *pool = NULL;
  CUevent ev = NULL;
  memset(&l, 0, sizeof l);
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_signal: out is NULL");
  *out = NULL;
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_signal: ctx is NULL");
  d = ctx->drv;
  DLSYNC_TRY(dlsync__lane_check(lane, "signalling"));
  if (lane->kind == DLSYNC_LANE_GRAPH)
    DLSYNC_TRY(dlsync__lane_fit(lane, 1, "signalling", "the record node"));
  opened.read = false;
  DLSYNC_TRY(dlsync__lanes_open(&opened, ctx, lane, NULL, &signal_ask));
  l = opened.a;
  pool = opened.pool;
  f = fence_alloc();
  if (f == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_fence_signal: out of memory");
    goto cleanup;
  }
  f->ctx = ctx;
  DLSYNC_TRY(dlsync__pool_get(&ev, pool));
  f->he = dlsync__held_event_new(pool, ev);
  if (f->he == NULL) {
    dlsync__pool_put(pool, ev);
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_fence_signal: out of memory");
    goto cleanup;
  }
  if (l.kind == DLSYNC_LANE_EAGER) {
    f->kind = DLSYNC_FENCE_EAGER;
    DLSYNC_CU(d, EventRecord, (ev, l.stream), "signalling stream %p", (void *)l.stream);
  } else {
    /* A record node in the lane's graph, which holds the event too. */
    f->kind = l.kind == DLSYNC_LANE_CAPTURING ? DLSYNC_FENCE_CAPTURED : DLSYNC_FENCE_BUILT;
    f->stream = l.stream;
    f->thread = pthread_self();
    f->where = dlsync__lane_where(&l);
    f->graph = l.graph;
    DLSYNC_TRY(dlsync__body_refuse(&ctx->bodies, "dlsync_fence_signal", &l, true));
    DLSYNC_TRY(dlsync__graph_hold_event(ctx->drv, f->he, &f->graph, 1));
    DLSYNC_TRY(dlsync__graph_append_event_node(ctx->drv, &l, ev, true, &f->node));
  }
  dlsync__context_ref(ctx);
  atomic_fetch_add_explicit(&ctx->live_fences, 1, memory_order_relaxed);
  *out = f;
  f = NULL;
cleanup:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    trace_signal(ctx, &l, st, *out);
  if (f != NULL) {
    dlsync__held_event_unref(f->he);
    fence_recycle(f);
  }
  return st;
}

/* Is the capture the fence was signalled in still going on? Asked of the
 * stream it was signalled on (which must still exist). */
static dlsync_status capture_active(bool *active, const dlsync_fence *f) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = f->ctx->drv;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  *active = false;
  if (f->stream == CU_STREAM_PER_THREAD && !pthread_equal(f->thread, pthread_self())) {
    /* That handle names this thread's own stream here, not the one that
     * captured: the capture's state cannot be read from this thread. */
    st = dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the fence was signalled in a capture of another thread's per-thread "
                      "default stream, whose state cannot be read from this thread; wait from "
                      "that thread, or signal on an explicit stream");
    goto cleanup;
  }
  DLSYNC_CU(d, StreamGetCaptureInfo, (f->stream, &cs, &id, NULL, NULL, NULL, NULL),
            "stream %p, on which fence %p was signalled", (void *)f->stream, (const void *)f);
  *active = cs != CU_STREAM_CAPTURE_STATUS_NONE && id == f->where.capture_id;
  if (*active && cs == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
    st = dlsync__fail(DLSYNC_ERROR_CAPTURE_INVALIDATED,
                      "the fence was signalled in capture %llu, which was invalidated: its graph "
                      "can never be made, so nothing can wait for the fence; end that capture "
                      "(cuStreamEndCapture fails) and signal a new fence",
                      (unsigned long long)f->where.capture_id);
cleanup:
  return st;
}

/* Is the fence's record node a node of the lane's graph? Graph and node
 * handles are reused after destroy, so equal graph handles are not enough:
 * the node must be found among the graph's nodes and record this fence's
 * event (no other node records it). */
static dlsync_status in_graph(bool *found, const dlsync_fence *f, CUgraph g) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = f->ctx->drv;
  CUgraphNode *nodes = NULL;
  size_t n = 0;
  *found = false;
  if (g != f->graph)
    return DLSYNC_SUCCESS;
  DLSYNC_CU(d, GraphGetNodes, (g, NULL, &n), "graph %p", (void *)g);
  if (n == 0)
    goto cleanup;
  {
    size_t bytes = 0;
    nodes = dlsync__mul_size(n, sizeof *nodes, &bytes) ? dlsync__malloc(bytes) : NULL;
  }
  if (nodes == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_fence_wait: out of memory");
    goto cleanup;
  }
  DLSYNC_CU(d, GraphGetNodes, (g, nodes, &n), "graph %p", (void *)g);
  for (size_t i = 0; i < n && !*found; i++) {
    CUgraphNodeType type;
    CUevent ev = NULL;
    if (nodes[i] != f->node)
      continue;
    DLSYNC_CU(d, GraphNodeGetType, (nodes[i], &type), "graph %p", (void *)g);
    if (type != CU_GRAPH_NODE_TYPE_EVENT_RECORD)
      break;
    DLSYNC_CU(d, GraphEventRecordNodeGetEvent, (nodes[i], &ev), "graph %p", (void *)g);
    *found = ev == f->he->event;
  }
cleanup:
  dlsync__free(nodes);
  return st;
}

/* The state of the lane the fence was signalled on, as the table sees it. */
static dlsync_lane_state_kind fence_state(const dlsync_fence *f) {
  switch (f->kind) {
  case DLSYNC_FENCE_EAGER:
    return DLSYNC_LANE_EAGER;
  case DLSYNC_FENCE_CAPTURED:
    return DLSYNC_LANE_CAPTURING;
  case DLSYNC_FENCE_IMPORTED:
    /* An external record node is waited on as a built graph's record node
     * (armed at launch); a plain record in a capture as that capture's. */
    return f->prov == DLSYNC_PROVENANCE_EXTERNAL_RECORD ? DLSYNC_LANE_BUILT
           : f->prov == DLSYNC_PROVENANCE_CAPTURED      ? DLSYNC_LANE_CAPTURING
                                                        : DLSYNC_LANE_EAGER;
  default:
    return DLSYNC_LANE_BUILT;
  }
}

/* Imported from a plain record in a capture: usable from that capture only. */
static bool imported_captured(const dlsync_fence *f) {
  return f->kind == DLSYNC_FENCE_IMPORTED && f->prov == DLSYNC_PROVENANCE_CAPTURED;
}

/* Reads what the classifier needs beyond the two kinds: whether the fence's
 * capture is still active (only asked for an eager waiter) and whether the
 * waiter is in the fence's capture or graph. */
static dlsync_status fence_table_in(dlsync__table_in *in, const dlsync_fence *f,
                                    const dlsync__lane_now *l) {
  dlsync_status st = DLSYNC_SUCCESS;
  memset(in, 0, sizeof *in);
  in->op = DLSYNC__OP_FENCE_WAIT;
  in->first = fence_state(f);
  in->then = l->kind;
  if (l->kind == DLSYNC_LANE_EAGER && f->kind == DLSYNC_FENCE_CAPTURED)
    DLSYNC_TRY(capture_active(&in->first_pending, f));
  if (l->kind == DLSYNC_LANE_EAGER && imported_captured(f))
    in->first_pending = true; /* never launched as such: an eager wait orders nothing */
  if (l->kind == DLSYNC_LANE_CAPTURING && in->first == DLSYNC_LANE_CAPTURING)
    in->same_graph = l->capture_id == f->where.capture_id; /* capture ids are unique */
  if (l->kind == DLSYNC_LANE_BUILT && f->kind == DLSYNC_FENCE_BUILT)
    DLSYNC_TRY(in_graph(&in->same_graph, f, l->graph));
cleanup:
  return st;
}

/* EAGER_EAGER, LAUNCHED_TO_EAGER: a plain wait for the event's last record. */
static dlsync_status wait_eager(dlsync_fence *f, const dlsync__lane_now *l) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = f->ctx->drv;
  DLSYNC_CU(d, StreamWaitEvent, (l->stream, f->he->event, 0), "waiting stream %p on fence %p",
            (void *)l->stream, (void *)f);
cleanup:
  return st;
}

/* REFUSE_CAPTURE_TO_EAGER. */
static dlsync_status wait_refused(const dlsync_fence *f, const dlsync__lane_now *l) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the fence was signalled in capture %llu, which is still active: eager "
                      "stream %p cannot wait for a graph that is not launched yet; wait after "
                      "ending the capture and launching its graph, or wait from that capture",
                      (unsigned long long)f->where.capture_id, (void *)l->stream);
}

/* An imported plain in-capture record waited on from anywhere but its
 * capture: nothing correct exists (foreign.h, note 3). */
static dlsync_status wait_foreign_refused(const dlsync_fence *f, const dlsync__lane_now *l) {
  char b[96];
  dlsync__lane_describe(b, sizeof b, l);
  return dlsync__fail(
      DLSYNC_ERROR_CAPTURE_ORDER,
      "fence %p was imported as a plain record in capture %llu: it can be waited on only from "
      "that capture, not from %s (an eager wait orders nothing, a wait from another capture "
      "breaks both, a wait node waits for an unrelated record); have the producer record with "
      "CU_EVENT_RECORD_EXTERNAL and import it as DLSYNC_PROVENANCE_EXTERNAL_RECORD",
      (const void *)f, (unsigned long long)f->where.capture_id, b);
}

/* SAME_CAPTURE: an edge from the record node, no new node. */
static dlsync_status wait_same_capture(dlsync_fence *f, const dlsync__lane_now *l) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = f->ctx->drv;
  if (imported_captured(f)) {
    /* A plain wait on a record of the same capture: edges only. */
    DLSYNC_CU(d, StreamWaitEvent, (l->stream, f->he->event, 0),
              "waiting stream %p on imported fence %p in its capture", (void *)l->stream,
              (void *)f);
    goto cleanup;
  }
  DLSYNC_CU(d, StreamUpdateCaptureDependencies,
            (l->stream, &f->node, NULL, 1, CU_STREAM_ADD_CAPTURE_DEPENDENCIES),
            "waiting stream %p on fence %p in the same capture", (void *)l->stream, (void *)f);
cleanup:
  return st;
}

/* The other rows: a wait node in the waiter's graph, which holds the event
 * (EAGER_TO_CAPTURE: an external wait; the rest: a node appended by hand). */
static dlsync_status wait_node(dlsync_fence *f, dlsync__row row, dlsync__lane_now *l) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = f->ctx->drv;
  DLSYNC_TRY(dlsync__body_refuse(&f->ctx->bodies, dlsync__row_name(row), l, false));
  if (l->kind == DLSYNC_LANE_BUILT)
    DLSYNC_TRY(dlsync__lane_fit(l->lane, 1, "waiting", "the wait node"));
  DLSYNC_TRY(dlsync__graph_hold_event(f->ctx->drv, f->he, &l->graph, 1));
  if (row == DLSYNC__ROW_EAGER_TO_CAPTURE) {
    DLSYNC_CU(d, StreamWaitEvent, (l->stream, f->he->event, CU_EVENT_WAIT_EXTERNAL),
              "capturing stream %p waiting on eager fence %p", (void *)l->stream, (void *)f);
  } else {
    DLSYNC_TRY(dlsync__graph_append_event_node(f->ctx->drv, l, f->he->event, false, NULL));
  }
cleanup:
  return st;
}

static DLSYNC__NOINLINE void trace_wait(const dlsync_fence *f, dlsync__row row,
                                        const dlsync__lane_now *l, int nodes, dlsync_status st) {
  char b[96];
  dlsync__lane_describe(b, sizeof b, l);
  dlsync__log(DLSYNC__LOG_TRACE,
              "fence wait %s: fence %p (%s, capture %llu, graph %p) -> waiting %s, nodes added "
              "%d%s%s",
              dlsync__row_name(row), (const void *)f,
              f->kind == DLSYNC_FENCE_EAGER      ? "eager"
              : f->kind == DLSYNC_FENCE_CAPTURED ? "captured"
              : f->kind == DLSYNC_FENCE_BUILT    ? "built"
                                                 : "imported",
              (unsigned long long)f->where.capture_id, (void *)f->graph, b,
              st == DLSYNC_SUCCESS ? nodes : 0, st == DLSYNC_SUCCESS ? "" : ", failed: ",
              st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
}

dlsync_status dlsync_fence_wait(dlsync_fence *f, dlsync_lane *lane) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_wait");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now l;
  dlsync__table_in in;
  dlsync__row row = DLSYNC__ROW_COUNT;
  int nodes = 0; /* the wait node, if one is added */
  if (f == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_wait: fence is NULL");
  if (atomic_load_explicit(&f->refs, memory_order_acquire) == 0)
    return fence_released(f, "dlsync_fence_wait");
  DLSYNC_TRY(dlsync__lane_check(lane, "waiting"));
  DLSYNC_TRY(dlsync__lane_read(&l, f->ctx->drv, lane, "waiting"));
  DLSYNC_TRY(fence_table_in(&in, f, &l));
  row = dlsync__table_classify(&in);
  if (imported_captured(f) && row != DLSYNC__ROW_SAME_CAPTURE) {
    st = wait_foreign_refused(f, &l);
    goto traced;
  }
  switch (row) {
  case DLSYNC__ROW_EAGER_EAGER:
  case DLSYNC__ROW_LAUNCHED_TO_EAGER:
    st = wait_eager(f, &l);
    break;
  case DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER:
    st = wait_refused(f, &l);
    break;
  case DLSYNC__ROW_SAME_CAPTURE:
    st = wait_same_capture(f, &l);
    break;
  case DLSYNC__ROW_SAME_BUILT:
    /* The same graph: the record node joins the frontier, no new node. */
    st = dlsync__graph_lane_add_dep(&l, f->node);
    break;
  default:
    st = wait_node(f, row, &l);
    nodes = 1;
    break;
  }
traced:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    trace_wait(f, row, &l, nodes, st);
cleanup:
  return st;
}

dlsync_fence *dlsync_fence_retain(dlsync_fence *f) {
  unsigned refs;
  if (DLSYNC__IN_FORKED_CHILD()) {
    (void)dlsync__fail_forked("dlsync_fence_retain");
    return NULL;
  }
  if (f == NULL)
    return NULL;
  refs = atomic_load_explicit(&f->refs, memory_order_relaxed);
  do {
    if (refs == 0) {
      (void)fence_released(f, "dlsync_fence_retain");
      return NULL;
    }
  } while (!atomic_compare_exchange_weak_explicit(&f->refs, &refs, refs + 1, memory_order_relaxed,
                                                  memory_order_relaxed));
  return f;
}

void dlsync_fence_release(dlsync_fence *f) {
  dlsync_context *ctx;
  unsigned refs;
  if (DLSYNC__IN_FORKED_CHILD()) {
    (void)dlsync__fail_forked("dlsync_fence_release"); /* the parent's: left alone */
    return;
  }
  if (f == NULL)
    return;
  refs = atomic_load_explicit(&f->refs, memory_order_relaxed);
  do {
    if (refs == 0) {
      (void)fence_released(f, "dlsync_fence_release"); /* a release too many: ignored */
      return;
    }
  } while (!atomic_compare_exchange_weak_explicit(&f->refs, &refs, refs - 1, memory_order_acq_rel,
                                                  memory_order_relaxed));
  if (refs != 1)
    return;
  ctx = f->ctx;
  dlsync__held_event_unref(f->he);
  fence_recycle(f);
  atomic_fetch_sub_explicit(&ctx->live_fences, 1, memory_order_relaxed);
  /* Maybe from a host function or a user-object destructor: if this was the
   * context's last reference (destroyed before its fences), the context and
   * its orphaned events go on dlsync's janitor. */
  dlsync__context_unref_elsewhere(ctx);
}

dlsync_status dlsync_fence_get_kind(dlsync_fence_kind *out, const dlsync_fence *f) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_get_kind");
  if (out == NULL || f == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_get_kind: %s is NULL",
                        out == NULL ? "out" : "fence");
  if (atomic_load_explicit(&f->refs, memory_order_acquire) == 0)
    return fence_released(f, "dlsync_fence_get_kind");
  *out = f->kind;
  return DLSYNC_SUCCESS;
}

/* ---- another runtime's events (include/dlsync/foreign.h) ---- */

static const char *provenance_name(dlsync_provenance p) {
  switch (p) {
  case DLSYNC_PROVENANCE_EAGER:
    return "EAGER";
  case DLSYNC_PROVENANCE_COMPLETE:
    return "COMPLETE";
  case DLSYNC_PROVENANCE_EXTERNAL_RECORD:
    return "EXTERNAL_RECORD";
  default:
    return "CAPTURED";
  }
}

static bool handle_error(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_VALUE ||
         r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

/* A driver call of the check failed: DLSYNC_ERROR_DRIVER (its capture
 * errors say nothing of a capture here), or OUT_OF_MEMORY. */
static dlsync_status import_check_failed(const dlsync__driver *d, CUresult r, const char *call,
                                         const char *what, CUevent event) {
  return dlsync__fail_driver_as(
      r == CUDA_ERROR_OUT_OF_MEMORY ? DLSYNC_ERROR_OUT_OF_MEMORY : DLSYNC_ERROR_DRIVER,
      &(dlsync__driver_call){d, r, call}, "%s event %p", what, (void *)event);
}

/* The event's state as cuEventQuery tells it, asked in the RELAXED capture
 * interaction mode (legal during another capture: rule R40), against what
 * the caller declared. An event declared CAPTURED is not asked: a query of
 * an event plainly recorded in an active capture invalidates that capture
 * (rule R41), so its check would break what it checks. */
static dlsync_status import_check(const dlsync__driver *d, CUevent event, dlsync_provenance prov) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CUresult r, x;
  bool contradicts;
  if (d->EventQuery == NULL || prov == DLSYNC_PROVENANCE_CAPTURED)
    return DLSYNC_SUCCESS; /* a driver without it, or a CAPTURED event: nothing checked */
  x = d->ThreadExchangeStreamCaptureMode(&mode);
  if (x != CUDA_SUCCESS)
    return import_check_failed(d, x, "cuThreadExchangeStreamCaptureMode",
                               "entering the RELAXED capture mode to ask for", event);
  r = d->EventQuery(event);
  x = d->ThreadExchangeStreamCaptureMode(&mode);
  if (x != CUDA_SUCCESS)
    return import_check_failed(d, x, "cuThreadExchangeStreamCaptureMode",
                               "restoring this thread's capture mode (it is left RELAXED) after "
                               "asking for",
                               event);
  if (handle_error(r))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_fence_import: event %p is not a live event (cuEventQuery: %s): "
                        "destroyed, or not an event",
                        (void *)event, dlsync__driver_error_name(d, r));
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY && r != CUDA_ERROR_CAPTURED_EVENT)
    return import_check_failed(d, r, "cuEventQuery", "asking for imported", event);
  contradicts = r == CUDA_ERROR_CAPTURED_EVENT ||
                (r == CUDA_ERROR_NOT_READY && prov == DLSYNC_PROVENANCE_COMPLETE);
  if (contradicts)
    return dlsync__fail(
        DLSYNC_ERROR_INVALID_ARGUMENT,
        "dlsync_fence_import: provenance %s contradicts the driver: cuEventQuery of event %p "
        "says %s (%s)",
        provenance_name(prov), (void *)event, dlsync__driver_error_name(d, r),
        r == CUDA_ERROR_CAPTURED_EVENT
            ? "last recorded by a plain record in a capture: declare it CAPTURED with that "
              "capture's id; the driver invalidates that capture on such a query"
        : r == CUDA_ERROR_NOT_READY ? "recorded eagerly or by a graph, not complete"
                                    : "recorded eagerly or by a graph, or never");
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_fence_import(dlsync_fence **out, dlsync_context *ctx, CUevent event,
                                  dlsync_provenance prov, uint64_t capture_id, unsigned int flags) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_import");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync_fence *f = NULL;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_import: out is NULL");
  *out = NULL;
  if (ctx == NULL || event == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_import: %s is NULL",
                        ctx == NULL ? "ctx" : "event");
  if (prov < DLSYNC_PROVENANCE_EAGER || prov > DLSYNC_PROVENANCE_CAPTURED)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_fence_import: unknown provenance %d (EAGER, COMPLETE, "
                        "EXTERNAL_RECORD or CAPTURED)",
                        (int)prov);
  if ((flags & ~DLSYNC_IMPORT_OWN) != 0)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_fence_import: unknown flags 0x%x (only DLSYNC_IMPORT_OWN)",
                        flags & ~DLSYNC_IMPORT_OWN);
  if ((capture_id == 0) == (prov == DLSYNC_PROVENANCE_CAPTURED))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_fence_import: capture_id %llu with provenance %s (a capture's id "
                        "for CAPTURED, 0 for the others)",
                        (unsigned long long)capture_id, provenance_name(prov));
  /* Owned events let go since the last import are destroyed now (cuEventDestroy
   * is legal during capture), so an importer's events do not pile up. */
  dlsync__orphans_collect();
  DLSYNC_TRY(import_check(ctx->drv, event, prov));
  f = fence_alloc();
  if (f == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_fence_import: out of memory");
    goto cleanup;
  }
  f->ctx = ctx;
  f->kind = DLSYNC_FENCE_IMPORTED;
  f->prov = prov;
  f->where.capture_id = capture_id;
  f->he = dlsync__held_event_new_foreign(ctx->drv, event, (flags & DLSYNC_IMPORT_OWN) != 0);
  if (f->he == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_fence_import: out of memory");
    goto cleanup;
  }
  dlsync__context_ref(ctx);
  atomic_fetch_add_explicit(&ctx->live_fences, 1, memory_order_relaxed);
  *out = f;
  f = NULL;
cleanup:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    dlsync__log(DLSYNC__LOG_TRACE,
                "fence import %s: context %p, event %p (%s, capture %llu) -> "
                "fence %p%s%s",
                st == DLSYNC_SUCCESS ? "done" : "failed", (const void *)ctx, (void *)event,
                provenance_name(prov), (unsigned long long)capture_id, (const void *)*out,
                st == DLSYNC_SUCCESS ? "" : ": ",
                st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
  if (f != NULL)
    fence_recycle(f); /* no held event yet: the event stays the caller's */
  return st;
}

dlsync_status dlsync_fence_export_event(CUevent *out, const dlsync_fence *f) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_export_event");
  if (out == NULL || f == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_export_event: %s is NULL",
                        out == NULL ? "out" : "fence");
  *out = NULL;
  if (atomic_load_explicit(&f->refs, memory_order_acquire) == 0)
    return fence_released(f, "dlsync_fence_export_event");
  if (imported_captured(f))
    return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                        "dlsync_fence_export_event: fence %p was imported as a plain record in "
                        "capture %llu; its event means something only inside that capture",
                        (const void *)f, (unsigned long long)f->where.capture_id);
  *out = f->he->event;
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_fence_get_provenance(dlsync_provenance *out, const dlsync_fence *f) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_fence_get_provenance");
  if (out == NULL || f == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_fence_get_provenance: %s is NULL",
                        out == NULL ? "out" : "fence");
  if (atomic_load_explicit(&f->refs, memory_order_acquire) == 0)
    return fence_released(f, "dlsync_fence_get_provenance");
  if (f->kind != DLSYNC_FENCE_IMPORTED)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_fence_get_provenance: fence %p was signalled by dlsync, not "
                        "imported (dlsync_fence_get_kind says where)",
                        (const void *)f);
  *out = f->prov;
  return DLSYNC_SUCCESS;
}
