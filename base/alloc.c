/* SPDX-License-Identifier: Apache-2.0 */
/* The one allocation function of the library. Every module allocates through
 * dlsync__malloc and friends, so that a test can make any allocation fail
 * (dlsync__alloc_fail_nth) as it makes any driver call fail. When no fault is
 * armed the cost is one relaxed atomic load. */
#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/base.h"

/* Allocations left before the one that fails; 0: none armed. */
static atomic_uint fail_countdown;

/* Bytes the library holds now (malloc_usable_size of each block), counted
 * only once dlsync__alloc_count_start has run (the bench's memory figures):
 * off, the cost is one relaxed load per allocation. */
static atomic_bool counting;
static atomic_size_t live_bytes;

static void *counted(void *p) {
  if (DLSYNC__UNLIKELY(atomic_load_explicit(&counting, memory_order_relaxed)) && p != NULL)
    atomic_fetch_add_explicit(&live_bytes, malloc_usable_size(p), memory_order_relaxed);
  return p;
}

static void uncount(void *p) {
  if (DLSYNC__UNLIKELY(atomic_load_explicit(&counting, memory_order_relaxed)) && p != NULL)
    atomic_fetch_sub_explicit(&live_bytes, malloc_usable_size(p), memory_order_relaxed);
}

void dlsync__alloc_count_start(void) {
  atomic_store_explicit(&counting, true, memory_order_relaxed);
}

size_t dlsync__alloc_live_bytes(void) {
  return atomic_load_explicit(&live_bytes, memory_order_relaxed);
}

static bool alloc_fails(void) {
  unsigned n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
  while (DLSYNC__UNLIKELY(n != 0)) {
    if (atomic_compare_exchange_weak_explicit(&fail_countdown, &n, n - 1, memory_order_relaxed,
                                              memory_order_relaxed))
      return n == 1;
  }
  return false;
}

void *dlsync__malloc(size_t size) {
  return alloc_fails() ? NULL : counted(malloc(size));
}

void *dlsync__calloc(size_t count, size_t size) {
  return alloc_fails() ? NULL : counted(calloc(count, size));
}

void *dlsync__realloc(void *ptr, size_t size) {
  size_t old;
  void *grown;
  if (alloc_fails())
    return NULL;
  if (DLSYNC__LIKELY(!atomic_load_explicit(&counting, memory_order_relaxed)))
    return realloc(ptr, size);
  old = ptr != NULL ? malloc_usable_size(ptr) : 0;
  grown = realloc(ptr, size);
  if (grown == NULL && size != 0)
    return NULL; /* ptr is untouched */
  atomic_fetch_sub_explicit(&live_bytes, old, memory_order_relaxed);
  return counted(grown);
}

char *dlsync__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = dlsync__malloc(n);
  if (copy != NULL)
    memcpy(copy, s, n);
  return copy;
}

void dlsync__free(void *ptr) {
  uncount(ptr);
  free(ptr);
}

void *dlsync__alloc_untouched(size_t size) {
  void *p;
  if (alloc_fails())
    return NULL;
  p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (DLSYNC__UNLIKELY(atomic_load_explicit(&counting, memory_order_relaxed)))
    atomic_fetch_add_explicit(&live_bytes, size, memory_order_relaxed);
  return p;
}

void dlsync__free_untouched(void *ptr, size_t size) {
  if (ptr == NULL)
    return;
  if (DLSYNC__UNLIKELY(atomic_load_explicit(&counting, memory_order_relaxed)))
    atomic_fetch_sub_explicit(&live_bytes, size, memory_order_relaxed);
  (void)munmap(ptr, size);
}

void dlsync__alloc_fail_nth(unsigned n) {
  atomic_store_explicit(&fail_countdown, n, memory_order_relaxed);
}

bool dlsync__alloc_fail_pending(void) {
  return atomic_load_explicit(&fail_countdown, memory_order_relaxed) != 0;
}
