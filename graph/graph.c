/* SPDX-License-Identifier: Apache-2.0 */
/* Nodes dlsync appends to graphs, and events owned by graphs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "graph/body.h"
#include "graph/graph.h"

/* What a user object owns: the caller's destructor and pointer, run once.
 * When cuUserObjectRelease fails on an error path (so no graph, and no
 * reference of ours, will ever let the object go), the destructor is run
 * here instead; the box then stays on a list, never freed, in case the driver
 * still calls it (it then does nothing). */
typedef struct hold_box {
  void (*destroy)(void *);
  void *ptr;
  atomic_flag ran;
  struct hold_box *next;
} hold_box;

static pthread_mutex_t abandoned_lock = PTHREAD_MUTEX_INITIALIZER;
static hold_box *abandoned;

static void box_run(void *p) {
  hold_box *b = p;
  if (atomic_flag_test_and_set(&b->ran))
    return; /* run already, by graph_hold: the box is on the abandoned list */
  b->destroy(b->ptr);
  dlsync__free(b);
}

/* The box of a user object that nothing will ever let go (its release
 * refused, no graph holding it): its destructor run now, once; the box kept
 * on the abandoned list, never freed, in case the driver calls it after all
 * (box_run then does nothing). */
static void box_abandon(hold_box *box) {
  if (atomic_flag_test_and_set(&box->ran))
    return;
  pthread_mutex_lock(&abandoned_lock);
  box->next = abandoned;
  abandoned = box;
  pthread_mutex_unlock(&abandoned_lock);
  box->destroy(box->ptr);
}

/* Gives the filled box (destroy, ptr) to the graphs: one user object that
 * each of them holds. *taken: the box (and ptr) are the user object's from
 * now on, whatever the status; false: both are still the caller's. */
static dlsync_status hold_give(const dlsync__driver *d, CUgraph *graphs, int ngraphs, hold_box *box,
                               bool *taken) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUuserObject uo = NULL;
  unsigned held = 0; /* references still held by this function */
  *taken = false;
  atomic_flag_clear(&box->ran);
  box->next = NULL;
  DLSYNC_CU(d, UserObjectCreate,
            (&uo, box, box_run, (unsigned)ngraphs, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
            "making an object owned by graph %p", (void *)graphs[0]);
  /* From here the destructor owns the box: it runs once the references
   * below are all gone, whatever happens next. */
  *taken = true;
  held = (unsigned)ngraphs;
  for (int i = 0; i < ngraphs; i++) {
    DLSYNC_CU(d, GraphRetainUserObject, (graphs[i], uo, 1, CU_GRAPH_USER_OBJECT_MOVE),
              "giving an object to graph %p", (void *)graphs[i]);
    held--;
  }
cleanup:
  if (held > 0) {
    /* Graphs that took a reference keep the object until they are
     * destroyed; dropping ours runs the destructor (on a driver thread) if
     * none did. */
    bool none_took = held == (unsigned)ngraphs;
    bool released = d->UserObjectRelease(uo, held) == CUDA_SUCCESS;
    if (!released && none_took) {
      box_abandon(box); /* nothing will ever drop the object */
    } else if (!released) {
      /* graphs[0] took the object: it takes our references too (moved, no
       * release needed), so that destroying it drops them all and runs the
       * destructor. Only if that fails as well does the object live until
       * the driver frees it with its context. */
      (void)d->GraphRetainUserObject(graphs[0], uo, held, CU_GRAPH_USER_OBJECT_MOVE);
    }
  }
  return st;
}

dlsync_status dlsync__graph_hold(const dlsync__driver *d, CUgraph *graphs, int ngraphs,
                                 dlsync__graph_object obj, bool *taken) {
  dlsync_status st;
  hold_box *box = dlsync__malloc(sizeof *box);
  *taken = false;
  if (box == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an object to graph %p: out of memory",
                        (void *)graphs[0]);
  box->destroy = obj.destroy;
  box->ptr = obj.ptr;
  st = hold_give(d, graphs, ngraphs, box, taken);
  if (!*taken)
    dlsync__free(box);
  return st;
}

static void held_event_destroy(void *p) {
  dlsync__held_event_unref(p);
}

dlsync_status dlsync__graph_hold_event(const dlsync__driver *d, dlsync__held_event *he,
                                       CUgraph *graphs, int ngraphs) {
  dlsync_status st;
  bool taken = false;
  dlsync__held_event_ref(he);
  st = dlsync__graph_hold(d, graphs, ngraphs, (dlsync__graph_object){held_event_destroy, he},
                          &taken);
  if (!taken)
    dlsync__held_event_unref(he);
  return st;
}

