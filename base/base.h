/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the base layer (base/). Never installed.
 *
 * The bottom of the library: status and the per-thread last error, the one
 * allocation function, the decision log, and the per-thread block. It uses no
 * other part of dlsync and knows nothing of CUDA.
 *
 * Habits: internal non-static names start with dlsync__; one cleanup label per
 * function; failures go through dlsync__fail* which set the thread's message
 * and return the status, so `st = dlsync__fail(...); goto cleanup;` is the
 * only way out of a function that failed (DLSYNC_TRY and driver.h's DLSYNC_CU
 * do that).
 */
#ifndef DLSYNC_PRIVATE_BASE_H
#define DLSYNC_PRIVATE_BASE_H

#include <stdarg.h>
#ifndef __cplusplus /* C++ tests include this header; gcc 13's C header refuses C++ */
#include <stdatomic.h>
#endif
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DLSYNC__PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#define DLSYNC__LIKELY(x) __builtin_expect(!!(x), 1)
#define DLSYNC__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define DLSYNC__INLINE inline __attribute__((always_inline))
#define DLSYNC__NOINLINE __attribute__((noinline))
#define DLSYNC__COLD __attribute__((cold, noinline))
/* On the declaration of a variable the hot paths read: the compiler then
 * knows it is in this library (every symbol is hidden, CMakeLists.txt) and
 * reads it in one instruction, not through its address in the GOT first. */
#define DLSYNC__HIDDEN __attribute__((visibility("hidden")))
#else
#define DLSYNC__COLD
#define DLSYNC__HIDDEN
#define DLSYNC__INLINE inline
#define DLSYNC__NOINLINE
#define DLSYNC__PRINTF(fmt, args)
#define DLSYNC__LIKELY(x) (x)
#define DLSYNC__UNLIKELY(x) (x)
#endif

/* ---- errors (base/status.c) ---- */

/* Sets the thread's last error (status, message, no driver result) and
 * returns status. */
DLSYNC__COLD dlsync_status dlsync__fail(dlsync_status status, const char *fmt, ...)
    DLSYNC__PRINTF(2, 3);

/* The general form: the message is site->prefix (may be NULL), then fmt,
 * then site->suffix (may be NULL); site->driver_result is what
 * dlsync_last_driver_result reports. The driver layer builds its messages
 * with it. */
typedef struct dlsync__fail_site {
  dlsync_status status;
  int driver_result;
  const char *prefix;
  const char *suffix;
} dlsync__fail_site;
DLSYNC__COLD dlsync_status dlsync__fail_with(const dlsync__fail_site *site, const char *fmt,
                                             va_list ap) DLSYNC__PRINTF(2, 0);

/* dlsync__fail with a driver result: a failure seen elsewhere (another
 * thread, an earlier call) reported again with its CUresult. */
DLSYNC__COLD dlsync_status dlsync__fail_result(dlsync_status status, int driver_result,
                                               const char *fmt, ...) DLSYNC__PRINTF(3, 4);

/* The thread's last failure was a driver call that queues nothing (a
 * capture query, cuStreamGetCtx, a dependency update the driver refused),
 * made before anything else was queued: an exchange's end that failed so
 * may be retried. Called right after the dlsync__fail* that reported it;
 * every dlsync__fail* clears it. */
void dlsync__fail_nothing_queued(void);
bool dlsync__last_error_nothing_queued(void);
/* Appends text to the thread's last error message (cut at its size). */
void dlsync__last_error_append(const char *text);

/* ---- allocation (base/alloc.c) ---- */

/* Every allocation of the library goes through these (malloc, calloc,
 * realloc, strdup semantics; dlsync__free(NULL) is a no-op). */
