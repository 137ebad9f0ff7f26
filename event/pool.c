/* SPDX-License-Identifier: Apache-2.0 */
/* Per-CUDA-context event pools.
 *
 * An event can be recorded again as soon as the wait that used it has been
 * queued (the wait captured the record it needed), so eager and same-capture
 * exchanges take an event and give it straight back. An event that a graph
 * node names belongs to that graph until the graph and its executables are
 * destroyed; then a user-object destructor (on a driver thread, where no CUDA
 * call is allowed) hands it back here.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "event/event.h"

struct dlsync__pool {
  dlsync__pool *next; /* in the context's list; fixed once published */
  const dlsync__driver *drv;
  CUcontext cuctx;
  CUdevice device;
  atomic_int lock; /* spin lock over the fields below */
  CUevent *free_events;
  size_t nfree;
  size_t cap;
  size_t kept;
  /* Trimming: the fewest free events since the last check, and the takes
   * and returns since then (see pool_trim_locked). */
  size_t low;
  size_t ops;
  uint64_t since_ns; /* when the period began (CLOCK_MONOTONIC_COARSE) */
  bool dead;         /* the context is destroyed */
  /* Two counts in one word, so that an event given to a graph costs one
   * atomic add: the low 32 bits the references (the context's, one per
   * event held by a graph or fence, one per orphan), the high 32 bits the
   * events held by graphs or fences (POOL_OWNED_ONE each). */
  atomic_uint_fast64_t refs;
  atomic_size_t created;
  atomic_size_t destroyed;
  CUevent *scratch; /* lent to threads for plain record/wait, see below */
  size_t nscratch;
  /* Holds (see below), all under `lock`: events in them, the free holds
   * and pairs (recycled, freed with the pool), the holds' generations. */
  size_t hold_owned;
  dlsync__hold *free_holds;
  struct hold_pair *free_pairs;
  uint64_t hold_gens;
};

/* ---- orphans: events whose context died while graphs held them ---- */

typedef struct orphan {
  struct orphan *next;
  const dlsync__driver *drv;
  CUevent event;
  dlsync__pool *pool; /* a reference held: its destroy is counted there */
} orphan;

uint64_t dlsync__pool_trim_period_ns = 1000000000u;

/* The clock of the trimming periods, read on returns only (a few ns: the
 * coarse clock is read from the vDSO without a system call). */
