/* dlsync private: what the modules share. Never installed.
 *
 * Habits: internal non-static names start with dlsync__; one cleanup label per
 * function; failures go through dlsync__fail* which set the thread's message
 * and return the status, so `st = dlsync__fail(...); goto cleanup;` is the
 * only way out of a function that failed (DLSYNC_TRY/DLSYNC_CU do that).
 */
#ifndef DLSYNC_PRIVATE_INTERNAL_H
#define DLSYNC_PRIVATE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlsync/dlsync.h"
#include "dlsync/private/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DLSYNC__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define DLSYNC__LIKELY(x) __builtin_expect(!!(x), 1)
#define DLSYNC__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define DLSYNC__INLINE inline __attribute__((always_inline))
#define DLSYNC__NOINLINE __attribute__((noinline))
#else
#define DLSYNC__INLINE inline
#define DLSYNC__NOINLINE
#define DLSYNC__PRINTF(fmt, args)
#define DLSYNC__LIKELY(x) (x)
#define DLSYNC__UNLIKELY(x) (x)
#endif

/* ---- errors (core/status.c) ---- */

/* Sets the thread's last error (status, message, no driver result) and
 * returns status. */
dlsync_status dlsync__fail(dlsync_status status, const char *fmt, ...) DLSYNC__PRINTF(2, 3);

/* For a failed driver call: the message reads
 * "<call> failed: <CUDA_ERROR_NAME> (<context>)", the status is
 * DLSYNC_ERROR_DRIVER unless the result maps to a more precise one
 * (invalidated capture, legacy stream during capture). */
dlsync_status dlsync__fail_driver(const dlsync__driver *d, CUresult result, const char *call,
                                  const char *fmt, ...) DLSYNC__PRINTF(4, 5);

/* Changes the status of the thread's last error, keeping its message. */
dlsync_status dlsync__retag(dlsync_status status);

#define DLSYNC_TRY(expr)                        \
  do {                                          \
    st = (expr);                                \
    if (DLSYNC__UNLIKELY(st != DLSYNC_SUCCESS)) \
      goto cleanup;                             \
  } while (0)

