/* SPDX-License-Identifier: Apache-2.0 */
/* Stream-ordered release: deleters run after the work that used an object.
 * include/dlsync/release.h has the contract.
 *
 * Eager lanes: a pooled event is recorded and the release is queued on the
 * reclaimer of the lane's GPU, a thread of dlsync's that waits for the event
 * (cuEventSynchronize, in RELAXED capture mode so that another thread's GLOBAL
 * capture is not broken) and then calls the deleter.
 * Graph lanes (capturing or built): a user object owned by the graph; its
 * destructor, on a driver thread, only queues the release on the reclaimer,
 * which calls the deleter: deleters never run on a driver thread.
 *
 * Each context keeps a book of its releases (pending, done) so that
 * destroying it can wait for the eager ones and report those graphs still
 * own. Books and queued releases are reference-counted, so a release that
 * outlives its context (owned by a graph) still runs.
 *
 * The threads (the reclaimers and the janitor: release_reclaimer.c) are
 * joined when this copy of the library is unloaded; in a child of fork()
 * they do not exist, and every entry point refuses (base/thread.c).
 * order/release_int.h says which file holds which part. This one: the entry
 * points, their eager and general paths, and the destructor of a release a
 * graph owned. */
#include <string.h>

#include "order/release_int.h"

/* The user-object destructor of a release owned by graphs. The reclaimer was
 * started when the release was made, so finding it takes no allocation. */
static void release_from_graph(void *p) {
  release_item *it = p;
  reclaimer *r;
  if (!atomic_load(&it->armed)) {
    /* The hand-over to the graph failed: the release never happened. */
    dlsync__book_cancel(it->book, true);
    dlsync__free(it);
    return;
  }
  r = dlsync__reclaimer_peek(it->device);
  if (r == NULL) {
    /* The library was unloaded (its threads joined) while a graph still
     * owned the release: not run, which would be on a driver thread. */
    DLSYNC__LOG(DLSYNC__LOG_WARN, "a release owned by a graph was let go after the library was "
                                  "unloaded; its deleter does not run");
    dlsync__book_cancel(it->book, true);
    dlsync__free(it);
    return;
  }
  /* Its graph let it go: queued from now on, as an eager release is (flush
   * waits for it; the stats and a context destroy count it queued). */
  dlsync__book_graph_queued(it->book);
  it->from_graph = false;
  enqueue(r, it);
}

/* ---- the API ---- */

/* The decision log's line for a release: eager (an event the reclaimer
 * waits for) or owned by the lane's graph (a user object). */
static DLSYNC__NOINLINE void trace_release(const dlsync_context *ctx, const dlsync__lane_now *l,
                                           dlsync_status st) {
  char a[96] = "?";
  if (st == DLSYNC_SUCCESS)
    dlsync__lane_describe(a, sizeof a, l);
  dlsync__log(DLSYNC__LOG_TRACE, "release %s: context %p, releasing %s, nodes added 0%s%s",
              st != DLSYNC_SUCCESS           ? "failed"
              : l->kind == DLSYNC_LANE_EAGER ? "eager (event recorded, reclaimer waits)"
                                             : "graph-owned (user object)",
              (const void *)ctx, a, st == DLSYNC_SUCCESS ? "" : ": ",
              st == DLSYNC_SUCCESS ? "" : dlsync_status_name(st));
}

static const dlsync__lanes_ask release_ask = {"releasing", NULL, "releasing on a graph lane",
                                              false};

/* The driver refused an event of the memo's pool for this stream: a stream
 * handle reused in another CUDA context (design.md R26). */
static inline bool context_mismatch(CUresult r) {
  return r == CUDA_ERROR_INVALID_HANDLE || r == CUDA_ERROR_INVALID_CONTEXT;
}

/* A release of ctx's book on device, every field set: eager (an event the
 * reclaimer waits for, its pool, stream and thread set by the caller; armed)
 * or owned by a graph (armed once the graph holds it). NULL: no memory. */
static DLSYNC__INLINE release_item *item_new(dlsync_context *ctx, dlsync_deleter fn, void *arg,
                                             int device, bool from_graph) {
  release_item *it = dlsync__malloc(sizeof *it);
  if (DLSYNC__UNLIKELY(it == NULL))
    return NULL;
  it->next = NULL;
  it->book = ctx->releases;
  it->drv = ctx->drv;
  it->pool = NULL;
  it->event = NULL;
  it->stream = NULL;
  it->stream_id = 0;
  it->thread = pthread_self();
  it->fn = fn;
  it->arg = arg;
  it->device = device;
  it->slot = -1;
  it->result = CUDA_SUCCESS;
  it->from_graph = from_graph;
  atomic_init(&it->armed, !from_graph);
  it->ring = NULL;
  it->ring_pos = 0;
  it->drop_book = NULL;
  it->drop_pool = NULL;
  return it;
}
/* The identity of the stream a release's event is recorded on: a handle
 * can name a new stream while the old one's work still runs (design.md
 * R33), a stream id cannot. 0 (unknown) where the driver has no
 * cuStreamGetId (before CUDA 12.0) or for a special handle: the reclaimer
 * then asks the event itself. */