static uint64_t trim_clock_ns(void) {
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
#endif
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
      return 0;
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static pthread_mutex_t orphan_lock = PTHREAD_MUTEX_INITIALIZER;
static orphan *orphans;
static atomic_int orphans_pending;
/* One collection at a time, and a collection in progress is waited for: a
 * caller that finds the list empty while another thread destroys what it
 * took still returns only once those events are gone. */
static pthread_mutex_t collect_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int collecting;
/* Called (no lock held) when an event of a destroyed context is orphaned,
 * so that some thread of the layer above collects it soon; NULL: the next
 * collection does (a pool growing, a context made or destroyed). */
static _Atomic(dlsync__orphans_waker) orphans_waker;

void dlsync__orphans_set_waker(dlsync__orphans_waker wake) {
  atomic_store_explicit(&orphans_waker, wake, memory_order_release);
}

void dlsync__orphans_collect(void) {
  orphan *list;
  if (atomic_load_explicit(&orphans_pending, memory_order_acquire) == 0 &&
      atomic_load_explicit(&collecting, memory_order_acquire) == 0)
    return;
  atomic_fetch_add_explicit(&collecting, 1, memory_order_acq_rel);
  pthread_mutex_lock(&collect_lock);
  pthread_mutex_lock(&orphan_lock);
  list = orphans;
  orphans = NULL;
  atomic_store_explicit(&orphans_pending, 0, memory_order_release);
  pthread_mutex_unlock(&orphan_lock);
  while (list != NULL) {
    orphan *next = list->next;
    /* Counted as destroyed in its pool, which may still be alive (an event
     * given back while the pool could not grow), so that what the pool
     * counts as alive stays what the driver has. */
    CUresult r = list->drv->EventDestroy(list->event);
    if (list->pool != NULL) { /* NULL: an owned foreign event, counted in no pool */
      if (r == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&list->pool->destroyed, 1, memory_order_relaxed);
      dlsync__pool_unref(list->pool);
    }
    dlsync__free(list);
    list = next;
  }
  pthread_mutex_unlock(&collect_lock);
  atomic_fetch_sub_explicit(&collecting, 1, memory_order_acq_rel);
}

static void pool_unref(dlsync__pool *p);

#define POOL_OWNED_ONE (UINT64_C(1) << 32)

static void holds_free(dlsync__pool *p);

static void pool_free(dlsync__pool *p) {
  holds_free(p);
  dlsync__free(p->scratch);
  dlsync__free(p->free_events);
  dlsync__free(p);
}

int dlsync__pool_device(const dlsync__pool *p) {
  return (int)p->device;
}

void dlsync__pool_unref(dlsync__pool *p) {
  pool_unref(p);
}

static void pool_unref(dlsync__pool *p) {
  if (atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
    pool_free(p);
}

void dlsync__pool_unref_n(dlsync__pool *p, unsigned n) {
  if (n > 0 && atomic_fetch_sub_explicit(&p->refs, n, memory_order_acq_rel) == n)
    pool_free(p);
}

void dlsync__pool_ref(dlsync__pool *p) {
  atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

/* ---- lookup ---- */

/* The pool of cuctx if there is one already (no lock: until the pools are
 * destroyed with their context, pools are only added, at the list's head). */
static inline dlsync__pool *pool_find(dlsync__pools *ps, CUcontext cuctx) {
  for (dlsync__pool *p = atomic_load_explicit(&ps->list, memory_order_acquire); p != NULL;
       p = p->next)
    if (p->cuctx == cuctx)
      return p;
  return NULL;
}

dlsync_status dlsync__pool_for_cuctx(dlsync__pool **out, dlsync__pools *ps, CUcontext cuctx) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__pool *p = pool_find(ps, cuctx);
  bool locked = false;
  if (p != NULL) {
    *out = p;
    return DLSYNC_SUCCESS;
  }
  pthread_mutex_lock(&ps->lock);
  locked = true;
  if ((p = pool_find(ps, cuctx)) != NULL) { /* made by another thread meanwhile */
    *out = p;
    goto cleanup;
  }
  p = dlsync__calloc(1, sizeof *p);
  if (p == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "creating an event pool: out of memory");
    goto cleanup;
  }
  p->since_ns = trim_clock_ns(); /* the first trimming period */
  {
    CUcontext popped = NULL;
    CUresult r = ps->drv->CtxPushCurrent(cuctx);
    if (r == CUDA_SUCCESS) {
      r = ps->drv->CtxGetDevice(&p->device);
      CUresult r2 = ps->drv->CtxPopCurrent(&popped);
      if (r == CUDA_SUCCESS)
        r = r2;
    }
    if (r != CUDA_SUCCESS) {
      st = dlsync__fail_driver(ps->drv, r, "cuCtxPushCurrent/cuCtxGetDevice/cuCtxPopCurrent",
                               "finding the device of CUDA context %p", (void *)cuctx);
      dlsync__free(p);
      p = NULL;
      goto cleanup;
    }
  }
  p->drv = ps->drv;
  p->cuctx = cuctx;
  p->kept = ps->events_kept;
  atomic_init(&p->lock, 0);
  atomic_init(&p->refs, 1);
  p->next = atomic_load_explicit(&ps->list, memory_order_relaxed);
  atomic_store_explicit(&ps->list, p, memory_order_release);
  *out = p;
cleanup:
  if (locked)
    pthread_mutex_unlock(&ps->lock);
  return st;
}

/* event/'s slot of the calling thread's block (memo, scratch slots). */
static dlsync__event_thread *hot(void) {
  return dlsync__event_thread_of(dlsync__thread_get());
}

void dlsync__pool_memo_forget(const dlsync__pools *ps, CUstream stream) {
  dlsync__event_thread *h = hot();
  for (unsigned i = 0; i < DLSYNC__MEMO_SLOTS; i++)
    if (h->memo[i].owner == ps && h->memo_key[i] == stream)
      h->memo[i].owner = NULL;
}

dlsync_status dlsync__pool_for_stream(dlsync__pool **out, bool *from_memo, dlsync__pools *ps,
                                      CUstream stream, const char *role) {
  dlsync_status st = DLSYNC_SUCCESS;
  bool memoise = from_memo != NULL && !dlsync__is_special_stream(stream);
  if (from_memo != NULL)
    *from_memo = false;
  if (memoise) {
    const dlsync__event_thread *h = hot();
    for (unsigned i = 0; i < DLSYNC__MEMO_SLOTS; i++) {
      const dlsync__stream_memo *m = &h->memo[i];
      if (h->memo_key[i] == stream && m->owner == ps && m->generation == ps->generation) {
        *out = m->pool;
        *from_memo = true;
        return DLSYNC_SUCCESS;
      }
    }
  }
  *out = NULL;
  DLSYNC_TRY(dlsync__pool_check(out, ps, stream, role)); /* no pool yet: the stream's */
  if (memoise) {
    dlsync__event_thread *h = hot();
    unsigned slot = h->memo_next++ % DLSYNC__MEMO_SLOTS;
    dlsync__stream_memo *m = &h->memo[slot];
    h->memo_key[slot] = stream;
    m->owner = ps;
    m->generation = ps->generation;
    m->pool = *out;
    m->scratch = NULL;
  }
cleanup:
  return st;
}

dlsync_status dlsync__pool_check(dlsync__pool **pool, dlsync__pools *ps, CUstream stream,
                                 const char *role) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUcontext cuctx = NULL;
  CUresult r = ps->drv->StreamGetCtx(stream, &cuctx);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = dlsync__fail_driver(ps->drv, r, "cuStreamGetCtx", "%s stream %p: finding its CUDA context",
                             role, (void *)stream);
    dlsync__fail_nothing_queued(); /* a lookup, made before anything is queued */
    goto cleanup;
  }
  if (DLSYNC__LIKELY(*pool != NULL && (*pool)->cuctx == cuctx))
    return DLSYNC_SUCCESS;
  DLSYNC_TRY(dlsync__pool_for_cuctx(pool, ps, cuctx));
