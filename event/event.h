/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: event pools, held events and event/'s per-thread slot
 * (event/). Never installed. Uses base/, driver/ and stream/'s stream
 * predicates. */
#ifndef DLSYNC_PRIVATE_EVENT_H
#define DLSYNC_PRIVATE_EVENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "driver/driver.h"
#include "stream/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Events of one CUDA context. Taking and giving back an event is a short
 * spin-locked push/pop; events are created (cuEventCreate, allowed during
 * capture) only when the pool is empty. An event placed in a graph is owned by
 * that graph (graph/graph.c) and comes back when the graph and its
 * executables are gone. */
typedef struct dlsync__pool dlsync__pool;

/* The pools of one dlsync context (one pool per CUDA context), with what they
 * need of it: the driver table, how many free events to keep, and the
 * context's generation (unique per context ever made: per-thread memos trust
 * an entry only for the generation that made it). Embedded in the context;
 * the event layer never sees the context itself. */
typedef struct dlsync__pools {
  const dlsync__driver *drv;
  uint32_t events_kept;
  uint64_t generation;
  pthread_mutex_t lock;         /* taken only to add a pool */
  _Atomic(dlsync__pool *) list; /* newest first */
} dlsync__pools;

/* The pool of the context `stream` belongs to (cuStreamGetCtx). With
 * from_memo non-NULL, a per-thread memo may answer without a driver call
 * (*from_memo is then true): such a pool may be wrong if the stream handle was
 * destroyed and reused in another CUDA context, which cuEventRecord reports
 * (CUDA_ERROR_INVALID_HANDLE / INVALID_CONTEXT); forget it and ask again. */
dlsync_status dlsync__pool_for_stream(dlsync__pool **out, bool *from_memo, dlsync__pools *ps,
                                      CUstream stream, const char *role);
void dlsync__pool_memo_forget(const dlsync__pools *ps, CUstream stream);
/* The pool of the calling thread's current CUDA context, for graph lanes
 * (which name no stream); DLSYNC_ERROR_INVALID_ARGUMENT naming `what` ("the
 * waiting lane is a graph lane") when there is none. */
dlsync_status dlsync__pool_for_current(dlsync__pool **out, dlsync__pools *ps, const char *what);
/* The pool of a CUDA context (created on first use). */
dlsync_status dlsync__pool_for_cuctx(dlsync__pool **out, dlsync__pools *ps, CUcontext cuctx);
/* *pool, a memo's answer for `stream` (or NULL), checked with the driver
 * (cuStreamGetCtx): kept when it is the pool of the stream's context, else
 * replaced by that pool. The memo is left as it is. */
dlsync_status dlsync__pool_check(dlsync__pool **pool, dlsync__pools *ps, CUstream stream,
                                 const char *role);
dlsync_status dlsync__pool_get(CUevent *out, dlsync__pool *pool);
void dlsync__pool_put(dlsync__pool *pool, CUevent event);
/* The trimming period of a pool that keeps `kept` events: its free events
 * that stayed unused (free) over a period of at least that many takes and
 * returns AND dlsync__pool_trim_period_ns nanoseconds (1 s), past `kept`,
 * are destroyed by the next return. The time bound keeps a burst's working
 * set (the events a burst of releases has in flight, taken again by the next
 * burst) from being destroyed and made again within the burst; tests set it
 * to 0 (the op count alone) or very long (no trimming). */
#define DLSYNC__POOL_TRIM_OPS(kept) ((size_t)(kept)*4 > 256 ? (size_t)(kept)*4 : (size_t)256)
extern uint64_t dlsync__pool_trim_period_ns;
/* dlsync__pool_put of n events under one lock (a reclaimer's batch), the
 * pool keeping up to `extra` free events past its limit (the events a
 * releasing burst will take again at once; without them each release past
 * the limit would create an event and each return destroy one). */
void dlsync__pool_put_many(dlsync__pool *pool, const CUevent *events, size_t n, size_t extra);
/* For a plain record followed at once by a wait: the calling thread's own
 * event of this pool (*lent true: give it back with dlsync__pool_unborrow,
 * which then does nothing), or one from the pool. Never put such an event in
 * a graph. */
dlsync_status dlsync__pool_borrow(CUevent *out, bool *lent, const dlsync__pools *ps,
                                  dlsync__pool *pool);
void dlsync__pool_unborrow(dlsync__pool *pool, CUevent event, bool lent);

/* Called from a user object's destructor (a driver thread: no CUDA calls):
 * hands an event back to its pool, or to the orphan list if the context is
 * gone. Drops the pool reference the graph held. */
