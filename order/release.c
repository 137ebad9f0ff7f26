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
 * The threads (the reclaimers and the janitor, below) are joined when this
 * copy of the library is unloaded; in a child of fork() they do not exist,
 * and every entry point refuses (base/thread.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "driver/hwloc.h"
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
  int slot;        /* a reclaimer's batch: the stream's slot, -1 when synchronised alone */
  CUresult result; /* a reclaimer's batch: its event's synchronisation */
  bool from_graph;
  atomic_bool armed; /* graph: handed over; until then the destructor only frees */
  /* A ring's slot (below): its ring and position; the book and pool whose
   * ring references end once it is done. The item is the reclaimer's. */
  struct release_ring *ring;
  unsigned ring_pos;
  dlsync__release_book *drop_book;
  dlsync__pool *drop_pool;
} release_item;

/* ---- books ---- */

static void book_unref_n(dlsync__release_book *b, unsigned n) {
  if (n == 0 || atomic_fetch_sub_explicit(&b->refs, n, memory_order_acq_rel) != n)
    return;
  pthread_cond_destroy(&b->cond);
  pthread_mutex_destroy(&b->lock);
  dlsync__free(b);
}

static void book_unref(dlsync__release_book *b) {
  book_unref_n(b, 1);
}

static inline void book_ref(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

dlsync_status dlsync__release_book_new(dlsync__release_book **out) {
  dlsync__release_book *b = dlsync__calloc(1, sizeof *b);
  *out = NULL;
  if (b == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "creating a context: out of memory");
  if (pthread_mutex_init(&b->lock, NULL) != 0) {
    dlsync__free(b);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "creating a context: no mutex");
  }
  if (pthread_cond_init(&b->cond, NULL) != 0) {
    pthread_mutex_destroy(&b->lock);
    dlsync__free(b);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "creating a context: no condition variable");
  }
  atomic_init(&b->refs, 1);
  atomic_init(&b->pending_eager, 0);
  *out = b;
  return DLSYNC_SUCCESS;
}

/* An eager release: no lock (the releasing thread's fast path). */
static inline void book_add_eager(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&b->pending_eager, 1, memory_order_relaxed);
}

static void book_add_graph(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  pthread_mutex_lock(&b->lock);
  b->pending_graph++;
  pthread_mutex_unlock(&b->lock);
}

/* A release that will not happen after all (it failed before being queued). */
static void book_cancel(dlsync__release_book *b, bool from_graph) {
  pthread_mutex_lock(&b->lock);
  if (from_graph)
    b->pending_graph--;
  else
    atomic_fetch_sub_explicit(&b->pending_eager, 1, memory_order_relaxed);
  pthread_cond_broadcast(&b->cond);
  pthread_mutex_unlock(&b->lock);
  book_unref(b);
}

/* A failure on the reclaimer thread, kept for flush and the stats (the
 * message of the first one since the last flush). Called with b->lock. */
static void book_note_failure_locked(dlsync__release_book *b, int result, const char *message) {
  if (b->first_failure == DLSYNC_SUCCESS) {
    b->first_failure = DLSYNC_ERROR_DRIVER;
    b->first_result = result;
    snprintf(b->first_message, sizeof b->first_message, "%s", message);
  }
}

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

static void ring_free_slots(struct release_ring *g, unsigned tail);

/* Tells the book: under its lock the counts change and the ring slots are
 * freed together, so that a waiter (flush, close) that finds no release
 * pending also finds each one counted done and its failure noted. */
static void tally_commit(book_tally *t) {
  dlsync__release_book *b = t->book;
  if (b == NULL)
    return;
  pthread_mutex_lock(&b->lock);
  atomic_fetch_sub_explicit(&b->pending_eager, t->eager, memory_order_relaxed);
  b->pending_graph -= t->graph;
  b->done += (size_t)t->eager + t->graph + t->ring;
  if (t->sync_failures > 0) {
    b->sync_failures += t->sync_failures;
    book_note_failure_locked(b, t->first_result, t->first_message);
  }
  for (unsigned i = 0; i < t->ntails; i++)
    ring_free_slots(t->tails[i].ring, t->tails[i].tail);
  t->ntails = 0;
  t->ring_since = 0;
  pthread_cond_broadcast(&b->cond);
  pthread_mutex_unlock(&b->lock);
  book_unref_n(b, t->eager + t->graph);
  t->book = NULL;
}

/* Counts a release done in the tally (committing the tally first when it
 * is another book's). */
static void tally_add(book_tally *t, const release_item *it) {
  unsigned i = 0;
  if (it->ring != NULL && t->book == it->book) {
    while (i < t->ntails && t->tails[i].ring != it->ring)
      i++;
    if (i == TALLY_RINGS)
      tally_commit(t); /* no room for another ring's slots: told now */
  }
  if (t->book != it->book) {
    tally_commit(t);
    t->book = it->book;
    t->eager = t->graph = t->ring = t->sync_failures = 0;
    t->ntails = 0;
    t->ring_since = 0;
  }
  if (it->from_graph) {
    t->graph++;
  } else if (it->ring != NULL) {
    t->ring++;
    t->ring_since++;
    for (i = 0; i < t->ntails && t->tails[i].ring != it->ring; i++)
      ;
    if (i == t->ntails) {
      t->tails[i].ring = it->ring;
      t->ntails++;
    }
    t->tails[i].tail = it->ring_pos + 1;
  } else {
    t->eager++;
  }
  if (it->result != CUDA_SUCCESS && t->sync_failures++ == 0) {
    t->first_result = (int)it->result;
    snprintf(t->first_message, sizeof t->first_message,
             "cuEventSynchronize failed on the reclaimer of device %d: %s (the deleter ran "
             "anyway)",
             it->device, dlsync__driver_error_name(it->drv, it->result));
  }
}

static _Thread_local bool on_reclaimer;

