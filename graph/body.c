/* SPDX-License-Identifier: Apache-2.0 */
/* The conditional bodies a context was told of (graph/body.h). */
#include <stdio.h>

#include "graph/body.h"

atomic_uint dlsync__bodies_total;

/* Every context's declarations, by graph handle and owner (the owning
 * context's table): the rows of any context refuse a body that another
 * declared. Values only (no pointer is followed): a reader racing a
 * context's destroy reads a stale word at worst. Writers take the lock. */
#define GLOBAL_BODIES 1024
static struct {
  _Atomic(uintptr_t) graph;
  _Atomic(uintptr_t) owner;
} global_bodies[GLOBAL_BODIES];
static atomic_bool global_lock;

static void spin_lock(atomic_bool *lock) {
  bool expected = false;
  while (!atomic_compare_exchange_weak_explicit(lock, &expected, true, memory_order_acquire,
                                                memory_order_relaxed))
    expected = false;
}

static void spin_unlock(atomic_bool *lock) {
  atomic_store_explicit(lock, false, memory_order_release);
}

bool dlsync__bodies_has_here(const dlsync__bodies *b, CUgraph g) {
  uintptr_t want = (uintptr_t)g;
  if (g == NULL)
    return false;
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    if (atomic_load_explicit(&b->graph[i], memory_order_acquire) == want)
      return true;
  return false;
}

dlsync__body_where dlsync__bodies_find(const dlsync__bodies *b, CUgraph g) {
  uintptr_t want = (uintptr_t)g;
  if (g == NULL)
    return DLSYNC__BODY_NOT;
  if (atomic_load_explicit(&b->n, memory_order_acquire) != 0 && dlsync__bodies_has_here(b, g))
    return DLSYNC__BODY_HERE;
  /* Others have some when the total is more than this context's count. */
  if (atomic_load_explicit(&dlsync__bodies_total, memory_order_acquire) <=
      atomic_load_explicit(&b->n, memory_order_acquire))
    return DLSYNC__BODY_NOT;
  for (int i = 0; i < GLOBAL_BODIES; i++)
    if (atomic_load_explicit(&global_bodies[i].graph, memory_order_acquire) == want &&
        atomic_load_explicit(&global_bodies[i].owner, memory_order_acquire) != (uintptr_t)b)
      return DLSYNC__BODY_ELSEWHERE;
  return DLSYNC__BODY_NOT;
}

/* The process-wide entry of (g, b): added (false when full) or cleared. */
static bool global_add(const dlsync__bodies *b, uintptr_t g) {
  bool ok = false;
  spin_lock(&global_lock);
  for (int i = 0; i < GLOBAL_BODIES && !ok; i++) {
    if (atomic_load_explicit(&global_bodies[i].graph, memory_order_relaxed) == 0) {
      atomic_store_explicit(&global_bodies[i].owner, (uintptr_t)b, memory_order_release);
      atomic_store_explicit(&global_bodies[i].graph, g, memory_order_release);
      ok = true;
    }
  }
  spin_unlock(&global_lock);
  return ok;
}

static void global_remove(const dlsync__bodies *b, uintptr_t g) {
  spin_lock(&global_lock);
  for (int i = 0; i < GLOBAL_BODIES; i++) {
    if (atomic_load_explicit(&global_bodies[i].graph, memory_order_relaxed) == g &&
        atomic_load_explicit(&global_bodies[i].owner, memory_order_relaxed) == (uintptr_t)b) {
      atomic_store_explicit(&global_bodies[i].graph, 0, memory_order_release);
      atomic_store_explicit(&global_bodies[i].owner, 0, memory_order_release);
      break;
    }
  }
  spin_unlock(&global_lock);
}

bool dlsync__bodies_add(dlsync__bodies *b, CUgraph g) {
  bool ok = true;
  int free_slot = -1;
  spin_lock(&b->lock);
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++) {
    uintptr_t v = atomic_load_explicit(&b->graph[i], memory_order_relaxed);
    if (v == (uintptr_t)g)
      goto done; /* declared already: counts once */
    if (v == 0 && free_slot < 0)
      free_slot = i;
  }
  if (free_slot < 0 || !global_add(b, (uintptr_t)g)) {
    ok = false;
    goto done;
  }
  atomic_store_explicit(&b->graph[free_slot], (uintptr_t)g, memory_order_release);
  atomic_fetch_add_explicit(&b->n, 1, memory_order_release);
  atomic_fetch_add_explicit(&dlsync__bodies_total, 1, memory_order_release);
done:
  spin_unlock(&b->lock);
  return ok;
}

