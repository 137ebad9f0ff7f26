/* SPDX-License-Identifier: Apache-2.0 */
/* Conditional bodies a library declares (include/dlsync/conditional.h): the
 * context's set of them (graph/body.h); the rows refuse a lane inside one
 * (rows.c, dlsync__body_guard_slow). */
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
