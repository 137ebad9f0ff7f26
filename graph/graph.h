/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: nodes appended to captures and built graphs, objects
 * owned by graphs (graph/). Never installed. Uses the layers below. */
#ifndef DLSYNC_PRIVATE_GRAPH_H
#define DLSYNC_PRIVATE_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include "driver/driver.h"
#include "event/event.h"
#include "stream/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Appends an event-record (record = true) or event-wait node at a lane's
 * position: after a capture's current dependencies (which then become the
 * node), or after a built lane's frontier (which then becomes the node). A
 * built lane must have room for that one node: the caller checks it first
 * (dlsync__lane_fit), before anything is given to a graph. */
/* out (may be NULL): the node it added. */
dlsync_status dlsync__graph_append_event_node(const dlsync__driver *d, dlsync__lane_now *lane,
                                              CUevent event, bool record, CUgraphNode *out);
/* A failed cuGraphAddEvent*Node after deps[0..l->ndeps) in l's graph (the
 * error, and whether a dependency is from another graph), and a failed
 * cuStreamUpdateCaptureDependencies after it (cold, graph.c). */
DLSYNC__COLD dlsync_status dlsync__graph_event_node_failed(const dlsync__driver *d, CUresult r,
                                                           const dlsync__lane_now *l,
                                                           const CUgraphNode *deps, bool record);
DLSYNC__COLD dlsync_status dlsync__graph_capture_set_failed(const dlsync__driver *d, CUresult r,
                                                            const dlsync__lane_now *lane);
/* dlsync__graph_append_event for a capturing lane, inline (the capture rows
 * of the fast path): the node after the capture's dependencies (used at
 * once: the driver's array is valid until the next call on the stream), then
 * the capture's dependencies are the node alone. Edge data is not carried
 * over: the node takes full (default) dependencies, which is never weaker. */
static inline dlsync_status dlsync__graph_append_capture_event(const dlsync__driver *d,
                                                               dlsync__lane_now *l, CUevent event,
                                                               bool record) {
  CUgraphNode node = NULL;
  const CUgraphNode *deps = dlsync__lane_deps(l);
  CUresult r = record ? d->GraphAddEventRecordNode(&node, l->graph, deps, l->ndeps, event)
                      : d->GraphAddEventWaitNode(&node, l->graph, deps, l->ndeps, event);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return dlsync__graph_event_node_failed(d, r, l, deps, record);
  r = d->StreamUpdateCaptureDependencies(l->stream, &node, NULL, 1,
                                         CU_STREAM_SET_CAPTURE_DEPENDENCIES);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return dlsync__graph_capture_set_failed(d, r, l);
  l->dep_buf[0] = node;
  l->deps = l->dep_buf;
  l->deps_inline = true;
  l->ndeps = 1;
  return DLSYNC_SUCCESS;
}
/* dlsync__graph_append_event for a built lane, inline: the node after the
 * lane's frontier, which is then the node alone (room checked by the
 * caller). */
static inline dlsync_status dlsync__graph_append_built_event(const dlsync__driver *d,
                                                             dlsync__lane_now *l, CUevent event,
                                                             bool record) {
  CUgraphNode node = NULL;
  dlsync_lane *lane = l->lane;
  CUresult r = record ? d->GraphAddEventRecordNode(&node, l->graph, l->deps, l->ndeps, event)
                      : d->GraphAddEventWaitNode(&node, l->graph, l->deps, l->ndeps, event);
  if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS))
    return dlsync__graph_event_node_failed(d, r, l, l->deps, record);
  lane->deps[0] = node;
  lane->ndeps = 1;
  l->deps = (const CUgraphNode *)lane->deps;
  l->ndeps = 1;
  return DLSYNC_SUCCESS;
}
/* An event-record or -wait node at a lane's position (capturing or built),
 * inline. */
