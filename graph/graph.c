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

/* ---- one holder per capture ----
 *
 * Every event dlsync puts into a capture must live as long as the captured
 * graph. Instead of a user object per event (two driver calls each time), a
 * capture gets one holder, a user object its graph retains (two calls, once
 * per capture); later events of that capture are added to the holder's list
 * with no driver call. Holders are found by capture id, which the driver
 * makes unique for the life of the process, so an id never names another
 * capture. When the graph (and its executables) are gone the driver runs
 * holder_destroy, which hands every event back.
 *
 * Holder memory is recycled, never freed: a thread that found a holder in the
 * table checks, under the lock, that it is still the same live holder (its
 * generation) before adding to it. */
/* What a holder keeps: a held event it shares with other graphs (one
 * reference), or an event it alone holds (pool and event, counted in the
 * pool's graph_owned: dlsync__pool_note_graph_owned). */
typedef struct held_item {
  dlsync__held_event *he; /* NULL: pool and event */
  dlsync__pool *pool;
  CUevent event;
} held_item;

static void held_item_release(held_item it) {
  if (it.he != NULL)
    dlsync__held_event_unref(it.he);
  else
    dlsync__pool_return_from_graph(it.pool, it.event);
}

/* A holder's items: the first HOLDER_INLINE in the holder itself (recycled
 * with it: a capture of few exchanges allocates nothing), the rest in chunks
 * (nothing copied as a capture grows). */
#define HOLDER_INLINE 16
#define HOLDER_CHUNK 128

typedef struct held_chunk {
  struct held_chunk *next;
  size_t n;
  held_item items[HOLDER_CHUNK];
} held_chunk;

typedef struct capture_holder {
  uint64_t gen;        /* changes each time the holder is reused */
  uint64_t capture_id; /* 0: free */
  bool dead;           /* its graph is gone: add nothing */
  size_t n;            /* items in `first` */
  held_item first[HOLDER_INLINE];
  held_chunk *chunks; /* the newest first */
  struct capture_holder *next_free;
} capture_holder;

#define HOLDER_SLOTS 16

/* A spin lock: every section under it is a few loads and stores (a chunk's
 * allocation, once per 128 events, at most). */
static atomic_int holders_lock;
static struct {
  uint64_t capture_id;
  capture_holder *h;
  uint64_t gen;
} holder_table[HOLDER_SLOTS];
static unsigned holder_next;
static capture_holder *holders_free;
static uint64_t holder_gens;

/* Adds `it` to h's list (a held event: one reference taken, or with
 * `adopt` the caller's own); false when out of memory (nothing taken).
 * holders_lock held, or h not shared yet. */
static bool holder_add_locked(capture_holder *h, held_item it, bool adopt) {
  if (h->n < HOLDER_INLINE) {
    h->first[h->n++] = it;
  } else {
    held_chunk *c = h->chunks;
    if (c == NULL || c->n == HOLDER_CHUNK) {
      c = dlsync__malloc(sizeof *c);
      if (c == NULL)
        return false;
      c->n = 0;
      c->next = h->chunks;
      h->chunks = c;
    }
    c->items[c->n++] = it;
  }
  if (it.he != NULL && !adopt)
    dlsync__held_event_ref(it.he);
  return true;
}

/* The user object's destructor (a driver thread: no CUDA calls). */
static void holder_destroy(void *p) {
  capture_holder *h = p;
  held_item first[HOLDER_INLINE];
  held_chunk *chunks;
  size_t n;
  dlsync__spin_lock(&holders_lock);
  h->dead = true;
  for (unsigned i = 0; i < HOLDER_SLOTS; i++)
    if (holder_table[i].h == h)
      holder_table[i].h = NULL;
  n = h->n;
  memcpy(first, h->first, n * sizeof first[0]);
  chunks = h->chunks;
  h->n = 0;
  h->chunks = NULL;
  h->capture_id = 0;
  h->next_free = holders_free;
  holders_free = h;
  dlsync__spin_unlock(&holders_lock);
  for (size_t i = 0; i < n; i++)
    held_item_release(first[i]);
  while (chunks != NULL) {
    held_chunk *next = chunks->next;
    for (size_t i = 0; i < chunks->n; i++)
      held_item_release(chunks->items[i]);
    dlsync__free(chunks);
    chunks = next;
  }
}

