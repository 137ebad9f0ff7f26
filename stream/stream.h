/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: lanes (stream/). Never installed. Uses base/ and driver/. */
#ifndef DLSYNC_PRIVATE_STREAM_H
#define DLSYNC_PRIVATE_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dlsync/lane.h"
#include "base/base.h"
#include "driver/driver.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dlsync__lane_now {
  dlsync_lane_state_kind kind;
  CUstream stream;         /* stream lanes */
  uint64_t capture_id;     /* CAPTURING */
  CUgraph graph;           /* CAPTURING: capture graph; BUILT: the lane's graph */
  const CUgraphNode *deps; /* CAPTURING: valid until the next query of that stream */
  size_t ndeps;
  dlsync_lane *lane; /* the caller's lane */
  const char *role;  /* "producer", "consumer", ... for messages */
  /* CAPTURING with ndeps <= DLSYNC__DEPS_INLINE: a copy of deps, which stays
   * valid after other calls on the stream (dlsync__lane_deps reads it). */
  bool deps_inline;
  CUgraphNode dep_buf[4];
} dlsync__lane_now;
#define DLSYNC__DEPS_INLINE 4

/* Where a lane's work goes now, as a small value compared by one function
 * (dlsync__where_same): eager, a capture (its id: unique for the process,
 * never reused), or a graph built by hand. What the exchange keeps of each
 * lane for its end. */
typedef struct dlsync__where {
  dlsync_lane_state_kind kind;
  uint64_t capture_id; /* CAPTURING */
  CUgraph graph;       /* BUILT */
} dlsync__where;

static inline dlsync__where dlsync__lane_where(const dlsync__lane_now *l) {
  dlsync__where w;
  w.kind = l->kind;
  w.capture_id = l->kind == DLSYNC_LANE_CAPTURING ? l->capture_id : 0;
  w.graph = l->kind == DLSYNC_LANE_BUILT ? l->graph : NULL;
  return w;
}

/* One capture, or one built graph (two eager lanes are in no graph). */
static inline bool dlsync__where_same(const dlsync__where *a, const dlsync__where *b) {
  if (a->kind != b->kind)
    return false;
  if (a->kind == DLSYNC_LANE_CAPTURING)
    return a->capture_id == b->capture_id;
  if (a->kind == DLSYNC_LANE_BUILT)
    return a->graph == b->graph;
  return false;
}

/* A capturing lane's dependencies: the copy when there is one (valid as long
 * as the struct), else the driver's array (valid until the next call on the
 * stream). Built lanes: the caller's frontier. */
static inline const CUgraphNode *dlsync__lane_deps(const dlsync__lane_now *l) {
  return l->deps_inline ? l->dep_buf : l->deps;
}

/* A capturing lane's stream got a node by a call that does not say which
 * (an external record or wait): its dependencies are that node now, unknown
 * here, so a later user reads them again (dlsync__lane_refresh). */
static inline void dlsync__lane_deps_moved(dlsync__lane_now *l) {
  l->deps = NULL;
  l->ndeps = 0;
  l->deps_inline = false;
}

/* A stream lane found eager. */
static inline void dlsync__lane_read_eager(dlsync__lane_now *out, dlsync_lane *lane,
                                           const char *role) {
  out->kind = DLSYNC_LANE_EAGER;
  out->stream = lane->stream;
  out->capture_id = 0;
  out->graph = NULL;
  out->deps = NULL;
  out->ndeps = 0;
  out->lane = lane;
  out->role = role;
  out->deps_inline = false;
}
/* What a full query that did not find an active capture or an eager stream
 * means (cold): a failed query (r), an invalidated capture (r is
 * CUDA_SUCCESS), or a driver without the query. *out is left eager. */
DLSYNC__COLD dlsync_status dlsync__lane_read_failed(dlsync__lane_now *out, const dlsync__driver *d,
                                                    CUresult r, dlsync_lane *lane,
                                                    const char *role);
/* What one full capture query of a stream said, before it is written into
 * a dlsync__lane_now (dlsync__lane_take): the fast path looks at the status
 * and the id first, and writes a lane only when it goes on with it. The
 * dependency array stays valid until the next call that operates on that
 * stream (a query of another stream does not). */
typedef struct dlsync__capture_info {
  CUresult r;
  CUstreamCaptureStatus status;
  cuuint64_t id;
  CUgraph graph;
  const CUgraphNode *deps;
  size_t n;
} dlsync__capture_info;

