/* SPDX-License-Identifier: Apache-2.0 */
/* dlsync private: the decision table as code (inline here; names in
 * order/table.c). Never installed.
 *
 * dlsync__table_classify is a pure function from what the two lanes are now
 * to a row of the table in include/dlsync/exchange.h and docs/design.md:
 * no driver call, no state. Each row has one function that carries it out
 * (order/rows.h for order, begin and end; order/fence.c for a fence wait),
 * and every decision is logged at TRACE with the row's name. Tests,
 * the GPU suite and the bench name rows by dlsync__row_name. */
#ifndef DLSYNC_PRIVATE_TABLE_H
#define DLSYNC_PRIVATE_TABLE_H

#include <stdbool.h>

#include "dlsync/lane.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(ROW, nodes added (record + wait), what dlsync does). "first" is the lane
 * whose earlier work `then`'s later work must follow: the producer at begin,
 * the consumer at end, the fence at a fence wait. */
#define DLSYNC__ROWS(X)                                                                           \
  X(SAME_STREAM, 0, "one stream: already ordered, nothing queued")                                \
  X(EAGER_EAGER, 0, "eager -> eager: record a pooled event on first, wait on then")               \
  X(SAME_CAPTURE, 0, "capturing -> the same capture: then takes first's dependencies (edges)")    \
  X(JOIN, 0, "capturing -> eager: then joins first's capture (plain record and wait)")            \
  X(EAGER_TO_CAPTURE, 1, "eager -> capturing: eager record, external wait node in the capture")   \
  X(EAGER_TO_BUILT, 1, "eager -> built graph: wait node in the graph, eager record")              \
  X(TWO_CAPTURES, 2, "capturing -> another capture: record node in first's, wait node in then's") \
  X(CAPTURE_TO_BUILT, 2, "capturing -> built graph: record node in the capture, wait node")       \
  X(BUILT_TO_CAPTURE, 2, "built graph -> capturing: record node in the graph, wait node")         \
  X(TWO_BUILT, 2, "built graph -> another built graph: record node, wait node")                   \
  X(SAME_BUILT, 0, "built graph -> the same graph: edges only (frontiers merged)")                \
  X(LAUNCHED_TO_EAGER, 0, "fence wait: a graph's record node (launched since) -> eager: wait")    \
  X(REFUSE_BUILT_TO_EAGER, 0, "built graph -> eager: refused, the graph is not launched yet")     \
  X(REFUSE_CAPTURE_TO_EAGER, 0, "fence wait: active capture -> eager: refused, not launched")     \
  X(REFUSE_END_TO_EAGER, 0, "end: graph consumer -> eager producer: refused")                     \
  X(REFUSE_END_CROSS, 0, "end after begin's record/wait node pair in two graphs: refused")

typedef enum dlsync__row {
#define DLSYNC__ROW_ENUM(name, nodes, text) DLSYNC__ROW_##name,
  DLSYNC__ROWS(DLSYNC__ROW_ENUM)
#undef DLSYNC__ROW_ENUM
      DLSYNC__ROW_COUNT
} dlsync__row;

/* Which call asks. */
typedef enum dlsync__op {
  DLSYNC__OP_ORDER,      /* dlsync_order */
  DLSYNC__OP_BEGIN,      /* dlsync_exchange_begin: the same rows as ORDER */
  DLSYNC__OP_END,        /* dlsync_exchange_end: first = consumer, then = producer */
  DLSYNC__OP_FENCE_WAIT, /* dlsync_fence_wait: first = the fence's signalling lane */
  DLSYNC__OP_COUNT
} dlsync__op;

/* What the two lanes are now. `first` and `then` are EAGER, CAPTURING or
 * BUILT (dlsync_lane_state_kind). */
typedef struct dlsync__table_in {
  dlsync__op op;
  dlsync_lane_state_kind first;
  dlsync_lane_state_kind then;
  /* Both are stream lanes naming one stream (the legacy handles count as
   * one). A fence has no stream to compare: false. */
  bool same_stream;
  /* Both capturing in one capture (same id), or both BUILT in one graph
   * (at a fence wait: the fence's record node is a node of then's graph). */
  bool same_graph;
  /* OP_FENCE_WAIT, first CAPTURING: the capture is still active.
   * OP_END: begin put a record node in the producer's graph and a wait node
   * in the consumer's, and both lanes are still in those graphs. */
  bool first_pending;
} dlsync__table_in;