cleanup:
  return st;
}

dlsync_status dlsync__pool_for_current(dlsync__pool **out, dlsync__pools *ps, const char *what) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ps->drv;
  CUcontext cur = NULL;
  DLSYNC_CU(d, CtxGetCurrent, (&cur), "%s", what);
  if (cur == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "%s, and this thread has no current CUDA context: make the graph's device "
                      "context current (cuCtxSetCurrent or cudaSetDevice) so that dlsync knows "
                      "which device's events to use",
                      what);
    goto cleanup;
  }
  if ((*out = pool_find(ps, cur)) != NULL) /* known: no call */
    return DLSYNC_SUCCESS;
  DLSYNC_TRY(dlsync__pool_for_cuctx(out, ps, cur));
cleanup:
  return st;
}

/* ---- take and give back ---- */

/* dlsync__pool_get of an empty pool: a new event in the pool's context
 * (allowed during capture). */
static DLSYNC__NOINLINE dlsync_status pool_get_new(CUevent *out, dlsync__pool *p) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = p->drv;
  CUevent ev = NULL;
  CUcontext popped = NULL;
  bool pushed = false;
  dlsync__orphans_collect();
  DLSYNC_CU(d, CtxPushCurrent, (p->cuctx), "making context %p current to create an event",
            (void *)p->cuctx);
  pushed = true;
  DLSYNC_CU(d, EventCreate, (&ev, CU_EVENT_DISABLE_TIMING), "growing the event pool of context %p",
            (void *)p->cuctx);
  atomic_fetch_add_explicit(&p->created, 1, memory_order_relaxed);
  *out = ev;
  ev = NULL;
cleanup:
  if (pushed) {
    CUresult r = d->CtxPopCurrent(&popped);
    if (r != CUDA_SUCCESS && st == DLSYNC_SUCCESS) {
      st = dlsync__fail_driver(d, r, "cuCtxPopCurrent", "restoring the caller's context");
      /* Counted as destroyed only when it was (a second fault leaks it). */
      if (d->EventDestroy(*out) == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&p->destroyed, 1, memory_order_relaxed);
      *out = NULL;
    }
  }
  return st;
}

/* One take from the free list, for the trimming's count. */
static inline void took_locked(dlsync__pool *p) {
  p->ops++;
  if (p->nfree < p->low)
    p->low = p->nfree;
}

dlsync_status dlsync__pool_get(CUevent *out, dlsync__pool *p) {
  dlsync__spin_lock(&p->lock);
  if (DLSYNC__LIKELY(p->nfree > 0)) {
    *out = p->free_events[--p->nfree];
    took_locked(p);
    dlsync__spin_unlock(&p->lock);
    return DLSYNC_SUCCESS;
  }
  p->ops++;
  p->low = 0;
  dlsync__spin_unlock(&p->lock);
  return pool_get_new(out, p);
}

/* Returns false when the event could not be kept (the caller destroys it).
 * With `limit`, at most p->kept events are kept. */
static bool keep_locked(dlsync__pool *p, CUevent event, bool limit) {
  if (limit && p->nfree >= p->kept)
    return false;
  if (p->nfree == p->cap) {
    size_t cap = 16, bytes = 0;
    CUevent *grown = NULL;
    if (p->cap != 0 && !dlsync__mul_size(p->cap, 2, &cap))
      return false;
    if (dlsync__mul_size(cap, sizeof *grown, &bytes))
      grown = dlsync__realloc(p->free_events, bytes);
    if (grown == NULL)
      return false;
    p->free_events = grown;
    p->cap = cap;
  }
  p->free_events[p->nfree++] = event;
  return true;
}

static void destroy_events(dlsync__pool *p, const CUevent *events, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p->drv->EventDestroy(events[i]) == CUDA_SUCCESS)
      atomic_fetch_add_explicit(&p->destroyed, 1, memory_order_relaxed);
}

/* Trimming. A pool may hold more free events than it keeps (p->kept): the
 * releases' returns keep every event of a burst for the releases that
 * follow, and graphs give back what they held. Once a period has seen
 * DLSYNC__POOL_TRIM_OPS takes and returns and lasted
 * dlsync__pool_trim_period_ns, the events that stayed free all the while
 * (p->low of them: the free list is last in, first out, so those at its
 * bottom were never taken) are not the pool's working set: those past
 * p->kept are destroyed. Made on returns only: they come from threads that may call CUDA
 * (never from a graph's destructor), and cuEventDestroy is allowed during
 * capture. */
static inline bool trim_due_locked(const dlsync__pool *p) {
  return p->ops >= DLSYNC__POOL_TRIM_OPS(p->kept);
}

/* Destroys the events that stayed free past p->kept, in runs of 64 (the lock
 * is never held long), and starts the next period. Reached once every
 * DLSYNC__POOL_TRIM_OPS takes and returns: the clock is read here, never on a
 * take or a return; a period that has not lasted dlsync__pool_trim_period_ns
 * yet counts its operations again and keeps its low mark. */