/* ---- one hold per capture (and thread) ----
 *
 * Every event dlsync puts into a capture must live as long as the captured
 * graph. Instead of a user object per event (two driver calls each time), a
 * capture gets a hold of the event's pool (event/pool.c): a list of events
 * that its graph owns through one user object (two calls, once per capture),
 * given back all at once when the graph and its executables are gone. Later
 * events cost no driver call and one section under the pool's lock, or, for
 * EAGER_TO_CAPTURE, one per batch (the thread's reserve, graph.h).
 *
 * Each thread remembers the holds it made for its last captures (capture id,
 * pool and the context generation the pool belongs to), in its block: no
 * lock to find one. A capture that several threads order into gets a hold
 * per thread. Capture ids are unique for the life of the process, and a
 * capture's graph cannot be destroyed while the capture records, so a
 * remembered hold is the capture's own; the pool checks it anyway, under its
 * lock (the hold's life; a reserved event after one load of it), so that a
 * graph destroyed by another thread while this one orders into its capture
 * costs a new hold, not a stale one. */
typedef dlsync__hold_memo hold_memo;
/* What a caller keeps of a memo (the memo itself may be replaced by the next
 * hold_make): the hold, its life and its capture. */
typedef struct hold_ref {
  dlsync__hold *hold;
  uint64_t life;
  uint64_t capture_id;
} hold_ref;
typedef dlsync__graph_thread graph_thread;
#define HOLD_MEMOS DLSYNC__HOLD_MEMOS

static void hold_destroy(void *p) {
  dlsync__hold_release(p);
}

/* A new hold for lane's capture, owned by its graph and remembered by the
 * thread (*out: what the new memo names). */
static DLSYNC__NOINLINE dlsync_status hold_make(hold_ref *out, graph_thread *gt,
                                                const dlsync__pools *ps, dlsync__pool *pool,
                                                const dlsync__lane_now *lane) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__hold *h = NULL;
  uint64_t life = 0;
  bool taken = false;
  CUgraph graph = lane->graph;
  hold_memo *m;
  DLSYNC_TRY(dlsync__hold_new(&h, &life, pool));
  st = dlsync__graph_hold(ps->drv, &graph, 1, (dlsync__graph_object){hold_destroy, h}, &taken);
  if (!taken)
    dlsync__hold_release(h); /* empty: nothing to give back */
  /* taken with an error: the graph did not take it, and its destructor gave
   * it back already. */
  if (st != DLSYNC_SUCCESS)
    goto cleanup;
  gt->keys[gt->next % HOLD_MEMOS] = lane->capture_id;
  m = &gt->memo[gt->next++ % HOLD_MEMOS];
  m->generation = ps->generation;
  m->pool = pool;
  m->capture_id = lane->capture_id;
  m->hold = h;
  m->life = life;
  m->nreserve = 0;
  m->taken = 0;
  out->hold = h;
  out->life = life;
  out->capture_id = lane->capture_id;
cleanup:
  return st;
}

/* The thread's hold for lane's capture (what its memo names), made if none. */
static dlsync_status hold_for(hold_ref *out, graph_thread *gt, const dlsync__pools *ps,
                              dlsync__pool *pool, const dlsync__lane_now *lane) {
  const hold_memo *m = dlsync__hold_find(gt, ps->generation, pool, lane->capture_id);
  if (m != NULL) {
    out->hold = m->hold;
    out->life = m->life;
    out->capture_id = m->capture_id;
    return DLSYNC_SUCCESS;
  }
  return hold_make(out, gt, ps, pool, lane);
}

static void hold_forget(graph_thread *gt, const hold_ref *m) {
  for (unsigned i = 0; i < HOLD_MEMOS; i++)
    if (gt->memo[i].hold == m->hold && gt->memo[i].life == m->life) {
      gt->keys[i] = 0;
      gt->memo[i].capture_id = 0;
      gt->memo[i].nreserve = 0;
    }
}

/* One capture's event, taken into its hold with as many more as the thread
 * has taken for it so far (at most DLSYNC__HOLD_RESERVE in all, under one
 * lock): the first for now, the rest kept in the thread's memo of it, next
 * one last (*out NULL: the hold was not live). */