static inline dlsync_status dlsync__graph_append_event(const dlsync__driver *d,
                                                       dlsync__lane_now *lane, CUevent event,
                                                       bool record) {
  if (lane->kind == DLSYNC_LANE_CAPTURING)
    return dlsync__graph_append_capture_event(d, lane, event, record);
  return dlsync__graph_append_built_event(d, lane, event, record);
}
/* dlsync_graph_launch (include/dlsync/graph.h) with the context's driver:
 * `graph` as a child node at a capturing or graph lane's position (which then
 * is that node), or `exec` launched on an eager stream. */
struct dlsync__bodies;
/* bodies: the context's declared conditional bodies (graph/body.h): a child
 * holding event nodes is refused in one. */
dlsync_status dlsync__graph_launch_at(const dlsync__driver *d, const struct dlsync__bodies *bodies,
                                      CUgraph graph, CUgraphExec exec, dlsync_lane *lane);
/* Adds one node to a graph lane's frontier (no node added to the graph). */
dlsync_status dlsync__graph_lane_add_dep(dlsync__lane_now *lane, CUgraphNode node);
/* What a graph is given: ptr, and its destructor (passed by value: two
 * registers). */
typedef struct dlsync__graph_object {
  void (*destroy)(void *);
  void *ptr;
} dlsync__graph_object;
/* Gives `obj.ptr` to the graphs: one user object (destructor `obj.destroy`,
 * run on a driver thread, no CUDA calls) that each graph holds a reference
 * to. Once *taken is true the destructor owns ptr and runs exactly once,
 * when every graph and executable holding it is gone (at once if none took
 * it); while false, ptr is still the caller's. */
dlsync_status dlsync__graph_hold(const dlsync__driver *d, CUgraph *graphs, int ngraphs,
                                 dlsync__graph_object obj, bool *taken);
/* The graphs hold a reference to `he` (taken from the caller's count of
 * one; the caller keeps its own). */
dlsync_status dlsync__graph_hold_event(const dlsync__driver *d, dlsync__held_event *he,
                                       CUgraph *graphs, int ngraphs);
/* ---- a capture's events: one hold per capture and thread (graph.c) ----
 * Each capture holds dlsync's events through one hold per thread (made, as
 * a user object its graph retains, by the thread's first event of that
 * capture; later events cost no driver call). The thread remembers the
 * holds of its last captures in its block (graph/'s slot). An order that
 * takes one event for one capture (EAGER_TO_CAPTURE) takes several free
 * events into the hold under one lock and keeps the rest in the memo, for
 * its next orders into that capture: those take no lock, one load says the
 * hold is still live. How many: as many as the thread has taken for that
 * capture so far (one, one, two, four, ...), at most DLSYNC__HOLD_RESERVE,
 * so a capture holds events it does not use (they come back with its graph
 * like the others) only once it has used more: at most
 * DLSYNC__HOLD_RESERVE - 1 per thread, and never more than it used. The cap
 * is larger than a built batch's (DLSYNC__BUILT_BATCH) because what a
 * capture keeps back is bounded by what it used, whatever the cap: its
 * unused events go with its one graph, which holds the used ones anyway. A
 * larger cap only makes the lock (and the refill's bookkeeping) rarer on a
 * capture with many orders. */
#define DLSYNC__HOLD_MEMOS 4
#define DLSYNC__HOLD_RESERVE 32

typedef struct dlsync__hold_memo {
  const dlsync__pool *pool;
  uint64_t generation; /* of the dlsync context whose pool it is */
  dlsync__hold *hold;
  uint64_t life;
  uint64_t capture_id; /* 0: free (the thread's keys[] has it too) */
  unsigned nreserve;
  unsigned taken; /* events taken for this capture so far, up to DLSYNC__HOLD_RESERVE */
  /* Events the hold took for this thread and it has not used yet, the next
   * one last. Valid while the hold is in `life`. */
  CUevent reserve[DLSYNC__HOLD_RESERVE - 1];
} dlsync__hold_memo;

/* ---- the events of built graphs: one batch per thread and pool ----
 * Every event dlsync puts into a graph built by hand (and into a capture's
 * graph, when the other lane is built) belongs to the thread's open batch of
 * its pool: a hold (event/) of up to DLSYNC__BUILT_BATCH events, taken
 * under one lock, and one user object that holds it, of which the thread
 * keeps a reference while the batch has events left. An order takes the
 * next event with no lock and no allocation; each graph it goes into
 * retains the user object (cuGraphRetainUserObject, one call; a capture's
 * graph once per capture and batch, since capture ids are never reused).
 * The thread drops its reference when it takes the batch's last event, at
 * its exit (a key destructor) and when it destroys the context; the events
 * come back once every graph that retained the object, and its executables,
 * are gone. A graph handle can name a new graph once the old one is
 * destroyed, so each order retains again: a graph is never trusted to hold
 * the object already. Batches grow like a capture's reserve (1, 1, 2, 4,
 * then 8): a thread keeps at most DLSYNC__BUILT_BATCH - 1 events it has
 * not used per memo, and never more than it has used. The cap stays small:
 * a batch's events come back only once every graph that took one of them is
 * gone, so one long-lived graph keeps back its whole batch. */
#define DLSYNC__BUILT_MEMOS 2
#define DLSYNC__BUILT_BATCH 8

typedef struct dlsync__built_memo {
  const dlsync__pool *pool; /* NULL: free */
  uint64_t generation;      /* of the dlsync context whose pool it is */
  /* The driver's cuUserObjectRelease, for a thread's exit (the context, and
   * its table, may be gone by then; the entry point is the library's). */
  CUresult(CUDAAPI *release)(CUuserObject, unsigned int);
  CUuserObject uo;     /* the thread's reference to the open batch; NULL: none */
  void *box;           /* uo's destructor and its argument (graph.c) */
  uint64_t capture_id; /* a capture whose graph retains uo already; 0: none */
  unsigned nreserve;   /* events of the batch not used yet: reserve[0..nreserve) */
  unsigned taken;      /* events taken so far, up to DLSYNC__BUILT_BATCH: the next batch's size */
  bool retained;       /* a graph has retained uo */
  unsigned size;       /* events the open batch took (used or not) */
  CUevent reserve[DLSYNC__BUILT_BATCH]; /* the next one last */
} dlsync__built_memo;

typedef struct DLSYNC__MAY_ALIAS dlsync__graph_thread {
  /* The memos' capture ids, side by side: a lookup reads one cache line,
   * then the memo it finds. */
  uint64_t keys[DLSYNC__HOLD_MEMOS];
  dlsync__hold_memo memo[DLSYNC__HOLD_MEMOS];
  unsigned next;
  unsigned built_last; /* the memo of built[] used last */
  bool built_keyed;    /* the thread-exit hook that closes the batches is set */
  dlsync__built_memo built[DLSYNC__BUILT_MEMOS];
  /* The registry of threads with a thread-exit hook (graph.c): context
   * destroy closes every such thread's batches of its pools. */
  struct dlsync__graph_thread *registry_next, *registry_prev;
} dlsync__graph_thread;

#ifndef __cplusplus
_Static_assert(sizeof(dlsync__graph_thread) <= DLSYNC__THREAD_GRAPH_BYTES,
               "graph/'s per-thread block does not fit its slot in dlsync__thread");
#endif

static inline dlsync__graph_thread *dlsync__graph_thread_of(dlsync__thread *t) {
  return (dlsync__graph_thread *)(void *)t->graph.bytes;
}

static inline dlsync__hold_memo *dlsync__hold_find(dlsync__graph_thread *gt, uint64_t generation,
                                                   const dlsync__pool *pool, uint64_t capture_id) {
  for (unsigned i = 0; i < DLSYNC__HOLD_MEMOS; i++) {
    dlsync__hold_memo *m = &gt->memo[i];
    if (gt->keys[i] == capture_id && m->pool == pool && m->generation == generation)
      return m;
  }
  return NULL;
}

/* An event of `pool` that the capture `capture_id` holds from the thread's
 * reserve for it (no lock, no driver call); NULL when there is none (no
 * hold remembered, the reserve used up, or the hold given back: then its
 * reserve is dropped). */
static inline CUevent dlsync__graph_capture_event_reserved(dlsync__thread *t,
                                                           const dlsync__pools *ps,
                                                           const dlsync__pool *pool,
                                                           uint64_t capture_id) {
  dlsync__hold_memo *m =
      dlsync__hold_find(dlsync__graph_thread_of(t), ps->generation, pool, capture_id);
  if (DLSYNC__UNLIKELY(m == NULL || m->nreserve == 0))
    return NULL;
  if (DLSYNC__UNLIKELY(!dlsync__hold_live(m->hold, m->life))) {
    m->nreserve = 0; /* given back with the hold */
    return NULL;
  }
  return m->reserve[--m->nreserve];
}

/* The captures an event goes into: a's, and b's too when b is non-NULL
 * (passed by value: two registers). */
typedef struct dlsync__lane_pair {
  const dlsync__lane_now *a, *b;
} dlsync__lane_pair;
/* The lanes whose graphs an event goes into: lanes[0..n) (passed by value:
 * two registers). */
typedef struct dlsync__lane_list {
  dlsync__lane_now *const *lanes;
  int n;
} dlsync__lane_list;

/* dlsync__graph_capture_event without an event at hand (reserved, or a
 * live hold remembered for a and b): makes the holds, then takes. */
dlsync_status dlsync__graph_capture_event_slow(CUevent *out, dlsync__thread *t,
                                               const dlsync__pools *ps, dlsync__pool *pool,
                                               dlsync__lane_pair ab);

/* An event of `pool` that ab.a's capture holds, and ab.b's too when ab.b is
 * non-NULL (another capture): it returns to the pool once their graphs are
 * gone. t:
 * the calling thread's block. For one capture, from the thread's reserve
 * when it has one (dlsync__graph_capture_event_reserved). */
static DLSYNC__INLINE dlsync_status dlsync__graph_capture_event(CUevent *out, dlsync__thread *t,
                                                                const dlsync__pools *ps,
                                                                dlsync__pool *pool,
                                                                dlsync__lane_pair ab) {
  const dlsync__lane_now *a = ab.a, *b = ab.b;
  dlsync__graph_thread *gt = dlsync__graph_thread_of(t);
  const dlsync__hold_memo *ma, *mb;
  dlsync_status st;
  if (b == NULL) {
    *out = dlsync__graph_capture_event_reserved(t, ps, pool, a->capture_id);
    if (DLSYNC__LIKELY(*out != NULL))
      return DLSYNC_SUCCESS;
    return dlsync__graph_capture_event_slow(out, t, ps, pool, ab);
  }
  ma = dlsync__hold_find(gt, ps->generation, pool, a->capture_id);
  mb = dlsync__hold_find(gt, ps->generation, pool, b->capture_id);
  if (DLSYNC__UNLIKELY(ma == NULL || mb == NULL))
    return dlsync__graph_capture_event_slow(out, t, ps, pool, ab);
  st = dlsync__hold_take(out, pool, (dlsync__hold_life){ma->hold, ma->life},
                         (dlsync__hold_life){mb->hold, mb->life});
  if (DLSYNC__LIKELY(*out != NULL) || st != DLSYNC_SUCCESS)
    return st;
  return dlsync__graph_capture_event_slow(out, t, ps, pool, ab); /* not live any more */
}

/* An event of `pool` for the graphs of ls.lanes[0..ls.n) (at most 2: built
 * lanes, and capturing ones whose row puts a node in a built graph; eager
 * lanes are skipped), from the thread's open batch of that pool (made when
 * it has none): each of those graphs retains the batch's user object. On
 * failure nothing was given to any graph but references the driver will let
 * go with it; the event, if taken, stays unused in the batch and comes back
 * with it. The inline part takes an event from a batch that has more left;
 * the _slow part opens a batch, or takes its last event and closes it. */
