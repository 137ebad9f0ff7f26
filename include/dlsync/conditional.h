/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync: conditional nodes' bodies.
 *
 * Caller's rules:
 *  - Declare each conditional node's bodies with the node and its parent
 *    (dlsync_conditional_node_declare, one call per node), or each body
 *    alone (dlsync_conditional_body_add), before any dlsync call on a lane
 *    in it: CUDA has no call that says
 *    whether a graph is a body, so dlsync knows only what it is told.
 *  - Remove a declaration (dlsync_conditional_body_remove) before the parent
 *    graph, which owns its bodies, is destroyed: graph handles are reused,
 *    and a new graph with the same handle would be taken for a body.
 *  - At most DLSYNC_CONDITIONAL_BODIES bodies are declared at once per
 *    context (and 1024 in the process).
 *
 * CUDA admits only kernel, empty, child-graph, memset, memcpy and conditional
 * nodes in the body of a conditional node (IF, WHILE, SWITCH:
 * CUDA_CONDITIONAL_NODE_PARAMS in cuda.h). An event-wait node put in a body
 * during a capture into it is accepted, the capture ends cleanly, and the
 * parent graph's cuGraphInstantiate then fails with CUDA_ERROR_INVALID_VALUE,
 * far from the call that added it (observed on the driver; the GPU suite
 * checks it). So the caller, who made the conditional node, tells dlsync:
 *
 *   cuGraphAddNode(&node, parent, deps, NULL, ndeps, &params);
 *   CUgraph body = params.conditional.phGraph_out[0];
 *   dlsync_conditional_node_declare(ctx, parent, node, &body, 1);
 *     // or dlsync_conditional_body_add(ctx, body): the rows refuse, not hoist
 *   cuStreamBeginCaptureToGraph(s, body, NULL, NULL, 0, mode);  // or nodes by hand
 *   ... exchanges, orders, fences on s (and on streams that join s) ...
 *   cuStreamEndCapture(s, &body);
 *   dlsync_conditional_body_remove(ctx, body);  // before the parent is destroyed
 *
 * Then, for a lane whose graph is a declared body (a stream capturing into it,
 * or a graph lane on it):
 *  - the rows that take edges only work as everywhere: SAME_CAPTURE (both
 *    streams in the body's capture), JOIN (an eager stream joins the body's
 *    capture), SAME_BUILT, one stream;
 *  - the rows that would add an event-record or event-wait node in the body
 *    (EAGER_TO_CAPTURE, EAGER_TO_BUILT, TWO_CAPTURES, CAPTURE_TO_BUILT,
 *    BUILT_TO_CAPTURE, TWO_BUILT), for a body declared with its parent and
 *    conditional node (dlsync_conditional_node_declare), put that node in the
 *    parent instead: a wait node ahead of the conditional node (an edge from
 *    it), a record node after it; for a body inside a body, in the outermost
 *    graph that admits it. The node orders the whole conditional node, which
 *    is never weaker. docs/design.md section 3 has the table;
 *  - those rows, for a body declared alone (dlsync_conditional_body_add) or
 *    by another context, or where both of the row's nodes would land in one
 *    graph, and a fence signalled in a body or waited on there with a node,
 *    are refused at once with DLSYNC_ERROR_CONDITIONAL_BODY and a message
 *    naming the row, the lane and the body: nothing is queued, the capture
 *    stays valid, and the parent graph still instantiates. Order that work
 *    before the conditional node instead (on the parent's lane, before the
 *    body's capture begins), or bring the other stream into the body's
 *    capture (an exchange that joins it takes edges only).
 *
 * A body of a body (a conditional node inside a body) is declared the same
 * way. Declarations belong to the context that made them (is_declared and
 * remove answer for it; they go when it is destroyed) and any thread's calls
 * see them; a graph is a body whatever context said so, so every context's
 * rows and dlsync_graph_launch refuse a body another context declared, the
 * message saying "in another dlsync context".
 *
 * Cost: while no context has a declared body, the rows that add nodes pay one
 * load; with some, they also compare their graphs with their context's
 * declared ones, and with the process's when other contexts have some. The
 * rows that add no node never look.
 */
#ifndef DLSYNC_CONDITIONAL_H
#define DLSYNC_CONDITIONAL_H

#include "dlsync/context.h"
#include "dlsync/export.h"
#include "dlsync/status.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct CUgraph_st;

#define DLSYNC_CONDITIONAL_BODIES 64

/* Declares `body` (a graph from CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out) a
 * conditional node's body for ctx. Declaring one twice is allowed and counts
 * once. No driver call: the handle is taken on the caller's word.
 * Returns: DLSYNC_SUCCESS, the body declared.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (ctx or body NULL, or
 *   DLSYNC_CONDITIONAL_BODIES bodies declared already in ctx, or 1024 in the
 *   process); nothing is declared then.
 * Threads: any thread, any number at once.
 * Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_conditional_body_add(dlsync_context *ctx, struct CUgraph_st *body);

struct CUgraphNode_st;

/* Declares every body of conditional node `node` of graph `parent` in one
 * call: bodies[0..nbodies) (CUDA_CONDITIONAL_NODE_PARAMS.phGraph_out after
 * cuGraphAddNode; IF: 1 or 2, WHILE: 1, SWITCH: its size). As
 * dlsync_conditional_body_add for each body, and more: the rows that would
 * put an event node in one of these bodies hoist it into the parent instead
 * (a wait node ahead of the conditional node; a record node after it), at
 * the outermost graph that admits it when the parent is itself a body
 * declared this way. The parent must still be able to take nodes: a graph
 * built by hand, or the graph a capture is building (the conditional node
 * added to it by cuGraphAddNode during the capture), not yet instantiated
 * (an executable made before the hoist does not see it: dlsync cannot tell
 * that a graph was instantiated). Declaring a body again with the same
 * parent and node is allowed and counts once. Remove each body
 * (dlsync_conditional_body_remove) before the parent is destroyed.
 * Driver calls: cuGraphNodeGetType and cuGraphGetNodes, to check the node.
 * Returns: DLSYNC_SUCCESS, all bodies declared.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (a NULL argument or body, nbodies 0
 *   or more than DLSYNC_CONDITIONAL_BODIES, a body given twice or equal to
 *   the parent, `node` not a conditional node, `node` not a node of
 *   `parent` (a conditional node of another graph), a body declared
 *   already with another parent or node, no room left); DLSYNC_ERROR_DRIVER
 *   (a driver call failed, whatever its code); DLSYNC_ERROR_OUT_OF_MEMORY.
 *   Nothing is declared on failure.
 * Threads: any thread, any number at once.
 * Capture: legal in every mode (graph queries only). */
DLSYNC_API dlsync_status dlsync_conditional_node_declare(dlsync_context *ctx,
                                                         struct CUgraph_st *parent,
                                                         struct CUgraphNode_st *node,
                                                         struct CUgraph_st *const *bodies,
                                                         size_t nbodies);

/* Forgets a declaration made by ctx. No driver call.
 * Returns: DLSYNC_SUCCESS, the declaration gone.
 * Errors: DLSYNC_ERROR_INVALID_ARGUMENT (ctx or body NULL, or body not
 *   declared by ctx).
 * Threads: any thread, any number at once.
 * Capture: no driver call; safe at any time. */
DLSYNC_API dlsync_status dlsync_conditional_body_remove(dlsync_context *ctx,
                                                        struct CUgraph_st *body);

/* Whether `body` is declared by ctx.
 * Returns: 1 when it is; 0 otherwise, also for NULL arguments and for a body
 *   only another context declared. Sets no error.
 * Threads: any thread. Capture: no driver call; safe at any time. */
DLSYNC_API int dlsync_conditional_body_is_declared(dlsync_context *ctx, struct CUgraph_st *body);

#ifdef __cplusplus
}
#endif

#endif