static size_t rings_pending(const dlsync__release_book *b);

/* The book's eager releases not run yet: those of the shared queue (counted
 * as they are made) and those in the releasing threads' rings (counted by
 * looking: a ring's release costs its book nothing as it is made). Called
 * with b->lock, which a reclaimer takes to tell the book of releases done
 * only after their ring slots are free again, so a waiter on b->cond misses
 * no decrease. */
static size_t book_pending_eager(const dlsync__release_book *b) {
  return atomic_load_explicit(&b->pending_eager, memory_order_relaxed) + rings_pending(b);
}

/* Waits until every eager release has run or is blocked (its reclaimer
 * cannot enter RELAXED mode), then returns the first failure since the last
 * flush (and forgets it). */
static dlsync_status book_flush(dlsync__release_book *b) {
  dlsync_status st;
  int result;
  char message[sizeof b->first_message];
  size_t blocked;
  pthread_mutex_lock(&b->lock);
  while (book_pending_eager(b) > b->blocked)
    pthread_cond_wait(&b->cond, &b->lock);
  st = b->first_failure;
  result = b->first_result;
  blocked = b->blocked;
  snprintf(message, sizeof message, "%s", b->first_message);
  b->first_failure = DLSYNC_SUCCESS;
  b->first_message[0] = '\0';
  pthread_mutex_unlock(&b->lock);
  if (st != DLSYNC_SUCCESS)
    return dlsync__fail_result(
        st, result, "dlsync_release_flush: a release failed on the reclaimer thread: %s%s", message,
        blocked > 0 ? " (its deleter has not run: it runs once the reclaimer "
                      "can enter RELAXED capture mode)"
                    : "");
  return DLSYNC_SUCCESS;
}

/* The release (item) the calling reclaimer is running now, NULL elsewhere,
 * and the tally of the batch it belongs to (releases whose deleters ran and
 * that their books do not count as done yet). */
static _Thread_local const release_item *running;
static _Thread_local const book_tally *running_tally;

dlsync_status dlsync__release_book_close(dlsync__release_book *b, dlsync__release_left *left) {
  dlsync__release_left l = {0, 0, 0, on_reclaimer};
  if (b != NULL) {
    pthread_mutex_lock(&b->lock);
    if (on_reclaimer) {
      /* From a deleter: a release queued behind the one running would wait
       * for itself, so the eager ones are not waited for; they still run
       * (the book is reference-counted). The one running, if it is of this
       * book, is not counted: it is done once its deleter returns; nor are
       * those of its batch whose deleters ran already. */
      bool own = running != NULL && running->book == b;
      const book_tally *t =
          running_tally != NULL && running_tally->book == b ? running_tally : NULL;
      l.queued = book_pending_eager(b) - (own && !running->from_graph ? 1 : 0) -
                 (t != NULL ? t->eager + t->ring : 0);
      l.graph_owned =
          b->pending_graph - (own && running->from_graph ? 1 : 0) - (t != NULL ? t->graph : 0);
    } else {
      while (book_pending_eager(b) > b->blocked)
        pthread_cond_wait(&b->cond, &b->lock);
      l.blocked = b->blocked;
      l.graph_owned = b->pending_graph;
    }
    pthread_mutex_unlock(&b->lock);
    book_unref(b);
  }
  if (left != NULL)
    *left = l;
  return l.queued + l.blocked + l.graph_owned > 0 ? DLSYNC_ERROR_BUSY : DLSYNC_SUCCESS;
}

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
 * (threads_unload, below, the first of base/'s unload hooks): at exit, or at the dlclose of a
 * shared library that embeds libdlsync.a, whose code the threads run. Stopping is a handshake
 * without timeout: the thread runs what is queued (a deleter running
 * finishes), then returns, and the unload joins it. */

#define NAP_US 50u
#define NAPS 40u

typedef struct reclaimer {
  _Atomic(release_item *) pushed; /* newest first; taken whole by the thread */
  atomic_bool sleeping;           /* the thread waits on cond: a push signals it */
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
 * publishes it with one store; the reclaimer copies the slots up to `head`
 * into its own items, runs them in its batch, and frees each slot (`tail`)
 * once its deleter has run. Nothing per release is shared but the slot and
 * `head`: the ring holds one reference on the book and one on the pool of
 * the run of releases it is in, and a slot that begins a new run carries the
 * old run's references for the reclaimer to drop once the slot is done
 * (every earlier slot of the ring is done by then). The book's count of
 * pending releases leaves ring releases out; flush, close and the stats
 * count them in the rings (book_pending_eager). A device past
 * DLSYNC__THREAD_RINGS or a ring that could not be made: the shared queue.
 * A full ring: an item of the shared queue's kind (an allocation) pushed on
 * the ring's own overflow stack, marked with the ring position it follows;
 * the reclaimer merges a ring's slots and its overflow by that mark, so one
 * thread's deleters run in the order it released, and the thread goes back
 * to its slots as soon as one is free. When its thread exits the ring is
 * marked; the reclaimer frees it once it is empty. */
#define RING_SLOTS 4096u /* a power of two */

/* One cache line (the ring is aligned to 64 bytes): a push writes one
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
  void *memory;         /* what was allocated (the ring is aligned inside it) */
  _Alignas(64) ring_slot slots[RING_SLOTS];
  ring_drop drops[RING_SLOTS]; /* of the slots tagged RUN_STARTS */
} release_ring;

_Static_assert(sizeof(ring_slot) == 64, "a ring slot is one cache line");
_Static_assert(offsetof(release_ring, slots) % 64 == 0, "a ring's slots start a cache line");

static void ring_free_slots(release_ring *g, unsigned tail) {
  atomic_store_explicit(&g->tail, tail, memory_order_release);
}

atomic_size_t dlsync__release_overflowed;

static pthread_mutex_t reclaimers_lock = PTHREAD_MUTEX_INITIALIZER;
static reclaimer **reclaimers;
static int nreclaimers;
static reclaimer *janitor;
static bool unloaded; /* under reclaimers_lock: no thread is started again */

/* The reclaimers of the first FAST_DEVICES devices, read without the lock
 * (set under it, once started; cleared at the unload). */
#define FAST_DEVICES 64
static _Atomic(reclaimer *) fast_reclaimers[FAST_DEVICES];

/* RELAXED each batch, for graph-owned releases too (their deleters may call
 * CUDA): nothing this thread does may break a capture. A batch's deleters
 * run after its synchronisations, and the next batch enters RELAXED mode
 * again, so a deleter that changes the thread's mode changes it for no
 * query of dlsync's. When the driver refuses, the thread's mode is unknown,
 * and cuEventSynchronize (or any query) in GLOBAL mode would invalidate
 * another thread's GLOBAL capture: the batch stays here, the failure is
 * counted for each of its releases and reported (flush returns it), and
 * entering RELAXED mode is tried again, from 1 ms to 100 ms apart. The
 * deleters run once that succeeds. Returns false when the library is being
 * unloaded meanwhile: the batch is then dropped (its deleters not run, as
 * they could run before the work). */
static void note_blocked(release_item *batch, int sign, CUresult r, const char *message) {
  for (release_item *it = batch; it != NULL; it = it->next) {
    pthread_mutex_lock(&it->book->lock);
    if (sign > 0) {
      it->book->mode_failures++;
      it->book->blocked += it->from_graph ? 0 : 1;
      book_note_failure_locked(it->book, (int)r, message);
      pthread_cond_broadcast(&it->book->cond);
    } else {
      it->book->blocked -= it->from_graph ? 0 : 1;
    }
    pthread_mutex_unlock(&it->book->lock);
  }
}

static bool enter_relaxed(reclaimer *rc, const dlsync__driver *drv, release_item *batch) {
  bool failed = false, entered = true;
  unsigned delay_us = 1000;
  for (;;) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult r = drv->ThreadExchangeStreamCaptureMode(&mode);
    if (r == CUDA_SUCCESS)
      break;
    if (!failed) {
      char message[200];
      snprintf(message, sizeof message,
               "cuThreadExchangeStreamCaptureMode failed on the reclaimer of device %d: %s",
               rc->device, dlsync__driver_error_name(drv, r));
      failed = true;
      note_blocked(batch, 1, r, message);
    }
    if (atomic_load(&rc->stopping)) {
      entered = false;
      break;
    }
    usleep(delay_us);
    delay_us = delay_us < 100000 ? delay_us * 2 : 100000;
  }
  if (failed)
    note_blocked(batch, -1, CUDA_SUCCESS, NULL);
  return entered;
}