void dlsync__pool_return_from_graph(dlsync__pool *pool, CUevent event);
void dlsync__pool_ref(dlsync__pool *pool);
void dlsync__pool_unref(dlsync__pool *pool);
/* n dlsync__pool_unref at once. */
void dlsync__pool_unref_n(dlsync__pool *pool, unsigned n);
/* The device ordinal of the pool's CUDA context. */
int dlsync__pool_device(const dlsync__pool *pool);
/* Counts an event as held by a graph and takes a pool reference for it. */
void dlsync__pool_note_graph_owned(dlsync__pool *pool);
/* Destroys every pool of a context; pools with events still owned by graphs
 * live on until those come back. */
dlsync_status dlsync__pools_destroy(dlsync__pools *ps);
/* Destroys events whose context was destroyed while a graph held them (and
 * those given back while their pool could not grow); returns once any
 * collection in progress on another thread is done too. */
void dlsync__orphans_collect(void);
/* Set by the layer above: called, with no lock held and on any thread (a
 * driver thread too: it must make no CUDA call), when an event of a
 * destroyed context is orphaned. */
typedef void (*dlsync__orphans_waker)(void);
void dlsync__orphans_set_waker(dlsync__orphans_waker wake);

/* An event held outside the pool, by graphs (user objects) and fences,
 * counted; back to the pool (no CUDA call: any thread, a driver thread too)
 * when the last holder lets go. */
typedef struct dlsync__held_event {
  atomic_uint refs;
  dlsync__pool *pool; /* NULL: another runtime's event (foreign) */
  CUevent event;
  const dlsync__driver *drv; /* foreign: the driver that destroys it when owned */
  bool owned;                /* foreign: destroyed (on the orphan list) when let go */
  void *orphan;              /* owned: its orphan-list entry, allocated beforehand */
} dlsync__held_event;
/* refs = 1; counts in the pool's graph_owned and holds a pool reference. */
dlsync__held_event *dlsync__held_event_new(dlsync__pool *pool, CUevent event);
/* refs = 1; another runtime's event, never pooled. When the last holder lets
 * go it is left alone (borrowed) or, when `owned`, put on the orphan list and
 * destroyed by the next collection (dlsync__orphans_collect: no CUDA call on
 * the letting-go thread, and no thread woken;
 * the list's entry is allocated here, so letting go cannot fail). NULL: out
 * of memory. */
dlsync__held_event *dlsync__held_event_new_foreign(const dlsync__driver *drv, CUevent event,
                                                   bool owned);
void dlsync__held_event_ref(dlsync__held_event *he);
void dlsync__held_event_unref(dlsync__held_event *he); /* NULL: no-op */

/* ---- holds: the events one graph holds, given back together ----
 * (pool.c). A hold holds a pool reference while it lives; its memory is the
 * pool's (recycled, freed with the pool), so a pointer to it stays readable
 * as long as the pool lives; `gen` names one life of it. */
typedef struct dlsync__hold dlsync__hold;
/* The start of every hold: its life word (pool.c keeps the rest). */
typedef struct dlsync__hold_head {
  atomic_uint_fast64_t life; /* the life's number times two, plus one while live */
} dlsync__hold_head;
/* Whether h is still in life `gen` (not given back, not made again): one
 * load, no lock. For the thread whose hold it is, before it uses an event
 * the hold took for it earlier (dlsync__hold_take_some): a hold is given
 * back only once its graph is gone, which a capture still active (the
 * caller has just asked) has not, so a yes holds for as long as a locked
 * take's would. */
static inline bool dlsync__hold_live(const dlsync__hold *h, uint64_t gen) {
  return atomic_load_explicit(&((const dlsync__hold_head *)(const void *)h)->life,
                              memory_order_acquire) == gen * 2 + 1;
}
/* A new, empty hold of `pool` (*gen: the life it begins). */
dlsync_status dlsync__hold_new(dlsync__hold **out, uint64_t *gen, dlsync__pool *pool);
/* Gives back everything the hold holds and ends its life (no CUDA call: a
 * driver thread may call it, from a user object's destructor). */
void dlsync__hold_release(dlsync__hold *h);
/* A hold in one of its lives (passed by value: two registers). */
typedef struct dlsync__hold_life {
  dlsync__hold *hold;
  uint64_t life;
} dlsync__hold_life;
/* Takes an event of `pool` into a.hold (life a.life), and also into b.hold
 * (life b.life) when b.hold is non-NULL: the event then comes back once both
 * are given back. Both holds must be of `pool`. DLSYNC_SUCCESS with *out
 * NULL: a or b is not in that life any more (given back, or made again),
 * nothing taken. */
dlsync_status dlsync__hold_take(CUevent *out, dlsync__pool *pool, dlsync__hold_life a,
                                dlsync__hold_life b);
/* Takes up to `max` events of `pool` into h.hold (life h.life) at once, under one
 * lock: out[0..*n), in the order they came off the free list (at least one,
 * made when none is free). *n = 0 with DLSYNC_SUCCESS: h is not in that
 * life any more, nothing taken. For a thread that keeps the rest for its
 * next orders into the same capture (graph.h): each is the hold's from now
 * on, used or not, and comes back with it. */