/* DLSYNC_CU(d, cuStreamWaitEvent, d->StreamWaitEvent(s, e, 0), "fmt", args...) */
#define DLSYNC_CU(d, name, expr, ...)                           \
  do {                                                          \
    CUresult cu_r_ = (expr);                                    \
    if (DLSYNC__UNLIKELY(cu_r_ != CUDA_SUCCESS)) {              \
      st = dlsync__fail_driver((d), cu_r_, #name, __VA_ARGS__); \
      goto cleanup;                                             \
    }                                                           \
  } while (0)

/* ---- event pool (event/pool.c) ---- */

/* Events of one CUDA context. Taking and giving back an event is a short
 * spin-locked push/pop; events are created (cuEventCreate, allowed during
 * capture) only when the pool is empty. An event placed in a graph is owned by
 * that graph (graph/graph.c) and comes back when the graph and its
 * executables are gone. */
typedef struct dlsync__pool dlsync__pool;

/* The pool of the context `stream` belongs to (cuStreamGetCtx). With
 * from_memo non-NULL, a per-thread memo may answer without a driver call
 * (*from_memo is then true): such a pool may be wrong if the stream handle was
 * destroyed and reused in another CUDA context, which cuEventRecord reports
 * (CUDA_ERROR_INVALID_HANDLE / INVALID_CONTEXT); forget it and ask again. */
dlsync_status dlsync__pool_for_stream(dlsync__pool **out, bool *from_memo, dlsync_context *ctx,
                                      CUstream stream, const char *role);
void dlsync__pool_memo_forget(const dlsync_context *ctx, CUstream stream);
/* The pool of the calling thread's current CUDA context, for graph lanes
 * (which name no stream); DLSYNC_ERROR_INVALID_ARGUMENT naming `what` ("the
 * waiting lane is a graph lane") when there is none. */
dlsync_status dlsync__pool_for_current(dlsync__pool **out, dlsync_context *ctx, const char *what);
/* The pool of a CUDA context (created on first use). */
dlsync_status dlsync__pool_for_cuctx(dlsync__pool **out, dlsync_context *ctx, CUcontext cuctx);
dlsync_status dlsync__pool_get(CUevent *out, dlsync__pool *pool);
void dlsync__pool_put(dlsync__pool *pool, CUevent event);
/* For a plain record followed at once by a wait: the calling thread's own
 * event of this pool (*lent true: give it back with dlsync__pool_unborrow,
 * which then does nothing), or one from the pool. Never put such an event in
 * a graph. */
dlsync_status dlsync__pool_borrow(CUevent *out, bool *lent, const dlsync_context *ctx,
                                  dlsync__pool *pool);
void dlsync__pool_unborrow(dlsync__pool *pool, CUevent event, bool lent);

/* Called from a user object's destructor (a driver thread: no CUDA calls):
 * hands an event back to its pool, or to the orphan list if the context is
 * gone. Drops the pool reference the graph held. */
void dlsync__pool_return_from_graph(dlsync__pool *pool, CUevent event);
void dlsync__pool_ref(dlsync__pool *pool);
void dlsync__pool_unref(dlsync__pool *pool);
/* The device ordinal of the pool's CUDA context. */
int dlsync__pool_device(const dlsync__pool *pool);
/* Counts an event as held by a graph and takes a pool reference for it. */
void dlsync__pool_note_graph_owned(dlsync__pool *pool);
/* Destroys every pool of a context; pools with events still owned by graphs
 * live on until those come back. */
dlsync_status dlsync__pools_destroy(dlsync_context *ctx);
/* Destroys events whose context was destroyed while a graph held them. */
void dlsync__orphans_collect(void);

/* An event held outside the pool, by graphs (user objects) and fences,
 * counted; back to the pool (no CUDA call: any thread, a driver thread too)
 * when the last holder lets go. */
typedef struct dlsync__held_event {
  atomic_uint refs;
  dlsync__pool *pool;
  CUevent event;
} dlsync__held_event;
/* refs = 1; counts in the pool's graph_owned and holds a pool reference. */
dlsync__held_event *dlsync__held_event_new(dlsync__pool *pool, CUevent event);
void dlsync__held_event_ref(dlsync__held_event *he);
void dlsync__held_event_unref(dlsync__held_event *he); /* NULL: no-op */

typedef struct dlsync__pool_stats {
  size_t free_events; /* in the pool now */
  size_t created;     /* cuEventCreate calls made */
  size_t destroyed;   /* cuEventDestroy calls made */
  size_t graph_owned; /* held by graphs or fences now */
} dlsync__pool_stats;
/* Sums over the context's pools (tests: "the pool is intact"). */
void dlsync__pool_stats_get(dlsync__pool_stats *out, dlsync_context *ctx);

/* ---- lanes (stream/lane.c) ---- */

typedef struct dlsync__lane_now {
  dlsync_lane_state_kind kind;
  CUstream stream;         /* stream lanes */
  uint64_t capture_id;     /* CAPTURING */
  CUgraph graph;           /* CAPTURING: capture graph; BUILT: the lane's graph */
  const CUgraphNode *deps; /* CAPTURING: valid until the next query of that stream */
  size_t ndeps;
  dlsync_lane *lane; /* the caller's lane */
  const char *role;  /* "producer", "consumer", ... for messages */
} dlsync__lane_now;

/* Reads a lane's state (one or two capture queries for a stream; none for a
 * graph lane). The lane must have passed dlsync__lane_check. Errors name
 * `role`. */
dlsync_status dlsync__lane_read(dlsync__lane_now *out, dlsync_context *ctx, dlsync_lane *lane,
                                const char *role);
/* Validates a lane's fields without calling the driver. */
dlsync_status dlsync__lane_check_slow(const dlsync_lane *lane, const char *role);
static inline dlsync_status dlsync__lane_check(const dlsync_lane *lane, const char *role) {
  if (DLSYNC__LIKELY(lane != NULL && lane->kind == DLSYNC_LANE_STREAM && lane->graph == NULL))
    return DLSYNC_SUCCESS;
  return dlsync__lane_check_slow(lane, role);
}

/* NULL and CU_STREAM_LEGACY both name the legacy default stream (dlsync
 * resolves driver entry points without per-thread default stream semantics). */
static inline bool dlsync__is_legacy_stream(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY;
}
/* The handles that follow the calling thread (legacy, per-thread default):
 * never memoised, never on the fast path. */
static inline bool dlsync__is_special_stream(CUstream s) {
  return dlsync__is_legacy_stream(s) || s == CU_STREAM_PER_THREAD;
}
static inline bool dlsync__same_stream(CUstream a, CUstream b) {
  return a == b || (dlsync__is_legacy_stream(a) && dlsync__is_legacy_stream(b));
}

/* ---- graphs (graph/graph.c) ---- */

/* Appends an event-record (record = true) or event-wait node at a lane's
 * position: after a capture's current dependencies (which then become the
 * node), or after a built lane's frontier (which then becomes the node). */
dlsync_status dlsync__graph_append_event(dlsync_context *ctx, dlsync__lane_now *lane, CUevent event,
                                         bool record);
/* The same, giving the node it added. */
dlsync_status dlsync__graph_append_event_node(dlsync_context *ctx, dlsync__lane_now *lane,
                                              CUevent event, bool record, CUgraphNode *out);
/* Adds one node to a graph lane's frontier (no node added to the graph). */
dlsync_status dlsync__graph_lane_add_dep(dlsync__lane_now *lane, CUgraphNode node);
/* Gives `ptr` to the graphs: one user object (destructor `destroy`, run on a
 * driver thread, no CUDA calls) that each graph holds a reference to. Once
 * *taken is true the destructor owns ptr and runs exactly once, when every
 * graph and executable holding it is gone (at once if none took it); while
 * false, ptr is still the caller's. */
dlsync_status dlsync__graph_hold(dlsync_context *ctx, CUgraph *graphs, int ngraphs,
                                 void (*destroy)(void *), void *ptr, bool *taken);
/* The graphs hold a reference to `he` (taken from the caller's count of
 * one; the caller keeps its own). */
dlsync_status dlsync__graph_hold_event(dlsync_context *ctx, dlsync__held_event *he, CUgraph *graphs,
                                       int ngraphs);
/* Gives `event` to the graphs (a user object each graph holds a reference
 * to); it returns to `pool` once all are destroyed. On failure the event is
 * back in the pool or held by the graphs that did take it. */
dlsync_status dlsync__graph_own_event(dlsync_context *ctx, dlsync__pool *pool, CUevent event,
                                      CUgraph *graphs, int ngraphs);

/* ---- context (core/context.c) ---- */

struct dlsync_context {
  const dlsync__driver *drv;
  uint32_t events_kept;
  uint32_t caps; /* dlsync_capability bits */
  int driver_version;
  uint64_t generation; /* unique per context ever created (memo keys) */
  bool is_default;
  pthread_mutex_t pools_lock;    /* taken only to add a pool */
  _Atomic(dlsync__pool *) pools; /* one per CUDA context, newest first */
  struct dlsync__release_book *releases;
  atomic_uint refs;          /* the caller's (until destroy) + one per live fence */
  atomic_size_t live_fences; /* fences signalled on it and not released yet */
  atomic_bool destroyed;     /* dlsync_context_destroy has run */
};

/* A fence keeps its context's memory (and driver table) alive past
 * dlsync_context_destroy; the last unref frees it. */
void dlsync__context_ref(dlsync_context *ctx);
void dlsync__context_unref(dlsync_context *ctx);

/* ---- the calling thread (event/pool.c) ---- */
/* Everything dlsync keeps per thread for the hot path, in one thread-local
 * block (one access through __tls_get_addr in the shared library).
 *
 * memo: stream -> pool, so that the hot path does not ask the driver for a
 * stream's context at each call; `scratch` caches the thread's scratch event
 * of that pool once known. An entry is trusted only for the context (and its
 * generation) that made it. A stream handle can be reused after
 * cuStreamDestroy, possibly in another CUDA context: then cuEventRecord with
 * the pool's event fails, and the caller forgets the entry and asks again
 * (dlsync__pool_memo_forget). The special handles are never memoised.
 *
 * scratch: a plain record followed by a wait leaves the event free again at
 * once, so the thread keeps one event per pool it uses (see pool.c). */
#define DLSYNC__MEMO_SLOTS 8
#define DLSYNC__SCRATCH_SLOTS 2

typedef struct dlsync__stream_memo {
  const dlsync_context *ctx;
  uint64_t generation;
  CUstream stream;
  dlsync__pool *pool;
  CUevent scratch; /* the thread's scratch event of pool, NULL until known */
} dlsync__stream_memo;

typedef struct dlsync__scratch_slot {
  const dlsync_context *ctx;
  uint64_t generation;
  dlsync__pool *pool;
  CUevent event;
} dlsync__scratch_slot;

typedef struct dlsync__thread {
  dlsync__stream_memo memo[DLSYNC__MEMO_SLOTS];
  unsigned memo_next;
  dlsync__scratch_slot scratch[DLSYNC__SCRATCH_SLOTS];
  unsigned scratch_next;
  void *spare;      /* core/exchange.c: one free exchange record */
  bool spare_keyed; /* the thread-exit hook that gives it back is set */
} dlsync__thread;

dlsync__thread *dlsync__thread_get(void);

/* Fills m->scratch from the scratch slots; NULL when the thread has no
 * scratch event of m->pool yet. */
CUevent dlsync__thread_scratch_fill(dlsync__thread *t, dlsync__stream_memo *m);

/* The thread's scratch event for `stream`, with no driver call and no lock;
 * NULL when the memo or the scratch slots do not know it yet (then take the
 * full path, which fills both). */
static inline CUevent dlsync__thread_scratch(dlsync__thread *t, const dlsync_context *ctx,
                                             CUstream stream) {
  for (unsigned i = 0; i < DLSYNC__MEMO_SLOTS; i++) {
    dlsync__stream_memo *m = &t->memo[i];
    if (m->stream == stream && m->ctx == ctx && m->generation == ctx->generation)
      return DLSYNC__LIKELY(m->scratch != NULL) ? m->scratch : dlsync__thread_scratch_fill(t, m);
  }
  return NULL;
}

/* ---- exchanges (core/exchange.c) ---- */

/* Ends, ordering nothing, the exchanges of ctx still begun (their handles
 * become invalid); returns how many. For dlsync_context_destroy. */
size_t dlsync__exchanges_abandon(const dlsync_context *ctx);

/* ---- releases (event/release.c) ---- */

typedef struct dlsync__release_book dlsync__release_book;
dlsync_status dlsync__release_book_new(dlsync__release_book **out);
/* Waits for the eager releases; DLSYNC_ERROR_BUSY (with a message) when
 * graphs still own some. Drops the context's reference either way. */
dlsync_status dlsync__release_book_close(dlsync__release_book *book);

/* Test hook: a context over a driver table the caller owns (the fake). The
 * table must outlive the context. */
dlsync_status dlsync__context_create_with_driver(dlsync_context **out,
                                                 const dlsync_context_config *config,
                                                 const dlsync__driver *drv);

uint32_t dlsync__capabilities_of(const dlsync__driver *d);

#ifdef __cplusplus
}
#endif

#endif