/* Every driver table of the batch (one, but for tests that wrap it). */
static bool enter_relaxed_batch(reclaimer *rc, release_item *batch) {
  const dlsync__driver *done[4];
  unsigned ndone = 0;
  for (release_item *it = batch; it != NULL; it = it->next) {
    bool seen = false;
    for (unsigned i = 0; i < ndone; i++)
      seen = seen || done[i] == it->drv;
    if (seen)
      continue;
    if (!enter_relaxed(rc, it->drv, batch))
      return false;
    if (ndone < sizeof done / sizeof done[0])
      done[ndone++] = it->drv;
  }
  return true;
}

/* The events of the batch back to their pools, consecutive ones of a pool
 * under one lock. A pool keeps every event a release gives back, past its
 * limit: the releases that follow take them again at once (past the limit
 * each would create an event and each return destroy one, a churn that
 * slows both sides most when they are busiest). What a pool holds is thus
 * bounded by the most releases it ever had in flight, destroyed with its
 * context. */
static void return_events(release_item *batch, size_t *keep) {
  CUevent evs[64];
  size_t n = 0, total = 0;
  unsigned refs = 0; /* the items' pool references (a ring's slot holds none) */
  dlsync__pool *pool = NULL;
  for (release_item *it = batch; it != NULL; it = it->next)
    total += it->event != NULL;
  *keep += total;
  total = *keep;
  for (release_item *it = batch;; it = it->next) {
    bool flush = it == NULL || (it->event != NULL && (it->pool != pool || n == 64));
    if (flush && n > 0) {
      dlsync__pool_put_many(pool, evs, n, total);
      dlsync__pool_unref_n(pool, refs);
      n = 0;
      refs = 0;
    }
    if (it == NULL)
      break;
    if (it->event == NULL)
      continue;
    pool = it->pool;
    evs[n++] = it->event;
    refs += it->ring == NULL;
    it->event = NULL;
  }
}

/* The deleters of the batch, in queue order, each book told once per run of
 * its releases. `run` false: dropped (the library is unloaded), counted done.
 * A ring's slot is freed as its book is told (tally_commit); the references
 * a slot carries end after that, and its item goes back to the reclaimer's
 * spares. */
static void run_deleters(reclaimer *rc, release_item *batch, bool run) {
  book_tally t;
  t.book = NULL;
  t.ntails = 0;
  t.ring_since = 0;
  running_tally = &t;
  for (release_item *it = batch, *next; it != NULL; it = next) {
    next = it->next;
    if (run) {
      running = it;
      it->fn(it->arg);
      running = NULL;
    }
    if (it->ring == NULL) {
      tally_add(&t, it);
      dlsync__free(it);
      continue;
    }
    tally_add(&t, it);
    if (t.ring_since == TALLY_RING_RUN)
      tally_commit(&t); /* its ring's slots back before a long batch ends */
    if (it->drop_book != NULL || it->drop_pool != NULL) {
      tally_commit(&t); /* it may be of the book whose reference ends */
      if (it->drop_book != NULL)
        book_unref(it->drop_book);
      if (it->drop_pool != NULL)
        dlsync__pool_unref(it->drop_pool);
    }
    it->next = rc->spare;
    rc->spare = it;
  }
  running_tally = NULL;
  tally_commit(&t);
}