void *dlsync__malloc(size_t size);
void *dlsync__calloc(size_t count, size_t size);
void *dlsync__realloc(void *ptr, size_t size);
char *dlsync__strdup(const char *s);
void dlsync__free(void *ptr);
/* A large zeroed block whose pages the system supplies, zeroed, only when
 * first touched (an anonymous mapping: page-aligned; malloc would zero,
 * and so touch, a block it reuses): resident memory grows as the block is
 * used, not when it is made. Failed and counted as the others; freed with
 * dlsync__free_untouched and the same size. */
void *dlsync__alloc_untouched(size_t size);
void dlsync__free_untouched(void *ptr, size_t size);

/* *out = a * b; false (and *out untouched) when the product does not fit a
 * size_t. Every size computed from a count goes through it. */
static inline bool dlsync__mul_size(size_t a, size_t b, size_t *out) {
  if (b != 0 && a > SIZE_MAX / b)
    return false;
  *out = a * b;
  return true;
}
/* The most elements of `size` bytes one array can hold: no object is larger
 * than PTRDIFF_MAX bytes. */
static inline size_t dlsync__max_count(size_t size) {
  return (size_t)PTRDIFF_MAX / size;
}

/* Bytes of the library's own allocations alive now (the bench's memory
 * figures), counted from the first dlsync__alloc_count_start on: blocks
 * allocated before it are not counted, so call it before the library is
 * used (a block freed later that was never counted would make the figure
 * wrong, not unsafe). */
void dlsync__alloc_count_start(void);
size_t dlsync__alloc_live_bytes(void);
/* Test hook: the nth allocation from now (1: the next one) returns NULL, once;
 * 0 disarms. Any thread's allocation counts. */
void dlsync__alloc_fail_nth(unsigned n);
/* True while an armed allocation fault has not fired. */
bool dlsync__alloc_fail_pending(void);

/* ---- the decision log (base/log.c) ---- */

/* DLSYNC_DEBUG=VERSION|WARN|INFO|TRACE, DLSYNC_DEBUG_FILE=path (%p: pid, %h:
 * host name); see docs/design.md. Each level writes what the ones before it
 * do. VERSION: one line, once, when the log is first asked for (dlsync's
 * version and the libdlsync file). WARN: what is likely wrong (no CUDA
 * driver, once). INFO: the driver loaded, contexts created and destroyed,
 * every error set through dlsync__fail*. TRACE: one line per decision
 * (order, exchange begin and end, fence signal and wait, release) naming the
 * row of the decision table, the streams, capture ids and nodes added. */
enum {
  DLSYNC__LOG_OFF = 0,
  DLSYNC__LOG_VERSION = 1,
  DLSYNC__LOG_WARN = 2,
  DLSYNC__LOG_INFO = 3,
  DLSYNC__LOG_TRACE = 4
};

#ifndef __cplusplus /* C11 atomics; the C++ tests include this header but never log */
/* -1 until the environment is read, then the level. */
extern DLSYNC__HIDDEN atomic_int dlsync__log_level_;
bool dlsync__log_on_slow(int level);

/* Whether lines of `level` are written: off costs one predictable branch. */
static inline bool dlsync__log_on(int level) {
  if (DLSYNC__LIKELY(atomic_load_explicit(&dlsync__log_level_, memory_order_relaxed) == 0))
    return false;
  return dlsync__log_on_slow(level);
}

/* Writes one line (no driver call, no allocation, one write(2)). */
void dlsync__log(int level, const char *fmt, ...) DLSYNC__PRINTF(2, 3);

#define DLSYNC__LOG(level, ...)                  \
  do {                                           \
    if (DLSYNC__UNLIKELY(dlsync__log_on(level))) \
      dlsync__log((level), __VA_ARGS__);         \
  } while (0)

/* ---- a spin lock, for sections of a few loads and stores ---- */

static inline void dlsync__spin_lock(atomic_int *l) {
  for (;;) {
    if (atomic_exchange_explicit(l, 1, memory_order_acquire) == 0)
      return;
    while (atomic_load_explicit(l, memory_order_relaxed) != 0) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
  }
}

static inline void dlsync__spin_unlock(atomic_int *l) {
  atomic_store_explicit(l, 0, memory_order_release);
}
#endif

