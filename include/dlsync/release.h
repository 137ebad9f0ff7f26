/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: stream-ordered release of exported objects.
 *
 * Caller's rules:
 *  - After a successful dlsync_release the object is dlsync's: queue no more
 *    work that reads it on any lane. After a failed one it is still yours.
 *  - A deleter may call CUDA (it never runs on a driver callback thread) but
 *    must not destroy the context or call dlsync_release_flush.
 *  - A slow deleter delays the deleters behind it on the same GPU.
 *  - dlsync_release is legal during capture, in every mode.
 *
 * dlsync_release hands back an object (a DLPack tensor, a buffer, anything
 * with a deleter) on a lane: the deleter runs only after the work queued so
 * far on that lane has finished, and never on the calling thread.
 *
 *  - eager stream: a pooled event is recorded; a reclaimer thread (one per
 *    GPU, bound to CPUs local to it where hwloc can tell) waits for it and
 *    calls the deleter. The releasing thread never blocks: on a stream it
 *    has released on before, it makes one capture status query, asks the
 *    stream's id (a handle can name a new stream while an old one's work
 *    runs) and records one event, then fills a slot of its own ring for
 *    that GPU: no lock, no allocation (a launch path may release after each
 *    launch). The reclaimer takes what is queued as one batch and, as events
 *    of one stream complete in order, waits only for the newest of each
 *    stream's.
 *  - capturing stream or graph built by hand: the graph owns the object (a
 *    user object); the deleter runs once, after the graph and every
 *    executable made from it are destroyed and their launches have finished,
 *    however many times it was replayed.
 *
 * Deleters run on a reclaimer thread of dlsync's, never on a driver callback
 * thread, so they may call CUDA (cudaFree, cuMemFree). That thread runs in
 * RELAXED capture mode, so a deleter's allocation calls do not break another
 * thread's GLOBAL capture. Deleters of one GPU run one at a time: those of
 * one thread's eager releases in the order it made them, those owned by
 * graphs in the order the graphs let go. A slow deleter, or a release whose
 * stream is still busy, delays those behind it. Do not
 * destroy the context from a deleter (it returns DLSYNC_ERROR_BUSY there
 * rather than wait for itself).
 *
 * Shutdown: dlsync_context_destroy waits for the context's pending eager
 * releases, and returns DLSYNC_ERROR_BUSY, naming how many, when graphs still
 * own releases (or eager ones are blocked, see dlsync_release_flush); those
 * still run when their graphs are destroyed. None is ever dropped.
 * dlsync_release_flush waits for the eager ones on demand.
 *
 * Faults: a failure of the driver on the reclaimer thread is counted
 * (dlsync_release_get_stats) and returned by the next dlsync_release_flush.
 * If cuUserObjectRelease fails while a release is being handed to a graph
 * that did not take it, the release is cancelled here (dlsync_release
 * returns the error, the object is still the caller's); the driver keeps
 * the user object it would not release.
 *
 * Capture safety: releasing on a capturing stream makes no call that is
 * illegal during capture.
 */
#ifndef DLSYNC_RELEASE_H
#define DLSYNC_RELEASE_H

#include <stddef.h>
#include <stdint.h>

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*dlsync_deleter)(void *arg);

/* Runs deleter(arg) once the work queued so far on `lane` is done (see above).
 * Returns: DLSYNC_SUCCESS; the deleter will run exactly once.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL context or deleter), the lane
 *   errors of dlsync_order, DLSYNC_ERROR_DRIVER, DLSYNC_ERROR_OUT_OF_MEMORY;
 *   DLSYNC_ERROR_UNLOADING when the library is being unloaded (another
 *   thread is in exit(), or the library embedding dlsync is being closed)
 *   and the reclaimer threads are stopped already. On failure the deleter has not run and will not:
 * the object is still the caller's. Threads: any thread, any number at once; never blocks. Capture:
 * legal in every mode; it makes no call that is illegal during capture. */
DLSYNC_API dlsync_status dlsync_release(dlsync_context *ctx, dlsync_lane *lane,
                                        dlsync_deleter deleter, void *arg);

/* Waits until every eager release made so far on this context has run its
 * deleter, or is blocked (below); so does every release a graph owned that
 * its graph has let go already (its deleter queued on the reclaimer).
 * Returns: DLSYNC_SUCCESS when no failure happened on the reclaimer thread
 *   since the previous flush.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL); the first failure on the
 *   reclaimer thread since the previous flush (DLSYNC_ERROR_DRIVER, the
 *   message names the call), which it then forgets
 *   (dlsync_release_get_stats counts them all);
 *   DLSYNC_ERROR_INVALID_ARGUMENT when called from a deleter (it would wait
 *   for itself).
 * Threads: any thread but a deleter's; blocks until the deleters ran.
 * Capture: it only waits on host state; no driver call of its own.
 *
 * The reclaimer's faults:
 *  - cuEventSynchronize failed: the deleter ran anyway (the stream's work
 *    cannot be waited for any more; keeping the object would only leak it).
 *  - the reclaimer could not enter RELAXED capture mode: it then makes no
 *    event query or synchronisation (in GLOBAL mode they would invalidate
 *    another thread's GLOBAL capture); the release stays queued, counted in
 *    `blocked`, and the reclaimer tries again (1 to 100 ms apart); its
 *    deleter, and those queued behind it on that GPU, run once that works. */
DLSYNC_API dlsync_status dlsync_release_flush(dlsync_context *ctx);

#define DLSYNC_RELEASE_STATS_VERSION 1u

/* Append-only; initialise with DLSYNC_RELEASE_STATS_INIT. */
typedef struct dlsync_release_stats {
  size_t size;          /* sizeof(dlsync_release_stats) */
  uint32_t version;     /* DLSYNC_RELEASE_STATS_VERSION */
  size_t pending_eager; /* waiting for their stream, or let go by their graph and queued */
  size_t pending_graph; /* owned by graphs still alive */
  size_t done;          /* deleters run */
  size_t sync_failures; /* cuEventSynchronize failed on the reclaimer (deleter ran anyway) */
  size_t mode_failures; /* the reclaimer could not enter RELAXED capture mode for a release */
  size_t blocked;       /* eager releases waiting now for the reclaimer to enter RELAXED mode */
} dlsync_release_stats;

#define DLSYNC_RELEASE_STATS_INIT \
  { sizeof(dlsync_release_stats), DLSYNC_RELEASE_STATS_VERSION, 0, 0, 0, 0, 0, 0 }

/* The context's release counts now (initialise *out with
 * DLSYNC_RELEASE_STATS_INIT).
 * Returns: DLSYNC_SUCCESS and *out filled.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL, or a size or version this
 *   library does not know: initialise with DLSYNC_RELEASE_STATS_INIT).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_release_get_stats(dlsync_release_stats *out,
                                                  const dlsync_context *ctx);

#ifdef __cplusplus
}
#endif

#endif