/* Nothing is stored in ci before the call: the driver writes the status
 * when it succeeds, and the id, graph and dependencies when the stream
 * captures, and every reader looks at r and the status first
 * (dlsync__capture_info_active, _eager, dlsync__lane_take), so no field is
 * read that the call did not write (stores the fast paths would pay for). */
static inline void dlsync__lane_query(dlsync__capture_info *ci, const dlsync__driver *d,
                                      CUstream s) {
  const CUgraphEdgeData *edges = NULL;
  ci->r =
      DLSYNC__UNLIKELY(d->StreamGetCaptureInfo == NULL)
          ? CUDA_ERROR_NOT_SUPPORTED
          : d->StreamGetCaptureInfo(s, &ci->status, &ci->id, &ci->graph, &ci->deps, &edges, &ci->n);
}
static inline bool dlsync__capture_info_active(const dlsync__capture_info *ci) {
  return ci->r == CUDA_SUCCESS && ci->status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}
static inline bool dlsync__capture_info_eager(const dlsync__capture_info *ci) {
  return ci->r == CUDA_SUCCESS && ci->status == CU_STREAM_CAPTURE_STATUS_NONE;
}
/* The lane as the query `ci` of its stream found it (an error when the query
 * failed or found an invalidated capture). */
static inline dlsync_status dlsync__lane_take(dlsync__lane_now *out, const dlsync__driver *d,
                                              dlsync_lane *lane, const char *role,
                                              const dlsync__capture_info *ci) {
  out->stream = lane->stream;
  out->lane = lane;
  out->role = role;
  if (DLSYNC__LIKELY(dlsync__capture_info_active(ci))) {
    size_t n = ci->n;
    out->kind = DLSYNC_LANE_CAPTURING;
    out->capture_id = ci->id;
    out->graph = ci->graph;
    out->deps = ci->deps;
    out->ndeps = n;
    out->deps_inline = n <= DLSYNC__DEPS_INLINE;
    if (out->deps_inline)
      for (size_t i = 0; i < n; i++)
        out->dep_buf[i] = ci->deps[i];
    return DLSYNC_SUCCESS;
  }
  if (DLSYNC__LIKELY(dlsync__capture_info_eager(ci))) {
    dlsync__lane_read_eager(out, lane, role);
    return DLSYNC_SUCCESS;
  }
  return dlsync__lane_read_failed(out, d, ci->r, lane, role);
}
/* A stream lane's full capture query (status, id, graph, dependencies),
 * inline: one cuStreamGetCaptureInfo. */
static inline dlsync_status dlsync__lane_read_stream_full(dlsync__lane_now *out,
                                                          const dlsync__driver *d,
                                                          dlsync_lane *lane, const char *role) {
  dlsync__capture_info ci;
  dlsync__lane_query(&ci, d, lane->stream);
  return dlsync__lane_take(out, d, lane, role, &ci);
}
/* A lane read before, read again if it is a capture whose dependencies
 * were too many to copy (the driver's array is valid only until the next
 * call on its stream): for callers that made other calls on the stream
 * since the read. */
DLSYNC__COLD dlsync_status dlsync__lane_refresh_slow(dlsync__lane_now *l, const dlsync__driver *d);
static inline dlsync_status dlsync__lane_refresh(dlsync__lane_now *l, const dlsync__driver *d) {
  if (DLSYNC__LIKELY(l->kind != DLSYNC_LANE_CAPTURING || l->deps_inline))
    return DLSYNC_SUCCESS;
  return dlsync__lane_refresh_slow(l, d);
}
/* Reads a lane's state (one or two capture queries for a stream; none for a
 * graph lane). The lane must have passed dlsync__lane_check. Errors name
 * `role`. */
dlsync_status dlsync__lane_read_stream(dlsync__lane_now *out, const dlsync__driver *d,
                                       dlsync_lane *lane, const char *role, bool full);
/* A graph lane: BUILT, its graph and frontier (no driver call). */
static inline void dlsync__lane_read_built(dlsync__lane_now *out, dlsync_lane *lane,
                                           const char *role) {
  out->kind = DLSYNC_LANE_BUILT;
  out->stream = NULL;
  out->capture_id = 0;
  out->graph = lane->graph;
  out->deps = (const CUgraphNode *)lane->deps;
  out->ndeps = lane->ndeps;
  out->lane = lane;
  out->role = role;
  out->deps_inline = false;
}
/* A graph lane inline; a stream lane's status (full = false) or full
 * capture query (full = true). */