/* Unloading: the work done already is released; work still going is not
 * waited for (an exit must not hang on it), its deleter not run. One release
 * at a time, as it is rare. */
static void run_stopping(reclaimer *rc, release_item *batch) {
  for (release_item *it = batch, *next; it != NULL; it = next) {
    bool run;
    next = it->next;
    it->next = NULL;
    run = enter_relaxed(rc, it->drv, it);
    it->result = CUDA_SUCCESS;
    if (run && it->event != NULL) {
      CUresult r = it->drv->EventQuery != NULL ? it->drv->EventQuery(it->event)
                                               : it->drv->EventSynchronize(it->event);
      if (r == CUDA_ERROR_NOT_READY) {
        run = false;
        r = CUDA_SUCCESS;
        DLSYNC__LOG(DLSYNC__LOG_WARN,
                    "the library is unloaded while a release's work is still running on "
                    "device %d: its deleter does not run",
                    it->device);
      }
      it->result = r;
    }
    return_events(it, &rc->keep);
    run_deleters(rc, it, run);
  }
}

/* One stream's newest event in a batch, of those one thread recorded. */
typedef struct stream_slot {
  const struct release_ring *ring; /* a ring's releases are never grouped with the queue's */
  CUstream stream;
  unsigned long long stream_id; /* 0: unknown, the slot is a handle */
  const dlsync__driver *drv;
  pthread_t thread;
  release_item *newest;
} stream_slot;

#define BATCH_STREAMS 32

static bool slot_is(const stream_slot *s, const release_item *it) {
  return s->stream_id == it->stream_id && s->stream == it->stream && s->ring == it->ring &&
         s->drv == it->drv && pthread_equal(s->thread, it->thread);
}

/* A batch of releases, oldest first. Events recorded on one stream complete
 * in the order they were recorded (docs/design.md R32), so of each stream's
 * events the newest is synchronised first: once it is complete, so are the
 * earlier ones, and they cost no driver call. Newest by the queue's order,
 * which is the order of the records only among one thread's releases (two
 * threads releasing on one stream push in either order), so a slot is a
 * stream and a recording thread. A stream is its id (cuStreamGetId, taken
 * when the release was made), not its handle: the driver gives a destroyed
 * stream's handle to a new stream while the old one's work still runs
 * (R33), and the id tells the two apart. Where the id is unknown (a driver
 * without cuStreamGetId) the slot is a handle, and each earlier event of it
 * is asked (cuEventQuery, which does not wait) before its deleter runs and
 * synchronised on its own when it is not complete yet. The special handles
 * (the legacy and per-thread streams, which name a stream per context or per
 * thread) and the streams past BATCH_STREAMS are synchronised one event at a
 * time. When the newest event's synchronisation fails, each earlier one of
 * its stream is synchronised on its own, so that each release reports its
 * own result. Then the events go back to their pools and the deleters run,
 * in queue order. */
static void run_batch(reclaimer *rc, release_item *batch) {
  stream_slot slots[BATCH_STREAMS];
  unsigned nslots = 0;
  if (atomic_load(&rc->stopping)) {
    run_stopping(rc, batch);
    return;
  }
  if (!enter_relaxed_batch(rc, batch)) {
    for (release_item *it = batch; it != NULL; it = it->next)
      it->result = CUDA_SUCCESS;
    return_events(batch, &rc->keep);
    run_deleters(rc, batch, false);
    return;
  }
  for (release_item *it = batch; it != NULL; it = it->next) {
    unsigned i = 0;
    it->result = CUDA_SUCCESS;
    it->slot = -1;
    if (it->event == NULL || dlsync__is_special_stream(it->stream))
      continue;
    while (i < nslots && !slot_is(&slots[i], it))
      i++;
    if (i == nslots) {
      if (nslots == BATCH_STREAMS)
        continue;
      slots[nslots].ring = it->ring;
      slots[nslots].stream = it->stream;
      slots[nslots].stream_id = it->stream_id;
      slots[nslots].drv = it->drv;
      slots[nslots].thread = it->thread;
      nslots++;
    }
    slots[i].newest = it;
    it->slot = (int)i;
  }
  for (unsigned i = 0; i < nslots; i++)
    slots[i].newest->result = slots[i].drv->EventSynchronize(slots[i].newest->event);
  for (release_item *it = batch; it != NULL; it = it->next) {
    const stream_slot *s = it->slot >= 0 ? &slots[it->slot] : NULL;
    if (it->event == NULL || (s != NULL && s->newest == it))
      continue;
    if (s != NULL && s->newest->result == CUDA_SUCCESS) {
      if (s->stream_id != 0)
        continue; /* the newest of its stream is complete, so is it (R32) */
      if (it->drv->EventQuery != NULL) {
        /* Complete already, unless its handle named another stream (R33). */
        it->result = it->drv->EventQuery(it->event);
        if (it->result != CUDA_ERROR_NOT_READY)
          continue;
      }
    }
    it->result = it->drv->EventSynchronize(it->event);
  }
  return_events(batch, &rc->keep);
  run_deleters(rc, batch, true);
}

/* The janitor's work: no book, no event. */
static void run_janitor(release_item *batch) {
  for (release_item *it = batch, *next; it != NULL; it = next) {
    next = it->next;
    it->fn(it->arg);
    dlsync__free(it);
  }
}

/* The whole queue, oldest first. */
static release_item *take_all(reclaimer *r) {
  release_item *it = atomic_exchange_explicit(&r->pushed, NULL, memory_order_acquire);
  release_item *fifo = NULL;
  while (it != NULL) {
    release_item *next = it->next;
    it->next = fifo;
    fifo = it;
    it = next;
  }
  return fifo;
}