static DLSYNC__NOINLINE void pool_trim(dlsync__pool *p) {
  uint64_t now = trim_clock_ns();
  CUevent out[64];
  size_t n;
  do {
    n = 0;
    dlsync__spin_lock(&p->lock);
    if (!trim_due_locked(p) || p->dead) {
      dlsync__spin_unlock(&p->lock);
      return;
    }
    if (now - p->since_ns < dlsync__pool_trim_period_ns) { /* not a whole period yet */
      p->ops = 0;
      dlsync__spin_unlock(&p->lock);
      return;
    }
    while (n < 64 && p->low > p->kept && p->nfree > 0) {
      out[n++] = p->free_events[--p->nfree];
      p->low--;
    }
    if (n < 64) { /* done: the next period */
      p->ops = 0;
      p->low = p->nfree;
      p->since_ns = now;
    }
    dlsync__spin_unlock(&p->lock);
    destroy_events(p, out, n);
  } while (n == 64);
}

void dlsync__pool_put(dlsync__pool *p, CUevent event) {
  bool kept, trim;
  dlsync__spin_lock(&p->lock);
  /* A dead pool (its context destroyed, e.g. from a deleter while releases
   * were queued) keeps nothing: the event is destroyed here. */
  kept = !p->dead && keep_locked(p, event, true);
  p->ops++;
  trim = trim_due_locked(p);
  dlsync__spin_unlock(&p->lock);
  if (!kept)
    destroy_events(p, &event, 1);
  if (DLSYNC__UNLIKELY(trim))
    pool_trim(p);
}

void dlsync__pool_put_many(dlsync__pool *p, const CUevent *events, size_t n, size_t extra) {
  size_t kept = 0;
  bool trim;
  dlsync__spin_lock(&p->lock);
  if (!p->dead)
    while (kept < n && (p->nfree < p->kept + extra || p->nfree < p->kept) &&
           keep_locked(p, events[kept], false))
      kept++;
  p->ops += n;
  trim = trim_due_locked(p);
  dlsync__spin_unlock(&p->lock);
  destroy_events(p, events + kept, n - kept);
  if (trim)
    pool_trim(p);
}

/* ---- scratch events ----
 *
 * A plain record followed by a wait leaves the event free again at once (the
 * wait took the record it needed), so each thread keeps one event per pool it
 * uses and records it over and over, without touching the pool's lock. The
 * pool remembers every event it lent this way (at most SCRATCH_MAX; past that
 * threads take and give back as usual) and destroys them with the context. A
 * thread's slots are trusted only for the context generation that filled
 * them, like the stream memo. A slot that is reused for another pool leaves
 * its event with the thread (a memo entry may still name it): it is never
 * lent to another thread. */
#define SCRATCH_MAX 256

dlsync_status dlsync__pool_borrow(CUevent *out, bool *lent, const dlsync__pools *ps,
                                  dlsync__pool *p) {
  dlsync_status st;
  bool registered = false;
  dlsync__event_thread *h = hot();
  for (unsigned i = 0; i < DLSYNC__SCRATCH_SLOTS; i++) {
    const dlsync__scratch_slot *sl = &h->scratch[i];
    if (sl->pool == p && sl->owner == ps && sl->generation == ps->generation) {
      *out = sl->event;
      *lent = true;
      return DLSYNC_SUCCESS;
    }
  }
  *lent = false;
  st = dlsync__pool_get(out, p);
  if (st != DLSYNC_SUCCESS)
    return st;
  dlsync__spin_lock(&p->lock);
  if (p->nscratch < SCRATCH_MAX) {
    if (p->scratch == NULL)
      p->scratch = dlsync__calloc(SCRATCH_MAX, sizeof *p->scratch);
    if (p->scratch != NULL) {
      p->scratch[p->nscratch++] = *out;
      registered = true;
    }
  }
  dlsync__spin_unlock(&p->lock);
  if (registered) {
    dlsync__scratch_slot *slot = &h->scratch[h->scratch_next++ % DLSYNC__SCRATCH_SLOTS];
    slot->owner = ps;
    slot->generation = ps->generation;
    slot->pool = p;
    slot->event = *out;
    *lent = true;
  }
  return DLSYNC_SUCCESS;
}

CUevent dlsync__thread_scratch_fill(dlsync__thread *t, dlsync__stream_memo *m) {
  const dlsync__event_thread *h = dlsync__event_thread_of(t);
  for (unsigned i = 0; i < DLSYNC__SCRATCH_SLOTS; i++) {
    const dlsync__scratch_slot *sl = &h->scratch[i];
    if (sl->pool == m->pool && sl->owner == m->owner && sl->generation == m->generation) {
      m->scratch = sl->event;
      return m->scratch;
    }
  }
  return NULL;
}

void dlsync__pool_unborrow(dlsync__pool *p, CUevent event, bool lent) {
  if (!lent)
    dlsync__pool_put(p, event);
}

/* An event that cannot go back to its pool (dead, or out of memory): to the
 * orphan list, destroyed by the next call that may make CUDA calls. */
