/* SPDX-License-Identifier: Apache-2.0 */
/* Env streams: a per-thread table of (device type, device id) -> stream, and
 * the producer's stream from a DLPack exchange API. include/dlsync/env.h has
 * the contract.
 *
 * The table is a sorted array of entries, found by binary search and grown by
 * doubling. Its header is allocated once per thread and freed at the
 * thread's exit by the layer's thread-exit hook (base/base.h, which runs it
 * before the library's own threads are gone at the unload, so a deleter's
 * table on a reclaimer is freed too); the entries array is reallocated
 * behind it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "interop/dlpack_abi.h"
#include "interop/env_hooks.h"
#include "order/order.h"

#define ENV_FIRST_CAPACITY 8u
/* prev_api links followed before giving up (a cycle, or a very long chain). */
#define ENV_MAX_API_CHAIN 16

typedef struct env_entry {
  uint64_t key; /* device type in the high half, device id in the low half */
  void *stream;
} env_entry;

typedef struct env_table {
  size_t count;
  size_t capacity;
  env_entry *entries;
} env_table;

static _Thread_local env_table *tls_table;
static dlsync__env_realloc_fn env_realloc = dlsync__realloc;

static void table_free(env_table *t) {
  if (t == NULL)
    return;
  dlsync__free(t->entries);
  dlsync__free(t);
}

/* The thread-exit hook (base/base.h): runs on the exiting thread, whose
 * thread-local storage is still there. */
static void table_thread_exit(dlsync__thread *thread) {
  env_table *t = tls_table;
  (void)thread;
  tls_table = NULL;
  table_free(t);
}

void dlsync__env_set_realloc(dlsync__env_realloc_fn fn) {
  env_realloc = fn != NULL ? fn : dlsync__realloc;
}

size_t dlsync__env_capacity(void) {
  return tls_table != NULL ? tls_table->capacity : 0;
}

static dlsync_status check_device(int32_t device_type, int32_t device_id, const char *fn) {
  if (device_type < 1)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "%s: device_type %d is not a DLPack device type (DLDeviceType starts at "
                        "kDLCPU = 1; kDLCUDA is 2)",
                        fn, (int)device_type);
  if (device_id < 0)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "%s: device_id %d is negative", fn,
                        (int)device_id);
  return DLSYNC_SUCCESS;
}

static uint64_t key_of(int32_t device_type, int32_t device_id) {
  return ((uint64_t)(uint32_t)device_type << 32) | (uint64_t)(uint32_t)device_id;
}

/* The index of key in t, or where it would go (*found false). */
static size_t table_find(const env_table *t, uint64_t key, bool *found) {
  size_t lo = 0, hi = t->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->entries[mid].key < key)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = lo < t->count && t->entries[lo].key == key;
  return lo;
}

/* The calling thread's table, created and registered on first use. */
static dlsync_status table_get(env_table **out) {
  dlsync_status st = DLSYNC_SUCCESS;
  env_table *t = tls_table;
  if (t != NULL) {
    *out = t;
    return DLSYNC_SUCCESS;
  }
  *out = NULL;
  dlsync__hooks_set(DLSYNC__HOOK_INTEROP, table_thread_exit, NULL);
  if (!dlsync__thread_exit_arm(dlsync__thread_get())) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                      "env streams: no thread-exit hook for the per-thread table "
                      "(pthread_key_create or pthread_setspecific failed, or dlsync is being "
                      "unloaded)");
    goto cleanup;
  }
  t = dlsync__calloc(1, sizeof *t);
  if (t == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "env streams: out of memory for the table");
    goto cleanup;
  }
  tls_table = t;
  *out = t;
  t = NULL;
cleanup:
  dlsync__free(t);
  return st;
}

static dlsync_status table_reserve(env_table *t, size_t need) {
  size_t cap = t->capacity != 0 ? t->capacity : ENV_FIRST_CAPACITY;
  env_entry *grown;
  if (need <= t->capacity)
    return DLSYNC_SUCCESS;
  while (cap < need) {
    if (cap > SIZE_MAX / 2 / sizeof(env_entry))
      return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY, "env streams: table of %zu entries", need);
    cap *= 2;
  }
  grown = env_realloc(t->entries, cap * sizeof(env_entry));
  if (grown == NULL)
    return dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                        "env streams: out of memory growing the table to %zu entries", cap);
  t->entries = grown;
  t->capacity = cap;
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_env_stream_set(void **previous, int32_t device_type, int32_t device_id,
                                    void *stream) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_env_stream_set");
  dlsync_status st = DLSYNC_SUCCESS;
  env_table *t = tls_table;
  uint64_t key = key_of(device_type, device_id);
  bool found = false;
  size_t at = 0;
  void *old = NULL;
  DLSYNC_TRY(check_device(device_type, device_id, "dlsync_env_stream_set"));
  if (t != NULL) {
    at = table_find(t, key, &found);
    old = found ? t->entries[at].stream : NULL;
  }
  if (found) {
    if (stream != NULL) {
      t->entries[at].stream = stream;
    } else {
      memmove(&t->entries[at], &t->entries[at + 1], (t->count - at - 1) * sizeof(env_entry));
      t->count--;
    }
    goto cleanup;
  }
  if (stream == NULL)
    goto cleanup; /* unset already */
  DLSYNC_TRY(table_get(&t));
  DLSYNC_TRY(table_reserve(t, t->count + 1));
  at = table_find(t, key, &found);
  memmove(&t->entries[at + 1], &t->entries[at], (t->count - at) * sizeof(env_entry));
  t->entries[at].key = key;
  t->entries[at].stream = stream;
  t->count++;