/* ---- the calling thread (base/thread.c) ---- */

/* Everything dlsync keeps per thread for the hot path, in one thread-local
 * block (one access through __tls_get_addr in the shared library). The base
 * holds each module's slot without knowing its type: event/ keeps its
 * stream->pool memo and scratch events in `event` (dlsync__event_thread,
 * event/event.h, which checks that it fits); graph/ the holds of the
 * thread's last captures and its batches of events for built graphs in
 * `graph` (graph/graph.h checks it); order/ its spare exchange record,
 * its release rings and what its last calls found captured in `order`
 * (order/order.h checks it). */
#define DLSYNC__THREAD_EVENT_BYTES 400
#define DLSYNC__THREAD_GRAPH_BYTES 1504
#define DLSYNC__THREAD_ORDER_BYTES 56

#if defined(__GNUC__)
/* A type that may view another object's bytes (the slots below). */
#define DLSYNC__MAY_ALIAS __attribute__((may_alias))
#else
#define DLSYNC__MAY_ALIAS
#endif

typedef struct dlsync__thread {
  /* order/: its per-thread block, first, beside event/'s memo keys: every
   * fast path reads both (no alignment beyond 8 is asked of thread-local
   * storage: a library loaded by dlopen gets its block from the loader's
   * allocator). */
  union {
    unsigned char bytes[DLSYNC__THREAD_ORDER_BYTES];
    void *align_p;
    uint64_t align_u;
  } order;
  bool exit_armed; /* base/: the key is set for this thread (dlsync__thread_exit_arm) */
  union {
    unsigned char bytes[DLSYNC__THREAD_EVENT_BYTES];
    void *align_p;
    uint64_t align_u;
  } event; /* event/: its per-thread block */
  union {
    unsigned char bytes[DLSYNC__THREAD_GRAPH_BYTES];
    void *align_p;
    uint64_t align_u;
  } graph; /* graph/: the holds of its last captures, its batches for built graphs */
} dlsync__thread;

/* Out of line on purpose: inlined, the compiler asks for the thread-local
 * address again at each use (a __tls_get_addr call each, seen in the
 * memo scan); one call per entry point is cheaper. */
dlsync__thread *dlsync__thread_get(void);

/* ---- thread exit and unload, in one written order (base/thread.c) ----
 *
 * The library has one pthread key and one destructor, both here. A layer
 * that keeps something per thread, or for the process, registers its hooks
 * in its slot below (dlsync__hooks_set, before it first needs them; setting
 * them again is harmless), and they run in the slots' order:
 *
 *   At the exit of a thread that armed the key (dlsync__thread_exit_arm):
 *   each layer's thread-exit hook, top layer first: interop/ (the thread's
 *   env-stream table), order/ (its release rings, its spare exchange
 *   record), graph/ (its batches of events for built graphs).
 *
 *   At the unload of this copy of the library (at exit, or at the dlclose
 *   of a library that embeds libdlsync.a):
 *   1. the threads dlsync started (order/'s reclaimers and janitor) are
 *      stopped and joined, so that their own exit hooks run while every
 *      layer's tables and the key are still there;
 *   2. each layer's unload hook, top layer first: interop/, order/ (the
 *      exchange records, fence memory: freed at a dlclose, kept at exit,
 *      dlsync__unload_at_exit below), graph/;
 *   3. the key is deleted: a thread still running after that no longer runs
 *      the exit hooks (what it holds stays, a leak only then), and no thread
 *      arms the key again.
 * In a child of fork() dlsync's threads do not exist: the hooks are told by
 * DLSYNC__IN_FORKED_CHILD and do what is safe there. */