static void orphan_event(dlsync__pool *p, CUevent event) {
  orphan *o = dlsync__malloc(sizeof *o);
  bool dead;
  dlsync__orphans_waker wake;
  dlsync__spin_lock(&p->lock);
  dead = p->dead;
  dlsync__spin_unlock(&p->lock);
  if (o != NULL) {
    o->drv = p->drv;
    o->event = event;
    o->pool = p;
    dlsync__pool_ref(p);
    pthread_mutex_lock(&orphan_lock);
    o->next = orphans;
    orphans = o;
    atomic_store_explicit(&orphans_pending, 1, memory_order_release);
    pthread_mutex_unlock(&orphan_lock);
    wake = atomic_load_explicit(&orphans_waker, memory_order_acquire);
    if (dead && wake != NULL)
      wake();
  } else {
    /* Out of memory on a driver thread: the event handle is lost (the
     * driver frees it with its context). */
    DLSYNC__LOG(DLSYNC__LOG_WARN,
                "event %p of CUDA context %p lost: out of memory while a graph gave it back",
                (void *)event, (void *)p->cuctx);
  }
}

void dlsync__pool_return_from_graph(dlsync__pool *p, CUevent event) {
  bool kept = false;
  dlsync__spin_lock(&p->lock);
  /* No CUDA call here: this runs on a driver thread, so a surplus event is
   * kept rather than destroyed. */
  if (!p->dead)
    kept = keep_locked(p, event, false);
  dlsync__spin_unlock(&p->lock);
  if (!kept)
    orphan_event(p, event);
  /* No longer held, and the reference it took let go: the last may free
   * the pool. */
  if (atomic_fetch_sub_explicit(&p->refs, POOL_OWNED_ONE + 1, memory_order_acq_rel) ==
      POOL_OWNED_ONE + 1)
    pool_free(p);
}

/* ---- holds: the events one graph holds, given back together ----
 *
 * A capture's graph holds every event dlsync put into it. Instead of a
 * count per event, the graph holds one hold (through a user object, made by
 * graph/), a list of the pool's events that comes back all at once when the
 * graph is gone. Taking an event into a hold is one section under the
 * pool's lock: the event off the free list, onto the hold, counted. An event
 * two captures hold (TWO_CAPTURES) is a pair, counted by its two holds under
 * the same lock. The events of built graphs are in holds too: a thread's
 * batch (graph/), which the graphs hold through one user object.
 *
 * Hold and pair memory belongs to the pool: recycled, never freed before the
 * pool (each live hold holds a pool reference), so that a thread holding a
 * stale pointer to a hold (from its cache, graph/) can check it under the
 * lock: the hold is still the one it made when its generation is the same and
 * it is live. Everything in a hold is written under the lock of its pool. */
#define HOLD_INLINE 16
#define HOLD_CHUNK 128

typedef enum hold_kind {
  HOLD_EVENT, /* the hold's alone */
  HOLD_PAIR,  /* shared with another hold */
  HOLD_DONE   /* handled already (while the hold is given back) */
} hold_kind;

typedef struct hold_pair {
  unsigned holds; /* under the pool's lock */
  CUevent event;
  struct hold_pair *next_free;
} hold_pair;

typedef struct hold_item {
  CUevent event;
  void *ref; /* HOLD_PAIR: the pair */
  unsigned char kind;
} hold_item;

typedef struct hold_chunk {
  struct hold_chunk *next;
  size_t n;
  hold_item items[HOLD_CHUNK];
} hold_chunk;

struct dlsync__hold {
  /* First (event.h reads it): its life, a new one each time the hold is
   * made, times two, plus one while live (made and not given back). Written
   * under the lock; read without it by dlsync__hold_live. */
  dlsync__hold_head head;
  dlsync__pool *pool; /* fixed for the hold's memory's life */
  size_t n;           /* items in `first` */
  hold_item first[HOLD_INLINE];
  hold_chunk *chunks; /* the newest first */
  dlsync__hold *next_free;
};

static void holds_free(dlsync__pool *p) {
  while (p->free_holds != NULL) {
    dlsync__hold *h = p->free_holds;
    p->free_holds = h->next_free;
    dlsync__free(h);
  }
  while (p->free_pairs != NULL) {
    hold_pair *pr = p->free_pairs;
    p->free_pairs = pr->next_free;
    dlsync__free(pr);
  }
}

dlsync_status dlsync__hold_new(dlsync__hold **out, uint64_t *gen, dlsync__pool *p) {
  dlsync__hold *h;
  *out = NULL;
  dlsync__spin_lock(&p->lock);
  h = p->free_holds;
  if (h != NULL)
    p->free_holds = h->next_free;
  dlsync__spin_unlock(&p->lock);
  if (h == NULL) {
    h = dlsync__calloc(1, sizeof *h);
    if (h == NULL)
      return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                          "giving events to a capture: out of memory (its hold)");
    h->pool = p;
  }
  /* A recycled hold may be named by a thread's stale cache entry, which
   * reads its life under the lock, or alone (dlsync__hold_live: the word
   * changes with each life, so an old one never matches). */
  dlsync__spin_lock(&p->lock);
  *gen = ++p->hold_gens;
  atomic_store_explicit(&h->head.life, *gen * 2 + 1, memory_order_release);
  h->n = 0;
  h->chunks = NULL;
  h->next_free = NULL;
  dlsync__spin_unlock(&p->lock);
  dlsync__pool_ref(p);
  *out = h;
  return DLSYNC_SUCCESS;
}

