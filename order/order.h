/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the ordering layer (order/): the context, whose struct only
 * this layer and the one above see, and the release book. Never installed. */
#ifndef DLSYNC_PRIVATE_ORDER_H
#define DLSYNC_PRIVATE_ORDER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dlsync/dlsync.h"
#include "event/event.h"
#include "graph/body.h"
#include "graph/graph.h"
#include "stream/stream.h"
#include "order/table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- this layer's part of the calling thread's block (base/base.h) ---- */

#define DLSYNC__THREAD_RINGS 4

typedef struct DLSYNC__MAY_ALIAS dlsync__order_thread {
  void *spare; /* one free exchange record (handles.c) */
  /* its release rings (release_rings.c), one per device below
   * DLSYNC__THREAD_RINGS; NULL until it releases on that device */
  void *rings[DLSYNC__THREAD_RINGS];
  /* the capture an end after a begin that found both streams in one capture
   * checks the consumer against (set by that end) */
  uint64_t end_capture_id;
  bool spare_keyed;   /* the thread-exit hook that gives `spare` back is set */
  bool end_capture;   /* this thread's last exchange end found its consumer capturing */
  bool then_capture;  /* its last begin or order found the later lane capturing */
  bool first_capture; /* ... and found the earlier one capturing too */
} dlsync__order_thread;

_Static_assert(sizeof(dlsync__order_thread) <= DLSYNC__THREAD_ORDER_BYTES,
               "order/'s per-thread block does not fit its slot in dlsync__thread");

static inline dlsync__order_thread *dlsync__order_thread_of(dlsync__thread *t) {
  return (dlsync__order_thread *)(void *)t->order.bytes;
}

/* ---- context (order/context.c) ---- */

struct dlsync_context {
  const dlsync__driver *drv;
  uint32_t caps; /* dlsync_capability bits */
  int driver_version;
  bool is_default;
  dlsync__pools pools; /* one per CUDA context */
  struct dlsync__release_book *releases;
  atomic_uint refs;          /* the caller's (until destroy) + one per live fence */
  atomic_size_t live_fences; /* fences signalled on it and not released yet */
  atomic_bool destroyed;     /* dlsync_context_destroy has run */
  dlsync__bodies bodies;     /* conditional bodies declared (graph/body.h) */
};

/* A fence keeps its context's memory (and driver table) alive past
 * dlsync_context_destroy; the last unref frees it. */
void dlsync__context_ref(dlsync_context *ctx);
void dlsync__context_unref(dlsync_context *ctx);
/* The same from a thread where no CUDA call may be made (a fence's last
 * release): the context is freed, and its orphans destroyed, on the
 * janitor. */
void dlsync__context_unref_elsewhere(dlsync_context *ctx);

/* Ends, ordering nothing, the exchanges of ctx still begun (their handles
 * become invalid); returns how many. For dlsync_context_destroy
 * (order/handles.c). */
size_t dlsync__exchanges_abandon(const dlsync_context *ctx);

/* The one lane-open helper: opens checked lanes for a call (one lane for a
 * fence signal or a release, two for an order or exchange): reads a legacy
 * stream lane before anything else touches it, finds the pool (the context
 * of the first stream lane, from the per-thread memo when `memo`, else asked
 * of the driver; for graph lanes only, the calling thread's current context,
 * `graph_what` saying why it is needed; none for two lanes of one graph),
 * then reads the lanes (a capture's dependency array is valid only until the
 * next call on its stream). `read`: out->a and out->b hold the lanes as the
 * exchange's fast path read them (two distinct stream lanes, neither a
 * special handle), not read again, and out->pool the memo's pool for a's
 * stream when the fast path had one (NULL: looked up). */
typedef struct dlsync__lanes_opened {
  dlsync__lane_now a, b; /* b: when a second lane was given */
  dlsync__pool *pool;
  bool from_memo;       /* the pool came from the memo, not checked yet */
  CUstream pool_stream; /* the stream whose context the pool is, if any */
  const char *pool_role;
  bool read; /* in: a and b were read by the exchange's fast path */
  bool same; /* out (the exchange's general path): the two lanes are one stream */
} dlsync__lanes_opened;

/* What a call asks of dlsync__lanes_open: the lanes' roles for messages
 * ("producer", "signalling", ...; rb unused without a second lane), why a
 * graph lane needs the thread's current context, and `memo`: look the pool
 * up in the per-thread memo (the exchange's general path). */
typedef struct dlsync__lanes_ask {
  const char *ra, *rb;
  const char *graph_what;
  bool memo;
} dlsync__lanes_ask;