dlsync_status dlsync__hold_take_some(CUevent *out, size_t max, size_t *n, dlsync__pool *pool,
                                     dlsync__hold_life h);
typedef struct dlsync__pool_stats {
  size_t free_events; /* in the pool now */
  size_t created;     /* cuEventCreate calls made */
  size_t destroyed;   /* cuEventDestroy calls made */
  size_t graph_owned; /* held by graphs or fences now */
} dlsync__pool_stats;
/* Sums over the context's pools (tests: "the pool is intact"). */
void dlsync__pool_stats_get(dlsync__pool_stats *out, dlsync__pools *ps);

/* ---- the calling thread's event slot (event/pool.c) ---- */
/* event/'s part of the calling thread's block (dlsync__thread, base.h).
 *
 * memo: stream -> pool, so that the hot path does not ask the driver for a
 * stream's context at each call; `scratch` caches the thread's scratch event
 * of that pool once known. An entry is trusted only for the pools (and their
 * generation) that made it. A stream handle can be reused after
 * cuStreamDestroy, possibly in another CUDA context: then cuEventRecord with
 * the pool's event fails, and the caller forgets the entry and asks again
 * (dlsync__pool_memo_forget). The special handles are never memoised.
 *
 * scratch: a plain record followed by a wait leaves the event free again at
 * once, so the thread keeps one event per pool it uses (see pool.c). */
#define DLSYNC__MEMO_SLOTS 8
#define DLSYNC__SCRATCH_SLOTS 2

/* What the thread knows of the stream memo_key[i] (below). */
typedef struct dlsync__stream_memo {
  const dlsync__pools *owner;
  uint64_t generation;
  dlsync__pool *pool;
  CUevent scratch; /* the thread's scratch event of pool, NULL until known */
} dlsync__stream_memo;

typedef struct dlsync__scratch_slot {
  const dlsync__pools *owner;
  uint64_t generation;
  dlsync__pool *pool;
  CUevent event;
} dlsync__scratch_slot;

typedef struct DLSYNC__MAY_ALIAS dlsync__event_thread {
  /* memo[i]'s stream, the keys side by side: a scan reads one cache line. */
  CUstream memo_key[DLSYNC__MEMO_SLOTS];
  dlsync__stream_memo memo[DLSYNC__MEMO_SLOTS];
  unsigned memo_next;
  dlsync__scratch_slot scratch[DLSYNC__SCRATCH_SLOTS];
  unsigned scratch_next;
} dlsync__event_thread;

#ifndef __cplusplus
_Static_assert(sizeof(dlsync__event_thread) <= DLSYNC__THREAD_EVENT_BYTES,
               "event/'s per-thread block does not fit its slot in dlsync__thread");
#endif

static inline dlsync__event_thread *dlsync__event_thread_of(dlsync__thread *t) {
  return (dlsync__event_thread *)(void *)t->event.bytes;
}

/* Fills m->scratch from the scratch slots; NULL when the thread has no
 * scratch event of m->pool yet. */
CUevent dlsync__thread_scratch_fill(dlsync__thread *t, dlsync__stream_memo *m);

/* The pool the thread's memo knows for `stream` (no driver call, no lock;
 * not checked with the driver: see dlsync__pool_for_stream), NULL when it
 * does not know it. */
static inline dlsync__pool *dlsync__thread_memo_pool(dlsync__thread *t, const dlsync__pools *ps,
                                                     CUstream stream) {
  const dlsync__event_thread *h = dlsync__event_thread_of(t);
  for (unsigned i = 0; i < DLSYNC__MEMO_SLOTS; i++)
    if (h->memo_key[i] == stream && h->memo[i].owner == ps &&
        h->memo[i].generation == ps->generation)
      return h->memo[i].pool;
  return NULL;
}

/* The thread's scratch event for `stream`, with no driver call and no lock;
 * NULL when the memo or the scratch slots do not know it yet (then take the
 * full path, which fills both). *pool: the stream's pool as the memo knows
 * it (not checked with the driver: a stream handle may have been reused in
 * another context), NULL when the memo does not know the stream. */
static inline CUevent dlsync__thread_scratch(dlsync__thread *t, const dlsync__pools *ps,
                                             CUstream stream, dlsync__pool **pool) {
  dlsync__event_thread *h = dlsync__event_thread_of(t);
  for (unsigned i = 0; i < DLSYNC__MEMO_SLOTS; i++) {
    if (h->memo_key[i] == stream) {
      dlsync__stream_memo *m = &h->memo[i];
      if (m->owner == ps && m->generation == ps->generation) {
        *pool = m->pool;
        return DLSYNC__LIKELY(m->scratch != NULL) ? m->scratch : dlsync__thread_scratch_fill(t, m);
      }
    }
  }
  *pool = NULL;
  return NULL;
}

#ifdef __cplusplus
}
#endif

#endif