static DLSYNC__NOINLINE bool hold_grow_locked(dlsync__hold *h) {
  hold_chunk *c = dlsync__malloc(sizeof *c);
  if (c == NULL)
    return false;
  c->n = 0;
  c->next = h->chunks;
  h->chunks = c;
  return true;
}

/* Room for one more item in a live hold (lock held): false when a chunk is
 * needed and cannot be allocated. */
static DLSYNC__INLINE bool hold_room_locked(dlsync__hold *h) {
  if (DLSYNC__LIKELY(h->n < HOLD_INLINE))
    return true;
  if (h->chunks != NULL && h->chunks->n < HOLD_CHUNK)
    return true;
  return hold_grow_locked(h);
}

/* Appends to a hold with room (hold_room_locked). */
static DLSYNC__INLINE void hold_add_locked(dlsync__hold *h, hold_item it) {
  if (DLSYNC__LIKELY(h->n < HOLD_INLINE))
    h->first[h->n++] = it;
  else
    h->chunks->items[h->chunks->n++] = it;
}

static DLSYNC__INLINE bool hold_is(const dlsync__hold *h, uint64_t gen) {
  return atomic_load_explicit(&h->head.life, memory_order_relaxed) == gen * 2 + 1;
}

static DLSYNC__COLD dlsync_status hold_out_of_memory(void) {
  return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to a capture: out of memory");
}

/* Takes `ev` (off the free list already) into h1, and into h2 as pair `pr`
 * when h2 is non-NULL (lock held; both live). False, nothing taken, when a
 * hold has no room. */
static DLSYNC__INLINE bool hold_put_locked(dlsync__pool *p, CUevent ev, dlsync__hold *h1,
                                           dlsync__hold *h2, hold_pair *pr) {
  hold_item it = {ev, NULL, HOLD_EVENT};
  if (DLSYNC__UNLIKELY(!hold_room_locked(h1) || (h2 != NULL && !hold_room_locked(h2))))
    return false;
  if (h2 != NULL) {
    pr->holds = 2;
    pr->event = ev;
    it.ref = pr;
    it.kind = HOLD_PAIR;
    hold_add_locked(h2, it);
  }
  hold_add_locked(h1, it);
  p->hold_owned++;
  return true;
}

/* hold_take when the pool has no free event, or a pair is needed and none
 * is free: made outside the lock, then taken. */
static DLSYNC__NOINLINE dlsync_status hold_take_slow(CUevent *out, dlsync__pool *p,
                                                     dlsync__hold_life a, dlsync__hold_life b) {
  dlsync__hold *h1 = a.hold, *h2 = b.hold;
  uint64_t g1 = a.life, g2 = b.life;
  dlsync_status st = DLSYNC_SUCCESS;
  CUevent ev = NULL;
  hold_pair *pr = NULL;
  dlsync__spin_lock(&p->lock);
  if (p->nfree > 0) {
    ev = p->free_events[--p->nfree];
    took_locked(p);
  }
  if (h2 != NULL && p->free_pairs != NULL) {
    pr = p->free_pairs;
    p->free_pairs = pr->next_free;
  }
  dlsync__spin_unlock(&p->lock);
  if (h2 != NULL && pr == NULL && (pr = dlsync__malloc(sizeof *pr)) == NULL) {
    st = hold_out_of_memory();
    goto cleanup;
  }
  if (ev == NULL)
    DLSYNC_TRY(pool_get_new(&ev, p));
  dlsync__spin_lock(&p->lock);
  if (hold_is(h1, g1) && (h2 == NULL || hold_is(h2, g2))) { /* else stale: *out stays NULL */
    if (hold_put_locked(p, ev, h1, h2, pr)) {
      *out = ev;
      ev = NULL;
      pr = NULL;
    } else {
      st = hold_out_of_memory();
    }
  }
  dlsync__spin_unlock(&p->lock);
cleanup:
  if (ev != NULL)
    dlsync__pool_put(p, ev);
  if (pr != NULL) {
    dlsync__spin_lock(&p->lock);
    pr->next_free = p->free_pairs;
    p->free_pairs = pr;
    dlsync__spin_unlock(&p->lock);
  }
  return st;
}

