/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table's names and words. The classifier itself, a pure
 * function from what the two lanes are now to the row, is inline in
 * order/table.h (it is on every call's path); it is tested
 * over every combination by tests/test_decision_table.c. */
#include "order/table.h"

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