static dlsync_status hold_take_reserve(CUevent *out, graph_thread *gt, dlsync__pool *pool,
                                       const hold_ref *m) {
  CUevent got[DLSYNC__HOLD_RESERVE];
  hold_memo *mine = NULL;
  size_t n = 0, want = 1;
  dlsync_status st;
  *out = NULL;
  for (unsigned i = 0; i < HOLD_MEMOS && mine == NULL; i++)
    if (gt->memo[i].hold == m->hold && gt->memo[i].life == m->life &&
        gt->memo[i].capture_id == m->capture_id)
      mine = &gt->memo[i];
  if (mine != NULL && mine->taken > 1)
    want = mine->taken < DLSYNC__HOLD_RESERVE ? mine->taken : DLSYNC__HOLD_RESERVE;
  st = dlsync__hold_take_some(got, want, &n, pool, (dlsync__hold_life){m->hold, m->life});
  if (st != DLSYNC_SUCCESS || n == 0)
    return st;
  *out = got[0];
  if (mine != NULL) {
    for (size_t j = 0; j + 1 < n; j++)
      mine->reserve[j] = got[n - 1 - j];
    mine->nreserve = (unsigned)(n - 1);
    mine->taken =
        mine->taken + n < DLSYNC__HOLD_RESERVE ? mine->taken + (unsigned)n : DLSYNC__HOLD_RESERVE;
  }
  return DLSYNC_SUCCESS;
}

static DLSYNC__COLD dlsync_status hold_lost(const dlsync__lane_now *lane) {
  return dlsync__fail(DLSYNC_ERROR_CAPTURE_ORDER,
                      "the %s lane's capture %llu (graph %p) gave back dlsync's events while "
                      "it was capturing: was its graph destroyed by another thread?",
                      lane->role, (unsigned long long)lane->capture_id, (void *)lane->graph);
}

dlsync_status dlsync__graph_capture_event_slow(CUevent *out, dlsync__thread *t,
                                               const dlsync__pools *ps, dlsync__pool *pool,
                                               dlsync__lane_pair ab) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__lane_now *a = ab.a, *b = ab.b;
  graph_thread *gt = dlsync__graph_thread_of(t);
  for (int tries = 0; tries < 2; tries++) {
    hold_ref ma, mb = {NULL, 0, 0};
    DLSYNC_TRY(hold_for(&ma, gt, ps, pool, a));
    if (b != NULL) {
      DLSYNC_TRY(hold_for(&mb, gt, ps, pool, b));
      DLSYNC_TRY(dlsync__hold_take(out, pool, (dlsync__hold_life){ma.hold, ma.life},
                                   (dlsync__hold_life){mb.hold, mb.life}));
    } else {
      DLSYNC_TRY(hold_take_reserve(out, gt, pool, &ma));
    }
    if (*out != NULL)
      return DLSYNC_SUCCESS;
    hold_forget(gt, &ma); /* not live: made again next time round */
    if (b != NULL)
      hold_forget(gt, &mb);
  }
  st = hold_lost(a);
cleanup:
  return st;
}

/* ---- the events of built graphs: one batch per thread and pool ----
 * (graph.h says what a batch is.) */
typedef dlsync__built_memo built_memo;

/* The threads whose exit hook is set (only they keep a batch open past the
 * order that opened it), so that context destroy closes every thread's
 * batches of its pools, not only its own. The lock also guards what another
 * thread may do to a memo: a memo's pool and generation are written only
 * under it (its owner reads them without it, and the sweep never writes
 * them), and its batch is closed under it by its owner only when the memo
 * goes to another pool or the thread exits. A memo's batch is otherwise its
 * owner's alone: the sweep closes only the memos of a context being
 * destroyed, which no other use of that context may race with. */
static pthread_mutex_t built_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static graph_thread *built_registry;

static void registry_add(graph_thread *gt) { /* with built_registry_lock */
  gt->registry_prev = NULL;
  gt->registry_next = built_registry;
  if (built_registry != NULL)
    built_registry->registry_prev = gt;
  built_registry = gt;
}

static void registry_remove(graph_thread *gt) { /* with built_registry_lock */
  if (gt->registry_prev != NULL)
    gt->registry_prev->registry_next = gt->registry_next;
  else if (built_registry == gt)
    built_registry = gt->registry_next;
  if (gt->registry_next != NULL)
    gt->registry_next->registry_prev = gt->registry_prev;
  gt->registry_next = gt->registry_prev = NULL;
}

/* Drops the thread's reference to m's batch (its events come back once the
 * graphs that retained it are gone) and empties m. When the driver refuses
 * (the result returned), a batch no graph took is given back by hand (its
 * destructor run once, box_abandon); otherwise the reference is moved into
 * `into` (d's), a graph that took the batch in this call, when there is one,
 * so that destroying that graph lets the batch go; else the batch stays with
 * the driver until its CUDA context goes. */
