/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: lanes, the places where work is ordered.
 *
 * A lane is either
 *  - a stream (DLSYNC_LANE_STREAM): any CUstream / cudaStream_t, including
 *    DLSYNC_STREAM_LEGACY and DLSYNC_STREAM_PER_THREAD. Whether it is eager or
 *    capturing is read from the driver (cuStreamGetCaptureInfo) at each call,
 *    never cached; or
 *  - a position in a graph built by hand (DLSYNC_LANE_GRAPH): a CUgraph and the
 *    nodes the lane's next work depends on (its frontier). A call that orders
 *    work on a graph lane writes the lane's new frontier back into deps[] and
 *    ndeps, so the caller builds on from there; deps must have room for
 *    `capacity` nodes (DLSYNC_ERROR_INVALID_ARGUMENT, nothing added, when the
 *    new frontier would not fit; a frontier of one node always fits).
 *
 * This header does not need cuda.h: handles are named by their struct tags,
 * which are those of cuda.h and cuda_runtime.h, so CUstream, cudaStream_t,
 * CUgraph and cudaGraph_t pass unchanged, whichever header comes first.
 */
#ifndef DLSYNC_LANE_H
#define DLSYNC_LANE_H

#include <stddef.h>
#include <stdint.h>

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUstream_st;
struct CUgraph_st;
struct CUgraphNode_st;

/* The driver's special stream handles (CU_STREAM_LEGACY, CU_STREAM_PER_THREAD). */
#define DLSYNC_STREAM_LEGACY ((struct CUstream_st *)0x1)
#define DLSYNC_STREAM_PER_THREAD ((struct CUstream_st *)0x2)

typedef enum dlsync_lane_kind {
  DLSYNC_LANE_NONE = 0, /* a zeroed lane: rejected with DLSYNC_ERROR_INVALID_LANE */
  DLSYNC_LANE_STREAM = 1,
  DLSYNC_LANE_GRAPH = 2
} dlsync_lane_kind;

typedef struct dlsync_lane {
  dlsync_lane_kind kind;
  struct CUstream_st *stream;   /* STREAM lanes; must be NULL-or-unused for GRAPH */
  struct CUgraph_st *graph;     /* GRAPH lanes; must be NULL for STREAM */
  struct CUgraphNode_st **deps; /* GRAPH lanes: the frontier, updated in place */
  size_t ndeps;                 /* GRAPH lanes: nodes in deps */
  size_t capacity;              /* GRAPH lanes: room in deps */
} dlsync_lane;

static inline dlsync_lane dlsync_lane_stream(struct CUstream_st *stream) {
  dlsync_lane lane;
  lane.kind = DLSYNC_LANE_STREAM;
  lane.stream = stream;
  lane.graph = NULL;
  lane.deps = NULL;
  lane.ndeps = 0;
  lane.capacity = 0;
  return lane;
}

static inline dlsync_lane dlsync_lane_graph(struct CUgraph_st *graph, struct CUgraphNode_st **deps,
                                            size_t ndeps, size_t capacity) {
  dlsync_lane lane;
  lane.kind = DLSYNC_LANE_GRAPH;
  lane.stream = NULL;
  lane.graph = graph;
  lane.deps = deps;
  lane.ndeps = ndeps;
  lane.capacity = capacity;
  return lane;
}

typedef enum dlsync_lane_state_kind {
  DLSYNC_LANE_EAGER = 0,     /* a stream not capturing */
  DLSYNC_LANE_CAPTURING = 1, /* a stream being captured */
  DLSYNC_LANE_BUILT = 2      /* a graph lane */
} dlsync_lane_state_kind;

typedef struct dlsync_lane_state {
  dlsync_lane_state_kind kind;
  uint64_t capture_id;      /* CAPTURING: the driver's capture id */
  struct CUgraph_st *graph; /* CAPTURING: the graph being built; BUILT: the lane's graph */
} dlsync_lane_state;

/* Reads what a lane is now. Errors: DLSYNC_ERROR_INVALID_LANE,
 * DLSYNC_ERROR_CAPTURE_INVALIDATED, DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE,
 * DLSYNC_ERROR_DRIVER. One cuStreamGetCaptureInfo for a stream lane; no
 * driver call for a graph lane. Legal during capture. */
DLSYNC_API dlsync_status dlsync_lane_query(dlsync_lane_state *out, dlsync_context *ctx,
                                           const dlsync_lane *lane);

#ifdef __cplusplus
}
#endif

#endif
