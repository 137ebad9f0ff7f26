/* SPDX-License-Identifier: Apache-2.0 */
/* Exchange records and their handles (exchange_int.h says how a handle
 * names a record; the inline parts used by begin and end are there). */
#include "order/exchange_int.h"

_Atomic(dlsync_exchange *) dlsync__ex_chunks[EX_CHUNKS];
static atomic_uint ex_made; /* records made so far */
static pthread_mutex_t ex_lock = PTHREAD_MUTEX_INITIALIZER;
static dlsync_exchange *ex_free; /* shared free list, under ex_lock */

static void shared_put(dlsync_exchange *ex) {
  pthread_mutex_lock(&ex_lock);
  ex->next_free = ex_free;
  ex_free = ex;
  pthread_mutex_unlock(&ex_lock);
}

/* The thread-exit hook (base/base.h): the thread's spare record back to
 * the shared list. */
static void spare_release(dlsync__thread *t) {
  if (dlsync__order_thread_of(t)->spare != NULL)
    shared_put(dlsync__order_thread_of(t)->spare);
  dlsync__order_thread_of(t)->spare = NULL;
  dlsync__order_thread_of(t)->spare_keyed = false;
}

/* The unload hook (base/base.h): the records' chunks freed. By then the
 * library's threads are joined; a thread of the program that still used a
 * record would be using a library that is going away. */
static void records_unload(void) {
  spare_release(dlsync__thread_get()); /* the unloading thread's, on the list */
  if (dlsync__unload_at_exit())
    return; /* another thread may be in a call with a record (base/base.h) */
  for (unsigned c = 0; c < EX_CHUNKS; c++) {
    dlsync_exchange *chunk = atomic_exchange(&dlsync__ex_chunks[c], NULL);
    if (chunk != NULL)
      dlsync__free(((void **)(void *)chunk)[-1]);
  }
  pthread_mutex_lock(&ex_lock);
  ex_free = NULL;
  atomic_store(&ex_made, 0);
  pthread_mutex_unlock(&ex_lock);
}

dlsync_exchange *dlsync__exchange_make(void) {
  dlsync_exchange *ex = NULL, *chunk;
  unsigned i;
  pthread_mutex_lock(&ex_lock);
  if (ex_free != NULL) {
    ex = ex_free;
    ex_free = ex->next_free;
    goto cleanup;
  }
  i = atomic_load_explicit(&ex_made, memory_order_relaxed);
  if (i >= EX_CHUNK * EX_CHUNKS)
    goto cleanup;
  chunk = atomic_load_explicit(&dlsync__ex_chunks[i / EX_CHUNK], memory_order_relaxed);
  if (chunk == NULL) {
    /* Freed at the unload only (records_unload); aligned by hand, with the
     * allocation's address in the word before the chunk (64 bytes more than
     * needed: malloc's alignment leaves at least 16 before the chunk). */
    unsigned char *raw = dlsync__calloc(1, EX_CHUNK * sizeof *chunk + 64);
    if (raw == NULL)
      goto cleanup;
    dlsync__hooks_set(DLSYNC__HOOK_RECORDS, spare_release, records_unload);
    chunk = (dlsync_exchange *)(void *)(raw + 64 - (uintptr_t)raw % 64);
    ((void **)(void *)chunk)[-1] = raw;
    for (unsigned j = 0; j < EX_CHUNK; j++) {
      atomic_init(&chunk[j].handle, i + j); /* generation 0 */
      atomic_init(&chunk[j].ctx, NULL);
      chunk[j].index = i + j;
    }
    atomic_store_explicit(&dlsync__ex_chunks[i / EX_CHUNK], chunk, memory_order_release);
  }
  ex = &chunk[i % EX_CHUNK];
  atomic_store_explicit(&ex_made, i + 1, memory_order_release);
cleanup:
  pthread_mutex_unlock(&ex_lock);
  return ex;
}

void dlsync__exchange_free_slow(dlsync__thread *t, dlsync_exchange *ex) {
  if (dlsync__order_thread_of(t)->spare == NULL) {
    if (dlsync__thread_exit_arm(t)) {
      dlsync__order_thread_of(t)->spare_keyed = true;
      dlsync__order_thread_of(t)->spare = ex;
      return;
    }
  }
  shared_put(ex);
}

dlsync_exchange *dlsync__exchange_refused(dlsync_exchange *handle, dlsync_status *st) {
  if (handle == NULL)
    *st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_exchange_end: exchange is NULL");
  else
    *st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                       "dlsync_exchange_end: %p is not an exchange that is begun: it was ended "
                       "already (each begin is ended once), its context was destroyed, or it was "
                       "never a handle from dlsync_exchange_begin",
                       (void *)handle);
  return NULL;
}

/* Context destroy: ends (without ordering anything) the exchanges of ctx
 * that are still begun; returns how many of them the caller holds handles
 * to (a begin_many's record counts once, its parts, which only its end
 * ends, not at all). Must not race with begin or end on ctx (context.h). */
size_t dlsync__exchanges_abandon(const dlsync_context *ctx) {
  size_t n = 0, parts = 0;
  unsigned made = atomic_load_explicit(&ex_made, memory_order_acquire);
  for (unsigned i = 0; i < made; i++) {
    dlsync_exchange *chunk =
        atomic_load_explicit(&dlsync__ex_chunks[i / EX_CHUNK], memory_order_acquire);
    dlsync_exchange *ex = &chunk[i % EX_CHUNK];
    uint64_t now = atomic_load_explicit(&ex->handle, memory_order_acquire);
    if ((now & EX_GEN_ONE) == 0 || atomic_load_explicit(&ex->ctx, memory_order_relaxed) != ctx)
      continue;
    if (atomic_compare_exchange_strong_explicit(&ex->handle, &now, now + EX_GEN_ONE,
                                                memory_order_acq_rel, memory_order_acquire)) {
      if (ex->bits & EX_MANY) {
        dlsync__free(ex->many); /* its parts are records of ctx too: abandoned by this scan */
        parts += ex->nmany;
      }
      ex->many = NULL;
      ex->nmany = 0;
      shared_put(ex);
      n++;
    }
  }
  return n - parts;
}
