/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: fences, for work exported for longer than one exchange.
 *
 * Caller's rules:
 *  - A fence signalled in a graph (a capture or a graph built by hand) is
 *    armed only when that graph is launched: launch it before the graphs
 *    that wait on the fence, and wait from an eager stream only after the
 *    launch (before it, the wait orders nothing).
 *  - Keep the stream a fence was signalled on alive while eager streams may
 *    wait on the fence.
 *  - Release every reference you hold (signal gives one, retain adds one);
 *    the last release must not race with a wait on the fence.
 *  - Every call is legal during capture, in every mode.
 *
 * dlsync_fence_signal marks the work queued so far on a lane; any number of
 * dlsync_fence_wait calls, from any lane and any thread, later order a lane
 * after that work. A fence is reference-counted: signal returns it with one
 * reference; dlsync_fence_retain and dlsync_fence_release add and drop them.
 *
 * What a fence is depends on where it was signalled:
 *  - on an eager stream: an event recorded now. Waits order after that work.
 *  - on a capturing stream or a graph built by hand: an event-record node in
 *    that graph. The fence is ARMED only when the graph is launched, each time
 *    it is launched: a wait from an eager stream orders after the record of
 *    the most recent launch that was issued before the wait, and orders
 *    nothing if the graph was never launched. A wait from another graph (a
 *    capture or a graph built by hand) becomes an event-wait node there, which
 *    takes the event's state when its own graph is launched: launch the
 *    signalling graph first, each time.
 *
 * Waiting from an eager stream on a fence whose capture is still active is
 * DLSYNC_ERROR_CAPTURE_ORDER (the record node has not been launched and
 * cannot be); from that same capture it adds edges only; from another
 * capture or a graph built by hand it adds a wait node as above. To tell
 * whether the capture is still active dlsync asks the stream the fence was
 * signalled on: keep that stream alive while eager streams may wait on the
 * fence (a fence signalled in a capture of the per-thread default stream can
 * be waited on eagerly only from the signalling thread). Whether an ended
 * capture's graph was ever instantiated or launched cannot be seen from
 * here: an eager wait on such a fence is the caller's responsibility.
 *
 * Lifetime: the event behind a fence stays out of the pool while the fence or
 * any graph that waits on it (or records it) exists; graphs hold it through
 * user objects, so releasing the fence while graphs still use it is fine.
 * Threads: signal, wait, retain and release may run concurrently on any
 * fences; a fence's last release must not race with a wait on it.
 *
 * Context: a fence may outlive its context. dlsync_context_destroy then
 * returns DLSYNC_ERROR_BUSY naming the fences; they still work, and keep the
 * context's memory and their event until their last release (context.h).
 *
 * Misuse: fence memory is recycled, never freed, and a released fence is
 * reused only after 64 more have been released. Until then a wait,
 * get_kind, retain or release of a fence whose last reference is gone is
 * DLSYNC_ERROR_INVALID_ARGUMENT (retain returns NULL; release, which returns
 * nothing, ignores it and sets the message). Not detected: a use after the
 * memory was reused by a later signal (it is then that other fence), and a
 * release from a holder that never retained (it drops someone else's
 * reference).
 */
#ifndef DLSYNC_FENCE_H
#define DLSYNC_FENCE_H

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlsync_fence dlsync_fence;

/* Marks the work queued so far on `lane`. A graph lane's frontier becomes the
 * record node; a capturing stream's capture continues after it.
 * Returns: DLSYNC_SUCCESS and *out the fence, with one reference.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT, DLSYNC_ERROR_INVALID_LANE,
 *   DLSYNC_ERROR_CAPTURE_INVALIDATED, DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE,
 *   DLSYNC_ERROR_FOREIGN_DEPENDENCY, DLSYNC_ERROR_DRIVER,
 *   DLSYNC_ERROR_OUT_OF_MEMORY; *out is NULL and nothing is queued.
 * Threads: any thread, any number at once.
 * Capture: legal in every mode; it never breaks a capture. */
DLSYNC_API dlsync_status dlsync_fence_signal(dlsync_fence **out, dlsync_context *ctx,
                                             dlsync_lane *lane);

/* Orders `lane`'s later work after the fence (see above). A graph lane's new
 * frontier is written back.
 * Returns: DLSYNC_SUCCESS, the order in place.
 * Errors: DLSYNC_ERROR_CAPTURE_ORDER (an eager lane after a fence whose
 *   capture is still active), DLSYNC_ERROR_INVALID_ARGUMENT (also a fence
 *   whose last reference is gone, see "Misuse"), the lane errors of
 *   dlsync_order, DLSYNC_ERROR_DRIVER, DLSYNC_ERROR_OUT_OF_MEMORY; nothing is
 *   queued then.
 * Threads: any thread, any number at once, not racing the fence's last
 *   release.
 * Capture: legal in every mode; it never breaks a capture. */
DLSYNC_API dlsync_status dlsync_fence_wait(dlsync_fence *fence, dlsync_lane *lane);

/* Adds a reference.
 * Returns: the fence; NULL for NULL, and for a fence whose last reference is
 *   gone (the message says so).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_fence *dlsync_fence_retain(dlsync_fence *fence);

/* Drops a reference; the last one gives the fence's event back (once no
 * graph holds it). NULL is a no-op; a fence already released is ignored (the
 * message says so).
 * Threads: any thread; the last release must not race with a wait.
 * Capture: legal in every mode. */
DLSYNC_API void dlsync_fence_release(dlsync_fence *fence);

typedef enum dlsync_fence_kind {
  DLSYNC_FENCE_EAGER = 0,    /* an event recorded on an eager stream */
  DLSYNC_FENCE_CAPTURED = 1, /* a record node in a stream capture */
  DLSYNC_FENCE_BUILT = 2,    /* a record node in a graph built by hand */
  DLSYNC_FENCE_IMPORTED = 3  /* another runtime's event (foreign.h) */
} dlsync_fence_kind;

/* Where the fence was signalled.
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL, or a fence whose last
 *   reference is gone).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_fence_get_kind(dlsync_fence_kind *out, const dlsync_fence *fence);

#ifdef __cplusplus
}
#endif

#endif
