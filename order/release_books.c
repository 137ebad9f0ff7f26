/* SPDX-License-Identifier: Apache-2.0 */
/* Each context's book of its releases (pending, done, failures), and the
 * tallies by which a reclaimer's batch tells the books (release_int.h). */
#include <stdio.h>

#include "order/release_int.h"

static void book_unref_n(dlsync__release_book *b, unsigned n) {
  if (n == 0 || atomic_fetch_sub_explicit(&b->refs, n, memory_order_acq_rel) != n)
    return;
  pthread_cond_destroy(&b->cond);
  pthread_mutex_destroy(&b->lock);
  dlsync__free(b);
}

void dlsync__book_unref(dlsync__release_book *b) {
  book_unref_n(b, 1);
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

void dlsync__book_add_graph(dlsync__release_book *b) {
  atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
  pthread_mutex_lock(&b->lock);
  b->pending_graph++;
  pthread_mutex_unlock(&b->lock);
}

/* A release owned by graphs that its graph let go (its destructor ran):
 * counted queued from now on, as an eager release is. */
void dlsync__book_graph_queued(dlsync__release_book *b) {
  pthread_mutex_lock(&b->lock);
  b->pending_graph--;
  atomic_fetch_add_explicit(&b->pending_eager, 1, memory_order_relaxed);
  pthread_mutex_unlock(&b->lock);
}

/* A release that will not happen after all (it failed before being queued). */
void dlsync__book_cancel(dlsync__release_book *b, bool from_graph) {
  pthread_mutex_lock(&b->lock);
  if (from_graph)
    b->pending_graph--;
  else
    atomic_fetch_sub_explicit(&b->pending_eager, 1, memory_order_relaxed);
  pthread_cond_broadcast(&b->cond);
  pthread_mutex_unlock(&b->lock);
  dlsync__book_unref(b);
}

/* A failure on the reclaimer thread, kept for flush and the stats (the
 * message of the first one since the last flush). Called with b->lock. */
void dlsync__book_note_failure_locked(dlsync__release_book *b, int result, const char *message) {
  if (b->first_failure == DLSYNC_SUCCESS) {
    b->first_failure = DLSYNC_ERROR_DRIVER;
    b->first_result = result;
    snprintf(b->first_message, sizeof b->first_message, "%s", message);
  }
}

/* Tells the book: under its lock the counts change and the ring slots are
 * freed together, so that a waiter (flush, close) that finds no release
 * pending also finds each one counted done and its failure noted. */
void dlsync__tally_commit(book_tally *t) {
  dlsync__release_book *b = t->book;
  if (b == NULL)
    return;
  pthread_mutex_lock(&b->lock);
  atomic_fetch_sub_explicit(&b->pending_eager, t->eager, memory_order_relaxed);
  b->pending_graph -= t->graph;
  b->done += (size_t)t->eager + t->graph + t->ring;
  if (t->sync_failures > 0) {
    b->sync_failures += t->sync_failures;
    dlsync__book_note_failure_locked(b, t->first_result, t->first_message);
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
void dlsync__tally_add(book_tally *t, const release_item *it) {
  unsigned i = 0;
  if (it->ring != NULL && t->book == it->book) {
    while (i < t->ntails && t->tails[i].ring != it->ring)
      i++;
    if (i == TALLY_RINGS)
      dlsync__tally_commit(t); /* no room for another ring's slots: told now */
  }
  if (t->book != it->book) {
    dlsync__tally_commit(t);
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

/* The book's eager releases not run yet: those of the shared queue (counted
 * as they are made) and those in the releasing threads' rings (counted by
 * looking: a ring's release costs its book nothing as it is made). Called
 * with b->lock, which a reclaimer takes to tell the book of releases done
 * only after their ring slots are free again, so a waiter on b->cond misses
 * no decrease. */
size_t dlsync__book_pending_eager(const dlsync__release_book *b) {
  return atomic_load_explicit(&b->pending_eager, memory_order_relaxed) + dlsync__rings_pending(b);
}

/* Waits until every eager release has run or is blocked (its reclaimer
 * cannot enter RELAXED mode), then returns the first failure since the last
 * flush (and forgets it). */
dlsync_status dlsync__book_flush(dlsync__release_book *b) {
  dlsync_status st;
  int result;
  char message[sizeof b->first_message];
  size_t blocked;
  pthread_mutex_lock(&b->lock);
  while (dlsync__book_pending_eager(b) > b->blocked)
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

dlsync_status dlsync__release_book_close(dlsync__release_book *b, dlsync__release_left *left) {
  dlsync__release_left l = {0, 0, 0, dlsync__on_reclaimer};
  if (b != NULL) {
    pthread_mutex_lock(&b->lock);
    if (dlsync__on_reclaimer) {
      /* From a deleter: a release queued behind the one running would wait
       * for itself, so the eager ones are not waited for; they still run
       * (the book is reference-counted). The one running, if it is of this
       * book, is not counted: it is done once its deleter returns; nor are
       * those of its batch whose deleters ran already. */
      bool own = dlsync__running != NULL && dlsync__running->book == b;
      const book_tally *t = dlsync__running_tally != NULL && dlsync__running_tally->book == b
                                ? dlsync__running_tally
                                : NULL;
      l.queued = dlsync__book_pending_eager(b) - (own && !dlsync__running->from_graph ? 1 : 0) -
                 (t != NULL ? t->eager + t->ring : 0);
      l.graph_owned = b->pending_graph - (own && dlsync__running->from_graph ? 1 : 0) -
                      (t != NULL ? t->graph : 0);
    } else {
      while (dlsync__book_pending_eager(b) > b->blocked)
        pthread_cond_wait(&b->cond, &b->lock);
      l.blocked = b->blocked;
      l.graph_owned = b->pending_graph;
    }
    pthread_mutex_unlock(&b->lock);
    dlsync__book_unref(b);
  }
  if (left != NULL)
    *left = l;
  return l.queued + l.blocked + l.graph_owned > 0 ? DLSYNC_ERROR_BUSY : DLSYNC_SUCCESS;
}