static CUresult built_close(built_memo *m, const dlsync__driver *d, CUgraph into) {
  CUresult r = CUDA_SUCCESS;
  if (m->uo != NULL) {
    r = m->release(m->uo, 1);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      if (!m->retained)
        box_abandon(m->box);
      else if (into != NULL)
        (void)d->GraphRetainUserObject(into, m->uo, 1, CU_GRAPH_USER_OBJECT_MOVE);
    }
  }
  m->uo = NULL;
  m->box = NULL;
  m->retained = false;
  m->nreserve = 0;
  m->capture_id = 0;
  return r;
}

static void built_close_warn(built_memo *m, const char *when) {
  bool retained = m->retained; /* built_close empties m */
  if (built_close(m, NULL, NULL) != CUDA_SUCCESS)
    DLSYNC__LOG(DLSYNC__LOG_WARN,
                "%s: cuUserObjectRelease refused a thread's batch of events for built graphs; %s",
                when,
                retained ? "they stay with the driver until their CUDA context is destroyed"
                         : "no graph had taken it, so its events were given back to the pool");
}

/* The thread-exit hook (base/base.h): its batches let go. */
static void built_thread_exit(dlsync__thread *t) {
  graph_thread *gt = dlsync__graph_thread_of(t);
  if (!gt->built_keyed)
    return;
  pthread_mutex_lock(&built_registry_lock);
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++) {
    built_close_warn(&gt->built[i], "a thread's exit");
    gt->built[i].pool = NULL;
  }
  registry_remove(gt);
  gt->built_keyed = false;
  pthread_mutex_unlock(&built_registry_lock);
}

/* The thread's memo of pool (of the context whose pools ps are): found, or
 * made in the slot used least recently (closing the batch it had). */
_Static_assert(DLSYNC__BUILT_MEMOS == 2,
               "built_memo_for: the memo used least recently of two is the one not used last");

static DLSYNC__INLINE built_memo *built_memo_for(graph_thread *gt, const dlsync__pools *ps,
                                                 const dlsync__pool *pool) {
  built_memo *m;
  unsigned pick = (gt->built_last + 1) % DLSYNC__BUILT_MEMOS;
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++) {
    m = &gt->built[i];
    if (m->pool == pool && m->generation == ps->generation) {
      gt->built_last = i;
      return m;
    }
  }
  /* A memo goes to another pool under the registry's lock: a context
   * destroy on another thread may be closing it. */
  pthread_mutex_lock(&built_registry_lock);
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++)
    if (gt->built[i].pool == NULL) { /* a free one first */
      pick = i;
      break;
    }
  gt->built_last = pick;
  m = &gt->built[pick];
  built_close_warn(m, "a thread's order into another context's graphs");
  m->pool = pool;
  m->generation = ps->generation;
  m->release = ps->drv->UserObjectRelease;
  m->taken = 0;
  pthread_mutex_unlock(&built_registry_lock);
  return m;
}

static DLSYNC__COLD dlsync_status built_out_of_memory(void) {
  return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                      "giving events to a graph built by hand: out of memory");
}

/* A new batch for m: a hold of as many events as the thread has taken so
 * far (at least one, at most DLSYNC__BUILT_BATCH; only one while the
 * thread-exit hook that would close it is not set), and the user object that
 * holds it, the thread's reference kept. */
static DLSYNC__NOINLINE dlsync_status built_open(built_memo *m, graph_thread *gt,
                                                 const dlsync__pools *ps, dlsync__pool *pool) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ps->drv;
  CUevent got[DLSYNC__BUILT_BATCH];
  size_t n = 0, want = 1;
  dlsync__hold *h = NULL;
  uint64_t life = 0;
  CUuserObject uo = NULL;
  CUresult r;
  hold_box *box = dlsync__malloc(sizeof *box);
  if (box == NULL)
    return built_out_of_memory();
  if (!gt->built_keyed) {
    dlsync__hooks_set(DLSYNC__HOOK_GRAPH, built_thread_exit, NULL);
    gt->built_keyed = dlsync__thread_exit_arm(dlsync__thread_get());
    if (gt->built_keyed) {
      pthread_mutex_lock(&built_registry_lock);
      registry_add(gt);
      pthread_mutex_unlock(&built_registry_lock);
    }
  }
  if (gt->built_keyed && m->taken > 1)
    want = m->taken < DLSYNC__BUILT_BATCH ? m->taken : DLSYNC__BUILT_BATCH;
  DLSYNC_TRY(dlsync__hold_new(&h, &life, pool));
  DLSYNC_TRY(dlsync__hold_take_some(got, want, &n, pool,
                                    (dlsync__hold_life){h, life})); /* a new hold: never stale */
  box->destroy = hold_destroy;
  box->ptr = h;
  box->next = NULL;
  atomic_flag_clear(&box->ran);
  r = d->UserObjectCreate(&uo, box, box_run, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
    st = dlsync__fail_driver(d, r, "cuUserObjectCreate",
                             "making the object that gives dlsync's events to built graphs");
    goto cleanup;
  }
  m->uo = uo;
  m->box = box;
  m->retained = false;
  box = NULL; /* the user object's: its destructor gives the hold back */
  h = NULL;
  for (size_t j = 0; j < n; j++)
    m->reserve[j] = got[n - 1 - j];
  m->nreserve = (unsigned)n;
  m->size = (unsigned)n;
  m->taken = m->taken + n < DLSYNC__BUILT_BATCH ? m->taken + (unsigned)n : DLSYNC__BUILT_BATCH;