/* Set by the unload before it frees the rings: a thread that exits after
 * that no longer touches its rings (rings_thread_exit). */
static atomic_bool rings_gone;

/* A ring's memory and the references of its current run. */
static void ring_free(release_ring *g) {
  /* Left only when the library is unloaded: dropped, as the shared queue's. */
  release_item *left = atomic_exchange(&g->overflow, NULL);
  while (left != NULL || g->held != NULL) {
    release_item *it = left != NULL ? left : g->held;
    if (left != NULL)
      left = it->next;
    else
      g->held = it->next;
    dlsync__free(it);
  }
  if (g->book != NULL)
    book_unref(g->book);
  if (g->pool != NULL)
    dlsync__pool_unref(g->pool);
  dlsync__free(g->memory);
}

/* A reclaimer's item for a ring's slot: one of its spares, or a new one
 * (NULL: no memory; the slot waits for the next batch). */
static release_item *spare_item(reclaimer *r) {
  release_item *it = r->spare;
  if (it != NULL) {
    r->spare = it->next;
    return it;
  }
  return dlsync__malloc(sizeof *it);
}

/* An item of the reclaimer's for slot `pos` of ring g. NULL: no memory. */
static release_item *slot_item(reclaimer *r, release_ring *g, unsigned pos) {
  const ring_slot *sl = &g->slots[pos % RING_SLOTS];
  release_item *it = spare_item(r);
  if (it == NULL)
    return NULL;
  it->next = NULL;
  it->book = atomic_load_explicit(&sl->book, memory_order_relaxed);
  it->drv = sl->drv;
  it->pool = (dlsync__pool *)(sl->pool & ~RUN_STARTS);
  it->event = sl->event;
  it->stream = sl->stream;
  it->stream_id = sl->stream_id;
  it->thread = g->thread;
  it->fn = sl->fn;
  it->arg = sl->arg;
  it->device = g->device;
  it->slot = -1;
  it->result = CUDA_SUCCESS;
  it->from_graph = false;
  atomic_init(&it->armed, true);
  it->ring = g;
  it->ring_pos = pos;
  it->drop_book = (sl->pool & RUN_STARTS) ? g->drops[pos % RING_SLOTS].book : NULL;
  it->drop_pool = (sl->pool & RUN_STARTS) ? g->drops[pos % RING_SLOTS].pool : NULL;
  return it;
}

/* g's overflow, taken onto its held list (oldest first). */
static void take_overflow(release_ring *g) {
  release_item *it = atomic_exchange_explicit(&g->overflow, NULL, memory_order_acquire);
  release_item *fifo = NULL, **end = &g->held;
  while (*end != NULL)
    end = &(*end)->next;
  while (it != NULL) {
    release_item *next = it->next;
    it->next = fifo;
    fifo = it;
    it = next;
  }
  *end = fifo;
}

/* The queued releases of r's rings, in each ring's order (its slots, as r's
 * own items, merged with its overflow by their marks), ahead of `batch` (the
 * shared queue's); frees the rings whose thread has exited once they are
 * empty. The overflow is taken before the head is read, so each release
 * taken follows only slots up to that head; one that follows a slot not
 * collected (no memory for its item) is held for a later batch. */
static release_item *collect_rings(reclaimer *r, release_item *batch) {
  release_item *first = NULL, **link = &first;
  pthread_mutex_lock(&r->lock);
  for (release_ring **pg = &r->rings; *pg != NULL;) {
    release_ring *g = *pg;
    unsigned pos = atomic_load_explicit(&g->tail, memory_order_relaxed), head;
    take_overflow(g);
    head = atomic_load_explicit(&g->head, memory_order_acquire);
    if (pos == head && g->held == NULL &&
        atomic_load_explicit(&g->orphaned, memory_order_acquire) &&
        atomic_load_explicit(&g->head, memory_order_acquire) == pos &&
        atomic_load_explicit(&g->overflow, memory_order_acquire) == NULL) {
      /* Its thread's last release was made before the mark. */
      *pg = g->next;
      ring_free(g);
      continue;
    }
    for (;;) {
      release_item *it;
      if (g->held != NULL && pos - g->held->ring_pos < 0x80000000u) { /* mark <= pos */
        it = g->held; /* made while the ring was full at this position */
        g->held = it->next;
      } else if (pos != head && (it = slot_item(r, g, pos)) != NULL) {
        pos++;
      } else {
        break;
      }
      it->next = NULL;
      *link = it;
      link = &it->next;
    }
    pg = &g->next;
  }
  pthread_mutex_unlock(&r->lock);
  *link = batch;
  return first;
}

/* Whether a ring of r has a slot queued. Called with r->lock. */
static bool rings_queued_locked(const reclaimer *r) {
  for (const release_ring *g = r->rings; g != NULL; g = g->next)
    if (atomic_load(&g->head) != atomic_load_explicit(&g->tail, memory_order_relaxed) ||
        atomic_load(&g->overflow) != NULL || g->held != NULL)
      return true;
  return false;
}

static size_t rings_pending(const dlsync__release_book *b) {
  size_t n = 0;
  pthread_mutex_lock(&reclaimers_lock);
  for (int i = 0; i < nreclaimers; i++) {
    reclaimer *r = reclaimers[i];
    if (r == NULL)
      continue;
    pthread_mutex_lock(&r->lock);
    for (const release_ring *g = r->rings; g != NULL; g = g->next) {
      unsigned pos = atomic_load_explicit(&g->tail, memory_order_acquire);
      unsigned head = atomic_load_explicit(&g->head, memory_order_acquire);
      for (; pos != head; pos++)
        n += atomic_load_explicit(&g->slots[pos % RING_SLOTS].book, memory_order_relaxed) == b;
    }
    pthread_mutex_unlock(&r->lock);
  }
  pthread_mutex_unlock(&reclaimers_lock);
  return n;
}

