/* SPDX-License-Identifier: Apache-2.0 */
/* The conditional bodies a context was told of (graph/body.h). */
#include <stdio.h>

#include "graph/body.h"

atomic_uint dlsync__bodies_total;

static void bodies_lock(dlsync__bodies *b) {
  bool expected = false;
  while (!atomic_compare_exchange_weak_explicit(&b->lock, &expected, true, memory_order_acquire,
                                                memory_order_relaxed))
    expected = false;
}

static void bodies_unlock(dlsync__bodies *b) {
  atomic_store_explicit(&b->lock, false, memory_order_release);
}

bool dlsync__bodies_has(const dlsync__bodies *b, CUgraph g) {
  uintptr_t want = (uintptr_t)g;
  if (g == NULL)
    return false;
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++)
    if (atomic_load_explicit(&b->graph[i], memory_order_acquire) == want)
      return true;
  return false;
}

bool dlsync__bodies_add(dlsync__bodies *b, CUgraph g) {
  bool ok = true;
  int free_slot = -1;
  bodies_lock(b);
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES; i++) {
    uintptr_t v = atomic_load_explicit(&b->graph[i], memory_order_relaxed);
    if (v == (uintptr_t)g)
      goto done; /* declared already: counts once */
    if (v == 0 && free_slot < 0)
      free_slot = i;
  }
  if (free_slot < 0) {
    ok = false;
    goto done;
  }
  atomic_store_explicit(&b->graph[free_slot], (uintptr_t)g, memory_order_release);
  atomic_fetch_add_explicit(&b->n, 1, memory_order_release);
  atomic_fetch_add_explicit(&dlsync__bodies_total, 1, memory_order_release);
done:
  bodies_unlock(b);
  return ok;
}

bool dlsync__bodies_remove(dlsync__bodies *b, CUgraph g) {
  bool found = false;
  bodies_lock(b);
  for (int i = 0; i < DLSYNC_CONDITIONAL_BODIES && !found; i++) {
    if (atomic_load_explicit(&b->graph[i], memory_order_relaxed) == (uintptr_t)g) {
      atomic_store_explicit(&b->graph[i], 0, memory_order_release);
      atomic_fetch_sub_explicit(&b->n, 1, memory_order_release);
      atomic_fetch_sub_explicit(&dlsync__bodies_total, 1, memory_order_release);
      found = true;
    }
  }
  bodies_unlock(b);
  return found;
}

dlsync_status dlsync__body_refuse(const dlsync__bodies *b, const char *what,
                                  const dlsync__lane_now *l, bool record) {
  bool capturing = l->kind == DLSYNC_LANE_CAPTURING;
  if (l->kind == DLSYNC_LANE_EAGER || !dlsync__bodies_has(b, l->graph))
    return DLSYNC_SUCCESS;
  char where[64];
  if (capturing)
    snprintf(where, sizeof where, "stream %p capturing into graph %p", (void *)l->stream,
             (void *)l->graph);
  else
    snprintf(where, sizeof where, "a graph lane on graph %p", (void *)l->graph);
  return dlsync__fail(DLSYNC_ERROR_CONDITIONAL_BODY,
                      "%s: the %s lane is %s, a conditional node's body "
                      "(dlsync_conditional_body_add), where CUDA admits no event-%s node (the "
                      "parent graph would fail to instantiate). Nothing was queued; %s. Order this "
                      "work before the conditional node (on the parent graph's lane), or bring the "
                      "other stream into the body's capture (edges only)",
                      what, l->role, where, record ? "record" : "wait",
                      capturing ? "the capture is still valid" : "the graph is unchanged");
}