cleanup:
  if (h != NULL)
    dlsync__hold_release(h); /* its events back to the pool */
  dlsync__free(box);
  return st;
}

dlsync_status dlsync__graph_built_retain_failed(const dlsync__driver *d, CUresult r,
                                                const dlsync__lane_now *l) {
  return dlsync__fail_driver(
      d, r, "cuGraphRetainUserObject", "giving dlsync's event to the %s lane's graph %p%s", l->role,
      (void *)l->graph, l->kind == DLSYNC_LANE_CAPTURING ? " (its capture's)" : "");
}

static DLSYNC__COLD dlsync_status built_release_failed(const dlsync__driver *d, CUresult r) {
  return dlsync__fail_driver(d, r, "cuUserObjectRelease",
                             "letting go of a used batch of events for built graphs (nothing "
                             "was queued)");
}

dlsync_status dlsync__graph_built_event_slow(CUevent *out, dlsync__thread *t,
                                             const dlsync__pools *ps, dlsync__pool *pool,
                                             dlsync__lane_list ls) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d = ps->drv;
  graph_thread *gt = dlsync__graph_thread_of(t);
  built_memo *m = built_memo_for(gt, ps, pool);
  CUgraph took = NULL; /* a graph that retained the batch in this call */
  CUevent ev;
  *out = NULL;
  if (DLSYNC__UNLIKELY(m->nreserve == 0))
    DLSYNC_TRY(built_open(m, gt, ps, pool));
  ev = m->reserve[--m->nreserve];
  {
    CUresult r = CUDA_SUCCESS;
    const dlsync__lane_now *refused = dlsync__graph_built_retain(d, m, ls, &took, &r);
    if (DLSYNC__UNLIKELY(refused != NULL)) {
      st = dlsync__graph_built_retain_failed(d, r, refused);
      goto cleanup;
    }
  }
  *out = ev;
cleanup:
  /* The batch's last event taken: the thread lets go of it now, so that its
   * events come back as soon as their graphs are gone. */
  if (m->nreserve == 0 && m->uo != NULL) {
    bool stays = m->retained && took == NULL; /* if refused: nowhere to move it */
    CUresult r = built_close(m, d, took);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      if (st == DLSYNC_SUCCESS) {
        st = built_release_failed(d, r);
        *out = NULL;
      } else { /* the first failure is the one returned; this one is logged */
        DLSYNC__LOG(DLSYNC__LOG_WARN,
                    "cuUserObjectRelease refused a used batch of events for built graphs (after "
                    "an earlier failure of the same order)%s",
                    stays ? "; it stays with the driver" : "");
      }
    }
  }
  return st;
}

/* Closes gt's memos of ps (with built_registry_lock). Another thread's
 * memo keeps its pool and generation (its owner may be reading them, to
 * find another memo); that generation is never matched again. */
static void built_close_of(graph_thread *gt, const dlsync__pools *ps, bool own) {
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++) {
    built_memo *m = &gt->built[i];
    if (m->pool == NULL || m->generation != ps->generation)
      continue;
    built_close_warn(m,
                     own ? "context destroy" : "context destroy, closing another thread's batch");
    if (own)
      m->pool = NULL;
  }
}

void dlsync__graph_built_close(const dlsync__pools *ps) {
  graph_thread *self = dlsync__graph_thread_of(dlsync__thread_get());
  pthread_mutex_lock(&built_registry_lock);
  built_close_of(self, ps, true); /* registered or not */
  for (graph_thread *gt = built_registry; gt != NULL; gt = gt->registry_next)
    if (gt != self)
      built_close_of(gt, ps, false);
  pthread_mutex_unlock(&built_registry_lock);
}