/* Nothing queued: a nap (the releasing threads do not signal a napping
 * thread), and after NAPS of them a sleep that a push ends. */
static void idle(reclaimer *r, unsigned *naps) {
  if (*naps < NAPS) {
    (*naps)++;
    usleep(NAP_US);
    return;
  }
  pthread_mutex_lock(&r->lock);
  atomic_store(&r->sleeping, true);
  /* seq_cst on both sides: either a push sees `sleeping` or this sees it
   * (a ring's push: its head stored, then `sleeping` read, both seq_cst). */
  if (atomic_load(&r->pushed) == NULL && !rings_queued_locked(r) && !atomic_load(&r->stopping))
    pthread_cond_wait(&r->cond, &r->lock);
  atomic_store(&r->sleeping, false);
  pthread_mutex_unlock(&r->lock);
  *naps = 0;
}

static void *reclaimer_main(void *p) {
  reclaimer *r = p;
  char bus_id[32] = {0};
  CUdevice dev;
  unsigned naps = NAPS; /* asleep until the first push */
  on_reclaimer = true;
  if (r->drv != NULL && r->drv->DeviceGet(&dev, r->device) == CUDA_SUCCESS &&
      r->drv->DeviceGetPCIBusId(bus_id, (int)sizeof bus_id, dev) == CUDA_SUCCESS)
    (void)dlsync__hwloc_bind_near(bus_id); /* unbound where hwloc is absent */
  pthread_mutex_lock(&r->lock);
  r->started = true;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  for (;;) {
    release_item *batch = take_all(r);
    if (r->drv != NULL)
      batch = collect_rings(r, batch);
    if (batch == NULL) {
      if (atomic_load(&r->stopping)) {
        /* Pushed before the stop was asked for: seen now. */
        batch = take_all(r);
        if (r->drv != NULL)
          batch = collect_rings(r, batch);
        if (batch == NULL)
          break;
      } else {
        idle(r, &naps);
        continue;
      }
    }
    naps = 0;
    if (r->drv == NULL)
      run_janitor(batch);
    else
      run_batch(r, batch);
  }
  return NULL;
}

static void reclaimer_free(reclaimer *r) {
  while (r->rings != NULL) {
    release_ring *g = r->rings;
    r->rings = g->next;
    ring_free(g);
  }
  while (r->spare != NULL) {
    release_item *it = r->spare;
    r->spare = it->next;
    dlsync__free(it);
  }
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  dlsync__free(r);
}

static void threads_unload(void);

/* A new thread (drv NULL: the janitor). Called with reclaimers_lock. */
static dlsync_status reclaimer_start(reclaimer **out, const dlsync__driver *drv, int device) {
  reclaimer *r;
  *out = NULL;
  if (unloaded)
    return dlsync__fail(DLSYNC_ERROR_INTERNAL,
                        "starting a reclaimer while the library is being unloaded");
  r = dlsync__calloc(1, sizeof *r);
  if (r == NULL || pthread_mutex_init(&r->lock, NULL) != 0) {
    dlsync__free(r);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "starting a reclaimer: out of memory");
  }
  if (pthread_cond_init(&r->cond, NULL) != 0) {
    pthread_mutex_destroy(&r->lock);
    dlsync__free(r);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "starting a reclaimer: no condition variable");
  }
  dlsync__hooks_set(DLSYNC__HOOK_THREADS, NULL, threads_unload);
  r->drv = drv;
  r->device = device;
  atomic_init(&r->pushed, NULL);
  atomic_init(&r->sleeping, false);
  atomic_init(&r->stopping, false);
  /* Joinable: the unload joins it. */
  if (pthread_create(&r->thread, NULL, reclaimer_main, r) != 0) {
    reclaimer_free(r);
    if (drv == NULL)
      return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "starting dlsync's janitor thread");
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "starting the reclaimer thread of device %d",
                        device);
  }
  /* Its start may load libraries (hwloc's plugins: dlopen), which takes
   * the loader's lock: waited for here, so that an unload (a dlclose, which
   * holds that lock while it joins the thread) never finds it there. */
  pthread_mutex_lock(&r->lock);
  while (!r->started)
    pthread_cond_wait(&r->cond, &r->lock);
  pthread_mutex_unlock(&r->lock);
  *out = r;
  return DLSYNC_SUCCESS;
}

/* The reclaimer of a GPU, started on first use. */
static DLSYNC__NOINLINE dlsync_status reclaimer_for_slow(reclaimer **out, const dlsync__driver *drv,
                                                         int device) {
  dlsync_status st = DLSYNC_SUCCESS;
  pthread_mutex_lock(&reclaimers_lock);
  if (device < nreclaimers && reclaimers[device] != NULL) {
    *out = reclaimers[device];
    goto cleanup;
  }
  if (device >= nreclaimers) {
    reclaimer **grown = dlsync__realloc(reclaimers, (size_t)(device + 1) * sizeof *grown);
    if (grown == NULL) {
      st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "starting a reclaimer: out of memory");
      goto cleanup;
    }
    for (int i = nreclaimers; i <= device; i++)
      grown[i] = NULL;
    reclaimers = grown;
    nreclaimers = device + 1;
  }
  DLSYNC_TRY(reclaimer_start(&reclaimers[device], drv, device));
  *out = reclaimers[device];
  if (device < FAST_DEVICES)
    atomic_store_explicit(&fast_reclaimers[device], *out, memory_order_release);
cleanup:
  pthread_mutex_unlock(&reclaimers_lock);
  return st;
}

static inline dlsync_status reclaimer_for(reclaimer **out, const dlsync__driver *drv, int device) {
  if (DLSYNC__LIKELY(device >= 0 && device < FAST_DEVICES)) {
    *out = atomic_load_explicit(&fast_reclaimers[device], memory_order_acquire);
    if (DLSYNC__LIKELY(*out != NULL))
      return DLSYNC_SUCCESS;
  }
  return reclaimer_for_slow(out, drv, device);
}