dlsync_status dlsync__hold_take(CUevent *out, dlsync__pool *p, dlsync__hold_life a,
                                dlsync__hold_life b) {
  dlsync__hold *h1 = a.hold, *h2 = b.hold;
  uint64_t g1 = a.life, g2 = b.life;
  CUevent ev;
  hold_pair *pr = NULL;
  *out = NULL;
  dlsync__spin_lock(&p->lock);
  if (DLSYNC__UNLIKELY(!hold_is(h1, g1) || (h2 != NULL && !hold_is(h2, g2)))) {
    dlsync__spin_unlock(&p->lock);
    return DLSYNC_SUCCESS; /* stale */
  }
  if (DLSYNC__UNLIKELY(p->nfree == 0 || (h2 != NULL && p->free_pairs == NULL))) {
    dlsync__spin_unlock(&p->lock);
    return hold_take_slow(out, p, a, b);
  }
  ev = p->free_events[p->nfree - 1];
  if (h2 != NULL)
    pr = p->free_pairs;
  if (DLSYNC__UNLIKELY(!hold_put_locked(p, ev, h1, h2, pr))) {
    dlsync__spin_unlock(&p->lock);
    return hold_out_of_memory();
  }
  p->nfree--;
  took_locked(p);
  if (h2 != NULL)
    p->free_pairs = pr->next_free;
  dlsync__spin_unlock(&p->lock);
  *out = ev;
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync__hold_take_some(CUevent *out, size_t max, size_t *n, dlsync__pool *p,
                                     dlsync__hold_life hl) {
  dlsync__hold *h = hl.hold;
  uint64_t gen = hl.life;
  size_t k = 0;
  *n = 0;
  dlsync__spin_lock(&p->lock);
  if (DLSYNC__UNLIKELY(!hold_is(h, gen))) {
    dlsync__spin_unlock(&p->lock);
    return DLSYNC_SUCCESS; /* stale */
  }
  if (DLSYNC__UNLIKELY(p->nfree == 0)) { /* one, made outside the lock */
    dlsync_status st;
    dlsync__spin_unlock(&p->lock);
    out[0] = NULL;
    st = hold_take_slow(out, p, hl, (dlsync__hold_life){NULL, 0});
    *n = out[0] != NULL ? 1 : 0;
    return st;
  }
  /* In runs: as many as fit the hold's inline items or its newest chunk. */
  while (k < max && p->nfree > 0) {
    bool inline_room = h->n < HOLD_INLINE;
    hold_item *dst;
    size_t *filled, m;
    if (DLSYNC__UNLIKELY(!hold_room_locked(h)))
      break;
    filled = inline_room ? &h->n : &h->chunks->n;
    dst = inline_room ? &h->first[*filled] : &h->chunks->items[*filled];
    m = (inline_room ? HOLD_INLINE : HOLD_CHUNK) - *filled;
    if (m > max - k)
      m = max - k;
    if (m > p->nfree)
      m = p->nfree;
    for (size_t j = 0; j < m; j++) {
      CUevent ev = p->free_events[p->nfree - 1 - j];
      dst[j].event = ev;
      dst[j].ref = NULL;
      dst[j].kind = HOLD_EVENT;
      out[k + j] = ev;
    }
    *filled += m;
    p->nfree -= m;
    p->ops += m;
    if (p->nfree < p->low)
      p->low = p->nfree;
    p->hold_owned += m;
    k += m;
  }
  dlsync__spin_unlock(&p->lock);
  *n = k;
  return k > 0 ? DLSYNC_SUCCESS : hold_out_of_memory();
}

/* Gives a hold's items back (lock held): its own events to the free list
 * (those that cannot be kept left as HOLD_EVENT for the caller to orphan),
 * a pair's event once its second hold lets go. */
static void hold_items_back_locked(dlsync__pool *p, hold_item *items, size_t n) {
  for (size_t i = n; i-- > 0;) { /* the last taken first: see dlsync__hold_release */
    hold_item *it = &items[i];
    if (it->kind == HOLD_PAIR) {
      hold_pair *pr = it->ref;
      if (--pr->holds > 0) {
        it->kind = HOLD_DONE;
        continue;
      }
      pr->next_free = p->free_pairs;
      p->free_pairs = pr;
      it->kind = HOLD_EVENT;
    }
    if (it->kind == HOLD_EVENT) {
      p->hold_owned--;
      if (!p->dead && keep_locked(p, it->event, false))
        it->kind = HOLD_DONE;
    }
  }
}

/* What hold_items_back_locked left: events that could not be kept,
 * orphaned. */
static void hold_items_finish(dlsync__pool *p, const hold_item *items, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (items[i].kind == HOLD_EVENT)
      orphan_event(p, items[i].event);
}

/* Items back under one short lock section, then what that left. */
static void hold_items_give_back(dlsync__pool *p, hold_item *items, size_t n) {
  dlsync__spin_lock(&p->lock);
  hold_items_back_locked(p, items, n);
  dlsync__spin_unlock(&p->lock);
  hold_items_finish(p, items, n);
}

/* The events go back in the reverse of the order they were taken, so that
 * the free list (last in, first out) hands them out again in that order: a
 * capture recorded again and again (a training step) records the same
 * events in the same order each time, as a hand-made one with events made
 * for it would (the driver's own event objects then stay in the caches the
 * same way). Chunks hold the later items, newest first. */
void dlsync__hold_release(dlsync__hold *h) {
  dlsync__pool *p = h->pool;
  hold_item first[HOLD_INLINE];
  hold_chunk *chunks;
  size_t n;
  dlsync__spin_lock(&p->lock);
  atomic_store_explicit(&h->head.life,
                        atomic_load_explicit(&h->head.life, memory_order_relaxed) & ~(uint64_t)1,
                        memory_order_release);
  n = h->n;
  chunks = h->chunks;
  memcpy(first, h->first, n * sizeof first[0]);
  dlsync__spin_unlock(&p->lock);
  /* Chunk by chunk, so that the lock is never held long. */
  while (chunks != NULL) {
    hold_chunk *next = chunks->next;
    hold_items_give_back(p, chunks->items, chunks->n);
    dlsync__free(chunks);
    chunks = next;
  }
  hold_items_give_back(p, first, n);
  dlsync__spin_lock(&p->lock);
  h->n = 0;
  h->chunks = NULL;
  h->next_free = p->free_holds;
  p->free_holds = h;
  dlsync__spin_unlock(&p->lock);
  pool_unref(p); /* the hold's: the last frees the pool, and the hold with it */
}

/* ---- teardown and stats ---- */

dlsync_status dlsync__pools_destroy(dlsync__pools *ps) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__pool *p = atomic_exchange_explicit(&ps->list, NULL, memory_order_acq_rel);
  while (p != NULL) {
    dlsync__pool *next = p->next;
    CUevent *events;
    size_t n;
    dlsync__spin_lock(&p->lock);
    p->dead = true;
    events = p->free_events;
    n = p->nfree;
    p->free_events = NULL;
    p->nfree = 0;
    p->cap = 0;
    dlsync__spin_unlock(&p->lock);
    for (size_t i = 0; i < p->nscratch; i++) {
      CUresult r = p->drv->EventDestroy(p->scratch[i]);
      if (r == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&p->destroyed, 1, memory_order_relaxed);
      if (r != CUDA_SUCCESS && st == DLSYNC_SUCCESS)
        st = dlsync__fail_driver(p->drv, r, "cuEventDestroy",
                                 "destroying the scratch events of context %p", (void *)p->cuctx);
    }
    p->nscratch = 0;
    for (size_t i = 0; i < n; i++) {
      CUresult r = p->drv->EventDestroy(events[i]);
      if (r == CUDA_SUCCESS)
        atomic_fetch_add_explicit(&p->destroyed, 1, memory_order_relaxed);
      if (r != CUDA_SUCCESS && st == DLSYNC_SUCCESS)
        st = dlsync__fail_driver(p->drv, r, "cuEventDestroy",
                                 "destroying the event pool of context %p", (void *)p->cuctx);
    }
    dlsync__free(events);
    pool_unref(p);
    p = next;
  }
  dlsync__orphans_collect();
  return st;
}

