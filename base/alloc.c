/* The one allocation function of the library. Every module allocates through
 * dlsync__malloc and friends, so that a test can make any allocation fail
 * (dlsync__alloc_fail_nth) as it makes any driver call fail. When no fault is
 * armed the cost is one relaxed atomic load. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dlsync/private/base.h"

/* Allocations left before the one that fails; 0: none armed. */
static atomic_uint fail_countdown;

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
  return alloc_fails() ? NULL : malloc(size);
}

void *dlsync__calloc(size_t count, size_t size) {
  return alloc_fails() ? NULL : calloc(count, size);
}

void *dlsync__realloc(void *ptr, size_t size) {
  return alloc_fails() ? NULL : realloc(ptr, size);
}

char *dlsync__strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *copy = dlsync__malloc(n);
  if (copy != NULL)
    memcpy(copy, s, n);
  return copy;
}

void dlsync__free(void *ptr) {
  free(ptr);
}

void dlsync__alloc_fail_nth(unsigned n) {
  atomic_store_explicit(&fail_countdown, n, memory_order_relaxed);
}

bool dlsync__alloc_fail_pending(void) {
  return atomic_load_explicit(&fail_countdown, memory_order_relaxed) != 0;
}