bool dlsync__bodies_add_node(dlsync__bodies *b, CUgraph parent, CUgraphNode node,
                             const CUgraph *bodies, size_t n) {
  int slot[DLSYNC_CONDITIONAL_BODIES];
  bool fresh[DLSYNC_CONDITIONAL_BODIES];
  bool ok = true;
  size_t tried = 0;
  if (n > DLSYNC_CONDITIONAL_BODIES)
    return false;
  spin_lock(&b->lock);
  /* Each body's slot: its own when declared already, else a free one. */
  for (size_t k = 0; k < n && ok; k++) {
    slot[k] = -1;
    fresh[k] = true;
    for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES && slot[k] < 0; i++)
      if (atomic_load_explicit(&b->graph[i], memory_order_relaxed) == (uintptr_t)bodies[k]) {
        slot[k] = i;
        fresh[k] = false;
      }
    for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES && slot[k] < 0; i++) {
      bool taken = atomic_load_explicit(&b->graph[i], memory_order_relaxed) != 0;
      for (size_t j = 0; j < k && !taken; j++)
        taken = slot[j] == i;
      if (!taken)
        slot[k] = i;
    }
    ok = slot[k] >= 0;
  }
  for (size_t k = 0; k < n && ok; k++, tried++)
    if (fresh[k])
      ok = global_add(b, (uintptr_t)bodies[k]);
  if (!ok) {
    for (size_t k = 0; k + 1 < tried; k++) /* the one that failed added nothing */
      if (fresh[k])
        global_remove(b, (uintptr_t)bodies[k]);
    goto done;
  }
  for (size_t k = 0; k < n; k++) {
    int i = slot[k];
    atomic_store_explicit(&b->parent[i], (uintptr_t)parent, memory_order_release);
    atomic_store_explicit(&b->node[i], (uintptr_t)node, memory_order_release);
    if (fresh[k]) {
      atomic_store_explicit(&b->graph[i], (uintptr_t)bodies[k], memory_order_release);
      atomic_fetch_add_explicit(&b->n, 1, memory_order_release);
      atomic_fetch_add_explicit(&dlsync__bodies_total, 1, memory_order_release);
    }
  }
done:
  spin_unlock(&b->lock);
  return ok;
}

bool dlsync__bodies_parent(const dlsync__bodies *b, CUgraph g, CUgraph *parent, CUgraphNode *node) {
  *parent = NULL;
  *node = NULL;
  if (g == NULL)
    return false;
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++) {
    if (atomic_load_explicit(&b->graph[i], memory_order_acquire) != (uintptr_t)g)
      continue;
    *parent = (CUgraph)atomic_load_explicit(&b->parent[i], memory_order_acquire);
    *node = (CUgraphNode)atomic_load_explicit(&b->node[i], memory_order_acquire);
    return *parent != NULL && *node != NULL;
  }
  return false;
}

static bool remove_locked(dlsync__bodies *b, uintptr_t g) {
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++) {
    if (g != 0 && atomic_load_explicit(&b->graph[i], memory_order_relaxed) == g) {
      atomic_store_explicit(&b->graph[i], 0, memory_order_release);
      atomic_store_explicit(&b->parent[i], 0, memory_order_release);
      atomic_store_explicit(&b->node[i], 0, memory_order_release);
      global_remove(b, g);
      atomic_fetch_sub_explicit(&b->n, 1, memory_order_release);
      atomic_fetch_sub_explicit(&dlsync__bodies_total, 1, memory_order_release);
      return true;
    }
  }
  return false;
}

bool dlsync__bodies_remove(dlsync__bodies *b, CUgraph g) {
  bool found;
  spin_lock(&b->lock);
  found = remove_locked(b, (uintptr_t)g);
  spin_unlock(&b->lock);
  return found;
}

void dlsync__bodies_forget_all(dlsync__bodies *b) {
  spin_lock(&b->lock);
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    (void)remove_locked(b, atomic_load_explicit(&b->graph[i], memory_order_relaxed));
  spin_unlock(&b->lock);
}

static dlsync_status refuse(const dlsync__bodies *b, const char *what, const dlsync__lane_now *l,
                            bool record, bool row) {
  bool capturing = l->kind == DLSYNC_LANE_CAPTURING;
  dlsync__body_where where_declared;
  if (l->kind == DLSYNC_LANE_EAGER)
    return DLSYNC_SUCCESS;
  where_declared = dlsync__bodies_find(b, l->graph);
  if (where_declared == DLSYNC__BODY_NOT)
    return DLSYNC_SUCCESS;
  char where[64];
  if (capturing)
    snprintf(where, sizeof where, "stream %p capturing into graph %p", (void *)l->stream,
             (void *)l->graph);
  else
    snprintf(where, sizeof where, "a graph lane on graph %p", (void *)l->graph);
  return dlsync__fail(
      DLSYNC_ERROR_CONDITIONAL_BODY,
      "%s: the %s lane is %s, a conditional node's body "
      "(dlsync_conditional_body_add%s), where CUDA admits no event-%s node (the "
      "parent graph would fail to instantiate). Nothing was queued; %s. Order this "
      "work before the conditional node (on the parent graph's lane), or bring the "
      "other stream into the body's capture (edges only)%s",
      what, l->role, where,
      where_declared == DLSYNC__BODY_ELSEWHERE ? " in another dlsync context" : "",
      record ? "record" : "wait",
      capturing ? "the capture is still valid" : "the graph is unchanged",
      row && where_declared == DLSYNC__BODY_HERE
          ? ", or declare the body with its parent graph and conditional node "
            "(dlsync_conditional_node_declare), which hoists the node into the parent"
          : "");
}

dlsync_status dlsync__body_refuse(const dlsync__bodies *b, const char *what,
                                  const dlsync__lane_now *l, bool record) {
  return refuse(b, what, l, record, false);
}

dlsync_status dlsync__body_refuse_row(const dlsync__bodies *b, const char *what,
                                      const dlsync__lane_now *l, bool record) {
  return refuse(b, what, l, record, true);
}
