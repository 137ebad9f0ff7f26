/* SPDX-License-Identifier: Apache-2.0 */
/* The reclaimer threads (one per GPU, for the whole process) and the
 * janitor: their queues, their batches, their start and the unload that
 * joins them (release_int.h says how they are fed). */
#include <stdio.h>
#include <unistd.h>

#include "driver/hwloc.h"

#include "order/release_int.h"

#define NAP_US 50u
#define NAPS 40u
/* A batch smaller than this is followed by a nap before the next is taken:
 * while releases trickle in, the thread gathers them for NAP_US instead of
 * taking each few as they come, so that its driver calls (a capture-mode
 * exchange and a synchronisation a batch) and its touches of the rings and
 * the pools the releasing threads use come once per batch, not once per few
 * releases. A deleter runs at most NAP_US later for it. */
#define BATCH_GATHER 64u

_Thread_local bool dlsync__on_reclaimer;
_Thread_local const release_item *dlsync__running;
_Thread_local const book_tally *dlsync__running_tally;

static pthread_mutex_t reclaimers_lock = PTHREAD_MUTEX_INITIALIZER;
static reclaimer **reclaimers;
static int nreclaimers;
static reclaimer *janitor;
static bool unloaded; /* under reclaimers_lock: no thread is started again */
_Atomic(reclaimer *) dlsync__fast_reclaimers[FAST_DEVICES]; /* release_int.h */

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
      dlsync__book_note_failure_locked(it->book, (int)r, message);
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
 * A ring's slot is freed as its book is told (dlsync__tally_commit); the references
 * a slot carries end after that, and its item goes back to the reclaimer's
 * spares. */
static void run_deleters(reclaimer *rc, release_item *batch, bool run) {
  book_tally t;
  t.book = NULL;
  t.ntails = 0;
  t.ring_since = 0;
  dlsync__running_tally = &t;
  for (release_item *it = batch, *next; it != NULL; it = next) {
    next = it->next;
    if (run) {
      dlsync__running = it;
      it->fn(it->arg);
      dlsync__running = NULL;
    }
    if (it->ring == NULL) {
      dlsync__tally_add(&t, it);
      dlsync__free(it);
      continue;
    }
    dlsync__tally_add(&t, it);
    if (t.ring_since == TALLY_RING_RUN)
      dlsync__tally_commit(&t); /* its ring's slots back before a long batch ends */
    if (it->drop_book != NULL || it->drop_pool != NULL) {
      dlsync__tally_commit(&t); /* it may be of the book whose reference ends */
      if (it->drop_book != NULL)
        dlsync__book_unref(it->drop_book);
      if (it->drop_pool != NULL)
        dlsync__pool_unref(it->drop_pool);
    }
    it->next = rc->spare;
    rc->spare = it;
  }
  dlsync__running_tally = NULL;
  dlsync__tally_commit(&t);
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
  release_item *it = NULL, *fifo = NULL;
  /* Read first: an exchange would write the line at each round. */
  if (atomic_load_explicit(&r->pushed, memory_order_relaxed) != NULL)
    it = atomic_exchange_explicit(&r->pushed, NULL, memory_order_acquire);
  while (it != NULL) {
    release_item *next = it->next;
    it->next = fifo;
    fifo = it;
    it = next;
  }
  return fifo;
}

size_t dlsync__rings_pending(const dlsync__release_book *b) {
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
  /* A full fence on both sides, so that either a push sees `sleeping` or
   * this sees the push: the shared queue's push is a compare-and-swap
   * (seq_cst), a ring's push stores its head then reads `sleeping`, seq_cst
   * or, on a light ring (made once membarrier was registered), a release
   * store whose fence is the membarrier made here, on the pushing thread's
   * CPU. Should the membarrier fail, the thread does not sleep: it naps. */
  if (r->rings != NULL && dlsync__fence_heavy_ready() && !dlsync__fence_heavy()) {
    atomic_store(&r->sleeping, false);
    pthread_mutex_unlock(&r->lock);
    usleep(NAP_US);
    return;
  }
  if (atomic_load(&r->pushed) == NULL && !dlsync__rings_queued_locked(r) &&
      !atomic_load(&r->stopping))
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
  dlsync__on_reclaimer = true;
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
      batch = dlsync__rings_collect(r, batch);
    if (batch == NULL) {
      if (atomic_load(&r->stopping)) {
        /* Pushed before the stop was asked for: seen now. */
        batch = take_all(r);
        if (r->drv != NULL)
          batch = dlsync__rings_collect(r, batch);
        if (batch == NULL)
          break;
      } else {
        idle(r, &naps);
        continue;
      }
    }
    naps = 0;
    {
      unsigned n = 0;
      for (const release_item *it = batch; it != NULL && n < BATCH_GATHER; it = it->next)
        n++;
      if (r->drv == NULL)
        run_janitor(batch);
      else
        run_batch(r, batch);
      if (n < BATCH_GATHER && !atomic_load(&r->stopping))
        usleep(NAP_US);
    }
  }
  return NULL;
}

static void reclaimer_free(reclaimer *r) {
  while (r->rings != NULL) {
    release_ring *g = r->rings;
    r->rings = g->next;
    dlsync__ring_free(g);
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
    return dlsync__fail(DLSYNC_ERROR_UNLOADING,
                        "dlsync_release: dlsync is being unloaded (another thread is in exit(), "
                        "or the library embedding dlsync is being closed) and its reclaimer "
                        "threads are stopped: the release is refused, its deleter will not run");
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
DLSYNC__NOINLINE dlsync_status dlsync__reclaimer_for_slow(reclaimer **out,
                                                          const dlsync__driver *drv, int device) {
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
    atomic_store_explicit(&dlsync__fast_reclaimers[device], *out, memory_order_release);
cleanup:
  pthread_mutex_unlock(&reclaimers_lock);
  return st;
}

/* The reclaimer of a GPU if it runs (NULL once the library is unloaded). */
reclaimer *dlsync__reclaimer_peek(int device) {
  reclaimer *r;
  if (device >= 0 && device < FAST_DEVICES)
    return atomic_load_explicit(&dlsync__fast_reclaimers[device], memory_order_acquire);
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
  atomic_store(&dlsync__rings_gone, true);
  pthread_mutex_lock(&reclaimers_lock);
  unloaded = true;
  all = reclaimers;
  n = nreclaimers;
  j = janitor;
  reclaimers = NULL;
  nreclaimers = 0;
  janitor = NULL;
  for (int i = 0; i < FAST_DEVICES; i++)
    atomic_store_explicit(&dlsync__fast_reclaimers[i], NULL, memory_order_release);
  pthread_mutex_unlock(&reclaimers_lock);
  /* The reclaimers first: a deleter they run may hand the janitor work. */
  for (int i = 0; i < n; i++)
    if (all[i] != NULL)
      reclaimer_stop(all[i]);
  dlsync__free(all);
  if (j != NULL)
    reclaimer_stop(j);
}

DLSYNC__NOINLINE void dlsync__reclaimer_wake(reclaimer *r) {
  pthread_mutex_lock(&r->lock);
  pthread_cond_signal(&r->cond);
  pthread_mutex_unlock(&r->lock);
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
