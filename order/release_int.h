/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private, order/ only: what the release's files share.
 *
 *   release.c            the entry points: dlsync_release (its eager path and
 *                        its general path), dlsync_release_flush, the stats;
 *                        the destructor of a release a graph owned
 *   release_books.c      each context's book of its releases, and the tally
 *                        by which a reclaimer's batch tells the books
 *   release_reclaimer.c  the reclaimer threads (one per GPU) and their
 *                        batches, the janitor, the unload that joins them
 *   release_rings.c      the releasing threads' rings: made, collected by
 *                        their reclaimer, marked when their thread exits
 *
 * The releasing path's inline parts (a GPU's reclaimer, a thread's ring, a
 * push into it, the shared queue's enqueue) are at the end of this header.
 * release.c's first comment says how a release goes. */
#ifndef DLSYNC_ORDER_RELEASE_INT_H
#define DLSYNC_ORDER_RELEASE_INT_H

#include "order/order.h"

struct dlsync__release_book {
  atomic_uint refs; /* the context's + one per pending release */
  /* Eager releases not run yet: added to without the lock (the releasing
   * thread's fast path), taken from under it (with a broadcast), so that a
   * waiter that reads it under the lock misses no decrease. */
  atomic_size_t pending_eager;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  size_t pending_graph;
  size_t done;
  size_t sync_failures;        /* events whose synchronisation failed (deleter ran anyway) */
  size_t mode_failures;        /* releases whose reclaimer could not enter RELAXED mode */
  size_t blocked;              /* eager releases waiting now for RELAXED mode */
  dlsync_status first_failure; /* since the last flush; DLSYNC_SUCCESS when none */
  int first_result;            /* its CUresult, for dlsync_last_driver_result */
  char first_message[256];
};

struct release_ring;

typedef struct release_item {
  struct release_item *next;
  dlsync__release_book *book;
  const dlsync__driver *drv;
  dlsync__pool *pool;           /* eager: the event's pool (a reference is held) */
  CUevent event;                /* eager: recorded after the work */
  CUstream stream;              /* eager: where it was recorded */
  unsigned long long stream_id; /* eager: its cuStreamGetId, 0 when unknown */
  pthread_t thread;             /* eager: the thread that recorded it */
  dlsync_deleter fn;
  void *arg;
  int device;
  int slot;          /* a reclaimer's batch: the stream's slot, -1 when synchronised alone */
  CUresult result;   /* a reclaimer's batch: its event's synchronisation */
  bool from_graph;   /* owned by graphs (false again once its graph let it go: queued) */
  atomic_bool armed; /* graph: handed over; until then the destructor only frees */
  /* A ring's slot (below): its ring and position; the book and pool whose
   * ring references end once it is done. The item is the reclaimer's. */
  struct release_ring *ring;
  unsigned ring_pos;
  dlsync__release_book *drop_book;
  dlsync__pool *drop_pool;
} release_item;

/* What a reclaimer's batch has done for one book and not told it yet: the
 * releases whose deleters ran (or were dropped), told in one go. */
#define TALLY_RINGS 8
#define TALLY_RING_RUN 256

typedef struct book_tally {
  dlsync__release_book *book;
  unsigned eager, graph;
  unsigned ring; /* eager releases of rings: not in pending_eager, no reference each */
  unsigned sync_failures;
  int first_result; /* of the first failed synchronisation in the tally */
  char first_message[200];
  /* The ring slots of the tally's releases, freed as the book is told (a
   * ring's pending releases are counted in its slots): each ring's new tail. */
  struct {
    struct release_ring *ring;
    unsigned tail;
  } tails[TALLY_RINGS];
  unsigned ntails;
  unsigned ring_since; /* ring releases since the tally last freed slots */
} book_tally;

/* ---- reclaimers: one thread per GPU, for the whole process ----
 *
 * And one more, the janitor (no GPU), for the work that must not be done
 * where it becomes due: freeing a destroyed context and destroying its
 * orphaned events when its last fence is released (perhaps from a host
 * function or a user-object destructor, where no CUDA call is allowed), and
 * destroying the events graphs give back to a destroyed context.
 *
 * Queue: releasing threads push onto a lock-free stack (one compare and
 * swap); the thread takes the whole stack at once and runs it oldest first,
 * as one batch. It wakes the thread only when that sleeps: after a batch
 * the thread naps (NAP_US, up to NAPS times) before it sleeps, so a steady
 * stream of releases never makes a system call on the releasing thread.
 *
 * Each thread is joined when this copy of the library is unloaded
 * (threads_unload in release_reclaimer.c, the first of base/'s unload
 * hooks): at exit, or at the dlclose of a shared library that embeds
 * libdlsync.a, whose code the threads run. Stopping is a handshake without
 * timeout: the thread runs what is queued (a deleter running finishes), then
 * returns, and the unload joins it. */

