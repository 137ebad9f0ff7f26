/* SPDX-License-Identifier: Apache-2.0 */
/* Nodes dlsync appends to graphs, and events owned by graphs. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dlsync/private/graph.h"

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
  DLSYNC_CU(
      d, cuUserObjectCreate,
      d->UserObjectCreate(&uo, box, box_run, (unsigned)ngraphs, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC),
      "making an object owned by graph %p", (void *)graphs[0]);
  /* From here the destructor owns the box: it runs once the references
   * below are all gone, whatever happens next. */
  *taken = true;
  held = (unsigned)ngraphs;
  for (int i = 0; i < ngraphs; i++) {
    DLSYNC_CU(d, cuGraphRetainUserObject,
              d->GraphRetainUserObject(graphs[i], uo, 1, CU_GRAPH_USER_OBJECT_MOVE),
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
      /* Nothing will ever drop the object: run its destructor now, once. */
      if (!atomic_flag_test_and_set(&box->ran)) {
        pthread_mutex_lock(&abandoned_lock);
        box->next = abandoned;
        abandoned = box;
        pthread_mutex_unlock(&abandoned_lock);
        box->destroy(box->ptr);
      }
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
                                 void (*destroy)(void *), void *ptr, bool *taken) {
  dlsync_status st;
  hold_box *box = dlsync__malloc(sizeof *box);
  *taken = false;
  if (box == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an object to graph %p: out of memory",
                        (void *)graphs[0]);
  box->destroy = destroy;
  box->ptr = ptr;
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
  st = dlsync__graph_hold(d, graphs, ngraphs, held_event_destroy, he, &taken);
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
  st = dlsync__graph_hold(ps->drv, &graph, 1, hold_destroy, h, &taken);
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
  st = dlsync__hold_take_some(got, want, &n, pool, m->hold, m->life);
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
                                               const dlsync__lane_now *a,
                                               const dlsync__lane_now *b) {
  dlsync_status st = DLSYNC_SUCCESS;
  graph_thread *gt = dlsync__graph_thread_of(t);
  for (int tries = 0; tries < 2; tries++) {
    hold_ref ma, mb = {NULL, 0, 0};
    DLSYNC_TRY(hold_for(&ma, gt, ps, pool, a));
    if (b != NULL) {
      DLSYNC_TRY(hold_for(&mb, gt, ps, pool, b));
      DLSYNC_TRY(dlsync__hold_take(out, pool, ma.hold, ma.life, mb.hold, mb.life));
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

/* Lane's capture holds a reference to `he` (an event of `pool`). */
static dlsync_status capture_add_held(const dlsync__pools *ps, dlsync__pool *pool,
                                      const dlsync__lane_now *lane, dlsync__held_event *he) {
  dlsync_status st = DLSYNC_SUCCESS;
  graph_thread *gt = dlsync__graph_thread_of(dlsync__thread_get());
  for (int tries = 0; tries < 2; tries++) {
    hold_ref m;
    bool stale = false;
    DLSYNC_TRY(hold_for(&m, gt, ps, pool, lane));
    DLSYNC_TRY(dlsync__hold_add_held(m.hold, m.life, he, &stale));
    if (!stale)
      return DLSYNC_SUCCESS;
    hold_forget(gt, &m);
  }
  st = hold_lost(lane);
cleanup:
  return st;
}

/* An event that built graphs alone hold: its count lives in the user
 * object's box, one allocation for both (the box is freed with it). */
typedef struct event_box {
  hold_box box; /* first: box_run frees the whole */
  dlsync__held_event he;
} event_box;

static dlsync_status own_event_built(const dlsync__driver *d, dlsync__pool *pool, CUevent event,
                                     CUgraph *graphs, int ngraphs) {
  dlsync_status st;
  bool taken = false;
  event_box *eb = dlsync__malloc(sizeof *eb);
  if (eb == NULL) {
    dlsync__pool_put(pool, event);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to a graph: out of memory");
  }
  dlsync__held_event_init(&eb->he, pool, event);
  eb->box.destroy = held_event_destroy;
  eb->box.ptr = &eb->he;
  st = hold_give(d, graphs, ngraphs, &eb->box, &taken);
  if (!taken) {
    dlsync__held_event_unref(&eb->he); /* the event back to its pool */
    dlsync__free(eb);
  }
  return st;
}

dlsync_status dlsync__graph_own_event_lanes(const dlsync__pools *ps, dlsync__pool *pool,
                                            CUevent event, dlsync__lane_now *const *lanes,
                                            int nlanes) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUgraph built[2];
  int nbuilt = 0;
  bool ours = true;
  dlsync__held_event *he;
  if (nlanes > 2)
    nlanes = 2;
  if (lanes[0]->kind == DLSYNC_LANE_BUILT && (nlanes < 2 || lanes[1]->kind == DLSYNC_LANE_BUILT)) {
    for (int i = 0; i < nlanes; i++)
      built[i] = lanes[i]->graph;
    return own_event_built(ps->drv, pool, event, built, nlanes);
  }
  he = dlsync__held_event_new(pool, event);
  if (he == NULL) {
    dlsync__pool_put(pool, event);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to a graph: out of memory");
  }
  /* he's one reference is this function's (`ours`) until the built graphs
   * take it; a capture's hold takes one of its own. */
  for (int i = 0; i < nlanes; i++) {
    if (lanes[i]->kind == DLSYNC_LANE_CAPTURING)
      DLSYNC_TRY(capture_add_held(ps, pool, lanes[i], he));
    else
      built[nbuilt++] = lanes[i]->graph;
  }
  if (nbuilt > 0) {
    /* One user object for them all; from then on its destructor lets the
     * reference go. */
    bool taken = false;
    st = dlsync__graph_hold(ps->drv, built, nbuilt, held_event_destroy, he, &taken);
    if (taken)
      ours = false;
  }
cleanup:
  if (ours)
    dlsync__held_event_unref(he); /* no graph took it: back to the pool */
  return st;
}

dlsync_status dlsync__graph_event_node_failed(const dlsync__driver *d, CUresult r, CUgraph graph,
                                              const CUgraphNode *deps, size_t ndeps, bool record,
                                              const char *role) {
  dlsync_status st =
      dlsync__fail_driver(d, r, record ? "cuGraphAddEventRecordNode" : "cuGraphAddEventWaitNode",
                          "%s lane, graph %p, after %zu node(s)", role, (void *)graph, ndeps);
  if (r == CUDA_ERROR_INVALID_VALUE && ndeps > 0) {
    size_t count = 0;
    CUgraphNode *nodes = NULL;
    bool foreign = false;
    if (d->GraphGetNodes(graph, NULL, &count) == CUDA_SUCCESS && count == 0) {
      foreign = true; /* an empty graph holds none of them */
    } else if ((nodes = dlsync__calloc(count + 1, sizeof *nodes)) != NULL &&
               d->GraphGetNodes(graph, nodes, &count) == CUDA_SUCCESS) {
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

static DLSYNC__INLINE dlsync_status add_event_node(const dlsync__driver *d, CUgraphNode *out,
                                                   CUgraph graph, const CUgraphNode *deps,
                                                   size_t ndeps, CUevent event, bool record,
                                                   const char *role) {
  CUresult r = record ? d->GraphAddEventRecordNode(out, graph, deps, ndeps, event)
                      : d->GraphAddEventWaitNode(out, graph, deps, ndeps, event);
  if (DLSYNC__LIKELY(r == CUDA_SUCCESS))
    return DLSYNC_SUCCESS;
  return dlsync__graph_event_node_failed(d, r, graph, deps, ndeps, record, role);
}

dlsync_status dlsync__graph_capture_set_failed(const dlsync__driver *d, CUresult r,
                                               const dlsync__lane_now *l) {
  return dlsync__fail_driver(d, r, "cuStreamUpdateCaptureDependencies",
                             "%s stream %p: putting the event node at the end of its capture",
                             l->role, (void *)l->stream);
}

dlsync_status dlsync__graph_append_event_node(const dlsync__driver *d, dlsync__lane_now *l,
                                              CUevent event, bool record, CUgraphNode *out) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUgraphNode node = NULL;
  if (l->kind == DLSYNC_LANE_CAPTURING) {
    DLSYNC_TRY(dlsync__graph_append_capture_event(d, l, event, record));
    node = l->dep_buf[0];
  } else {
    dlsync_lane *lane = l->lane; /* room for one node: checked by the caller (lane_fit) */
    DLSYNC_TRY(add_event_node(d, &node, l->graph, l->deps, l->ndeps, event, record, l->role));
    lane->deps[0] = node;
    lane->ndeps = 1;
    l->deps = (const CUgraphNode *)lane->deps;
    l->ndeps = 1;
  }
  if (out != NULL)
    *out = node;
cleanup:
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