size_t dlsync__graph_built_held(const dlsync__pools *ps) {
  const graph_thread *gt = dlsync__graph_thread_of(dlsync__thread_get());
  size_t n = 0;
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++) {
    const built_memo *m = &gt->built[i];
    if (m->pool != NULL && m->generation == ps->generation && m->uo != NULL)
      n += m->size;
  }
  return n;
}

size_t dlsync__graph_built_unused(const dlsync__pools *ps) {
  const graph_thread *gt = dlsync__graph_thread_of(dlsync__thread_get());
  size_t n = 0;
  for (unsigned i = 0; i < DLSYNC__BUILT_MEMOS; i++) {
    const built_memo *m = &gt->built[i];
    if (m->pool != NULL && m->generation == ps->generation && m->uo != NULL)
      n += m->nreserve;
  }
  return n;
}

dlsync_status dlsync__graph_event_node_failed(const dlsync__driver *d, CUresult r,
                                              const dlsync__lane_now *l, const CUgraphNode *deps,
                                              bool record) {
  CUgraph graph = l->graph;
  size_t ndeps = l->ndeps;
  const char *role = l->role;
  dlsync_status st =
      dlsync__fail_driver(d, r, record ? "cuGraphAddEventRecordNode" : "cuGraphAddEventWaitNode",
                          "%s lane, graph %p, after %zu node(s)", role, (void *)graph, ndeps);
  if (r == CUDA_ERROR_INVALID_VALUE && ndeps > 0) {
    size_t count = 0;
    CUgraphNode *nodes = NULL;
    bool foreign = false;
    if (d->GraphGetNodes(graph, NULL, &count) == CUDA_SUCCESS && count == 0) {
      foreign = true; /* an empty graph holds none of them */
    } else if (count >= dlsync__max_count(sizeof *nodes) ||
               (nodes = dlsync__calloc(count + 1, sizeof *nodes)) == NULL) {
      st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                        "the %s lane's event node was refused (CUDA_ERROR_INVALID_VALUE, graph "
                        "%p): out of memory checking whether its dependencies are nodes of that "
                        "graph",
                        role, (void *)graph);
    } else if (d->GraphGetNodes(graph, nodes, &count) == CUDA_SUCCESS) {
      for (size_t i = 0; i < ndeps && !foreign; i++) {
        bool found = false;
        for (size_t j = 0; j < count && !found; j++)
          found = nodes[j] == deps[i];
        foreign = !found;
      }
    }
    dlsync__free(nodes);
    if (foreign)
      st = dlsync__fail(DLSYNC_ERROR_FOREIGN_DEPENDENCY,
                        "the %s graph lane's dependencies include a node that is not in its "
                        "graph %p; a graph lane's deps must be nodes of that graph",
                        role, (void *)graph);
  }
  return st;
}

dlsync_status dlsync__graph_capture_set_failed(const dlsync__driver *d, CUresult r,
                                               const dlsync__lane_now *l) {
  return dlsync__fail_driver(d, r, "cuStreamUpdateCaptureDependencies",
                             "%s stream %p: putting the event node at the end of its capture",
                             l->role, (void *)l->stream);
}

dlsync_status dlsync__graph_append_event_node(const dlsync__driver *d, dlsync__lane_now *l,
                                              CUevent event, bool record, CUgraphNode *out) {
  dlsync_status st = dlsync__graph_append_event(d, l, event, record);
  if (st == DLSYNC_SUCCESS && out != NULL)
    *out = l->kind == DLSYNC_LANE_CAPTURING ? l->dep_buf[0] : l->lane->deps[0];
  return st;
}

dlsync_status dlsync__graph_lane_add_dep(dlsync__lane_now *l, CUgraphNode node) {
  dlsync_lane *lane = l->lane;
  dlsync_status st;
  for (size_t i = 0; i < lane->ndeps; i++)
    if (lane->deps[i] == node)
      return DLSYNC_SUCCESS;
  st = dlsync__lane_fit(lane, lane->ndeps + 1, l->role, "its nodes and one more");
  if (st != DLSYNC_SUCCESS)
    return st;
  lane->deps[lane->ndeps++] = node;
  l->deps = (const CUgraphNode *)lane->deps;
  l->ndeps = lane->ndeps;
  return DLSYNC_SUCCESS;
}

/* ---- a library's own graph on a lane (include/dlsync/graph.h) ---- */

/* Why cuGraphAddChildGraphNode refused `child`: the node types a child may
 * not hold, named, when the child has them; else the driver's word. */