static DLSYNC__INLINE dlsync_status stream_id_of(unsigned long long *id, const dlsync__driver *d,
                                                 CUstream stream) {
  CUresult r;
  *id = 0;
  if (d->StreamGetId == NULL || dlsync__is_special_stream(stream))
    return DLSYNC_SUCCESS;
  r = d->StreamGetId(stream, id);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    *id = 0;
    return dlsync__fail_driver(d, r, "cuStreamGetId", "releasing on stream %p", (void *)stream);
  }
  return DLSYNC_SUCCESS;
}

/* Queues an eager release (a, its event recorded): into the calling
 * thread's (t's) ring for the pool's GPU; an item (an allocation, a pool
 * reference, two book counts and a compare-and-swap) on the ring's overflow
 * when it is full, or on the shared queue where the thread has no ring. */
static DLSYNC__INLINE dlsync_status queue_eager(dlsync__thread *t, const release_args *a) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__pool *pool = a->pool;
  reclaimer *r = NULL;
  release_ring *g;
  release_item *it;
  DLSYNC_TRY(reclaimer_for(&r, a->ctx->drv, dlsync__pool_device(pool)));
  g = ring_of(r, t);
  if (DLSYNC__LIKELY(g != NULL) && DLSYNC__LIKELY(ring_push(r, g, a)))
    return DLSYNC_SUCCESS;
  it = item_new(a->ctx, a->fn, a->arg, dlsync__pool_device(pool), false);
  if (DLSYNC__UNLIKELY(it == NULL))
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_release: out of memory");
  it->pool = pool;
  it->event = a->event;
  it->stream = a->stream;
  it->stream_id = a->stream_id;
  dlsync__pool_ref(pool);
  book_add_eager(it->book);
  if (g == NULL) {
    enqueue(r, it);
    return DLSYNC_SUCCESS;
  }
  /* The ring is full: onto its overflow, after the slots published so far. */
  atomic_fetch_add_explicit(&dlsync__release_overflowed, 1, memory_order_relaxed);
  it->ring_pos = atomic_load_explicit(&g->head, memory_order_relaxed);
  it->next = atomic_load_explicit(&g->overflow, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(&g->overflow, &it->next, it, memory_order_seq_cst,
                                                memory_order_relaxed))
    ;
  if (DLSYNC__UNLIKELY(atomic_load(&r->sleeping)))
    dlsync__reclaimer_wake(r);
cleanup:
  return st;
}

/* An eager stream that is not a special handle: the releasing thread's
 * fast path. One capture status query (made by the caller), the stream's
 * id, the pool from the per-thread memo (checked by the record itself: a
 * stream handle reused in another context fails it, and the pool is then
 * asked of the driver), a pooled event recorded and the release put in the
 * thread's ring: no lock, no allocation, no system call. */
static dlsync_status release_eager(dlsync_context *ctx, const dlsync__lane_now *l,
                                   dlsync_deleter deleter, void *arg) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  dlsync__thread *t = dlsync__thread_get();
  dlsync__pool *pool = dlsync__thread_memo_pool(t, &ctx->pools, l->stream);
  bool from_memo = pool != NULL;
  CUevent ev = NULL;
  CUresult cr;
  unsigned long long sid;
  DLSYNC_TRY(stream_id_of(&sid, d, l->stream));
  if (DLSYNC__UNLIKELY(pool == NULL))
    DLSYNC_TRY(dlsync__pool_for_stream(&pool, &from_memo, &ctx->pools, l->stream, "releasing"));
  DLSYNC_TRY(dlsync__pool_get(&ev, pool));
  cr = d->EventRecord(ev, l->stream);
  if (DLSYNC__UNLIKELY(cr != CUDA_SUCCESS) && from_memo && context_mismatch(cr)) {
    dlsync__pool_put(pool, ev);
    ev = NULL;
    dlsync__pool_memo_forget(&ctx->pools, l->stream);
    DLSYNC_TRY(dlsync__pool_for_stream(&pool, NULL, &ctx->pools, l->stream, "releasing"));
    DLSYNC_TRY(dlsync__pool_get(&ev, pool));
    cr = d->EventRecord(ev, l->stream);
  }
  if (DLSYNC__UNLIKELY(cr != CUDA_SUCCESS)) {
    st = dlsync__fail_driver(d, cr, "cuEventRecord", "releasing on stream %p", (void *)l->stream);
    goto cleanup;
  }
  {
    release_args a = {ctx, pool, ev, l->stream, sid, deleter, arg};
    DLSYNC_TRY(queue_eager(t, &a));
  }
  return DLSYNC_SUCCESS;
cleanup:
  /* The event was recorded (or not) and is given back: a pooled event
   * is recorded over before its next use. */
  if (ev != NULL)
    dlsync__pool_put(pool, ev);
  return st;
}

/* Every other lane: a special stream handle (legacy, per-thread: eager, as
 * above but with the pool of the current context), a capturing stream, a
 * graph built by hand (owned by the graph). */
