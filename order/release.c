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
  pthread_mutex_t lock;
  pthread_cond_t cond;
  size_t pending_eager;
  size_t pending_graph;
  size_t done;
  size_t sync_failures;        /* events whose synchronisation failed (deleter ran anyway) */
  size_t mode_failures;        /* releases whose reclaimer could not enter RELAXED mode */
  size_t blocked;              /* eager releases waiting now for RELAXED mode */
  dlsync_status first_failure; /* since the last flush; DLSYNC_SUCCESS when none */
  int first_result;            /* its CUresult, for dlsync_last_driver_result */
  char first_message[256];
};

typedef struct release_item {
  struct release_item *next;
  dlsync__release_book *book;
  const dlsync__driver *drv;
  dlsync__pool *pool; /* eager: the event's pool (a reference is held) */
  CUevent event;      /* eager: recorded after the work */
  dlsync_deleter fn;
  void *arg;
  int device;
  bool from_graph;
  atomic_bool armed; /* graph: handed over; until then the destructor only frees */
} release_item;

/* ---- books ---- */

static void book_unref(dlsync__release_book *b) {
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1)
    return;
  pthread_cond_destroy(&b->cond);
  pthread_mutex_destroy(&b->lock);
  dlsync__free(b);
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
  *out = b;
  return DLSYNC_SUCCESS;
}

static void book_add(dlsync__release_book *b, bool from_graph) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  pthread_mutex_lock(&b->lock);
  if (from_graph)
    b->pending_graph++;
  else
    b->pending_eager++;
  pthread_mutex_unlock(&b->lock);
}

