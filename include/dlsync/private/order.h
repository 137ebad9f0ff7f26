/* dlsync private: the ordering layer (order/): the context, whose struct only
 * this layer and the one above see, and the release book. Never installed. */
#ifndef DLSYNC_PRIVATE_ORDER_H
#define DLSYNC_PRIVATE_ORDER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dlsync/dlsync.h"
#include "dlsync/private/event.h"
#include "dlsync/private/graph.h"
#include "dlsync/private/stream.h"
#include "dlsync/private/table.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- context (order/context.c) ---- */

struct dlsync_context {
  const dlsync__driver *drv;
  uint32_t caps; /* dlsync_capability bits */
  int driver_version;
  bool is_default;
  dlsync__pools pools; /* one per CUDA context */
  struct dlsync__release_book *releases;
};

/* Opens a checked lane for a call that needs its pool (fence signal,
 * release): reads the legacy stream first, finds the pool (the stream's
 * context, asked of the driver; for a graph lane the calling thread's
 * current context, `graph_what` saying why it is needed), then reads the
 * lane. The exchange opens its two lanes the same way (exchange.c,
 * order_lanes), with the per-thread memo. */
dlsync_status dlsync__lane_open(dlsync__lane_now *out, dlsync__pool **pool, dlsync_context *ctx,
                                dlsync_lane *lane, const char *role, const char *graph_what);

/* ---- releases (order/release.c) ---- */

typedef struct dlsync__release_book dlsync__release_book;
dlsync_status dlsync__release_book_new(dlsync__release_book **out);
/* Waits for the eager releases; DLSYNC_ERROR_BUSY (with a message) when
 * graphs still own some. Drops the context's reference either way. */
dlsync_status dlsync__release_book_close(dlsync__release_book *book);

/* Test hook: a context over a driver table the caller owns (the fake). The
 * table must outlive the context. */
dlsync_status dlsync__context_create_with_driver(dlsync_context **out,
                                                 const dlsync_context_config *config,
                                                 const dlsync__driver *drv);

uint32_t dlsync__capabilities_of(const dlsync__driver *d);

#ifdef __cplusplus
}
#endif

#endif
