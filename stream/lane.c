/* SPDX-License-Identifier: Apache-2.0 */
/* Lanes: validation and the capture query made at each call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stream/stream.h"

typedef struct dep_at {
  CUgraphNode node;
  size_t at;
} dep_at;

static int dep_at_cmp(const void *a, const void *b) {
  const dep_at *x = a, *y = b;
  if ((uintptr_t)x->node != (uintptr_t)y->node)
    return (uintptr_t)x->node < (uintptr_t)y->node ? -1 : 1;
  return x->at < y->at ? -1 : x->at > y->at;
}

/* Does a node repeat in deps[0..n)? The first repeat (the smallest *i with
 * an equal deps[*j], *j < *i, the first such). Pairwise for small frontiers;
 * larger ones sorted (n log n: a frontier may hold tens of thousands of
 * nodes), or pairwise if no memory can be had for that. */
static bool deps_repeat(size_t *j_out, size_t *i_out, const CUgraphNode *deps, size_t n) {
  size_t bytes = 0;
  dep_at *items =
      n > 64 && dlsync__mul_size(n, sizeof *items, &bytes) ? dlsync__malloc(bytes) : NULL;
  bool found = false;
  if (items == NULL) {
    for (size_t i = 0; i < n; i++)
      for (size_t j = 0; j < i; j++)
        if (deps[i] == deps[j]) {
          *j_out = j;
          *i_out = i;
          return true;
        }
    return false;
  }
  for (size_t k = 0; k < n; k++) {
    items[k].node = deps[k];
    items[k].at = k;
  }
  qsort(items, n, sizeof *items, dep_at_cmp);
  for (size_t k = 1, first = 0; k < n; k++) {
    if (items[k].node != items[k - 1].node) {
      first = k;
      continue;
    }
    if (k == first + 1 && (!found || items[k].at < *i_out)) {
      *i_out = items[k].at;
      *j_out = items[first].at;
      found = true;
    }
  }
  dlsync__free(items);
  return found;
}

dlsync_status dlsync__lane_check_slow(const dlsync_lane *lane, const char *role) {
  if (lane == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "the %s lane is NULL", role);
  switch (lane->kind) {
  case DLSYNC_LANE_STREAM:
    if (lane->graph != NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_LANE,
                          "the %s lane names both a stream (%p) and a graph (%p); a stream lane "
                          "must leave graph NULL (use dlsync_lane_stream or dlsync_lane_graph)",
                          role, (void *)lane->stream, (void *)lane->graph);
    return DLSYNC_SUCCESS;
  case DLSYNC_LANE_GRAPH:
    if (lane->stream != NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_LANE,
                          "the %s lane names both a graph (%p) and a stream (%p); a graph lane "
                          "must leave stream NULL",
                          role, (void *)lane->graph, (void *)lane->stream);
    if (lane->graph == NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_LANE, "the %s lane is a graph lane with no graph",
                          role);
    if (lane->capacity > DLSYNC__LANE_MAX_NODES || lane->ndeps > DLSYNC__LANE_MAX_NODES)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "the %s graph lane has ndeps = %zu and capacity = %zu: no array of "
                          "nodes can hold %zu (at most %zu); nothing was read or queued",
                          role, lane->ndeps, lane->capacity,
                          lane->capacity > lane->ndeps ? lane->capacity : lane->ndeps,
                          (size_t)DLSYNC__LANE_MAX_NODES);
    if (lane->ndeps > 0 && lane->deps == NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "the %s graph lane has ndeps = %zu but deps is NULL", role, lane->ndeps);
    if (lane->ndeps > lane->capacity)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "the %s graph lane has ndeps = %zu > capacity = %zu", role, lane->ndeps,
                          lane->capacity);
    if (lane->capacity > 0 && lane->deps == NULL)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "the %s graph lane has capacity = %zu but deps is NULL: dlsync writes "
                          "the lane's new frontier into deps (give it an array of capacity nodes)",
                          role, lane->capacity);
    {
      size_t i = 0, j = 0;
      if (deps_repeat(&j, &i, lane->deps, lane->ndeps))
        return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                            "the %s graph lane's deps name node %p twice (deps[%zu] and "
                            "deps[%zu]); a frontier lists each node once",
                            role, (void *)lane->deps[i], j, i);
    }
    return DLSYNC_SUCCESS;
  case DLSYNC_LANE_NONE:
  default:
    return dlsync__fail(DLSYNC_ERROR_INVALID_LANE,
                        "the %s lane names neither a stream nor a graph (kind %d); make it with "
                        "dlsync_lane_stream or dlsync_lane_graph",
                        role, (int)lane->kind);
  }
}

static dlsync_status lane_read_failed(dlsync__lane_now *out, const dlsync__driver *d, CUresult r,
                                      dlsync_lane *lane, const char *role) {
  dlsync__lane_read_eager(out, lane, role);
  if (d->StreamGetCaptureInfo == NULL)
    return dlsync__driver_require(d, DLSYNC__NEED_CAPTURE, "a capture-aware exchange");
  if (r == CUDA_SUCCESS) /* a capture that an earlier call invalidated */
    return dlsync__fail(DLSYNC_ERROR_CAPTURE_INVALIDATED,
                        "the %s stream %p is in a capture that an earlier call invalidated; end "
                        "it with cuStreamEndCapture (which will fail) and capture again",
                        role, (void *)lane->stream);
  if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)
    return dlsync__fail_driver(d, r, "cuStreamGetCaptureInfo",
                               "the %s lane is the legacy default stream while a blocking stream "
                               "of its context is capturing; pass the capturing stream or a "
                               "non-blocking stream instead",
                               role);
  return dlsync__fail_driver(d, r, "cuStreamGetCaptureInfo", "%s stream %p", role,
                             (void *)lane->stream);
}

/* A failed capture query queues nothing. */
dlsync_status dlsync__lane_read_failed(dlsync__lane_now *out, const dlsync__driver *d, CUresult r,
                                       dlsync_lane *lane, const char *role) {
  dlsync_status st = lane_read_failed(out, d, r, lane, role);
  dlsync__fail_nothing_queued();
  return st;
}

dlsync_status dlsync__lane_refresh_slow(dlsync__lane_now *l, const dlsync__driver *d) {
  return dlsync__lane_read_full(l, d, l->lane, l->role);
}

dlsync_status dlsync__lane_read_stream(dlsync__lane_now *out, const dlsync__driver *d,
                                       dlsync_lane *lane, const char *role, bool full) {
  /* Most streams are eager: a plain status query settles those (a little
   * cheaper than the full query: design.md R17). The special handles go
   * straight to the full query, whose answer for the legacy stream during a
   * blocking capture (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) is known to leave
   * the capture intact. */
  if (!full && !dlsync__is_special_stream(lane->stream) && d->StreamGetCaptureInfo != NULL) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = d->StreamIsCapturing(lane->stream, &cs);
    if (DLSYNC__UNLIKELY(r != CUDA_SUCCESS)) {
      dlsync_status st;
      dlsync__lane_read_eager(out, lane, role);
      st = dlsync__fail_driver(d, r, "cuStreamIsCapturing", "%s stream %p", role,
                               (void *)lane->stream);
      dlsync__fail_nothing_queued();
      return st;
    }
    if (DLSYNC__LIKELY(cs == CU_STREAM_CAPTURE_STATUS_NONE)) {
      dlsync__lane_read_eager(out, lane, role);
      return DLSYNC_SUCCESS;
    }
  }
  return dlsync__lane_read_stream_full(out, d, lane, role);
}

void dlsync__lane_describe(char *buf, size_t size, const dlsync__lane_now *l) {
  switch (l->kind) {
  case DLSYNC_LANE_EAGER:
    snprintf(buf, size, "stream %p (eager)", (void *)l->stream);
    break;
  case DLSYNC_LANE_CAPTURING:
    snprintf(buf, size, "stream %p (capture %llu, graph %p)", (void *)l->stream,
             (unsigned long long)l->capture_id, (void *)l->graph);
    break;
  default:
    snprintf(buf, size, "graph %p (built, %zu deps)", (void *)l->graph, l->ndeps);
    break;
  }
}

dlsync_status dlsync__lane_fit_failed(const dlsync_lane *lane, size_t nodes, const char *role,
                                      const char *what) {
  return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "the %s graph lane has capacity %zu, but its new frontier (%s) has %zu "
                      "node%s: dlsync writes the new frontier into deps",
                      role, lane->capacity, what, nodes, nodes == 1 ? "" : "s");
}