static DLSYNC__COLD dlsync_status holder_out_of_memory(uint64_t capture_id) {
  return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to capture %llu: out of memory",
                      (unsigned long long)capture_id);
}

/* capture_hold when the capture has no holder yet (holders_lock held; this
 * function lets it go). */
static DLSYNC__NOINLINE dlsync_status capture_hold_new(const dlsync__driver *d, uint64_t capture_id,
                                                       CUgraph graph, held_item it, bool adopt,
                                                       bool *kept) {
  dlsync_status st = DLSYNC_SUCCESS;
  capture_holder *h = NULL;
  uint64_t gen = 0;
  bool taken = false;
  /* A new holder, with the event in it already: once the graph has it, its
   * destructor hands the event back, whatever happens next. */
  h = holders_free;
  if (h != NULL)
    holders_free = h->next_free;
  gen = ++holder_gens;
  dlsync__spin_unlock(&holders_lock);
  if (h == NULL) {
    h = dlsync__calloc(1, sizeof *h);
    if (h == NULL)
      return holder_out_of_memory(capture_id);
  }
  h->gen = gen;
  h->capture_id = capture_id;
  h->dead = false;
  h->n = 0;
  h->chunks = NULL;
  h->next_free = NULL;
  if (!holder_add_locked(h, it, adopt)) { /* h is not shared yet */
    st = holder_out_of_memory(capture_id);
    goto cleanup;
  }
  st = dlsync__graph_hold(d, &graph, 1, holder_destroy, h, &taken);
  if (!taken) {
    if (it.he != NULL && !adopt)
      dlsync__held_event_unref(it.he); /* the holder's reference */
    h->n = 0;
    goto cleanup;
  }
  *kept = true;
  if (st == DLSYNC_SUCCESS) {
    /* Published only if its graph has not let it go already. */
    dlsync__spin_lock(&holders_lock);
    if (h->gen == gen && !h->dead) {
      unsigned i = holder_next++ % HOLDER_SLOTS;
      holder_table[i].capture_id = capture_id;
      holder_table[i].h = h;
      holder_table[i].gen = gen;
    }
    dlsync__spin_unlock(&holders_lock);
  }
  h = NULL; /* the graph's */
cleanup:
  if (h != NULL) { /* holds nothing (its one item was taken back) */
    h->n = 0;
    dlsync__spin_lock(&holders_lock);
    h->next_free = holders_free;
    holders_free = h;
    dlsync__spin_unlock(&holders_lock);
  }
  return st;
}

/* The capture `capture_id` (graph `graph`) holds `it` (a reference to a held
 * event, or the event itself). *kept: the capture's holder has it, and
 * gives it back when the graph is gone, whatever the status; false: it is
 * still the caller's. A held event: the holder takes a reference of its
 * own, or with `adopt` the caller's (which, when *kept, is no longer the
 * caller's). */