static DLSYNC__NOINLINE dlsync_status release_general(dlsync_context *ctx, dlsync_lane *lane,
                                                      dlsync__lane_now *l, dlsync_deleter deleter,
                                                      void *arg) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ctx->drv;
  dlsync__lanes_opened opened;
  dlsync__pool *pool = NULL;
  reclaimer *r = NULL;
  release_item *it = NULL;
  CUevent ev = NULL;
  bool taken = false;
  /* For a graph lane, the current context's device says which GPU's
   * reclaimer runs it. */
  opened.read = false;
  DLSYNC_TRY(dlsync__lanes_open(&opened, ctx, lane, NULL, &release_ask));
  *l = opened.a;
  pool = opened.pool;
  if (l->kind == DLSYNC_LANE_EAGER && !dlsync__is_special_stream(l->stream))
    return release_eager(ctx, l, deleter, arg);
  if (l->kind == DLSYNC_LANE_EAGER) {
    unsigned long long sid;
    DLSYNC_TRY(stream_id_of(&sid, d, l->stream));
    DLSYNC_TRY(dlsync__pool_get(&ev, pool));
    DLSYNC_CU(d, EventRecord, (ev, l->stream), "releasing on stream %p", (void *)l->stream);
    {
      release_args a = {ctx, pool, ev, l->stream, sid, deleter, arg};
      DLSYNC_TRY(queue_eager(dlsync__thread_get(), &a));
    }
    return DLSYNC_SUCCESS;
  }
  DLSYNC_TRY(reclaimer_for(&r, d, dlsync__pool_device(pool)));
  it = item_new(ctx, deleter, arg, dlsync__pool_device(pool), true);
  if (it == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_release: out of memory");
    goto cleanup;
  }
  dlsync__book_add_graph(it->book);
  st = dlsync__graph_hold(ctx->drv, &l->graph, 1, (dlsync__graph_object){release_from_graph, it},
                          &taken);
  if (taken) {
    /* From here the destructor owns the item (and its book entry). On
     * failure no graph holds it and the destructor has run or will run
     * unarmed: we must not touch it. */
    if (st == DLSYNC_SUCCESS)
      atomic_store(&it->armed, true);
    it = NULL;
  }
cleanup:
  if (ev != NULL)
    dlsync__pool_put(pool, ev);
  if (it != NULL) {
    dlsync__book_cancel(it->book, true);
    dlsync__free(it);
  }
  return st;
}

dlsync_status dlsync_release(dlsync_context *ctx, dlsync_lane *lane, dlsync_deleter deleter,
                             void *arg) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_release");
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now l;
  if (DLSYNC__UNLIKELY(ctx == NULL || deleter == NULL))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_release: %s is NULL",
                        ctx == NULL ? "ctx" : "deleter");
  DLSYNC_TRY(dlsync__lane_check(lane, "releasing"));
  if (DLSYNC__LIKELY(lane->kind == DLSYNC_LANE_STREAM &&
                     !dlsync__is_special_stream(lane->stream))) {
    /* One status query (cuStreamIsCapturing) says whether it is eager. */
    DLSYNC_TRY(dlsync__lane_read(&l, ctx->drv, lane, "releasing"));
    if (DLSYNC__LIKELY(l.kind == DLSYNC_LANE_EAGER))
      st = release_eager(ctx, &l, deleter, arg);
    else
      st = release_general(ctx, lane, &l, deleter, arg);
  } else {
    memset(&l, 0, sizeof l);
    st = release_general(ctx, lane, &l, deleter, arg);
  }
cleanup:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    trace_release(ctx, &l, st);
  return st;
}

dlsync_status dlsync_release_flush(dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_release_flush");
  if (ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_release_flush: ctx is NULL");
  if (dlsync__on_reclaimer)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_release_flush called from a deleter: it would wait for itself");
  return dlsync__book_flush(ctx->releases);
}

dlsync_status dlsync_release_get_stats(dlsync_release_stats *out, const dlsync_context *ctx) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_release_get_stats");
  dlsync__release_book *b;
  if (out == NULL || ctx == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_release_get_stats: %s is NULL",
                        out == NULL ? "out" : "ctx");
  if (out->size < offsetof(dlsync_release_stats, done) + sizeof out->done || out->version == 0 ||
      out->version > DLSYNC_RELEASE_STATS_VERSION)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_release_stats has size %zu version %u; initialise it with "
                        "DLSYNC_RELEASE_STATS_INIT",
                        out->size, out->version);
  b = ctx->releases;
  pthread_mutex_lock(&b->lock);
  out->pending_eager = dlsync__book_pending_eager(b);
  out->pending_graph = b->pending_graph;
  out->done = b->done;
  if (out->size >= offsetof(dlsync_release_stats, blocked) + sizeof out->blocked) {
    out->sync_failures = b->sync_failures;
    out->mode_failures = b->mode_failures;
    out->blocked = b->blocked;
  }
  pthread_mutex_unlock(&b->lock);
  return DLSYNC_SUCCESS;
}