typedef struct reclaimer {
  /* Read by every push, written only as the thread falls asleep or wakes:
   * on a cache line of its own (the lock and the queue are written at each
   * of the thread's rounds). */
  char before[64];
  atomic_bool sleeping; /* the thread waits on cond: a push signals it */
  char after[64];
  _Atomic(release_item *) pushed; /* newest first; taken whole by the thread */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t thread;
  const dlsync__driver *drv; /* NULL: the janitor */
  int device;
  size_t keep;                /* the thread's: events given back so far (its pools keep them) */
  atomic_bool stopping;       /* the unload asked it to return once its queue is empty */
  bool started;               /* under lock: past its start (see reclaimer_start) */
  struct release_ring *rings; /* under lock: the releasing threads' rings (below) */
  release_item *spare;        /* the thread's: items of ring slots, reused */
} reclaimer;

/* ---- rings: one releasing thread's releases to one reclaimer ----
 *
 * The shared queue costs a releasing thread an allocation (freed by the
 * reclaimer: on glibc about 300 ns of arena traffic on an H200's host), a
 * pool reference, two book counts and a compare-and-swap, each on memory
 * the reclaimer writes too. So a thread that releases on a device's streams
 * gets a ring of its own for that device: a single-producer single-consumer
 * queue of RING_SLOTS slots. The thread fills the slot at `head` and
 * publishes it with one release store (no fence: ring_push); the reclaimer
 * copies the slots up to `head` into its own items, runs them in its batch,
 * and frees each slot (`tail`) once its deleter has run. Nothing per release
 * is shared but the slot and `head`: the ring holds one reference on the
 * book and one on the pool of the run of releases it is in, and a slot that
 * begins a new run carries the old run's references for the reclaimer to
 * drop once the slot is done (every earlier slot of the ring is done by
 * then). The book's count of pending releases leaves ring releases out;
 * flush, close and the stats count them in the rings
 * (dlsync__book_pending_eager). A device past DLSYNC__THREAD_RINGS or a ring
 * that could not be made: the shared queue.
 * A full ring: an item of the shared queue's kind (an allocation) pushed on
 * the ring's own overflow stack, marked with the ring position it follows;
 * the reclaimer merges a ring's slots and its overflow by that mark, so one
 * thread's deleters run in the order it released, and the thread goes back
 * to its slots as soon as one is free. When its thread exits the ring is
 * marked; the reclaimer frees it once it is empty.
 *
 * Memory: a ring is an anonymous mapping (dlsync__alloc_untouched) written
 * nowhere at creation but its first cache lines, so that its pages become
 * resident as the head first reaches them, not when the thread first
 * releases (100 threads releasing once would otherwise hold 32 MiB). No
 * slot is ever read before it is written: a slot is valid only in [tail,
 * head), and a drop only where its slot carries RUN_STARTS. */
#define RING_SLOTS 4096u /* a power of two */

/* One cache line (the ring is page-aligned): a push writes one
 * line, the reclaimer reads one. */
typedef struct ring_slot {
  _Atomic(dlsync__release_book *) book; /* read by other threads counting a book's */
  const dlsync__driver *drv;
  /* The event's pool; tagged with RUN_STARTS when the slot begins a new run
   * of the ring, whose ending references are in the ring's `drops`. */
  uintptr_t pool;
  CUevent event;
  CUstream stream;
  unsigned long long stream_id;
  dlsync_deleter fn;
  void *arg;
} ring_slot;

#define RUN_STARTS ((uintptr_t)1)

/* The references that end once a slot beginning a run is done. */
typedef struct ring_drop {
  dlsync__release_book *book;
  dlsync__pool *pool;
} ring_drop;

