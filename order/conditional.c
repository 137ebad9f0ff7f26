/* SPDX-License-Identifier: Apache-2.0 */
/* Conditional bodies a library declares (include/dlsync/conditional.h): the
 * context's set of them (graph/body.h); the rows refuse a lane inside one
 * or hoist its event nodes into the body's parent (rows.c, dlsync__body_guard_slow). */
#include "order/order.h"

dlsync_status dlsync_conditional_body_add(dlsync_context *ctx, struct CUgraph_st *body) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_conditional_body_add");
  if (ctx == NULL || body == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_conditional_body_add: %s is NULL",
                        ctx == NULL ? "ctx" : "body");
  if (!dlsync__bodies_add(&ctx->bodies, body))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_conditional_body_add: graph %p: %d bodies are declared already "
                        "in this context (DLSYNC_CONDITIONAL_BODIES), or 1024 in the process; "
                        "remove those whose parent graph is done",
                        (void *)body, DLSYNC_CONDITIONAL_BODIES);
  DLSYNC__LOG(DLSYNC__LOG_INFO, "graph %p declared a conditional body", (void *)body);
  return DLSYNC_SUCCESS;
}

dlsync_status dlsync_conditional_body_remove(dlsync_context *ctx, struct CUgraph_st *body) {
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_conditional_body_remove");
  if (ctx == NULL || body == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT, "dlsync_conditional_body_remove: %s is NULL",
                        ctx == NULL ? "ctx" : "body");
  if (!dlsync__bodies_remove(&ctx->bodies, body))
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_conditional_body_remove: graph %p is not a declared body of "
                        "context %p",
                        (void *)body, (void *)ctx);
  return DLSYNC_SUCCESS;
}

int dlsync_conditional_body_is_declared(dlsync_context *ctx, struct CUgraph_st *body) {
  return ctx != NULL && dlsync__bodies_has_here(&ctx->bodies, body);
}

/* Whether `node` is one of `parent`'s nodes (cuda.h 13.0 has no call that
 * names a node's graph: the parent's nodes are read and searched). */
/* The check's graph queries: a failure is DLSYNC_ERROR_DRIVER
 * (DLSYNC_ERROR_OUT_OF_MEMORY for the driver's), whatever code the driver
 * gives: a graph query has no capture to report on. */
#define QUERY_CU(d, name, args, ...)                                                            \
  do {                                                                                          \
    CUresult q_r_ = (d)->name args;                                                             \
    if (q_r_ != CUDA_SUCCESS) {                                                                 \
      st = dlsync__fail_driver_as(q_r_ == CUDA_ERROR_OUT_OF_MEMORY ? DLSYNC_ERROR_OUT_OF_MEMORY \
                                                                   : DLSYNC_ERROR_DRIVER,       \
                                  &(dlsync__driver_call){(d), q_r_, "cu" #name}, __VA_ARGS__);  \
      goto cleanup;                                                                             \
    }                                                                                           \
  } while (0)

static dlsync_status node_in_graph(const dlsync__driver *d, CUgraph parent, CUgraphNode node,
                                   bool *found) {
  dlsync_status st = DLSYNC_SUCCESS;
  CUgraphNode *nodes = NULL;
  size_t n = 0, bytes = 0;
  *found = false;
  QUERY_CU(d, GraphGetNodes, (parent, NULL, &n),
           "dlsync_conditional_node_declare: counting the nodes of graph %p", (void *)parent);
  if (n == 0)
    goto cleanup;
  if (!dlsync__mul_size(n, sizeof *nodes, &bytes) || (nodes = dlsync__malloc(bytes)) == NULL) {
    st = dlsync__fail(DLSYNC_ERROR_OUT_OF_MEMORY,
                      "dlsync_conditional_node_declare: the %zu nodes of graph %p: out of memory",
                      n, (void *)parent);
    goto cleanup;
  }
  QUERY_CU(d, GraphGetNodes, (parent, nodes, &n),
           "dlsync_conditional_node_declare: reading the nodes of graph %p", (void *)parent);
  for (size_t i = 0; i < n && !*found; i++)
    *found = nodes[i] == node;
cleanup:
  dlsync__free(nodes);
  return st;
}

dlsync_status dlsync_conditional_node_declare(dlsync_context *ctx, struct CUgraph_st *parent,
                                              struct CUgraphNode_st *node,
                                              struct CUgraph_st *const *bodies, size_t nbodies) {
  dlsync_status st = DLSYNC_SUCCESS;
  const dlsync__driver *d;
  CUgraphNodeType type;
  bool found = false;
  DLSYNC__REFUSE_IN_FORKED_CHILD("dlsync_conditional_node_declare");
  if (ctx == NULL || parent == NULL || node == NULL || bodies == NULL)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_conditional_node_declare: %s is NULL",
                        ctx == NULL      ? "ctx"
                        : parent == NULL ? "parent"
                        : node == NULL   ? "node"
                                         : "bodies");
  if (nbodies == 0 || nbodies > DLSYNC_CONDITIONAL_BODIES)
    return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                        "dlsync_conditional_node_declare: nbodies is %zu (1 to %d: a conditional "
                        "node's body count)",
                        nbodies, DLSYNC_CONDITIONAL_BODIES);
  for (size_t i = 0; i < nbodies; i++) {
    CUgraph had_parent;
    CUgraphNode had_node;
    if (bodies[i] == NULL || bodies[i] == parent)
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "dlsync_conditional_node_declare: bodies[%zu] is %s; nothing was "
                          "declared",
                          i, bodies[i] == NULL ? "NULL" : "the parent graph itself");
    for (size_t j = 0; j < i; j++)
      if (bodies[j] == bodies[i])
        return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                            "dlsync_conditional_node_declare: graph %p is given twice (bodies[%zu] "
                            "and bodies[%zu]); nothing was declared",
                            (void *)bodies[i], j, i);
    if (dlsync__bodies_parent(&ctx->bodies, bodies[i], &had_parent, &had_node) &&
        (had_parent != parent || had_node != node))
      return dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                          "dlsync_conditional_node_declare: body %p is declared already as a "
                          "body of conditional node %p of graph %p, not of node %p of graph %p "
                          "(a declared parent that is not the body's parent); nothing was "
                          "declared",
                          (void *)bodies[i], (void *)had_node, (void *)had_parent, (void *)node,
                          (void *)parent);
  }
  d = ctx->drv;
  QUERY_CU(d, GraphNodeGetType, (node, &type),
           "dlsync_conditional_node_declare: node %p of graph %p (a destroyed or not-a-node "
           "handle?); nothing was declared",
           (void *)node, (void *)parent);
  if (type != CU_GRAPH_NODE_TYPE_CONDITIONAL) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "dlsync_conditional_node_declare: node %p is of type %d, not a conditional "
                      "node (CU_GRAPH_NODE_TYPE_CONDITIONAL); nothing was declared",
                      (void *)node, (int)type);
    goto cleanup;
  }
  DLSYNC_TRY(node_in_graph(d, parent, node, &found));
  if (!found) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "dlsync_conditional_node_declare: conditional node %p is not a node of "
                      "graph %p (a conditional node of another graph); nothing was declared",
                      (void *)node, (void *)parent);
    goto cleanup;
  }
  if (!dlsync__bodies_add_node(&ctx->bodies, parent, node, (const CUgraph *)bodies, nbodies)) {
    st = dlsync__fail(DLSYNC_ERROR_INVALID_ARGUMENT,
                      "dlsync_conditional_node_declare: %zu bodies of node %p: %d bodies are "
                      "declared already in this context (DLSYNC_CONDITIONAL_BODIES), or 1024 in "
                      "the process; remove those whose parent graph is done; nothing was declared",
                      nbodies, (void *)node, DLSYNC_CONDITIONAL_BODIES);
    goto cleanup;
  }
  DLSYNC__LOG(DLSYNC__LOG_INFO, "conditional node %p of graph %p: %zu bodies declared",
              (void *)node, (void *)parent, nbodies);
cleanup:
  return st;
}