dlsync_status dlsync__lanes_open_streams(dlsync__lanes_opened *out, dlsync_context *ctx,
                                         dlsync_lane *a, dlsync_lane *b,
                                         const dlsync__lanes_ask *ask);
/* `out->read` is an input (set it false unless the exchange's fast path read
 * the lanes). */
static inline dlsync_status dlsync__lanes_open(dlsync__lanes_opened *out, dlsync_context *ctx,
                                               dlsync_lane *a, dlsync_lane *b,
                                               const dlsync__lanes_ask *ask) {
  if (out->read) {
    /* What is left: a's pool, the fast path's memo answer (checked by its
     * first use) or looked up, which may ask the driver about the stream: a
     * capture's long dependency array is read again then. */
    dlsync_status st = DLSYNC_SUCCESS;
    out->pool_stream = a->stream;
    out->pool_role = ask->ra;
    if (DLSYNC__LIKELY(out->pool != NULL)) {
      out->from_memo = true;
      return DLSYNC_SUCCESS;
    }
    st = dlsync__pool_for_stream(&out->pool, &out->from_memo, &ctx->pools, a->stream, ask->ra);
    if (st == DLSYNC_SUCCESS)
      st = dlsync__lane_refresh(&out->a, ctx->drv);
    if (st == DLSYNC_SUCCESS)
      st = dlsync__lane_refresh(&out->b, ctx->drv);
    return st;
  }
  if (a->kind == DLSYNC_LANE_GRAPH && b != NULL && b->kind == DLSYNC_LANE_GRAPH) {
    /* Two graph lanes: nothing to ask the driver about them; the pool is
     * that of the thread's current context (none for one graph: edges). */
    dlsync__lane_read_built(&out->a, a, ask->ra);
    dlsync__lane_read_built(&out->b, b, ask->rb);
    out->pool = NULL;
    out->from_memo = false;
    out->pool_stream = NULL;
    out->pool_role = NULL;
    return a->graph == b->graph
               ? DLSYNC_SUCCESS
               : dlsync__pool_for_current(&out->pool, &ctx->pools, ask->graph_what);
  }
  /* Any lane on a stream (order/context.c). */
  return dlsync__lanes_open_streams(out, ctx, a, b, ask);
}

/* ---- releases (order/release*.c; order/release_int.h says which file) ---- */

typedef struct dlsync__release_book dlsync__release_book;
dlsync_status dlsync__release_book_new(dlsync__release_book **out);
/* What a context's destroy leaves to run later. */
typedef struct dlsync__release_left {
  size_t queued;      /* eager, not waited for: destroyed from a deleter */
  size_t blocked;     /* eager, waiting for the reclaimer to enter RELAXED mode */
  size_t graph_owned; /* run when their graphs go */
  bool from_deleter;  /* the destroy runs in a deleter, on a reclaimer */
} dlsync__release_left;
/* Waits for the eager releases (not from a deleter: those queued behind it
 * would wait for it); DLSYNC_ERROR_BUSY, no message set, when some are left
 * (*left says which; left may be NULL). Drops the context's reference either
 * way. */
dlsync_status dlsync__release_book_close(dlsync__release_book *book, dlsync__release_left *left);

/* Runs fn(arg) soon on dlsync's janitor thread (started on first use, joined
 * at unload), for work that must not run where it becomes due (CUDA calls
 * from a host function or a user-object destructor). No CUDA call; false
 * when it cannot (out of memory, no thread, a child of fork(), unloading):
 * then the caller decides. */
bool dlsync__defer(void (*fn)(void *), void *arg);
/* The event layer's orphan waker (dlsync__orphans_set_waker): a collection
 * queued on the janitor. */
void dlsync__release_orphans_wake(void);
/* Eager releases that found their thread's ring full (went to its overflow,
 * an allocation each) since the library was loaded: for the benches. */
extern atomic_size_t dlsync__release_overflowed;

/* ---- test hooks (order/exchange.c, order/context.c) ---- */

/* Test hook: forgets what the calling thread's last calls found
 * (dlsync__thread's end_capture and then_capture), so that a test's exact
 * call counts do not depend on the test before it. */
void dlsync__order_hints_reset(void);

/* Test hook: a context over a driver table the caller owns (the fake). The
 * table must outlive the context. */
dlsync_status dlsync__context_create_with_driver(dlsync_context **out,
                                                 const dlsync_context_config *config,
                                                 const dlsync__driver *drv);

/* The capability bits (dlsync_capability) a driver table offers. */
uint32_t dlsync__capabilities_of(const dlsync__driver *d);

#ifdef __cplusplus
}
#endif

#endif