typedef struct release_ring {
  /* The releasing thread's. */
  atomic_uint head;           /* slots [tail, head) are queued */
  unsigned tail_seen;         /* tail as it last read it */
  dlsync__release_book *book; /* the current run's book (a reference) */
  dlsync__pool *pool;         /* the current run's pool (a reference) */
  bool light;                 /* published without a full fence (ring_push) */
  char apart[64];             /* the reclaimer's fields on another cache line */
  /* The reclaimer's (tail is read by the releasing thread and counters). */
  atomic_uint tail;
  /* Releases made while the ring was full, newest first; `ring_pos` of
   * each: the head then (it follows the slots before that). */
  _Atomic(release_item *) overflow;
  release_item *held;        /* the reclaimer's: overflow taken, oldest first, not run yet */
  struct release_ring *next; /* in the reclaimer's list, under its lock */
  reclaimer *owner;
  pthread_t thread;
  int device;
  atomic_bool orphaned; /* its thread has exited */
  _Alignas(64) ring_slot slots[RING_SLOTS];
  ring_drop drops[RING_SLOTS]; /* of the slots tagged RUN_STARTS */
} release_ring;

_Static_assert(sizeof(ring_slot) == 64, "a ring slot is one cache line");
_Static_assert(offsetof(release_ring, slots) % 64 == 0, "a ring's slots start a cache line");

static inline void ring_free_slots(release_ring *g, unsigned tail) {
  atomic_store_explicit(&g->tail, tail, memory_order_release);
}

/* The reclaimers of the first FAST_DEVICES devices, read without the lock
 * (set under it, once started; cleared at the unload). */
#define FAST_DEVICES 64
extern DLSYNC__HIDDEN _Atomic(reclaimer *) dlsync__fast_reclaimers[FAST_DEVICES];

/* ---- across the files ---- */

/* release_books.c */
void dlsync__book_unref(dlsync__release_book *b);
void dlsync__book_add_graph(dlsync__release_book *b);
void dlsync__book_cancel(dlsync__release_book *b, bool from_graph);
void dlsync__book_graph_queued(dlsync__release_book *b);
void dlsync__book_note_failure_locked(dlsync__release_book *b, int result, const char *message);
void dlsync__tally_commit(book_tally *t);
void dlsync__tally_add(book_tally *t, const release_item *it);
size_t dlsync__book_pending_eager(const dlsync__release_book *b);
dlsync_status dlsync__book_flush(dlsync__release_book *b);

/* release_reclaimer.c */
/* True on a reclaimer's thread (and the janitor's). */
extern DLSYNC__HIDDEN _Thread_local bool dlsync__on_reclaimer;
/* The release (item) the calling reclaimer is running now, NULL elsewhere,
 * and the tally of the batch it belongs to (releases whose deleters ran and
 * that their books do not count as done yet). */
extern DLSYNC__HIDDEN _Thread_local const release_item *dlsync__running;
extern DLSYNC__HIDDEN _Thread_local const book_tally *dlsync__running_tally;
DLSYNC__NOINLINE dlsync_status dlsync__reclaimer_for_slow(reclaimer **out,
                                                          const dlsync__driver *drv, int device);
reclaimer *dlsync__reclaimer_peek(int device);
DLSYNC__NOINLINE void dlsync__reclaimer_wake(reclaimer *r);
size_t dlsync__rings_pending(const dlsync__release_book *b);

/* release_rings.c */
/* Set by the unload before it frees the rings: a thread that exits after
 * that no longer touches its rings. */
extern DLSYNC__HIDDEN atomic_bool dlsync__rings_gone;
void dlsync__ring_free(release_ring *g);
release_item *dlsync__rings_collect(reclaimer *r, release_item *batch);
bool dlsync__rings_queued_locked(const reclaimer *r);
DLSYNC__NOINLINE release_ring *dlsync__ring_new(dlsync__thread *t, reclaimer *r);

/* ---- the releasing path's inline parts ---- */

static inline void book_ref(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

/* An eager release: no lock (the releasing thread's fast path). */
static inline void book_add_eager(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&b->pending_eager, 1, memory_order_relaxed);
}

static inline dlsync_status reclaimer_for(reclaimer **out, const dlsync__driver *drv, int device) {
  if (DLSYNC__LIKELY(device >= 0 && device < FAST_DEVICES)) {
    *out = atomic_load_explicit(&dlsync__fast_reclaimers[device], memory_order_acquire);
    if (DLSYNC__LIKELY(*out != NULL))
      return DLSYNC_SUCCESS;
  }
  return dlsync__reclaimer_for_slow(out, drv, device);
}