static DLSYNC__COLD dlsync_status child_refused(const dlsync__driver *d, CUresult r, CUgraph child,
                                                CUgraph into, const char *role) {
  CUgraphNode nodes[256];
  size_t n = 256;
  int cond = 0, alloc = 0, freed = 0;
  if (r == CUDA_ERROR_INVALID_VALUE && d->GraphGetNodes(child, nodes, &n) == CUDA_SUCCESS) {
    for (size_t i = 0; i < n && i < 256; i++) {
      CUgraphNodeType t;
      if (d->GraphNodeGetType(nodes[i], &t) != CUDA_SUCCESS)
        continue;
      cond += t == CU_GRAPH_NODE_TYPE_CONDITIONAL;
      alloc += t == CU_GRAPH_NODE_TYPE_MEM_ALLOC;
      freed += t == CU_GRAPH_NODE_TYPE_MEM_FREE;
    }
    if (cond + alloc + freed > 0)
      return dlsync__fail_driver_as(
          DLSYNC_ERROR_INVALID_ARGUMENT, &(dlsync__driver_call){d, r, "cuGraphAddChildGraphNode"},
          "graph %p cannot run as a child graph in the %s lane's graph %p: it holds %d "
          "conditional, %d memory-allocation and %d memory-free node(s), which CUDA does not "
          "admit in a child graph; nothing was added. Launch its executable on an eager stream "
          "instead, or build the graph without them",
          (void *)child, role, (void *)into, cond, alloc, freed);
  }
  return dlsync__fail_driver(d, r, "cuGraphAddChildGraphNode",
                             "graph %p as a child node in the %s lane's graph %p (a destroyed or "
                             "not-a-graph handle, or a graph of another context?)",
                             (void *)child, role, (void *)into);
}

/* Event-record and event-wait nodes in g and, at any depth, in the graphs
 * of its child-graph nodes, added to *events (a body admits none of them,
 * nested or not: rule R28 of the fake); the driver's refusal (a destroyed or
 * not-a-graph handle, say) reported, the call named. */
#define EVENT_SCAN_DEPTH 32
static DLSYNC__COLD dlsync_status event_nodes_in(const dlsync__driver *d, CUgraph g, CUgraph into,
                                                 int depth, int *events) {
  CUgraphNode inline_nodes[64], *nodes = inline_nodes;
  size_t n = 0;
  dlsync_status st = DLSYNC_SUCCESS;
  CUresult r;
  if (depth > EVENT_SCAN_DEPTH)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_graph_launch: graph %p nests child graphs deeper than %d; dlsync "
                        "reads no deeper for event nodes before launching into the conditional "
                        "node's body %p; nothing was added",
                        (void *)g, EVENT_SCAN_DEPTH, (void *)into);
  r = d->GraphGetNodes(g, NULL, &n);
  if (r == CUDA_SUCCESS && n > 64) {
    size_t bytes = 0;
    nodes = dlsync__mul_size(n, sizeof *nodes, &bytes) ? dlsync__malloc(bytes) : NULL;
    if (nodes == NULL)
      return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                          "dlsync_graph_launch: reading the %zu nodes of graph %p before "
                          "launching it into the conditional node's body %p: out of memory; "
                          "nothing was added",
                          n, (void *)g, (void *)into);
  }
  if (r == CUDA_SUCCESS && n > 0)
    r = d->GraphGetNodes(g, nodes, &n);
  if (r != CUDA_SUCCESS) {
    st = dlsync__fail_driver(d, r, "cuGraphGetNodes",
                             "reading graph %p's nodes before launching it into the conditional "
                             "node's body %p (a destroyed or not-a-graph handle?); nothing was "
                             "added",
                             (void *)g, (void *)into);
    goto done;
  }
  for (size_t i = 0; i < n && st == DLSYNC_SUCCESS; i++) {
    CUgraphNodeType t;
    CUgraph child = NULL;
    r = d->GraphNodeGetType(nodes[i], &t);
    if (r != CUDA_SUCCESS) {
      st = dlsync__fail_driver(d, r, "cuGraphNodeGetType",
                               "reading graph %p's node %p before launching it into the "
                               "conditional node's body %p; nothing was added",
                               (void *)g, (void *)nodes[i], (void *)into);
      break;
    }
    *events += t == CU_GRAPH_NODE_TYPE_EVENT_RECORD || t == CU_GRAPH_NODE_TYPE_WAIT_EVENT;
    if (t != CU_GRAPH_NODE_TYPE_GRAPH)
      continue;
    if (d->GraphChildGraphNodeGetGraph == NULL) {
      st = dlsync__driver_require_entry(d, DLSYNC__DRIVER_INDEX_GraphChildGraphNodeGetGraph,
                                        "dlsync_graph_launch");
      break;
    }
    r = d->GraphChildGraphNodeGetGraph(nodes[i], &child);
    if (r != CUDA_SUCCESS) {
      st = dlsync__fail_driver(d, r, "cuGraphChildGraphNodeGetGraph",
                               "reading graph %p's child-graph node %p before launching it into "
                               "the conditional node's body %p; nothing was added",
                               (void *)g, (void *)nodes[i], (void *)into);
      break;
    }
    st = event_nodes_in(d, child, into, depth + 1, events);
  }