static inline dlsync_status dlsync__lane_read_as(dlsync__lane_now *out, const dlsync__driver *d,
                                                 dlsync_lane *lane, const char *role, bool full) {
  if (lane->kind == DLSYNC_LANE_GRAPH) {
    dlsync__lane_read_built(out, lane, role);
    return DLSYNC_SUCCESS;
  }
  return dlsync__lane_read_stream(out, d, lane, role, full);
}
static inline dlsync_status dlsync__lane_read(dlsync__lane_now *out, const dlsync__driver *d,
                                              dlsync_lane *lane, const char *role) {
  return dlsync__lane_read_as(out, d, lane, role, false);
}
/* The same with one cuStreamGetCaptureInfo and no cuStreamIsCapturing first:
 * for callers that expect a capture (the general path, after the fast path
 * found one). */
static inline dlsync_status dlsync__lane_read_full(dlsync__lane_now *out, const dlsync__driver *d,
                                                   dlsync_lane *lane, const char *role) {
  if (lane->kind == DLSYNC_LANE_GRAPH) {
    dlsync__lane_read_built(out, lane, role);
    return DLSYNC_SUCCESS;
  }
  return dlsync__lane_read_stream_full(out, d, lane, role);
}
/* "stream 0x.. (capture 5, graph 0x..)", for the decision log. */
void dlsync__lane_describe(char *buf, size_t size, const dlsync__lane_now *l);
/* The one capacity check: a graph lane's new frontier of `nodes` nodes
 * (`what`, for the message) fits its deps array. Made before anything is
 * given to a graph; the functions that then write the frontier
 * (dlsync__graph_append_event*) rely on it. */
DLSYNC__COLD dlsync_status dlsync__lane_fit_failed(const dlsync_lane *lane, size_t nodes,
                                                   const char *role, const char *what);
static inline dlsync_status dlsync__lane_fit(const dlsync_lane *lane, size_t nodes,
                                             const char *role, const char *what) {
  if (DLSYNC__LIKELY(nodes <= lane->capacity))
    return DLSYNC_SUCCESS;
  return dlsync__lane_fit_failed(lane, nodes, role, what);
}
/* The largest ndeps or capacity a graph lane may give: more nodes than any
 * array can hold is a lying count, refused before deps is read. */
#define DLSYNC__LANE_MAX_NODES (PTRDIFF_MAX / sizeof(CUgraphNode))
/* Validates a lane's fields without calling the driver. */
dlsync_status dlsync__lane_check_slow(const dlsync_lane *lane, const char *role);
static inline dlsync_status dlsync__lane_check(const dlsync_lane *lane, const char *role) {
  if (DLSYNC__LIKELY(lane != NULL && lane->kind == DLSYNC_LANE_STREAM && lane->graph == NULL))
    return DLSYNC_SUCCESS;
  return dlsync__lane_check_slow(lane, role);
}
/* dlsync__lane_check for a lane expected to be a graph lane: a frontier of
 * at most one node (nothing to find twice) that fits is checked inline. */
static inline dlsync_status dlsync__lane_check_graph(const dlsync_lane *lane, const char *role) {
  if (DLSYNC__LIKELY(lane->kind == DLSYNC_LANE_GRAPH && lane->stream == NULL &&
                     lane->graph != NULL && lane->ndeps <= 1 && lane->ndeps <= lane->capacity &&
                     lane->capacity <= DLSYNC__LANE_MAX_NODES &&
                     (lane->capacity == 0 || lane->deps != NULL)))
    return DLSYNC_SUCCESS;
  return dlsync__lane_check_slow(lane, role);
}

/* NULL and CU_STREAM_LEGACY both name the legacy default stream (dlsync
 * resolves driver entry points without per-thread default stream semantics). */
static inline bool dlsync__is_legacy_stream(CUstream s) {
  return s == NULL || s == CU_STREAM_LEGACY;
}
/* The handles that follow the calling thread (legacy, per-thread default):
 * never memoised, never on the fast path. */
static inline bool dlsync__is_special_stream(CUstream s) {
  /* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the handles 0, 1
   * and 2 (cuda.h's ABI: ((CUstream)0x1), ((CUstream)0x2)): one compare,
   * where gcc makes two or three of the three tests on the fast paths. */
  return (uintptr_t)s <= (uintptr_t)CU_STREAM_PER_THREAD;
}
static inline bool dlsync__same_stream(CUstream a, CUstream b) {
  return a == b || (dlsync__is_legacy_stream(a) && dlsync__is_legacy_stream(b));
}

#ifdef __cplusplus
}
#endif

#endif