/* No CUDA call and no lock but when the thread sleeps: also used from
 * user-object destructors (driver threads) and the releasing fast path. */
static inline void enqueue(reclaimer *r, release_item *it) {
  release_item *head = atomic_load_explicit(&r->pushed, memory_order_relaxed);
  do
    it->next = head;
  while (!atomic_compare_exchange_weak_explicit(&r->pushed, &head, it, memory_order_seq_cst,
                                                memory_order_relaxed));
  if (DLSYNC__UNLIKELY(atomic_load(&r->sleeping)))
    dlsync__reclaimer_wake(r);
}

/* The calling thread's (t's) ring for r, NULL when it has none there and cannot
 * make one. (A device has one reclaimer for the library's life, so a ring
 * of another reclaimer is never found.) */
static DLSYNC__INLINE release_ring *ring_of(reclaimer *r, dlsync__thread *t) {
  release_ring *g;
  if (DLSYNC__UNLIKELY(r->device < 0 || r->device >= DLSYNC__THREAD_RINGS))
    return NULL;
  g = dlsync__order_thread_of(t)->rings[r->device];
  return DLSYNC__LIKELY(g != NULL) ? g : dlsync__ring_new(t, r);
}

/* One eager release on its way to a reclaimer: what the releasing path
 * hands from call to call (its event recorded already). */
typedef struct release_args {
  dlsync_context *ctx;
  dlsync__pool *pool;           /* the event's pool */
  CUevent event;                /* recorded after the work */
  CUstream stream;              /* where it was recorded */
  unsigned long long stream_id; /* its cuStreamGetId, 0 when unknown */
  dlsync_deleter fn;
  void *arg;
} release_args;

/* An eager release (its event recorded) into ring g of r: no allocation, no
 * atomic read-modify-write, one store that publishes the slot and a look at
 * `sleeping`. False when g is full: the caller puts it on g's overflow. */
static DLSYNC__INLINE bool ring_push(reclaimer *r, release_ring *g, const release_args *a) {
  dlsync__release_book *book = a->ctx->releases;
  dlsync__pool *pool = a->pool;
  ring_slot *sl;
  unsigned head = atomic_load_explicit(&g->head, memory_order_relaxed);
  if (DLSYNC__UNLIKELY(head - g->tail_seen >= RING_SLOTS)) {
    g->tail_seen = atomic_load_explicit(&g->tail, memory_order_acquire);
    if (head - g->tail_seen >= RING_SLOTS)
      return false;
  }
  sl = &g->slots[head % RING_SLOTS];
  sl->pool = (uintptr_t)pool;
  if (DLSYNC__UNLIKELY(g->book != book || g->pool != pool)) {
    ring_drop *dr = &g->drops[head % RING_SLOTS];
    dr->book = NULL;
    dr->pool = NULL;
    if (g->book != book) {
      book_ref(book);
      dr->book = g->book;
      g->book = book;
    }
    if (g->pool != pool) {
      dlsync__pool_ref(pool);
      dr->pool = g->pool;
      g->pool = pool;
    }
    sl->pool |= RUN_STARTS;
  }
  atomic_store_explicit(&sl->book, book, memory_order_relaxed);
  sl->drv = a->ctx->drv;
  sl->event = a->event;
  sl->stream = a->stream;
  sl->stream_id = a->stream_id;
  sl->fn = a->fn;
  sl->arg = a->arg;
  /* The head stored, then `sleeping` read, against idle()'s opposite
   * (release_reclaimer.c): a full fence between them on both sides. A light
   * ring's is the reclaimer's membarrier as it falls asleep (base/base.h),
   * so the push's store is a plain release store and a compiler barrier;
   * without membarrier, a sequentially consistent store. */
  if (DLSYNC__LIKELY(g->light)) {
    atomic_store_explicit(&g->head, head + 1, memory_order_release);
    dlsync__fence_light();
  } else {
    atomic_store(&g->head, head + 1);
  }
  if (DLSYNC__UNLIKELY(atomic_load(&r->sleeping)))
    dlsync__reclaimer_wake(r);
  return true;
}

#endif