done:
  if (nodes != inline_nodes)
    dlsync__free(nodes);
  return st;
}

dlsync_status dlsync__graph_launch_at(const dlsync__driver *d, const dlsync__bodies *bodies,
                                      CUgraph graph, CUgraphExec exec, dlsync_lane *lane) {
  dlsync_status st = DLSYNC_SUCCESS;
  dlsync__lane_now l;
  CUgraphNode node = NULL;
  CUresult r;
  DLSYNC_TRY(dlsync__lane_check(lane, "launching"));
  if (lane->kind == DLSYNC_LANE_GRAPH)
    DLSYNC_TRY(dlsync__lane_fit(lane, 1, "launching", "the child-graph node"));
  DLSYNC_TRY(dlsync__lane_read(&l, d, lane, "launching"));
  if (l.kind == DLSYNC_LANE_EAGER) {
    if (exec == NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "dlsync_graph_launch: stream %p is eager and exec is NULL: an eager "
                          "launch needs the graph's executable (cuGraphInstantiate)",
                          (void *)l.stream);
    if (d->GraphLaunch == NULL)
      return dlsync__driver_require_entry(d, DLSYNC__DRIVER_INDEX_GraphLaunch,
                                          "dlsync_graph_launch");
    DLSYNC_CU(d, GraphLaunch, (exec, l.stream), "executable %p (of graph %p) on eager stream %p",
              (void *)exec, (void *)graph, (void *)l.stream);
    goto cleanup;
  }
  if (graph == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_graph_launch: the lane is %s and graph is NULL: a child-graph node "
                        "needs the graph itself",
                        l.kind == DLSYNC_LANE_CAPTURING ? "a capturing stream" : "a graph lane");
  if (graph == l.graph)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_graph_launch: graph %p is the launching lane's own graph (%s): a "
                        "graph cannot hold itself as a child graph; nothing was added",
                        (void *)graph,
                        l.kind == DLSYNC_LANE_CAPTURING ? "the graph its stream captures into"
                                                        : "a graph lane on it");
  if (d->GraphAddChildGraphNode == NULL)
    return dlsync__driver_require_entry(d, DLSYNC__DRIVER_INDEX_GraphAddChildGraphNode,
                                        "dlsync_graph_launch");
  if (dlsync__bodies_any(bodies)) {
    dlsync__body_where where = dlsync__bodies_find(bodies, l.graph);
    int events = 0;
    /* A child's nodes must be admitted in a body too. */
    if (where != DLSYNC__BODY_NOT)
      DLSYNC_TRY(event_nodes_in(d, graph, l.graph, 0, &events));
    if (events != 0)
      return dlsync__fail(DLSYNC_ERROR_CONDITIONAL_BODY,
                          "dlsync_graph_launch: the launching lane's graph %p is a conditional "
                          "node's body (dlsync_conditional_body_add%s) and graph %p holds %d "
                          "event-record or event-wait node(s), which CUDA does not admit in a body "
                          "(the parent graph would fail to instantiate). Nothing was added; "
                          "launch the graph before the conditional node instead",
                          (void *)l.graph,
                          where == DLSYNC__BODY_ELSEWHERE ? " in another dlsync context" : "",
                          (void *)graph, events);
  }
  r = d->GraphAddChildGraphNode(&node, l.graph, dlsync__lane_deps(&l), l.ndeps, graph);
  if (r != CUDA_SUCCESS)
    return child_refused(d, r, graph, l.graph, "launching");
  if (l.kind == DLSYNC_LANE_CAPTURING) {
    r = d->StreamUpdateCaptureDependencies(l.stream, &node, NULL, 1,
                                           CU_STREAM_SET_CAPTURE_DEPENDENCIES);
    if (r != CUDA_SUCCESS)
      return dlsync__graph_capture_set_failed(d, r, &l);
  } else {
    lane->deps[0] = node;
    lane->ndeps = 1;
  }
cleanup:
  return st;
}