typedef enum dlsync__hook_slot {
  DLSYNC__HOOK_THREADS = 0, /* order/: its threads stopped and joined (unload only) */
  DLSYNC__HOOK_INTEROP,     /* interop/: the env-stream tables */
  DLSYNC__HOOK_RINGS,       /* order/: the release rings */
  DLSYNC__HOOK_RECORDS,     /* order/: exchange records (a thread's spare; the pool) */
  DLSYNC__HOOK_FENCES,      /* order/: fence memory (unload only) */
  DLSYNC__HOOK_GRAPH,       /* graph/: the batches of events for built graphs */
  DLSYNC__HOOKS
} dlsync__hook_slot;

typedef void (*dlsync__thread_exit_fn)(dlsync__thread *t);
typedef void (*dlsync__unload_fn)(void);

/* Registers slot's hooks (either may be NULL). */
void dlsync__hooks_set(dlsync__hook_slot slot, dlsync__thread_exit_fn at_thread_exit,
                       dlsync__unload_fn at_unload);
/* In an unload hook: true when the unload is the process's exit(), false at
 * the dlclose of a library embedding libdlsync.a. At exit another thread may
 * still be inside a dlsync call (nothing stops it), and the system takes the
 * process's memory back anyway: an unload hook then keeps what a call in
 * progress may touch (the exchange records, fence memory) and frees it only
 * at a dlclose, when no call of that copy can be in progress. */
bool dlsync__unload_at_exit(void);

/* Arms the key for the calling thread (t, its block): its exit runs the
 * thread-exit hooks. False when it cannot be (pthread_key_create or
 * pthread_setspecific failed, or the library is being unloaded): the caller
 * then keeps nothing per thread that only the hook would give back. */
bool dlsync__thread_exit_arm(dlsync__thread *t);

/* ---- fork() (base/thread.c) ---- */

#ifndef __cplusplus
/* Set in a child of fork() (a pthread_atfork handler): CUDA cannot be used
 * there, and dlsync's own threads were not copied, so every entry point that
 * can fail refuses with DLSYNC_ERROR_NO_DRIVER (dlsync__fail_forked) and the
 * others do nothing. A plain bool, not an atomic: it is written once, in the
 * child, while the child has one thread (the one that forked), and every
 * thread the child starts later is started after the write; in the parent it
 * is never written. So no access races, and the test is one compare with
 * memory (gcc makes a load and a test of an atomic). */
extern DLSYNC__HIDDEN bool dlsync__forked;
#define DLSYNC__IN_FORKED_CHILD() DLSYNC__UNLIKELY(dlsync__forked)
#endif

/* ---- an asymmetric fence (base/thread.c) ----
 * A thread that publishes often and a thread that rarely goes to sleep
 * (a Dekker pair: each stores, then loads what the other stored) need a
 * full fence between the store and the load on each side. The frequent
 * side may use dlsync__fence_light (a compiler barrier: no instruction)
 * where the rare side calls dlsync__fence_heavy, which makes every thread
 * of the process that runs now pass a full fence (Linux membarrier,
 * private expedited). dlsync__fence_heavy_ready registers the process
 * once; where it returns false (no membarrier, or refused), the light side
 * must use a sequentially consistent store and load instead. */
bool dlsync__fence_heavy_ready(void);
/* False when the system refused it (the rare side must then not rely on it). */
bool dlsync__fence_heavy(void);
#ifndef __cplusplus
#define dlsync__fence_light() atomic_signal_fence(memory_order_seq_cst)
#endif

/* DLSYNC_ERROR_NO_DRIVER with a message naming fn and why. */
DLSYNC__COLD dlsync_status dlsync__fail_forked(const char *fn);

/* The first line of an entry point that returns a status. */
#define DLSYNC__REFUSE_IN_FORKED_CHILD(fn) \
  do {                                     \
    if (DLSYNC__IN_FORKED_CHILD())         \
      return dlsync__fail_forked(fn);      \
  } while (0)

#define DLSYNC_TRY(expr)                        \
  do {                                          \
    st = (expr);                                \
    if (DLSYNC__UNLIKELY(st != DLSYNC_SUCCESS)) \
      goto cleanup;                             \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif
