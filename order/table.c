/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table as one pure function: what the two lanes are now ->
 * the row (include/dlsync/private/table.h). No driver call, no state; tested
 * over every combination by tests/test_decision_table.c. */
#include "dlsync/private/table.h"

static dlsync__row two_graphs(dlsync_lane_state_kind first, dlsync_lane_state_kind then) {
  if (first == DLSYNC_LANE_CAPTURING)
    return then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_TWO_CAPTURES : DLSYNC__ROW_CAPTURE_TO_BUILT;
  return then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_BUILT_TO_CAPTURE : DLSYNC__ROW_TWO_BUILT;
}

/* then is eager. */
static dlsync__row to_eager(const dlsync__table_in *in) {
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

dlsync__row dlsync__table_classify(const dlsync__table_in *in) {
  if (in->same_stream && in->op != DLSYNC__OP_FENCE_WAIT)
    return DLSYNC__ROW_SAME_STREAM;
  if (in->then == DLSYNC_LANE_EAGER)
    return to_eager(in);
  if (in->first == DLSYNC_LANE_EAGER)
    return in->then == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_EAGER_TO_CAPTURE
                                             : DLSYNC__ROW_EAGER_TO_BUILT;
  /* Both in graphs. */
  if (in->same_graph && in->first == in->then)
    return in->first == DLSYNC_LANE_CAPTURING ? DLSYNC__ROW_SAME_CAPTURE : DLSYNC__ROW_SAME_BUILT;
  if (in->op == DLSYNC__OP_END && in->first_pending)
    return DLSYNC__ROW_REFUSE_END_CROSS;
  return two_graphs(in->first, in->then);
}

const char *dlsync__row_name(dlsync__row row) {
  switch (row) {
#define DLSYNC__ROW_NAME_CASE(name, nodes, text) \
  case DLSYNC__ROW_##name:                       \
    return "DLSYNC__ROW_" #name;
    DLSYNC__ROWS(DLSYNC__ROW_NAME_CASE)
#undef DLSYNC__ROW_NAME_CASE
  default:
    return "DLSYNC__ROW_UNKNOWN";
  }
}

const char *dlsync__row_text(dlsync__row row) {
  switch (row) {
#define DLSYNC__ROW_TEXT_CASE(name, nodes, text) \
  case DLSYNC__ROW_##name:                       \
    return text;
    DLSYNC__ROWS(DLSYNC__ROW_TEXT_CASE)
#undef DLSYNC__ROW_TEXT_CASE
  default:
    return "unknown row";
  }
}

int dlsync__row_nodes(dlsync__row row) {
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

const char *dlsync__op_name(dlsync__op op) {
  switch (op) {
  case DLSYNC__OP_ORDER:
    return "order";
  case DLSYNC__OP_BEGIN:
    return "exchange begin";
  case DLSYNC__OP_END:
    return "exchange end";
  case DLSYNC__OP_FENCE_WAIT:
    return "fence wait";
  default:
    return "?";
  }
}