/* A release that will not happen after all (it failed before being queued). */
static void book_cancel(dlsync__release_book *b, bool from_graph) {
  pthread_mutex_lock(&b->lock);
  if (from_graph)
    b->pending_graph--;
  else
    b->pending_eager--;
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

static void book_done(dlsync__release_book *b, bool from_graph, int sync_result,
                      const char *message) {
  bool sync_failed = sync_result != CUDA_SUCCESS;
  pthread_mutex_lock(&b->lock);
  if (from_graph)
    b->pending_graph--;
  else
    b->pending_eager--;
  b->done++;
  if (sync_failed) {
    b->sync_failures++;
    book_note_failure_locked(b, sync_result, message);
  }
  pthread_cond_broadcast(&b->cond);
  pthread_mutex_unlock(&b->lock);
  book_unref(b);
}

static _Thread_local bool on_reclaimer;

/* Waits until every eager release has run or is blocked (its reclaimer
 * cannot enter RELAXED mode), then returns the first failure since the last
 * flush (and forgets it). */
static dlsync_status book_flush(dlsync__release_book *b) {
  dlsync_status st;
  int result;
  char message[sizeof b->first_message];
  size_t blocked;
  pthread_mutex_lock(&b->lock);
  while (b->pending_eager > b->blocked)
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

/* The release (item) the calling reclaimer is running now, NULL elsewhere. */
static _Thread_local const release_item *running;

dlsync_status dlsync__release_book_close(dlsync__release_book *b, dlsync__release_left *left) {
  dlsync__release_left l = {0, 0, 0, on_reclaimer};
  if (b != NULL) {
    pthread_mutex_lock(&b->lock);
    if (on_reclaimer) {
      /* From a deleter: a release queued behind the one running would wait
       * for itself, so the eager ones are not waited for; they still run
       * (the book is reference-counted). The one running, if it is of this
       * book, is not counted: it is done once its deleter returns. */
      bool own = running != NULL && running->book == b;
      l.queued = b->pending_eager - (own && !running->from_graph ? 1 : 0);
      l.graph_owned = b->pending_graph - (own && running->from_graph ? 1 : 0);
    } else {
      while (b->pending_eager > b->blocked)
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
 * Each thread is joined when this copy of the library is unloaded (its
 * destructor, below): at exit, or at the dlclose of a shared library that
 * embeds libdlsync.a, whose code the threads run. Stopping is a handshake
 * without timeout: the thread runs what is queued (a deleter running
 * finishes), then returns, and the unload joins it. */

typedef struct reclaimer {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  release_item *head, *tail;
  pthread_t thread;
  const dlsync__driver *drv; /* NULL: the janitor */
  int device;
  atomic_bool stopping; /* the unload asked it to return once its queue is empty */
  bool started;         /* under lock: past its start (see reclaimer_start) */
} reclaimer;

static pthread_mutex_t reclaimers_lock = PTHREAD_MUTEX_INITIALIZER;
static reclaimer **reclaimers;
static int nreclaimers;
static reclaimer *janitor;
static bool unloaded; /* under reclaimers_lock: no thread is started again */

/* RELAXED each time, for graph-owned releases too (their deleters may call
 * CUDA): nothing this thread does may break a capture. When the driver
 * refuses, the thread's mode is unknown, and cuEventSynchronize (or any
 * query) in GLOBAL mode would invalidate another thread's GLOBAL capture: the
 * item stays here, the failure is counted and reported (flush returns it),
 * and entering RELAXED mode is tried again, from 1 ms to 100 ms apart. The
 * deleter runs once that succeeds. Returns false when the library is being
 * unloaded meanwhile: the item is then dropped (its deleter not run, as it
 * could run before the work). */
static bool enter_relaxed(reclaimer *rc, release_item *it) {
  bool failed = false, entered = true;
  unsigned delay_us = 1000;
  for (;;) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUresult r = it->drv->ThreadExchangeStreamCaptureMode(&mode);
    if (r == CUDA_SUCCESS)
      break;
    if (!failed) {
      char message[200];
      snprintf(message, sizeof message,
               "cuThreadExchangeStreamCaptureMode failed on the reclaimer of device %d: %s",
               it->device, dlsync__driver_error_name(it->drv, r));
      failed = true;
      pthread_mutex_lock(&it->book->lock);
      it->book->mode_failures++;
      it->book->blocked += it->from_graph ? 0 : 1;
      book_note_failure_locked(it->book, (int)r, message);
      pthread_cond_broadcast(&it->book->cond);
      pthread_mutex_unlock(&it->book->lock);
    }
    if (atomic_load(&rc->stopping)) {
      entered = false;
      break;
    }
    usleep(delay_us);
    delay_us = delay_us < 100000 ? delay_us * 2 : 100000;
  }
  if (failed) {
    pthread_mutex_lock(&it->book->lock);
    it->book->blocked -= it->from_graph ? 0 : 1;
    pthread_mutex_unlock(&it->book->lock);
  }
  return entered;
}

static void run_item(reclaimer *rc, release_item *it) {
  CUresult sync_result = CUDA_SUCCESS;
  char message[200] = {0};
  bool run;
  if (it->book == NULL) { /* the janitor's work */
    it->fn(it->arg);
    dlsync__free(it);
    return;
  }
  run = enter_relaxed(rc, it);
  if (it->event != NULL) {
    CUresult r = CUDA_SUCCESS;
    if (run && atomic_load(&rc->stopping) && it->drv->EventQuery != NULL) {
      /* Unloading: the work done already is released; work still going is
       * not waited for (an exit must not hang on it), its deleter not run. */
      r = it->drv->EventQuery(it->event);
      if (r == CUDA_ERROR_NOT_READY) {
        run = false;
        r = CUDA_SUCCESS;
        DLSYNC__LOG(DLSYNC__LOG_WARN,
                    "the library is unloaded while a release's work is still running on "
                    "device %d: its deleter does not run",
                    it->device);
      }
    } else if (run) {
      r = it->drv->EventSynchronize(it->event);
    }
    if (r != CUDA_SUCCESS) {
      /* The deleter runs anyway (the stream will not get better by waiting);
       * the failure is counted and returned by the next flush. */
      sync_result = r;
      snprintf(message, sizeof message,
               "cuEventSynchronize failed on the reclaimer of device %d: %s (the deleter ran "
               "anyway)",
               it->device, dlsync__driver_error_name(it->drv, r));
    }
    dlsync__pool_put(it->pool, it->event);
    dlsync__pool_unref(it->pool);
  }
  if (run) {
    running = it;
    it->fn(it->arg);
    running = NULL;
  }
  book_done(it->book, it->from_graph, (int)sync_result, message);
  dlsync__free(it);
}

static void *reclaimer_main(void *p) {
  reclaimer *r = p;
  char bus_id[32] = {0};
  CUdevice dev;
  on_reclaimer = true;
  if (r->drv != NULL && r->drv->DeviceGet(&dev, r->device) == CUDA_SUCCESS &&
      r->drv->DeviceGetPCIBusId(bus_id, (int)sizeof bus_id, dev) == CUDA_SUCCESS)
    (void)dlsync__hwloc_bind_near(bus_id); /* unbound where hwloc is absent */
  pthread_mutex_lock(&r->lock);
  r->started = true;
  pthread_cond_broadcast(&r->cond);
  pthread_mutex_unlock(&r->lock);
  for (;;) {
    release_item *it;
    pthread_mutex_lock(&r->lock);
    while (r->head == NULL && !atomic_load(&r->stopping))
      pthread_cond_wait(&r->cond, &r->lock);
    it = r->head;
    if (it == NULL) { /* stopping, and nothing left */
      pthread_mutex_unlock(&r->lock);
      break;
    }
    r->head = it->next;
    if (r->head == NULL)
      r->tail = NULL;
    pthread_mutex_unlock(&r->lock);
    run_item(r, it);
  }
  return NULL;
}

static void reclaimer_free(reclaimer *r) {
  pthread_cond_destroy(&r->cond);
  pthread_mutex_destroy(&r->lock);
  dlsync__free(r);
}

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
  r->drv = drv;
  r->device = device;
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
static dlsync_status reclaimer_for(reclaimer **out, const dlsync__driver *drv, int device) {
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
cleanup:
  pthread_mutex_unlock(&reclaimers_lock);
  return st;
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

#if defined(__GNUC__)
/* This copy's threads, stopped and joined when it is unloaded (at exit, or
 * at the dlclose of a library embedding libdlsync.a). In a child of fork()
 * they do not exist: nothing to do. */
__attribute__((destructor)) static void reclaimers_unload(void) {
  reclaimer **all;
  reclaimer *j;
  int n;
  if (DLSYNC__IN_FORKED_CHILD())
    return;
  pthread_mutex_lock(&reclaimers_lock);
  unloaded = true;
  all = reclaimers;
  n = nreclaimers;
  j = janitor;
  reclaimers = NULL;
  nreclaimers = 0;
  janitor = NULL;
  pthread_mutex_unlock(&reclaimers_lock);
  /* The reclaimers first: a deleter they run may hand the janitor work. */
  for (int i = 0; i < n; i++)
    if (all[i] != NULL)
      reclaimer_stop(all[i]);
  dlsync__free(all);
  if (j != NULL)
    reclaimer_stop(j);
}
#endif

/* No CUDA call: also used from user-object destructors (driver threads). */
static void enqueue(reclaimer *r, release_item *it) {
  it->next = NULL;
  pthread_mutex_lock(&r->lock);
  if (r->tail != NULL)
    r->tail->next = it;
  else
    r->head = it;
  r->tail = it;
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
  pthread_mutex_lock(&reclaimers_lock);
  r = it->device < nreclaimers ? reclaimers[it->device] : NULL;
  pthread_mutex_unlock(&reclaimers_lock);
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

dlsync_status dlsync_release(dlsync_context *ctx, dlsync_lane *lane, dlsync_deleter deleter,
                             void *arg) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_release");
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d;
  dlsync__lane_now l;
  dlsync__lanes_opened opened;
  dlsync__pool *pool = NULL;
  reclaimer *r = NULL;
  release_item *it = NULL;
  bool booked = false;
  memset(&l, 0, sizeof l);
  if (ctx == NULL || deleter == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_release: %s is NULL",
                        ctx == NULL ? "ctx" : "deleter");
  d = ctx->drv;
  DLSYNC_TRY(dlsync__lane_check(lane, "releasing"));
  /* For a graph lane, the current context's device says which GPU's
   * reclaimer runs it. */
  opened.read = false;
  DLSYNC_TRY(dlsync__lanes_open(&opened, ctx, lane, NULL, &release_ask));
  l = opened.a;
  pool = opened.pool;
  DLSYNC_TRY(reclaimer_for(&r, d, dlsync__pool_device(pool)));
  it = dlsync__calloc(1, sizeof *it);
  if (it == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "dlsync_release: out of memory");
    goto cleanup;
  }
  it->book = ctx->releases;
  it->drv = d;
  it->fn = deleter;
  it->arg = arg;
  it->device = dlsync__pool_device(pool);
  it->from_graph = l.kind != DLSYNC_LANE_EAGER;
  atomic_init(&it->armed, false);
  book_add(it->book, it->from_graph);
  booked = true;
  if (l.kind == DLSYNC_LANE_EAGER) {
    DLSYNC_TRY(dlsync__pool_get(&it->event, pool));
    DLSYNC_CU(d, EventRecord, (it->event, l.stream), "releasing on stream %p", (void *)l.stream);
    it->pool = pool;
    dlsync__pool_ref(pool);
    enqueue(r, it);
    it = NULL;
  } else {
    bool taken = false;
    st = dlsync__graph_hold(ctx->drv, &l.graph, 1, release_from_graph, it, &taken);
    if (taken) {
      /* From here the destructor owns the item (and its book entry). On
       * failure no graph holds it and the destructor has run or will run
       * unarmed: we must not touch it. */
      booked = false;
      if (st == DLSYNC_SUCCESS)
        atomic_store(&it->armed, true);
      it = NULL;
    }
    if (st != DLSYNC_SUCCESS)
      goto cleanup;
  }
cleanup:
  if (DLSYNC__UNLIKELY(dlsync__log_on(DLSYNC__LOG_TRACE)))
    trace_release(ctx, &l, st);
  if (it != NULL) {
    if (it->event != NULL && it->pool == NULL)
      dlsync__pool_put(pool, it->event);
    if (booked)
      book_cancel(it->book, it->from_graph);
    dlsync__free(it);
  }
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
  out->pending_eager = b->pending_eager;
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
