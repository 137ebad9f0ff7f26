/* SPDX-License-Identifier: Apache-2.0 */
/* The releasing threads' rings (release_int.h): made on a thread's first
 * release on a GPU, collected by that GPU's reclaimer, marked when their
 * thread exits and freed by the reclaimer once empty. */

#include "order/release_int.h"

atomic_size_t dlsync__release_overflowed;

/* Set by the unload before it frees the rings: a thread that exits after
 * that no longer touches its rings (rings_thread_exit). */
atomic_bool dlsync__rings_gone;

/* A ring's memory and the references of its current run. */
void dlsync__ring_free(release_ring *g) {
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
    dlsync__book_unref(g->book);
  if (g->pool != NULL)
    dlsync__pool_unref(g->pool);
  dlsync__free_untouched(g, sizeof *g);
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
release_item *dlsync__rings_collect(reclaimer *r, release_item *batch) {
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
      dlsync__ring_free(g);
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
bool dlsync__rings_queued_locked(const reclaimer *r) {
  for (const release_ring *g = r->rings; g != NULL; g = g->next)
    if (atomic_load(&g->head) != atomic_load_explicit(&g->tail, memory_order_relaxed) ||
        atomic_load(&g->overflow) != NULL || g->held != NULL)
      return true;
  return false;
}

/* ---- the releasing thread's rings ---- */

/* Its thread exits: each of its rings is marked, for its reclaimer to free
 * once empty (woken, so that a sleeping one does not keep it). */
static void rings_thread_exit(dlsync__thread *t) {
  for (int i = 0; i < DLSYNC__THREAD_RINGS; i++) {
    release_ring *g = dlsync__order_thread_of(t)->rings[i];
    reclaimer *owner;
    dlsync__order_thread_of(t)->rings[i] = NULL;
    if (g == NULL || atomic_load(&dlsync__rings_gone))
      continue;
    owner = g->owner; /* read first: once marked, the ring may be freed at once */
    atomic_store(&g->orphaned, true);
    if (atomic_load(&owner->sleeping))
      dlsync__reclaimer_wake(owner);
  }
}

/* The calling thread's ring for r, made and registered; NULL when it cannot
 * be (no memory, no thread-exit hook, a device past DLSYNC__THREAD_RINGS). */
DLSYNC__NOINLINE release_ring *dlsync__ring_new(dlsync__thread *t, reclaimer *r) {
  release_ring *g;
  if (r->device < 0 || r->device >= DLSYNC__THREAD_RINGS)
    return NULL;
  dlsync__hooks_set(DLSYNC__HOOK_RINGS, rings_thread_exit, NULL);
  if (!dlsync__thread_exit_arm(t))
    return NULL;
  /* Zeroed pages, supplied as the head first reaches them: its slots and
   * drops are written before they are read (release_int.h). */
  g = dlsync__alloc_untouched(sizeof *g);
  if (g == NULL)
    return NULL;
  atomic_init(&g->head, 0);
  atomic_init(&g->tail, 0);
  atomic_init(&g->overflow, NULL);
  atomic_init(&g->orphaned, false);
  g->light = dlsync__fence_heavy_ready();
  g->owner = r;
  g->thread = pthread_self();
  g->device = r->device;
  pthread_mutex_lock(&r->lock);
  g->next = r->rings;
  r->rings = g;
  pthread_mutex_unlock(&r->lock);
  dlsync__order_thread_of(t)->rings[r->device] = g;
  return g;
}
