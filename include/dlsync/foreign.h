/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: other runtimes' events as fences, and fences as events.
 *
 * Another runtime (a communication library, a framework, an Arrow producer)
 * hands readiness over as a CUevent / cudaEvent_t. Where that event was
 * recorded decides what a wait on it can mean, and the driver cannot tell all
 * of it, so the caller says it (the provenance):
 *
 *  - DLSYNC_PROVENANCE_EAGER: recorded by cuEventRecord on a stream that was
 *    not capturing (or never recorded). Waits order after that record.
 *  - DLSYNC_PROVENANCE_COMPLETE: as EAGER, and its work has completed.
 *  - DLSYNC_PROVENANCE_EXTERNAL_RECORD: recorded by an event-record node of
 *    a graph: CU_EVENT_RECORD_EXTERNAL during a capture, or
 *    cuGraphAddEventRecordNode. Armed when that graph is launched, at each
 *    launch: the rules of a fence signalled in a graph apply (fence.h).
 *  - DLSYNC_PROVENANCE_CAPTURED: recorded by a plain cuEventRecord inside
 *    capture `capture_id` (cuStreamGetCaptureInfo's id). The event then stands
 *    for a point of that capture and is usable only from that same capture.
 *
 * dlsync_fence_wait on the imported fence then does, by the waiting lane:
 *
 *   provenance        eager lane       capture (same id)  other capture    built graph
 *   EAGER, COMPLETE   plain wait       external wait node external wait n. wait node
 *   EXTERNAL_RECORD   plain wait (1)   wait node (2)      wait node (2)    wait node (2)
 *   CAPTURED (id)     refused (3)      plain wait: edges  refused (3)      refused (3)
 *
 *  (1) orders after the record of the graph's most recent launch issued
 *      before the wait (nothing if never launched): launch it first.
 *  (2) a wait node appended by hand; it takes the event's state when its own
 *      graph is launched: launch the recording graph first, each time.
 *  (3) DLSYNC_ERROR_CAPTURE_ORDER: an eager wait on an in-capture record
 *      orders nothing (the event's state is not the capture's), a plain wait
 *      from another capture merges or invalidates both (CUDA's MERGE and
 *      ISOLATION), and a wait node would wait for an unrelated record.
 *      Record with CU_EVENT_RECORD_EXTERNAL instead.
 *
 * A wait that would add a node (an external wait or a wait node) in a
 * declared conditional body is DLSYNC_ERROR_CONDITIONAL_BODY
 * (conditional.h); the edges-only wait (CAPTURED, same capture) works there.
 *
 * Checks made at import: the arguments; then, for EAGER, COMPLETE and
 * EXTERNAL_RECORD, one cuEventQuery, with this thread switched to the
 * RELAXED capture interaction mode around it (cuThreadExchangeStreamCaptureMode,
 * so that the query is legal even while this or another thread captures in
 * GLOBAL mode; rule R40 of tests/fake/fake_driver.h, checked on the GPU by
 * gpu_rules). Its answer:
 *  - CUDA_ERROR_INVALID_HANDLE (and other handle errors): not an event, or
 *    destroyed: DLSYNC_ERROR_INVALID_ARGUMENT. A destroyed handle that the
 *    driver has reused for another event is not found.
 *  - CUDA_ERROR_CAPTURED_EVENT (last recorded by a plain record in an active
 *    capture): the declaration is wrong: DLSYNC_ERROR_INVALID_ARGUMENT
 *    ("contradicts"). The driver has then invalidated that capture (rule
 *    R41): declare such an event CAPTURED.
 *  - CUDA_ERROR_NOT_READY: COMPLETE contradicts it.
 * An event declared CAPTURED is not queried (the query would invalidate its
 * capture, R41): its provenance and capture id are taken as given. Not
 * checked either (the driver cannot tell): EAGER against EXTERNAL_RECORD (an
 * event-record node leaves the event's eager state as it was).
 *
 * Ownership: by default the event is borrowed: keep it alive, and do not
 * record it again, while the fence or any graph that waits on it may use it
 * (a graph holds it until the graph and its executables are gone). With
 * DLSYNC_IMPORT_OWN dlsync owns it from a successful import and destroys it
 * once the last fence reference and the last graph holding it are gone: not
 * on the thread that lets go (a driver thread, maybe), but at dlsync's next
 * collection (the next dlsync_fence_import, a growing event pool, or a
 * dlsync context made or destroyed). On failure the event stays the
 * caller's.
 *
 * Exporting: dlsync_fence_export_event gives the event behind a fence, for
 * another runtime to wait on (cuStreamWaitEvent, cudaStreamWaitEvent, an
 * event-wait node, Arrow's sync_event):
 *  - a fence signalled on an eager stream: the event recorded then.
 *  - a fence signalled in a capture or a graph built by hand: the event of its
 *    event-record node (recorded as with CU_EVENT_RECORD_EXTERNAL), so an
 *    eager wait issued after the graph's launch orders after that launch's
 *    record. Rule for the waiter: wait only after launching the graph (a wait
 *    issued before any launch, the capture still active or not, orders
 *    nothing: rule R10); from another graph use an external wait
 *    (CU_EVENT_WAIT_EXTERNAL) or an event-wait node, and launch the
 *    signalling graph first.
 *  - an imported fence: the imported event (CAPTURED: refused, see (3)).
 * The event is dlsync's (or the importer's): only wait on it; never record,
 * synchronize-and-destroy or destroy it. It stays valid while the caller
 * holds a reference to the fence (dlsync_fence_retain before handing it on).
 */
#ifndef DLSYNC_FOREIGN_H
#define DLSYNC_FOREIGN_H

#include <stdint.h>

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/fence.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUevent_st; /* CUevent, cudaEvent_t */

typedef enum dlsync_provenance {
  DLSYNC_PROVENANCE_EAGER = 1,           /* cuEventRecord on a stream not capturing */
  DLSYNC_PROVENANCE_COMPLETE = 2,        /* as EAGER, and its work has completed */
  DLSYNC_PROVENANCE_EXTERNAL_RECORD = 3, /* an event-record node of a graph */
  DLSYNC_PROVENANCE_CAPTURED = 4         /* a plain cuEventRecord in capture capture_id */
} dlsync_provenance;

/* dlsync_fence_import's flags. */
#define DLSYNC_IMPORT_OWN 0x1u /* dlsync destroys the event when done with it */

/* A fence for another runtime's event, recorded as `provenance` says
 * (capture_id: the capture's id for CAPTURED, 0 for the others).
 * Returns: DLSYNC_SUCCESS and *out the fence (kind DLSYNC_FENCE_IMPORTED),
 *   with one reference.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (out, ctx or event NULL; an unknown
 *   provenance or flag; capture_id 0 for CAPTURED or not 0 for the others; an
 *   event the driver calls invalid or destroyed; a provenance the driver's
 *   answer contradicts, see above), DLSYNC_ERROR_DRIVER,
 *   DLSYNC_ERROR_OUT_OF_MEMORY; *out is NULL, nothing is queued, and the
 *   event stays the caller's.
 * Threads: any thread, any number at once.
 * Capture: legal in every mode, on any thread; it never breaks a capture
 *   (the one query runs in the RELAXED interaction mode). */
DLSYNC_API dlsync_status dlsync_fence_import(dlsync_fence **out, dlsync_context *ctx,
                                             struct CUevent_st *event, dlsync_provenance provenance,
                                             uint64_t capture_id, unsigned int flags);

/* The event behind a fence, for another runtime to wait on (see above).
 * Returns: DLSYNC_SUCCESS and *out the event, valid while the caller holds a
 *   reference to the fence.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL, or a fence whose last
 *   reference is gone), DLSYNC_ERROR_CAPTURE_ORDER (a fence imported as
 *   CAPTURED: its event means something only inside that capture); *out is
 *   NULL then.
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_fence_export_event(struct CUevent_st **out,
                                                   const dlsync_fence *fence);

/* The provenance a fence was imported with.
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL; a fence whose last reference
 *   is gone; a fence that was not imported: dlsync_fence_get_kind says what
 *   it is).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_fence_get_provenance(dlsync_provenance *out,
                                                     const dlsync_fence *fence);

#ifdef __cplusplus
}
#endif

#endif