/* The reclaimer of a GPU if it runs (NULL once the library is unloaded). */
static reclaimer *reclaimer_peek(int device) {
  reclaimer *r;
  if (device >= 0 && device < FAST_DEVICES)
    return atomic_load_explicit(&fast_reclaimers[device], memory_order_acquire);
  pthread_mutex_lock(&reclaimers_lock);
  r = device < nreclaimers ? reclaimers[device] : NULL;
  pthread_mutex_unlock(&reclaimers_lock);
  return r;
}

/* Asks r to stop and joins it; frees it. From r's own thread (a deleter
 * that unloads the library), only asks: that thread returns when the
 * deleter does, and frees nothing. */
static void reclaimer_stop(reclaimer *r) {
  pthread_mutex_lock(&r->lock);
  atomic_store(&r->stopping, true);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
  if (pthread_equal(r->thread, pthread_self())) {
    (void)pthread_detach(r->thread);
    return;
  }
  (void)pthread_join(r->thread, NULL);
  reclaimer_free(r);
}

/* This copy's threads, stopped and joined when it is unloaded (at exit, or
 * at the dlclose of a library embedding libdlsync.a): the first unload hook
 * (base/base.h). In a child of fork() they do not exist: nothing to do. */
static void threads_unload(void) {
  reclaimer **all;
  reclaimer *j;
  int n;
  if (DLSYNC__IN_FORKED_CHILD())
    return;
  /* No thread-exit hook may touch a ring once the threads are joined (and
   * their rings freed). */
  atomic_store(&rings_gone, true);
  pthread_mutex_lock(&reclaimers_lock);
  unloaded = true;
  all = reclaimers;
  n = nreclaimers;
  j = janitor;
  reclaimers = NULL;
  nreclaimers = 0;
  janitor = NULL;
  for (int i = 0; i < FAST_DEVICES; i++)
    atomic_store_explicit(&fast_reclaimers[i], NULL, memory_order_release);
  pthread_mutex_unlock(&reclaimers_lock);
  /* The reclaimers first: a deleter they run may hand the janitor work. */
  for (int i = 0; i < n; i++)
    if (all[i] != NULL)
      reclaimer_stop(all[i]);
  dlsync__free(all);
  if (j != NULL)
    reclaimer_stop(j);
}

static DLSYNC__NOINLINE void wake(reclaimer *r) {
  pthread_mutex_lock(&r->lock);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
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
    wake(r);
}

/* ---- the releasing thread's rings ---- */

/* Its thread exits: each of its rings is marked, for its reclaimer to free
 * once empty (woken, so that a sleeping one does not keep it). */
static void rings_thread_exit(dlsync__thread *t) {
  for (int i = 0; i < DLSYNC__THREAD_RINGS; i++) {
    release_ring *g = t->rings[i];
    reclaimer *owner;
    t->rings[i] = NULL;
    if (g == NULL || atomic_load(&rings_gone))
      continue;
    owner = g->owner; /* read first: once marked, the ring may be freed at once */
    atomic_store(&g->orphaned, true);
    if (atomic_load(&owner->sleeping))
      wake(owner);
  }
}

/* The calling thread's ring for r, made and registered; NULL when it cannot
 * be (no memory, no thread-exit hook, a device past DLSYNC__THREAD_RINGS). */
static DLSYNC__NOINLINE release_ring *ring_new(dlsync__thread *t, reclaimer *r) {
  release_ring *g;
  if (r->device < 0 || r->device >= DLSYNC__THREAD_RINGS)
    return NULL;
  dlsync__hooks_set(DLSYNC__HOOK_RINGS, rings_thread_exit, NULL);
  if (!dlsync__thread_exit_arm(t))
    return NULL;
  {
    unsigned char *raw = dlsync__calloc(1, sizeof *g + 64);
    if (raw == NULL)
      return NULL;
    g = (release_ring *)(void *)(raw + (64 - (uintptr_t)raw % 64) % 64);
    g->memory = raw;
  }
  atomic_init(&g->head, 0);
  atomic_init(&g->tail, 0);
  atomic_init(&g->overflow, NULL);
  atomic_init(&g->orphaned, false);
  for (unsigned i = 0; i < RING_SLOTS; i++)
    atomic_init(&g->slots[i].book, NULL);
  g->owner = r;
  g->thread = pthread_self();
  g->device = r->device;
  pthread_mutex_lock(&r->lock);
  g->next = r->rings;
  r->rings = g;
  pthread_mutex_unlock(&r->lock);
  t->rings[r->device] = g;
  return g;
}

/* The calling thread's (t's) ring for r, NULL when it has none there and cannot
 * make one. (A device has one reclaimer for the library's life, so a ring
 * of another reclaimer is never found.) */
static DLSYNC__INLINE release_ring *ring_of(reclaimer *r, dlsync__thread *t) {
  release_ring *g;
  if (DLSYNC__UNLIKELY(r->device < 0 || r->device >= DLSYNC__THREAD_RINGS))
    return NULL;
  g = t->rings[r->device];
  return DLSYNC__LIKELY(g != NULL) ? g : ring_new(t, r);
}

/* An eager release (its event recorded) into ring g of r: no allocation, no
 * atomic read-modify-write, one store that publishes the slot and a look at
 * `sleeping`. False when g is full: the caller puts it on g's overflow. */
