/* SPDX-License-Identifier: Apache-2.0 */
/* Exchange records and their handles (exchange_int.h says how a handle
 * names a record; the inline parts used by begin and end are there). */
#include "order/exchange_int.h"

_Atomic(dlsync_exchange *) dlsync__ex_chunks[EX_CHUNKS];
static atomic_uint ex_made; /* records made so far */
static pthread_mutex_t ex_lock = PTHREAD_MUTEX_INITIALIZER;
static dlsync_exchange *ex_free; /* shared free list, under ex_lock */

static pthread_once_t spare_once = PTHREAD_ONCE_INIT;
static pthread_key_t spare_key;
static atomic_bool spare_key_ok;

static void shared_put(dlsync_exchange *ex) {
  pthread_mutex_lock(&ex_lock);
  ex->next_free = ex_free;
  ex_free = ex;
  pthread_mutex_unlock(&ex_lock);
}

static void spare_release(void *p) {
  dlsync__thread *t = p;
  if (t->spare != NULL)
    shared_put(t->spare);
  t->spare = NULL;
  t->spare_keyed = false;
}

static void spare_key_init(void) {
  atomic_store(&spare_key_ok, pthread_key_create(&spare_key, spare_release) == 0);
}

/* As graph.c's built_unload: the key dropped when this copy's destructors
 * run (at exit, or at the dlclose of a library embedding libdlsync.a). */
#if defined(__GNUC__)
__attribute__((destructor)) static void spare_unload(void) {
  if (atomic_exchange(&spare_key_ok, false))
    pthread_key_delete(spare_key);
}
#endif

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
    /* Never freed; aligned by hand (64 bytes more than needed). */
    unsigned char *raw = dlsync__calloc(1, EX_CHUNK * sizeof *chunk + 64);
    if (raw == NULL)
      goto cleanup;
    chunk = (dlsync_exchange *)(void *)(raw + (64 - (uintptr_t)raw % 64) % 64);
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
  if (t->spare == NULL) {
    pthread_once(&spare_once, spare_key_init);
    if (atomic_load(&spare_key_ok) && pthread_setspecific(spare_key, t) == 0) {
      t->spare_keyed = true;
      t->spare = ex;
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
