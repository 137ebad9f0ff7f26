/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: a library's own graph, run on any lane.
 *
 * Caller's rules:
 *  - On an eager stream pass `exec`, an executable of `graph` (only `exec` is
 *    used there: `graph` may be NULL or already destroyed). Elsewhere pass
 *    `graph`.
 *  - `graph` must be able to be a child graph: no conditional,
 *    memory-allocation or memory-free nodes, and not the lane's own graph (a
 *    graph lane on it, a capture into it).
 *  - In a conditional node's body declared in any context
 *    (include/dlsync/conditional.h), `graph` must hold no event-record or
 *    event-wait node, at any depth of its child graphs.
 *  - A graph lane needs room for one node in its deps.
 *  - The graph may be destroyed after the call: what dlsync placed holds a
 *    copy.
 *
 * A library that captured or built a graph of its own earlier (a step it
 * replays) must run it wherever its caller is: on an eager stream, inside
 * the caller's stream capture, or at a position in a graph the caller builds
 * by hand. dlsync_graph_launch does what each place needs:
 *  - an eager stream: cuGraphLaunch(exec, stream);
 *  - a capturing stream: a child-graph node (cuGraphAddChildGraphNode, a
 *    copy of `graph`) after the capture's current dependencies, which become
 *    that node: no other node, no join of unrelated work. Inside a
 *    conditional node's body too (a child graph is admitted there when its
 *    own nodes are);
 *  - a graph lane: a child-graph node after the lane's frontier, which
 *    becomes that node.
 * The child node holds a copy of `graph`, valid as long as the graph it went
 * into, or an executable of it, lives.
 *
 * Not detected: an executable of another graph than `graph` on an eager
 * stream. The driver keeps no link from an executable to its graph that can
 * be read without side effects: cuGraphExecGetFlags gives only the
 * instantiation flags, cuGraphExecUpdate would rewrite the executable to
 * check, and cuGraphNodeGetEnabled (which refuses a node of another graph)
 * only takes kernel, memset and memcpy nodes and costs a node list per
 * launch. exec is what runs. A handle of another kind passed as graph is
 * refused by the driver when it checks its handles (the fake does); a real
 * driver may not, as for any CUDA call given a wrong handle.
 */
#ifndef DLSYNC_GRAPH_H
#define DLSYNC_GRAPH_H

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/lane.h"
#include "dlsync/status.h"

#ifdef __cplusplus
extern "C" {
#endif

struct CUgraph_st;
struct CUgraphExec_st;

/* Runs `graph` (launched as `exec` on an eager stream) at `lane`. A graph
 * lane's new frontier (the child node) is written back.
 * Returns: DLSYNC_SUCCESS, the graph launched or its node in place.
 * Errors, each with a message and nothing queued:
 *   DLSYNC_ERROR_INVALID_ARGUMENT (ctx or lane NULL; graph NULL where a child
 *   node is needed; exec NULL on an eager stream; graph the lane's own graph;
 *   a graph that cannot be a child, said so by name; a graph lane without
 *   room for one node), DLSYNC_ERROR_INVALID_LANE,
 *   DLSYNC_ERROR_CAPTURE_INVALIDATED, DLSYNC_ERROR_LEGACY_STREAM_IN_CAPTURE
 *   (the legacy stream while a blocking stream captures, as for
 *   dlsync_order), DLSYNC_ERROR_CONDITIONAL_BODY (the lane's graph is a
 *   declared body and graph holds event nodes), DLSYNC_ERROR_DRIVER_TOO_OLD
 *   (a driver without cuGraphAddChildGraphNode,
 *   cuGraphChildGraphNodeGetGraph or cuGraphLaunch, named),
 *   DLSYNC_ERROR_DRIVER (the driver refused: a destroyed graph or
 *   executable, a handle that is no graph, named with the call),
 *   DLSYNC_ERROR_OUT_OF_MEMORY (host memory, or the driver's
 *   CUDA_ERROR_OUT_OF_MEMORY).
 * Threads: any number of calls at once on one context; a graph lane is
 *   written by one thread at a time.
 * Capture: legal during capture (a capturing stream is one of its lanes). */
DLSYNC_API dlsync_status dlsync_graph_launch(dlsync_context *ctx, struct CUgraph_st *graph,
                                             struct CUgraphExec_st *exec, dlsync_lane *lane);

#ifdef __cplusplus
}
#endif

#endif