cleanup:
  if (previous != NULL)
    *previous = old;
  return st;
}

dlsync_status dlsync_env_stream_get(void **out, int32_t device_type, int32_t device_id) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_env_stream_get");
  dlsync_status st = DLSYNC_SUCCESS;
  const env_table *t = tls_table;
  bool found = false;
  size_t at;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_env_stream_get: out is NULL");
  *out = NULL;
  DLSYNC_TRY(check_device(device_type, device_id, "dlsync_env_stream_get"));
  if (t == NULL)
    goto cleanup;
  at = table_find(t, key_of(device_type, device_id), &found);
  if (found)
    *out = t->entries[at].stream;
cleanup:
  return st;
}

void dlsync_env_stream_clear(void) {
  env_table *t = tls_table;
  if (t == NULL)
    return;
  tls_table = NULL;
  table_free(t);
}

/* ---- the producer's stream from its DLPackExchangeAPI ---- */

static const unsigned char *api_next(const unsigned char *h) {
  const unsigned char *prev = NULL;
  memcpy(&prev, h + offsetof(dlsync__dlpack_api_header, prev_api), sizeof prev);
  return prev;
}

/* The first struct of the prev_api chain whose major version is 1. */
static dlsync_status api_pick(const unsigned char **out, const unsigned char *api) {
  char seen[256] = "";
  size_t used = 0;
  int hops = 0;
  const unsigned char *h = api;
  *out = NULL;
  for (; h != NULL && hops < ENV_MAX_API_CHAIN; h = api_next(h), hops++) {
    dlsync__dlpack_version v;
    int n;
    memcpy(&v, h + offsetof(dlsync__dlpack_api_header, version), sizeof v);
    if (v.major == DLSYNC_DLPACK_MAJOR_VERSION) {
      *out = h;
      return DLSYNC_SUCCESS;
    }
    n = snprintf(seen + used, sizeof seen - used, "%s%u.%u", hops == 0 ? "" : ", ",
                 (unsigned)v.major, (unsigned)v.minor);
    if (n > 0 && (size_t)n < sizeof seen - used)
      used += (size_t)n;
  }
  return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "the DLPackExchangeAPI at %p is of DLPack version %s%s; dlsync reads major "
                      "version %u only (its layout is that of dlpack.h %u.%u)",
                      (const void *)api, seen,
                      h != NULL ? " (and its prev_api chain goes on past 16 links)"
                                : (hops > 1 ? " along its prev_api chain" : ""),
                      DLSYNC_DLPACK_MAJOR_VERSION, DLSYNC_DLPACK_MAJOR_VERSION,
                      DLSYNC_DLPACK_MINOR_VERSION);
}

dlsync_status dlsync_env_stream_from_exchange_api(void **out, const struct DLPackExchangeAPI *api,
                                                  int32_t device_type, int32_t device_id) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_env_stream_from_exchange_api");
  dlsync_status st = DLSYNC_SUCCESS;
  const unsigned char *h = NULL;
  dlsync__dlpack_current_work_stream_fn fn = NULL;
  void *stream = NULL;
  int rc;
  if (out == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_env_stream_from_exchange_api: out is NULL");
  *out = NULL;
  if (api == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "dlsync_env_stream_from_exchange_api: the DLPackExchangeAPI is NULL");
    goto cleanup;
  }
  DLSYNC_TRY(check_device(device_type, device_id, "dlsync_env_stream_from_exchange_api"));
  DLSYNC_TRY(api_pick(&h, (const unsigned char *)api));
  memcpy(&fn, h + offsetof(dlsync__dlpack_exchange_api, current_work_stream), sizeof fn);
  if (fn == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "the DLPackExchangeAPI at %p has no current_work_stream (NULL), which "
                      "DLPack requires",
                      (const void *)h);
    goto cleanup;
  }
  rc = fn(device_type, device_id, &stream);
  if (rc != 0) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "the producer's DLPackExchangeAPI.current_work_stream(device_type %d, "
                      "device_id %d) failed (returned %d); a Python producer has set a Python "
                      "exception saying why: raise or clear it",
                      (int)device_type, (int)device_id, rc);
    goto cleanup;
  }
  *out = stream;
cleanup:
  return st;
}