static DLSYNC__INLINE bool ring_push(reclaimer *r, release_ring *g, dlsync_context *ctx,
                                     dlsync__pool *pool, CUevent ev, CUstream stream,
                                     unsigned long long sid, dlsync_deleter fn, void *arg) {
  ring_slot *sl;
  unsigned head = atomic_load_explicit(&g->head, memory_order_relaxed);
  if (DLSYNC__UNLIKELY(head - g->tail_seen >= RING_SLOTS)) {
    g->tail_seen = atomic_load_explicit(&g->tail, memory_order_acquire);
    if (head - g->tail_seen >= RING_SLOTS)
      return false;
  }
  sl = &g->slots[head % RING_SLOTS];
  sl->pool = (uintptr_t)pool;
  if (DLSYNC__UNLIKELY(g->book != ctx->releases || g->pool != pool)) {
    ring_drop *dr = &g->drops[head % RING_SLOTS];
    dr->book = NULL;
    dr->pool = NULL;
    if (g->book != ctx->releases) {
      book_ref(ctx->releases);
      dr->book = g->book;
      g->book = ctx->releases;
    }
    if (g->pool != pool) {
      dlsync__pool_ref(pool);
      dr->pool = g->pool;
      g->pool = pool;
    }
    sl->pool |= RUN_STARTS;
  }
  atomic_store_explicit(&sl->book, ctx->releases, memory_order_relaxed);
  sl->drv = ctx->drv;
  sl->event = ev;
  sl->stream = stream;
  sl->stream_id = sid;
  sl->fn = fn;
  sl->arg = arg;
  /* seq_cst store and load, against idle(): see there. */
  atomic_store(&g->head, head + 1);
  if (DLSYNC__UNLIKELY(atomic_load(&r->sleeping)))
    wake(r);
  return true;
}

/* ---- the janitor ---- */

bool dlsync__defer(void (*fn)(void *), void *arg) {
  release_item *it;
  bool queued = false;
  if (DLSYNC__IN_FORKED_CHILD())
    return false;
  it = dlsync__calloc(1, sizeof *it);
  if (it == NULL)
    return false;
  it->fn = fn;
  it->arg = arg;
  /* Queued under reclaimers_lock, so that the unload, which takes the
   * janitor under it, joins a thread that has seen the item. */
  pthread_mutex_lock(&reclaimers_lock);
  if (janitor == NULL && !unloaded)
    (void)reclaimer_start(&janitor, NULL, -1); /* on failure: the caller does it */
  if (janitor != NULL) {
    enqueue(janitor, it);
    queued = true;
  }
  pthread_mutex_unlock(&reclaimers_lock);
  if (!queued)
    dlsync__free(it);
  return queued;
}

static atomic_flag collect_queued = ATOMIC_FLAG_INIT;

static void collect_job(void *arg) {
  (void)arg;
  atomic_flag_clear(&collect_queued);
  dlsync__orphans_collect();
}

void dlsync__release_orphans_wake(void) {
  if (atomic_flag_test_and_set(&collect_queued))
    return; /* a collection is queued and has not started yet: it takes this one too */
  if (!dlsync__defer(collect_job, NULL))
    atomic_flag_clear(&collect_queued); /* the next collection takes it */
}

/* The user-object destructor of a release owned by graphs. The reclaimer was
 * started when the release was made, so finding it takes no allocation. */
static void release_from_graph(void *p) {
  release_item *it = p;
  reclaimer *r;
  if (!atomic_load(&it->armed)) {
    /* The hand-over to the graph failed: the release never happened. */
    book_cancel(it->book, true);
    dlsync__free(it);
    return;
  }
  r = reclaimer_peek(it->device);
  if (r == NULL) {
    /* The library was unloaded (its threads joined) while a graph still
     * owned the release: not run, which would be on a driver thread. */
    DLSYNC__LOG(DLSYNC__LOG_WARN, "a release owned by a graph was let go after the library was "
                                  "unloaded; its deleter does not run");
    book_cancel(it->book, true);
    dlsync__free(it);
    return;
  }
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

/* Queues an eager release whose event `ev` (of `pool`) is recorded on
 * `stream`: into the calling thread's (t's) ring for the pool's GPU; an item
 * (an allocation, a pool reference, two book counts and a compare-and-swap)
 * on the ring's overflow when it is full, or on the shared queue where the
 * thread has no ring. */
static DLSYNC__INLINE dlsync_status queue_eager(dlsync__thread *t, dlsync_context *ctx,
                                                dlsync__pool *pool, CUevent ev, CUstream stream,
                                                unsigned long long sid, dlsync_deleter deleter,
                                                void *arg) {
  dlsync_status st = DLSYNC_SUCCESS;
  reclaimer *r = NULL;
  release_ring *g;
  release_item *it;
  DLSYNC_TRY(reclaimer_for(&r, ctx->drv, dlsync__pool_device(pool)));
  g = ring_of(r, t);
  if (DLSYNC__LIKELY(g != NULL) &&
      DLSYNC__LIKELY(ring_push(r, g, ctx, pool, ev, stream, sid, deleter, arg)))
    return DLSYNC_SUCCESS;
  it = item_new(ctx, deleter, arg, dlsync__pool_device(pool), false);
  if (DLSYNC__UNLIKELY(it == NULL))
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_release: out of memory");
  it->pool = pool;
  it->event = ev;
  it->stream = stream;
  it->stream_id = sid;
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
    wake(r);
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
  DLSYNC_TRY(queue_eager(t, ctx, pool, ev, l->stream, sid, deleter, arg));
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
    DLSYNC_TRY(queue_eager(dlsync__thread_get(), ctx, pool, ev, l->stream, sid, deleter, arg));
    return DLSYNC_SUCCESS;
  }
  DLSYNC_TRY(reclaimer_for(&r, d, dlsync__pool_device(pool)));
  it = item_new(ctx, deleter, arg, dlsync__pool_device(pool), true);
  if (it == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_release: out of memory");
    goto cleanup;
  }
  book_add_graph(it->book);
  st = dlsync__graph_hold(ctx->drv, &l->graph, 1, release_from_graph, it, &taken);
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
    book_cancel(it->book, true);
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
  if (on_reclaimer)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_release_flush called from a deleter: it would wait for itself");
  return book_flush(ctx->releases);
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
  out->pending_eager = book_pending_eager(b);
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