/* Inline: it sits on every call's path. */
static inline dlsync__row dlsync__table_two_graphs(dlsync_lane_state_kind first,
                                                   dlsync_lane_state_kind then) {
  if (first == DLSYNC_LANE_CAPTURING)
    return then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_TWO_CAPTURES : DLSYNC__ROW_CAPTURE_TO_BUILT;
  return then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_BUILT_TO_CAPTURE : DLSYNC__ROW_TWO_BUILT;
}

/* then is eager. */
static inline dlsync__row dlsync__table_to_eager(const dlsync__table_in *in) {
  switch (in->first) {
  case DLSYNC_LANE_EAGER:
    return DLSYNC__ROW_EAGER_EAGER;
  case DLSYNC_LANE_CAPTURING:
    if (in->op == DLSYNC__OP_END)
      return DLSYNC__ROW_REFUSE_END_TO_EAGER;
    if (in->op == DLSYNC__OP_FENCE_WAIT)
      return in->first_pending ? DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER
                               : DLSYNC__ROW_LAUNCHED_TO_EAGER;
    return DLSYNC__ROW_JOIN;
  default: /* BUILT */
    if (in->op == DLSYNC__OP_END)
      return DLSYNC__ROW_REFUSE_END_TO_EAGER;
    if (in->op == DLSYNC__OP_FENCE_WAIT)
      return DLSYNC__ROW_LAUNCHED_TO_EAGER;
    return DLSYNC__ROW_REFUSE_BUILT_TO_EAGER;
  }
}

static inline dlsync__row dlsync__table_classify(const dlsync__table_in *in) {
  if (in->same_stream && in->op != DLSYNC__OP_FENCE_WAIT)
    return DLSYNC__ROW_SAME_STREAM;
  if (in->then == DLSYNC_LANE_EAGER)
    return dlsync__table_to_eager(in);
  if (in->first == DLSYNC_LANE_EAGER)
    return in->then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_EAGER_TO_CAPTURE
                                             : DLSYNC__ROW_EAGER_TO_BUILT;
  /* Both in graphs. */
  if (in->same_graph && in->first == in->then)
    return in->first == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_SAME_CAPTURE : DLSYNC__ROW_SAME_BUILT;
  if (in->op == DLSYNC__OP_END && in->first_pending)
    return DLSYNC__ROW_REFUSE_END_CROSS;
  return dlsync__table_two_graphs(in->first, in->then);
}

/* "DLSYNC__ROW_EAGER_EAGER"; "DLSYNC__ROW_UNKNOWN" past the end. */
const char *dlsync__row_name(dlsync__row row);
/* The row's words, for messages and docs. */
const char *dlsync__row_text(dlsync__row row);
/* Graph nodes the row adds (record and wait nodes; a fence wait adds at most
 * the wait node, its record node was added by the signal). */
static inline int dlsync__row_nodes(dlsync__row row) {
  switch (row) {
#define DLSYNC__ROW_NODES_CASE(name, nodes, text) \
  case DLSYNC__ROW_##name:                        \
    return nodes;
    DLSYNC__ROWS(DLSYNC__ROW_NODES_CASE)
#undef DLSYNC__ROW_NODES_CASE
  default:
    return 0;
  }
}
/* The rows the fast path carries out itself: a plain record on first and a
 * wait on then with the thread's scratch event (EAGER_EAGER, JOIN), or
 * first's dependencies added to then's (SAME_CAPTURE). */
static inline bool dlsync__row_is_plain(dlsync__row row) {
  return row == DLSYNC__ROW_EAGER_EAGER || row == DLSYNC__ROW_SAME_CAPTURE ||
         row == DLSYNC__ROW_JOIN;
}
/* Rows that are refusals (DLSYNC_ERROR_CAPTURE_ORDER, nothing queued). */
static inline bool dlsync__row_is_refusal(dlsync__row row) {
  switch (row) {
  case DLSYNC__ROW_REFUSE_BUILT_TO_EAGER:
  case DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER:
  case DLSYNC__ROW_REFUSE_END_TO_EAGER:
  case DLSYNC__ROW_REFUSE_END_CROSS:
    return true;
  default:
    return false;
  }
}
const char *dlsync__op_name(dlsync__op op);

#ifdef __cplusplus
}
#endif

#endif
