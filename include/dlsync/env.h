/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: env streams, the current work stream of each device.
 *
 * Caller's rules:
 *  - Set returns the stream it replaces: restore it when done (below).
 *  - The table is the calling thread's own; set and read on the same thread.
 *  - dlsync keeps the handle only: unset or replace a stream before you
 *    destroy it.
 *  - Nothing here calls the driver: safe at any time, during capture too.
 *
 * A framework sets the stream its work goes to for a device (DLPack device
 * type and id: DLSYNC_DLPACK_DEVICE_CUDA and a CUDA ordinal, say); a kernel
 * library called from it reads that stream and launches there. This is the
 * same contract as TVM FFI's TVMFFIEnvSetStream / TVMFFIEnvGetStream and
 * DLPack 1.3's DLPackCurrentWorkStream: set returns the value it replaces, so
 * a caller restores it when done:
 *
 *   void *prev;
 *   dlsync_env_stream_set(&prev, DLSYNC_DLPACK_DEVICE_CUDA, 0, my_stream);
 *   call_the_library();
 *   dlsync_env_stream_set(NULL, DLSYNC_DLPACK_DEVICE_CUDA, 0, prev);
 *
 * Streams are void * because not every device type has CUDA streams; for
 * CUDA (and ROCm) the value is the cudaStream_t / CUstream (hipStream_t)
 * handle itself. Unset is NULL, and NULL on CUDA means the legacy default
 * stream (dlsync_lane_stream(NULL) orders work on it); a framework that means
 * the per-thread default stream sets DLSYNC_STREAM_PER_THREAD.
 *
 * Threads: the table is per thread (thread-local): each thread sees only what
 * it set, no call takes a lock, and any number of threads may call at once.
 * It holds any number of (device type, device id) pairs, grows as needed and
 * is freed when the thread exits (or by dlsync_env_stream_clear).
 *
 * Ownership: dlsync keeps the handle only; it never creates, retains,
 * synchronises or destroys a stream. A stream destroyed while it is set
 * leaves a dangling handle there: set something else first.
 *
 * Capture: nothing here calls the driver; safe at any time.
 */
#ifndef DLSYNC_ENV_H
#define DLSYNC_ENV_H

#include <stdint.h>

#include "dlsync/dlpack.h"
#include "dlsync/export.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets the calling thread's current stream for (device_type, device_id) and
 * writes the one it replaces (NULL when none was set) to *previous, which may
 * be NULL. Setting NULL unsets.
 * Returns: DLSYNC_SUCCESS.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (device_type < 1, not a
 *   DLDeviceType; device_id < 0), DLSYNC_ERROR_OUT_OF_MEMORY. On failure
 *   nothing changes and *previous still gets the value in effect, so
 *   restoring it is always right.
 * Threads: the calling thread's table only; no lock.
 * Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_env_stream_set(void **previous, int32_t device_type,
                                               int32_t device_id, void *stream);

/* The calling thread's current stream for (device_type, device_id); NULL when
 * none is set (on CUDA: the legacy default stream).
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (out NULL, or the device as for set;
 *   *out is then NULL if out is not).
 * Threads: the calling thread's table only. Capture: safe at any time. */
DLSYNC_API dlsync_status dlsync_env_stream_get(void **out, int32_t device_type, int32_t device_id);

/* Unsets every stream of the calling thread and frees its table now rather
 * than at thread exit (the main thread's, say, before a leak check).
 * Returns: nothing; never fails.
 * Threads: the calling thread's table only. Capture: safe at any time. */
DLSYNC_API void dlsync_env_stream_clear(void);

/* The producer's current work stream for (device_type, device_id), asked from
 * its DLPack 1.x exchange API (the C struct a framework publishes as
 * __dlpack_c_exchange_api__): calls api->current_work_stream once and writes
 * its answer to *out. Does not change the env stream (set it with
 * dlsync_env_stream_set if the library reads it from there).
 *
 * NULL from the producer means its default stream; on CUDA that is the legacy
 * default stream. For kDLCPU a producer may always answer NULL.
 *
 * The API struct must be of DLPack major version 1 (DLSYNC_DLPACK_MAJOR_VERSION):
 * if its header says otherwise, the structs chained through header.prev_api
 * are tried, newest first, as DLPack says a consumer may.
 * Errors, all with a message and *out = NULL: DLSYNC_ERROR_INVALID_ARGUMENT for a NULL argument,
 * a device as for set, no major version 1 in the chain (the versions found are
 * named), a NULL current_work_stream, and a producer's function that failed
 * (returned non-zero; a Python producer has then set a Python exception, which
 * the caller should raise or clear).
 * Returns (on success): DLSYNC_SUCCESS and *out, the producer's answer.
 * Threads: the producer's function runs on the calling thread; whether it
 *   needs the GIL is the producer's contract.
 * Capture: dlsync makes no driver call; the producer's function is the
 *   producer's. */
DLSYNC_API dlsync_status dlsync_env_stream_from_exchange_api(void **out,
                                                             const struct DLPackExchangeAPI *api,
                                                             int32_t device_type,
                                                             int32_t device_id);

#ifdef __cplusplus
}
#endif

#endif
