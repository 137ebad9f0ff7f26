/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: lanes, the places where work is ordered.
 *
 * Caller's rules:
 *  - Make lanes with dlsync_lane_stream or dlsync_lane_graph; a zeroed lane
 *    is rejected (DLSYNC_ERROR_INVALID_LANE).
 *  - A stream lane is any CUstream / cudaStream_t, including
 *    DLSYNC_STREAM_LEGACY and DLSYNC_STREAM_PER_THREAD; whether it is eager
 *    or capturing is read from the driver at each call, never cached.
 *  - A graph lane is a position in a graph built by hand: the CUgraph and the
 *    nodes its next work depends on (its frontier). A call that orders work
 *    on it writes the new frontier back into deps[] and ndeps, so build on
 *    from there; deps must have room for `capacity` nodes (a frontier that
 *    would not fit is DLSYNC_ERROR_INVALID_ARGUMENT, nothing added; a
 *    frontier of one node always fits).
 *  - No cuda.h is needed: handles are named by their struct tags, which are
 *    those of cuda.h and cuda_runtime.h, so CUstream, cudaStream_t, CUgraph
 *    and cudaGraph_t pass unchanged, whichever header comes first.
 *
 * Layout: struct dlsync_lane and struct dlsync_lane_state are frozen, field
 * for field as written here, for every 0.x version and until 1.0; a change
 * before then would come as a new struct with a new name, never as a new
 * field in these. (Unlike the config and stats structs, they carry no size
 * field: callers make them on the stack for every call.)
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

/* A stream lane. No driver call; any thread; legal during capture. */
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

/* A graph lane: `graph` and its frontier deps[0..ndeps), with room for
 * `capacity` nodes in deps. No driver call; any thread; legal during
 * capture. */
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

/* Reads what a lane is now: one cuStreamGetCaptureInfo for a stream lane; no
 * driver call for a graph lane.
 * Returns: DLSYNC_SUCCESS and *out filled.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT, DLSYNC_ERROR_INVALID_LANE,
 *   DLSYNC_ERROR_CAPTURE_INVALIDATED, DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE,
 *   DLSYNC_ERROR_DRIVER.
 * Threads: any thread, any number at once.
 * Capture: legal in every mode (a capture query harms no capture, design.md
 *   R8). */
DLSYNC_API dlsync_status dlsync_lane_query(dlsync_lane_state *out, dlsync_context *ctx,
                                           const dlsync_lane *lane);

#ifdef __cplusplus
}
#endif

#endif