dlsync_status dlsync__graph_built_event_slow(CUevent *out, dlsync__thread *t,
                                             const dlsync__pools *ps, dlsync__pool *pool,
                                             dlsync__lane_list ls);
DLSYNC__COLD dlsync_status dlsync__graph_built_retain_failed(const dlsync__driver *d, CUresult r,
                                                             const dlsync__lane_now *l);
/* Each graph of ls.lanes[0..ls.n) retains m's batch (eager lanes none; a
 * capture's graph once per capture and batch). *took: the last graph that
 * did (unchanged when none). Returns the lane whose graph refused (*r: the
 * driver's result), NULL when all took it. */
static inline const dlsync__lane_now *dlsync__graph_built_retain(const dlsync__driver *d,
                                                                 dlsync__built_memo *m,
                                                                 dlsync__lane_list ls,
                                                                 CUgraph *took, CUresult *r) {
  dlsync__lane_now *const *lanes = ls.lanes;
  int nlanes = ls.n;
  for (int i = 0; i < nlanes; i++) {
    const dlsync__lane_now *l = lanes[i];
    if (l->kind == DLSYNC_LANE_EAGER ||
        (l->kind == DLSYNC_LANE_CAPTURING && l->capture_id == m->capture_id))
      continue;
    *r = d->GraphRetainUserObject(l->graph, m->uo, 1, 0);
    if (DLSYNC__UNLIKELY(*r != CUDA_SUCCESS))
      return l;
    *took = l->graph;
    m->retained = true;
    if (l->kind == DLSYNC_LANE_CAPTURING)
      m->capture_id = l->capture_id;
  }
  return NULL;
}
static inline dlsync_status dlsync__graph_built_event(CUevent *out, dlsync__thread *t,
                                                      const dlsync__pools *ps, dlsync__pool *pool,
                                                      dlsync__lane_list ls) {
  dlsync__graph_thread *gt = dlsync__graph_thread_of(t);
  for (unsigned k = 0; k < DLSYNC__BUILT_MEMOS; k++) {
    dlsync__built_memo *m = &gt->built[k];
    if (m->pool != pool || m->generation != ps->generation)
      continue;
    /* The common case inline: the memo's batch has more than this event
     * left (the last one closes it: the slow path). */
    if (DLSYNC__UNLIKELY(m->nreserve < 2))
      break;
    CUgraph took = NULL;
    CUresult r = CUDA_SUCCESS;
    const dlsync__lane_now *refused;
    gt->built_last = k;
    *out = m->reserve[--m->nreserve];
    refused = dlsync__graph_built_retain(ps->drv, m, ls, &took, &r);
    if (DLSYNC__UNLIKELY(refused != NULL)) {
      *out = NULL; /* unused, in the batch: back with it */
      return dlsync__graph_built_retain_failed(ps->drv, r, refused);
    }
    return DLSYNC_SUCCESS;
  }
  return dlsync__graph_built_event_slow(out, t, ps, pool, ls);
}
/* Closes every thread's open batches of the pools `ps` (each thread's
 * reference dropped: their unused events come back once their graphs are
 * gone). For context destroy, which no other use of that context races
 * with: another thread touches its memo of `ps` only to give it to another
 * pool or at its exit, both under the registry's lock, as is this. */
void dlsync__graph_built_close(const dlsync__pools *ps);
/* How many events the calling thread's open batches of the pools `ps` hold
 * that it has not used yet, and how many they hold in all, used or not (a
 * batch's events come back together, once its graphs are gone and the
 * thread has let go of it): for tests and the bench. */
size_t dlsync__graph_built_unused(const dlsync__pools *ps);
size_t dlsync__graph_built_held(const dlsync__pools *ps);

#ifdef __cplusplus
}
#endif

#endif
