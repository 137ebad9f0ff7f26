/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: contexts, the driver they use, devices and capabilities.
 *
 * Caller's rules:
 *  - Use the library's default context (dlsync_context_default) unless you
 *    need your own driver path or pool size; never destroy the default one.
 *  - Create a context outside any capture (it calls cuInit and reads device
 *    attributes); using it never breaks a capture.
 *  - Every function taking a context may run on any number of threads at
 *    once, except dlsync_context_destroy, which must not race with any other
 *    use of that context.
 *  - A program using dlsync starts on a machine without a GPU: the driver
 *    (libcuda.so.1) is loaded at run time, never linked, and a missing one is
 *    DLSYNC_ERROR_NO_DRIVER.
 *
 * A context owns the per-device event pools and everything dlsync keeps for
 * ordering work.
 *
 * Ownership: a context is destroyed once with dlsync_context_destroy. The
 * default context (dlsync_context_default) belongs to the library and lives
 * until the process ends; never destroy it (dlsync_context_destroy refuses it
 * with DLSYNC_ERROR_INVALID_ARGUMENT).
 *
 * Lifetime of what was made with a context: dlsync_context_destroy always
 * destroys it (the handle is gone when it returns, whatever the status) and
 * returns DLSYNC_ERROR_BUSY, naming them, when some things outlive it:
 *  - fences not released: they keep working (wait, retain, release); the
 *    context's memory and driver table, and each fence's event, stay until the
 *    last of them is released;
 *  - exchanges begun and not ended: abandoned (nothing is ordered for them);
 *    their dlsync_exchange_end is DLSYNC_ERROR_INVALID_ARGUMENT;
 *  - releases still owned by graphs: they run when the graphs go
 *    (release.h); eager releases are waited for first, except those blocked
 *    because the reclaimer cannot enter RELAXED capture mode (they run once
 *    it can).
 * Destroyed from a deleter (release.h), the eager releases of the context
 * queued behind the one running are not waited for (they still run) and are
 * named too; with none left, the status is DLSYNC_SUCCESS.
 *
 * Threads: dlsync runs one reclaimer thread per GPU it released on
 * (release.h) and one janitor thread, which frees a destroyed context when
 * its last fence is released and destroys the events graphs give back to a
 * destroyed context (so neither happens on a driver thread). They are
 * stopped and joined when the library is unloaded: at exit, or at the
 * dlclose of a shared library that embeds libdlsync.a. Eager releases still
 * queued then run first if their work is done; those whose work is still
 * running are not waited for, and their deleters do not run. A deleter
 * running at that moment must not load or unload a library (the loader's
 * lock is held while the thread is joined).
 *
 * fork(): in a child of fork() CUDA cannot be used and dlsync's threads do
 * not exist. There every function that returns a dlsync_status returns
 * DLSYNC_ERROR_NO_DRIVER (the message names the fork), dlsync_fence_retain
 * returns NULL, dlsync_fence_release does nothing; the status and version
 * functions work. Use dlsync in the parent, or start children with exec
 * (Python's multiprocessing "spawn").
 */
#ifndef DLSYNC_CONTEXT_H
#define DLSYNC_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "dlsync/export.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlsync_context dlsync_context;

#define DLSYNC_CONTEXT_CONFIG_VERSION 1u

/* Append-only; fill with DLSYNC_CONTEXT_CONFIG_INIT, then set fields. */
typedef struct dlsync_context_config {
  size_t size;      /* sizeof(dlsync_context_config) */
  uint32_t version; /* DLSYNC_CONTEXT_CONFIG_VERSION */
  /* Path given to dlopen; NULL means "libcuda.so.1". */
  const char *driver_path;
  /* Free events kept per CUDA context before extra ones are destroyed; 0
   * means 64. The pool grows past it as needed and never fails for size
   * (releases keep the events of a burst for the releases that follow);
   * free events past it that stay unused over max(4 * events_kept, 256)
   * takes and returns of the pool are destroyed, down to events_kept. */
  uint32_t events_kept;
} dlsync_context_config;

#define DLSYNC_CONTEXT_CONFIG_INIT \
  { sizeof(dlsync_context_config), DLSYNC_CONTEXT_CONFIG_VERSION, NULL, 0 }

/* Creates a context. config may be NULL (defaults).
 * Returns: DLSYNC_SUCCESS and *out the context; *out is NULL on failure.
 * Errors: DLSYNC_ERROR_NO_DRIVER (libcuda could not be loaded or
 *   initialised; the message says what was tried), DLSYNC_ERROR_DRIVER_TOO_OLD,
 *   DLSYNC_ERROR_INVALID_ARGUMENT (bad config size or version),
 *   DLSYNC_ERROR_OUT_OF_MEMORY.
 * Threads: any thread.
 * Capture: outside any capture (cuInit, device attributes). */
DLSYNC_API dlsync_status dlsync_context_create(dlsync_context **out,
                                               const dlsync_context_config *config);

/* Destroys a context and its pools. NULL is a no-op. Events still owned by
 * graphs are handed to the library and destroyed once those graphs are gone;
 * nothing is leaked and no graph loses an event. Every thread's open batch
 * of events for built graphs (up to 8 CUDA events per thread, exchange.h)
 * of this context is closed here, the threads still alive included.
 * The context is destroyed whatever the status.
 * Returns: DLSYNC_SUCCESS.
 * Errors: DLSYNC_ERROR_BUSY, with a message naming them, when fences,
 *   exchanges or releases outlive it (see "Lifetime" above); the first driver
 *   error met while destroying events; DLSYNC_ERROR_INVALID_ARGUMENT for the
 *   default context.
 * Threads: must not race with any other use of the context; not from a
 *   release's deleter (DLSYNC_ERROR_BUSY there).
 * Capture: waits for the context's pending eager releases; outside any
 *   capture. */
DLSYNC_API dlsync_status dlsync_context_destroy(dlsync_context *ctx);

/* The process-wide default context, created with the default configuration
 * by the first call that succeeds. Once made, every call returns it (one
 * atomic load); it lives until the process ends (see "Ownership" above).
 * Returns: DLSYNC_SUCCESS and *out the context; *out is NULL on failure.
 * Errors: as dlsync_context_create; the message begins "the default context
 *   could not be created". A failure that trying again cannot change within
 *   the process is remembered: every later call returns it, with the same
 *   message and dlsync_last_driver_result, and tries nothing. Those are
 *   DLSYNC_ERROR_NO_DRIVER (libcuda.so.1 could not be loaded, or cuInit
 *   failed, which the driver keeps for the process) and
 *   DLSYNC_ERROR_DRIVER_TOO_OLD. Any other failure (DLSYNC_ERROR_OUT_OF_MEMORY,
 *   DLSYNC_ERROR_DRIVER, ...) is returned to that call only, keeps nothing,
 *   and the next call tries again.
 * Threads: threads calling at once get the same context, made once.
 * Capture: the first call creates the context: outside any capture; later
 *   calls make no driver call. */
DLSYNC_API dlsync_status dlsync_context_default(dlsync_context **out);

/* The version of the driver the context uses (cuDriverGetVersion: 13000 for
 * CUDA 13.0).
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (a NULL argument).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_context_driver_version(int *out, const dlsync_context *ctx);

/* Capabilities of the driver a context uses. */
typedef enum dlsync_capability {
  /* cuStreamGetCaptureInfo with edge data (driver 12.3); needed for every
   * capture-aware path of the exchange. */
  DLSYNC_CAP_CAPTURE_EDGE_DATA = 1u << 0,
  /* cuStreamBeginCaptureToGraph (driver 12.3). */
  DLSYNC_CAP_CAPTURE_TO_USER_GRAPH = 1u << 1,
  /* cuUserObjectCreate / cuGraphRetainUserObject (driver 11.3): events and
   * tensors owned by graphs. */
  DLSYNC_CAP_USER_OBJECTS = 1u << 2,
  /* cuGraphAddNode with edge data (driver 12.3): nodes appended during
   * capture keep the edge data of the capture's dependencies. */
  DLSYNC_CAP_GRAPH_ADD_NODE_EDGE_DATA = 1u << 3
} dlsync_capability;

/* The capabilities of the context's driver, a bitmask of dlsync_capability.
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (a NULL argument).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_context_capabilities(uint32_t *out, const dlsync_context *ctx);

/* Whether the context's driver has a capability.
 * Returns: DLSYNC_SUCCESS when it is there.
 * Errors: DLSYNC_ERROR_DRIVER_TOO_OLD with a message naming the driver entry
 *   point, the driver version it needs and the one found;
 *   DLSYNC_ERROR_INVALID_ARGUMENT (a NULL context).
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_context_require(const dlsync_context *ctx, dlsync_capability cap);

/* A printable name for one capability bit ("capture-edge-data").
 * Returns: static storage; never fails.
 * Threads: any thread. Capture: safe at any time. */
DLSYNC_API const char *dlsync_capability_name(dlsync_capability cap);

#define DLSYNC_DEVICE_INFO_VERSION 1u

typedef struct dlsync_device_info {
  size_t size;      /* sizeof(dlsync_device_info) */
  uint32_t version; /* DLSYNC_DEVICE_INFO_VERSION */
  int ordinal;
  char name[256];
  char pci_bus_id[32]; /* "0000:19:00.0" */
  int cc_major;
  int cc_minor;
  size_t total_memory; /* bytes */
  int multiprocessors;
} dlsync_device_info;

#define DLSYNC_DEVICE_INFO_INIT \
  { sizeof(dlsync_device_info), DLSYNC_DEVICE_INFO_VERSION, 0, {0}, {0}, 0, 0, 0, 0 }

/* The number of devices the context's driver reports (cuDeviceGetCount).
 * Returns: DLSYNC_SUCCESS and *out.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT, DLSYNC_ERROR_DRIVER.
 * Threads: any thread. Capture: legal (a device query, no stream touched). */
DLSYNC_API dlsync_status dlsync_device_count(int *out, const dlsync_context *ctx);

/* Fills *info (initialised with DLSYNC_DEVICE_INFO_INIT) for device ordinal.
 * Returns: DLSYNC_SUCCESS and *info filled.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (NULL; a size or version other than
 *   DLSYNC_DEVICE_INFO_INIT's), DLSYNC_ERROR_DRIVER (an ordinal the driver
 *   does not know, with its message).
 * Threads: any thread. Capture: legal (device queries, no stream touched). */
DLSYNC_API dlsync_status dlsync_device_get_info(dlsync_device_info *info, const dlsync_context *ctx,
                                                int ordinal);

#ifdef __cplusplus
}
#endif

#endif
