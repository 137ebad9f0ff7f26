/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the conditional bodies a context was told of
 * (include/dlsync/conditional.h), kept in graph/body.c. Never installed.
 *
 * A fixed table in the context (zeroed with it: no setup, nothing to free):
 * the graphs as atomic words, a count of those declared for the rows' one
 * load, and a spin lock for the writers (declarations are rare; readers never
 * take it). */
#ifndef DLSYNC_PRIVATE_BODY_H
#define DLSYNC_PRIVATE_BODY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "dlsync/conditional.h"
#include "driver/driver.h"
#include "stream/stream.h"

typedef struct dlsync__bodies {
  atomic_uint n;    /* bodies declared now */
  atomic_bool lock; /* writers only */
  _Atomic(uintptr_t) graph[DLSYNC_CONDITIONAL_BODIES];
  /* For a body declared with its conditional node
   * (dlsync_conditional_node_declare): the node's graph and the node (0:
   * declared alone). Written before graph[i], read after it. */
  _Atomic(uintptr_t) parent[DLSYNC_CONDITIONAL_BODIES];
  _Atomic(uintptr_t) node[DLSYNC_CONDITIONAL_BODIES];
} dlsync__bodies;

/* Bodies declared now in all contexts: the rows that add nodes load this
 * one word (no pointer to follow) and look at their context's table only
 * when it is not 0. */
extern DLSYNC__HIDDEN atomic_uint dlsync__bodies_total;

/* Whether any body is declared in any context (a graph is a body whatever
 * context declared it: the rows of every context look). b: the context's
 * table (unused: the test is the one global word). */
static inline bool dlsync__bodies_any(const dlsync__bodies *b) {
  (void)b;
  return atomic_load_explicit(&dlsync__bodies_total, memory_order_acquire) != 0;
}
/* Where g is declared: not at all (NULL: not), in b's context, or only in
 * another context's (each declaration is also kept in a process-wide table
 * of graph handles, graph/body.c). */
typedef enum dlsync__body_where {
  DLSYNC__BODY_NOT,
  DLSYNC__BODY_HERE,
  DLSYNC__BODY_ELSEWHERE
} dlsync__body_where;
dlsync__body_where dlsync__bodies_find(const dlsync__bodies *b, CUgraph g);
/* Whether g is declared in b's context. */
bool dlsync__bodies_has_here(const dlsync__bodies *b, CUgraph g);
/* Declares g: false when the table (or the process-wide one) is full (g
 * declared already: true). */
bool dlsync__bodies_add(dlsync__bodies *b, CUgraph g);
/* Declares bodies[0..n) the bodies of conditional node `node` of graph
 * `parent`, all or none: false when the tables lack room for them. A body
 * declared already keeps its entry and takes the parent and node. The
 * caller checked that none is declared with another parent or node. */
bool dlsync__bodies_add_node(dlsync__bodies *b, CUgraph parent, CUgraphNode node,
                             const CUgraph *bodies, size_t n);
/* The parent graph and conditional node g was declared with in b's
 * context: false (both NULL) when g is not declared there, or was declared
 * alone (dlsync_conditional_body_add). */
bool dlsync__bodies_parent(const dlsync__bodies *b, CUgraph g, CUgraph *parent, CUgraphNode *node);
/* Forgets g: false when it was not declared in b's context. */
bool dlsync__bodies_remove(dlsync__bodies *b, CUgraph g);
/* Forgets every declaration of b's context (context destroy). */
void dlsync__bodies_forget_all(dlsync__bodies *b);

/* A lane whose graph is a declared body that `what` (a row's name, a
 * fence's call) would give an event-record (record) or event-wait node:
 * DLSYNC_ERROR_CONDITIONAL_BODY naming both, nothing done. DLSYNC_SUCCESS
 * when the lane is eager or its graph no declared body. */
DLSYNC__COLD dlsync_status dlsync__body_refuse(const dlsync__bodies *b, const char *what,
                                               const dlsync__lane_now *l, bool record);
/* The same for a row of the table, whose message also names the way to
 * have the node hoisted (dlsync_conditional_node_declare). */
DLSYNC__COLD dlsync_status dlsync__body_refuse_row(const dlsync__bodies *b, const char *what,
                                                   const dlsync__lane_now *l, bool record);

#endif