void dlsync__pool_stats_get(dlsync__pool_stats *out, dlsync__pools *ps) {
  memset(out, 0, sizeof *out);
  for (dlsync__pool *p = atomic_load_explicit(&ps->list, memory_order_acquire); p != NULL;
       p = p->next) {
    dlsync__spin_lock(&p->lock);
    out->free_events += p->nfree + p->nscratch; /* scratch events are idle between calls */
    out->created += atomic_load(&p->created);
    out->destroyed += atomic_load(&p->destroyed);
    out->graph_owned += p->hold_owned;
    dlsync__spin_unlock(&p->lock);
    out->graph_owned += (size_t)(atomic_load(&p->refs) / POOL_OWNED_ONE);
  }
}

dlsync__held_event *dlsync__held_event_new(dlsync__pool *p, CUevent event) {
  dlsync__held_event *he = dlsync__malloc(sizeof *he);
  if (he == NULL)
    return NULL;
  atomic_init(&he->refs, 1);
  he->pool = p;
  he->event = event;
  he->drv = NULL;
  he->owned = false;
  he->orphan = NULL;
  dlsync__pool_note_graph_owned(p);
  return he;
}

dlsync__held_event *dlsync__held_event_new_foreign(const dlsync__driver *drv, CUevent event,
                                                   bool owned) {
  dlsync__held_event *he = dlsync__malloc(sizeof *he);
  orphan *o = NULL;
  if (he == NULL)
    return NULL;
  if (owned && (o = dlsync__malloc(sizeof *o)) == NULL) {
    dlsync__free(he);
    return NULL;
  }
  atomic_init(&he->refs, 1);
  he->pool = NULL;
  he->event = event;
  he->drv = drv;
  he->owned = owned;
  he->orphan = o;
  return he;
}

/* An owned foreign event let go (maybe on a driver thread: no CUDA call): to
 * the orphan list in its entry `o`. Nobody is woken (a thread making driver
 * calls at any moment would disturb the caller's): the next collection takes
 * it (a dlsync_fence_import, a pool growing, a context made or destroyed). */
static void orphan_foreign(orphan *o, const dlsync__driver *drv, CUevent event) {
  o->drv = drv;
  o->event = event;
  o->pool = NULL;
  pthread_mutex_lock(&orphan_lock);
  o->next = orphans;
  orphans = o;
  atomic_store_explicit(&orphans_pending, 1, memory_order_release);
  pthread_mutex_unlock(&orphan_lock);
}

void dlsync__held_event_ref(dlsync__held_event *he) {
  atomic_fetch_add_explicit(&he->refs, 1, memory_order_relaxed);
}

void dlsync__held_event_unref(dlsync__held_event *he) {
  if (he == NULL || atomic_fetch_sub_explicit(&he->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (he->pool == NULL) {
    if (he->owned)
      orphan_foreign(he->orphan, he->drv, he->event);
    dlsync__free(he);
    return;
  }
  dlsync__pool_return_from_graph(he->pool, he->event);
  dlsync__free(he);
}

void dlsync__pool_note_graph_owned(dlsync__pool *p) {
  atomic_fetch_add_explicit(&p->refs, POOL_OWNED_ONE + 1, memory_order_relaxed);
}
