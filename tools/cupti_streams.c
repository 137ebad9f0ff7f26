/* SPDX-License-Identifier: Apache-2.0 */
/* The CUPTI stream counter (cupti_streams.h). */
#include "cupti_streams.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

/* The records read: each kind's record type as this toolkit's header
 * declares it. A kernel record is read through CUpti_ActivityKernel4 (in
 * every toolkit since CUDA 9): its streamId lies where every later version's
 * does, which the assertion checks against the newest this header has. */
#define DLSYNC_CUPTI_MAX_IDS 1024
#define DLSYNC_CUPTI_BUFFER ((size_t)1 << 20)
#if defined(CUPTI_API_VERSION) && CUPTI_API_VERSION >= 130000
_Static_assert(offsetof(CUpti_ActivityKernel4, streamId) ==
                   offsetof(CUpti_ActivityKernel10, streamId),
               "the kernel record's streamId moved");
#endif

static struct {
  CUptiResult(CUPTIAPI *enable)(CUpti_ActivityKind);
  CUptiResult(CUPTIAPI *disable)(CUpti_ActivityKind);
  CUptiResult(CUPTIAPI *register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                            CUpti_BuffersCallbackCompleteFunc);
  CUptiResult(CUPTIAPI *flush_all)(uint32_t);
  CUptiResult(CUPTIAPI *next_record)(uint8_t *, size_t, CUpti_Activity **);
  CUptiResult(CUPTIAPI *result_string)(CUptiResult, const char **); /* may be NULL */
} cupti;

static int opened; /* 0: not yet, 1: ready, -1: failed */
static char open_why[256];
static uint32_t ids[DLSYNC_CUPTI_MAX_IDS];
static int nids, nrecords;
static bool overflow, started;

static int fail(char *why, size_t why_size, const char *text) {
  if (why != NULL && why_size > 0)
    snprintf(why, why_size, "%s", text);
  return -1;
}

/* "what refused (CUPTI_ERROR_...: no GPU, or another profiler attached?)" */
static int refused(char *why, size_t why_size, const char *what, CUptiResult r) {
  const char *name = NULL;
  if (cupti.result_string == NULL || cupti.result_string(r, &name) != CUPTI_SUCCESS || name == NULL)
    name = "an unknown CUptiResult";
  if (why != NULL && why_size > 0)
    snprintf(why, why_size, "%s refused (%s: no GPU, or another profiler attached?)", what, name);
  return -1;
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = aligned_alloc(8, DLSYNC_CUPTI_BUFFER);
  *size = *buffer != NULL ? DLSYNC_CUPTI_BUFFER : 0;
  *max_records = 0;
}

static void note_stream(uint32_t id) {
  for (int i = 0; i < nids; i++)
    if (ids[i] == id)
      return;
  if (nids < DLSYNC_CUPTI_MAX_IDS)
    ids[nids++] = id;
  else
    overflow = true;
}

static void CUPTIAPI buffer_completed(CUcontext c, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
  CUpti_Activity *rec = NULL;
  (void)c;
  (void)stream;
  (void)size;
  while (buffer != NULL && cupti.next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      note_stream(((const CUpti_ActivityMemset4 *)(const void *)rec)->streamId);
      nrecords++;
    } else if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
               rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      note_stream(((const CUpti_ActivityKernel4 *)(const void *)rec)->streamId);
      nrecords++;
    }
  }
  free(buffer);
}

static void *load_cupti(void) {
  static const char *const paths[] = {"libcupti.so",
                                      "libcupti.so.13",
                                      "libcupti.so.12",
                                      "/usr/local/cuda/lib64/libcupti.so",
                                      "/usr/local/cuda/lib/libcupti.so",
                                      "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so"};
  const char *env = getenv("DLSYNC_CUPTI_LIB");
  void *lib;
  if (env != NULL && env[0] != '\0')
    return dlopen(env, RTLD_NOW | RTLD_LOCAL); /* the named one, or none */
  lib = NULL;
  for (size_t i = 0; lib == NULL && i < sizeof paths / sizeof paths[0]; i++)
    lib = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
  return lib;
}

int dlsync_cupti_streams_open(char *why, size_t why_size) {
  void *lib;
  if (opened != 0)
    return opened > 0 ? 0 : fail(why, why_size, open_why);
  opened = -1;
  lib = load_cupti();
  if (lib == NULL) {
    snprintf(open_why, sizeof open_why, "libcupti not found (set DLSYNC_CUPTI_LIB to its path)");
    return fail(why, why_size, open_why);
  }
  *(void **)&cupti.enable = dlsym(lib, "cuptiActivityEnable");
  *(void **)&cupti.disable = dlsym(lib, "cuptiActivityDisable");
  *(void **)&cupti.register_callbacks = dlsym(lib, "cuptiActivityRegisterCallbacks");
  *(void **)&cupti.flush_all = dlsym(lib, "cuptiActivityFlushAll");
  *(void **)&cupti.next_record = dlsym(lib, "cuptiActivityGetNextRecord");
  *(void **)&cupti.result_string = dlsym(lib, "cuptiGetResultString");
  if (cupti.enable == NULL || cupti.disable == NULL || cupti.register_callbacks == NULL ||
      cupti.flush_all == NULL || cupti.next_record == NULL) {
    snprintf(open_why, sizeof open_why, "libcupti lacks the activity API");
    return fail(why, why_size, open_why);
  }
  {
    CUptiResult r = cupti.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) {
      refused(open_why, sizeof open_why, "cuptiActivityRegisterCallbacks", r);
      return fail(why, why_size, open_why);
    }
  }
  opened = 1;
  return 0;
}

int dlsync_cupti_streams_start(char *why, size_t why_size) {
  CUptiResult r;
  if (dlsync_cupti_streams_open(why, why_size) != 0)
    return -1;
  if (started)
    return fail(why, why_size, "the counter is counting already");
  nids = 0;
  nrecords = 0;
  overflow = false;
  r = cupti.enable(CUPTI_ACTIVITY_KIND_MEMSET);
  if (r != CUPTI_SUCCESS)
    return refused(why, why_size, "cuptiActivityEnable", r);
  r = cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    cupti.disable(CUPTI_ACTIVITY_KIND_MEMSET);
    return refused(why, why_size, "cuptiActivityEnable", r);
  }
  started = true;
  return 0;
}

int dlsync_cupti_streams_stop(int *streams, int *records, char *why, size_t why_size) {
  CUptiResult flushed, off1, off2;
  if (!started)
    return fail(why, why_size, "the counter was not started");
  started = false;
  flushed = cupti.flush_all(1);
  off1 = cupti.disable(CUPTI_ACTIVITY_KIND_MEMSET);
  off2 = cupti.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (flushed == CUPTI_SUCCESS)
    flushed = cupti.flush_all(1);
  if (flushed != CUPTI_SUCCESS || off1 != CUPTI_SUCCESS || off2 != CUPTI_SUCCESS)
    return fail(why, why_size, "cuptiActivityFlushAll or cuptiActivityDisable failed");
  if (overflow)
    return fail(why, why_size, "more than 1024 streams");
  if (streams != NULL)
    *streams = nids;
  if (records != NULL)
    *records = nrecords;
  return 0;
}
