/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: DLPack integration.
 *
 * Caller's rules:
 *  - Pass DLPack 1.x tensors (DLManagedTensorVersioned *) from any dlpack.h,
 *    included before or after this header; a tensor of another major version
 *    may only have its deleter called.
 *  - For CUDA, Python's stream=None is the legacy default stream: pass 1.
 *    ROCm's stream values are not handled.
 *  - After dlsync_dlpack_call_deleter or a successful dlsync_dlpack_release
 *    the tensor is its producer's again: use it no more (after a release:
 *    queue no more work that reads it).
 *  - Every function may run on any thread at once and is legal during
 *    capture.
 *
 * dlsync works with DLPack 1.x tensors (struct DLManagedTensorVersioned, ABI
 * as in dlpack.h 1.3) without needing dlpack.h: this header names the DLPack
 * structs by their tags only, and uses them only through pointers. The
 * official dlpack.h may be included before or after it, in C and in C++; a
 * DLManagedTensorVersioned * from it passes to these functions unchanged.
 * dlsync reads the fields it needs at the offsets of the DLPack 1.x ABI (the
 * version, the deleter) and never writes to a tensor.
 *
 * __dlpack__(stream=...) values: dlsync_dlpack_stream turns the value a
 * consumer passes into a lane for dlsync_order / dlsync_exchange_begin, with
 * the producer's lane as the other side. Values are those of the DLPack
 * specification for CUDA (kDLCUDA): -1 no ordering, 1 the legacy default
 * stream (what Python's stream=None means for CUDA: pass 1 for it), 2 the
 * per-thread default stream, a larger value a cudaStream_t / CUstream handle,
 * 0 disallowed. ROCm's conventions differ (0 is its default stream) and are
 * not handled: dlsync lanes are CUDA streams.
 *
 * Threads: every function may be called from any thread at once. Capture:
 * nothing here synchronises or makes a call that is illegal during capture;
 * dlsync_dlpack_stream reads at most the producer's capture state (the
 * queries of dlsync_lane_query), and only for stream value 1.
 *
 * Ownership: dlsync_dlpack_call_deleter and a successful dlsync_dlpack_release
 * hand the tensor back to its producer; the caller must not use it afterwards
 * (after a release: must queue no more work reading it). The other functions
 * only read.
 */
#ifndef DLSYNC_DLPACK_H
#define DLSYNC_DLPACK_H

#include <stdbool.h>
#include <stdint.h>

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/lane.h"
#include "dlsync/release.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The struct tags of dlpack.h; defined there, never here. */
struct DLManagedTensorVersioned;
struct DLPackExchangeAPI;

/* The DLPack ABI major version dlsync reads, and the minor version of the
 * dlpack.h it was written against. A tensor or exchange API of another major
 * version has another layout: only its deleter may be called. */
#define DLSYNC_DLPACK_MAJOR_VERSION 1u
#define DLSYNC_DLPACK_MINOR_VERSION 3u

/* DLDeviceType values (dlpack.h's kDLCPU, kDLCUDA, kDLROCM). */
#define DLSYNC_DLPACK_DEVICE_CPU 1
#define DLSYNC_DLPACK_DEVICE_CUDA 2
#define DLSYNC_DLPACK_DEVICE_ROCM 10

/* The special values of __dlpack__(stream=...) for CUDA. */
#define DLSYNC_DLPACK_STREAM_NO_SYNC (-1)
#define DLSYNC_DLPACK_STREAM_LEGACY 1
#define DLSYNC_DLPACK_STREAM_PER_THREAD 2

/* Calls t->deleter(t), once, if t and its deleter are not NULL (DLPack allows
 * a NULL deleter). Safe for any DLPack major version: the deleter sits where
 * the DLPack ABI promises to keep it.
 * Returns: nothing; never fails.
 * Threads: runs the producer's code on the calling thread, which must not be
 *   a CUDA driver callback thread.
 * Capture: whatever the producer's deleter does. */
DLSYNC_API void dlsync_dlpack_call_deleter(struct DLManagedTensorVersioned *t);

/* Stream-ordered release of a tensor (dlsync_release with a deleter that
 * calls dlsync_dlpack_call_deleter): its deleter runs once the work queued so
 * far on `lane` has finished, on a reclaimer thread of dlsync's, or once the
 * graphs that captured it are gone (release.h).
 * Returns: DLSYNC_SUCCESS; the deleter will run exactly once.
 * Errors: those of dlsync_release; DLSYNC_ERROR_INVALID_ARGUMENT for a NULL
 *   tensor. On failure nothing will call the deleter: the tensor is still the
 *   caller's.
 * Threads, Capture: as dlsync_release. */
DLSYNC_API dlsync_status dlsync_dlpack_release(dlsync_context *ctx, dlsync_lane *lane,
                                               struct DLManagedTensorVersioned *t);

/* The version a tensor carries (t->version). A major version other than
 * DLSYNC_DLPACK_MAJOR_VERSION means: call the deleter, read nothing else.
 * Returns: DLSYNC_SUCCESS, *major and *minor.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT when an argument is NULL.
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_dlpack_version(uint32_t *major, uint32_t *minor,
                                               const struct DLManagedTensorVersioned *t);

/* Turns a __dlpack__ stream value into the consumer's lane.
 *
 *   -1      *ordered = false: the consumer asked for no ordering; *out is a
 *           zeroed lane (rejected by dlsync_order) and nothing is checked.
 *   1       the legacy default stream (DLSYNC_STREAM_LEGACY).
 *   2       the per-thread default stream (DLSYNC_STREAM_PER_THREAD).
 *   > 2     that stream handle.
 *   0       DLSYNC_ERROR_INVALID_ARGUMENT: disallowed for CUDA by the DLPack
 *           specification (ambiguous between the two default streams).
 *   < -1    DLSYNC_ERROR_INVALID_ARGUMENT.
 * Otherwise *ordered = true and *out is a stream lane; order it after the
 * producer with dlsync_order(ctx, producer, out) or dlsync_exchange_begin.
 *
 * producer may be NULL (nothing checked against it, ctx may then be NULL too).
 * When it is given it is validated, and for 1 its state is read
 * (dlsync_lane_query, one capture query): a producer stream being captured
 * cannot be waited for by the legacy stream without invalidating its capture,
 * so that is DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE, with a message saying to
 * pass the consumer's own (capturing) stream handle or -1 instead. Errors of
 * the query (an invalidated capture, a legacy producer stream while a blocking
 * stream captures) are returned as they are. The legacy stream as the
 * consumer while a blocking stream of its context captures is reported by
 * dlsync_order / dlsync_exchange_begin (DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE).
 *
 * Returns: DLSYNC_SUCCESS, *ordered and *out as above.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (0, < -1, a NULL out or ordered),
 *   DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE, and the errors of
 *   dlsync_lane_query for the producer. On failure *ordered is false and *out
 *   a zeroed lane.
 * Threads: any thread, any number at once.
 * Capture: legal; at most one capture query of the producer, for value 1. */
DLSYNC_API dlsync_status dlsync_dlpack_stream(dlsync_lane *out, bool *ordered, dlsync_context *ctx,
                                              int64_t stream_value, const dlsync_lane *producer);

#ifdef __cplusplus
}
#endif

#endif
