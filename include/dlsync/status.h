/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: status codes and per-thread error information.
 *
 * Caller's rules:
 *  - Every dlsync function that can fail returns a dlsync_status; test it
 *    against DLSYNC_SUCCESS.
 *  - On failure, the calling thread's last error holds a message naming what
 *    went wrong and, when a driver call failed, that call's CUresult (as an
 *    int). Read it on the same thread before the next dlsync call: it stays
 *    until the next failing dlsync call on that thread, and successful calls
 *    do not clear it.
 *  - DLSYNC_ERROR_INTERNAL means a bug in dlsync (a state it cannot be in):
 *    report it with its message.
 *  - DLSYNC_ERROR_UNLOADING: the call came while this copy of dlsync is
 *    being unloaded (another thread is in exit(), or a library that embeds
 *    libdlsync.a is being dlclosed) and needed a thread of dlsync's, which
 *    the unload has stopped; nothing was queued.
 *  - Nothing here calls the driver: safe at any time, during capture too.
 */
#ifndef DLSYNC_STATUS_H
#define DLSYNC_STATUS_H

#include "dlsync/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, description) */
#define DLSYNC_STATUS_LIST(X)                                                               \
  X(SUCCESS, 0, "success")                                                                  \
  X(ERROR_INVALID_ARGUMENT, 1, "invalid argument")                                          \
  X(ERROR_OUT_OF_MEMORY, 2, "out of host memory")                                           \
  X(ERROR_NO_DRIVER, 3, "no CUDA driver could be loaded")                                   \
  X(ERROR_DRIVER_TOO_OLD, 4, "the CUDA driver is too old for this feature")                 \
  X(ERROR_DRIVER, 5, "a CUDA driver call failed")                                           \
  X(ERROR_INVALID_LANE, 6, "a lane names both a stream and a graph, or neither")            \
  X(ERROR_CAPTURE_INVALIDATED, 7, "a stream's capture has been invalidated")                \
  X(ERROR_LEGACY_STREAM_IN_CAPTURE, 8,                                                      \
    "the legacy default stream was used while a blocking stream is capturing")              \
  X(ERROR_CAPTURE_ORDER, 9,                                                                 \
    "the order asked for would need work to wait for a graph that is not launched yet")     \
  X(ERROR_FOREIGN_DEPENDENCY, 10, "a graph lane's dependencies are not nodes of its graph") \
  X(ERROR_BUSY, 11, "work that dlsync tracks is still pending")                             \
  X(ERROR_INTERNAL, 12, "internal error in dlsync")                                         \
  X(ERROR_CROSS_DEVICE, 13, "the driver refused to order work between two devices")         \
  X(ERROR_CONDITIONAL_BODY, 14,                                                             \
    "the order would put an event node in a conditional node's body, which CUDA refuses")   \
  X(ERROR_UNLOADING, 15,                                                                    \
    "dlsync is being unloaded (the process exits, or the library embedding it is closed)")

typedef enum dlsync_status {
#define DLSYNC_STATUS_ENUM_(name, value, text) DLSYNC_##name = value,
  DLSYNC_STATUS_LIST(DLSYNC_STATUS_ENUM_)
#undef DLSYNC_STATUS_ENUM_
      DLSYNC_STATUS_COUNT_
} dlsync_status;

/* "DLSYNC_ERROR_CAPTURE_INVALIDATED" for a status; "DLSYNC_STATUS_UNKNOWN" for
 * a value outside the enum.
 * Returns: never NULL, static storage; never fails.
 * Threads: any thread. Capture: safe at any time. */
DLSYNC_API const char *dlsync_status_name(dlsync_status status);

/* A short description in words ("a stream's capture has been invalidated").
 * Returns: never NULL, static storage; never fails.
 * Threads: any thread. Capture: safe at any time. */
DLSYNC_API const char *dlsync_status_string(dlsync_status status);

/* The calling thread's last error: its status, a message, and the CUresult
 * of the driver call that failed.
 * Returns: the status (DLSYNC_SUCCESS when no dlsync call has failed on this
 *   thread); the message, never NULL ("" then), valid until the next dlsync
 *   call on this thread; the CUresult, 0 when the failure was not a driver
 *   call's. Never fail.
 * Threads: per thread; each thread reads its own.
 * Capture: safe at any time. */
DLSYNC_API dlsync_status dlsync_last_status(void);
DLSYNC_API const char *dlsync_last_error(void);
DLSYNC_API int dlsync_last_driver_result(void);

#ifdef __cplusplus
}
#endif

#endif
