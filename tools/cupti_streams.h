/* SPDX-License-Identifier: Apache-2.0 */
/* How many streams GPU work ran on, counted with CUPTI's activity records:
 * the streamId of each memset (CUPTI_ACTIVITY_KIND_MEMSET) and kernel
 * (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) between start and stop. libcupti is
 * loaded with dlopen (DLSYNC_CUPTI_LIB, else libcupti.so from the loader's
 * path or the CUDA toolkit's usual folders), never linked.
 *
 * Used by bench/replay_streams.c (compiled in) and by dlsync.testing
 * (python/dlsync/testing/_streams.py loads libdlsync_cupti_streams.so, built
 * from this file where the toolkit's cupti.h is found, with ctypes). Not part
 * of libdlsync. One counter per process; calls from one thread at a time.
 *
 * Each call returns 0 on success; on failure -1 and a sentence saying why in
 * why[0..why_size) (libcupti not found, CUPTI refused: another profiler
 * attached, no GPU). */
#ifndef DLSYNC_CUPTI_STREAMS_H
#define DLSYNC_CUPTI_STREAMS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DLSYNC_CUPTI_STREAMS_API __attribute__((visibility("default")))
#else
#define DLSYNC_CUPTI_STREAMS_API
#endif

/* Loads libcupti and registers the activity buffers (once; later calls
 * return the first call's result). */
DLSYNC_CUPTI_STREAMS_API int dlsync_cupti_streams_open(char *why, size_t why_size);

/* Forgets what was counted and turns the memset and kernel records on. */
DLSYNC_CUPTI_STREAMS_API int dlsync_cupti_streams_start(char *why, size_t why_size);

/* Flushes the records (synchronise the work first), turns them off and
 * writes the number of distinct streams seen since start to *streams and
 * the number of records to *records. */
DLSYNC_CUPTI_STREAMS_API int dlsync_cupti_streams_stop(int *streams, int *records, char *why,
                                                       size_t why_size);

#ifdef __cplusplus
}
#endif

#endif