static DLSYNC__INLINE dlsync_status capture_hold(const dlsync__driver *d, uint64_t capture_id,
                                                 CUgraph graph, held_item it, bool adopt,
                                                 bool *kept) {
  unsigned next;
  *kept = false;
  dlsync__spin_lock(&holders_lock);
  /* Newest first: the captures being recorded now published theirs last. */
  next = holder_next;
  for (unsigned k = 1; k <= HOLDER_SLOTS; k++) {
    unsigned i = (next - k) % HOLDER_SLOTS;
    capture_holder *t = holder_table[i].h;
    if (holder_table[i].capture_id == capture_id && t != NULL && t->gen == holder_table[i].gen &&
        !t->dead) {
      *kept = holder_add_locked(t, it, adopt);
      dlsync__spin_unlock(&holders_lock);
      return DLSYNC__LIKELY(*kept) ? DLSYNC_SUCCESS : holder_out_of_memory(capture_id);
    }
  }
  return capture_hold_new(d, capture_id, graph, it, adopt, kept);
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

dlsync_status dlsync__graph_own_event_capture(const dlsync__driver *d, dlsync__pool *pool,
                                              CUevent event, const dlsync__lane_now *lane) {
  /* One capture holds the event alone: no count of holders. */
  held_item it = {NULL, pool, event};
  bool kept = false;
  dlsync_status st;
  dlsync__pool_note_graph_owned(pool);
  st = capture_hold(d, lane->capture_id, lane->graph, it, false, &kept);
  if (DLSYNC__UNLIKELY(!kept))
    dlsync__pool_return_from_graph(pool, event);
  return st;
}

dlsync_status dlsync__graph_own_event_lanes(const dlsync__driver *d, dlsync__pool *pool,
                                            CUevent event, dlsync__lane_now *const *lanes,
                                            int nlanes) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUgraph built[2];
  int nbuilt = 0;
  bool ours = true;
  dlsync__held_event *he;
  if (lanes[0]->kind == DLSYNC_LANE_BUILT && (nlanes < 2 || lanes[1]->kind == DLSYNC_LANE_BUILT)) {
    for (int i = 0; i < nlanes && i < 2; i++)
      built[i] = lanes[i]->graph;
    return own_event_built(d, pool, event, built, nlanes < 2 ? nlanes : 2);
  }
  if (nlanes == 1)
    return dlsync__graph_own_event_capture(d, pool, event, lanes[0]);
  he = dlsync__held_event_new(pool, event);
  if (he == NULL) {
    dlsync__pool_put(pool, event);
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "giving an event to a graph: out of memory");
  }
  /* he's one reference is this function's (`ours`) until a holder adopts
   * it; later holders take their own. */
  for (int i = 0; i < nlanes && i < 2; i++) {
    if (lanes[i]->kind == DLSYNC_LANE_CAPTURING) {
      held_item it = {he, NULL, NULL};
      bool kept = false;
      st = capture_hold(d, lanes[i]->capture_id, lanes[i]->graph, it, ours, &kept);
      if (kept)
        ours = false;
      if (st != DLSYNC_SUCCESS)
        goto cleanup;
    } else
      built[nbuilt++] = lanes[i]->graph;
  }
  if (nbuilt > 0) {
    /* The built graphs take a reference (one user object for them all);
     * from then on their destructor lets it go. */
    bool taken = false;
    if (!ours) {
      dlsync__held_event_ref(he);
      ours = true;
    }
    st = dlsync__graph_hold(d, built, nbuilt, held_event_destroy, he, &taken);
    if (taken)
      ours = false;
  }
cleanup:
  if (ours)
    dlsync__held_event_unref(he); /* no graph took it: back to the pool */
  return st;
}

/* A failed cuGraphAdd*Node: the error, and whether a dependency is from
 * another graph (cold path). */
static DLSYNC__NOINLINE dlsync_status add_event_node_failed(const dlsync__driver *d, CUresult r,
                                                            CUgraph graph, const CUgraphNode *deps,
                                                            size_t ndeps, bool record,
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
  return add_event_node_failed(d, r, graph, deps, ndeps, record, role);
}

dlsync_status dlsync__graph_append_event_node(const dlsync__driver *d, dlsync__lane_now *l,
                                              CUevent event, bool record, CUgraphNode *out) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUgraphNode node = NULL;
  if (l->kind == DLSYNC_LANE_CAPTURING) {
    /* The capture's dependency array is only valid until the next call on
     * the stream; it is used right away. Edge data is not carried over: the
     * event node takes full (default) dependencies, which is never weaker. */
    DLSYNC_TRY(
        add_event_node(d, &node, l->graph, dlsync__lane_deps(l), l->ndeps, event, record, l->role));
    DLSYNC_CU(d, cuStreamUpdateCaptureDependencies,
              d->StreamUpdateCaptureDependencies(l->stream, &node, NULL, 1,
                                                 CU_STREAM_SET_CAPTURE_DEPENDENCIES),
              "%s stream %p: putting the event node at the end of its capture", l->role,
              (void *)l->stream);
    /* The capture's dependencies are now the node alone. */
    l->dep_buf[0] = node;
    l->deps = l->dep_buf;
    l->deps_inline = true;
    l->ndeps = 1;
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
