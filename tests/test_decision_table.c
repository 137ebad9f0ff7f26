/* SPDX-License-Identifier: Apache-2.0 */
/* The decision table without any driver: dlsync__table_classify over every
 * combination of its inputs, against the table of include/dlsync/exchange.h
 * and docs/design.md written out here a second time, as lookup tables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "order/table.h"

enum { E, C, B }; /* eager, capturing, built: indices of the tables below */

static const dlsync_lane_state_kind kinds[3] = {DLSYNC_LANE_EAGER, DLSYNC_LANE_CAPTURING,
                                                DLSYNC_LANE_BUILT};

/* [first][then], two different streams, two different graphs. */
static const dlsync__row order_rows[3][3] = {
    [E] = {DLSYNC__ROW_EAGER_EAGER, DLSYNC__ROW_EAGER_TO_CAPTURE, DLSYNC__ROW_EAGER_TO_BUILT},
    [C] = {DLSYNC__ROW_JOIN, DLSYNC__ROW_TWO_CAPTURES, DLSYNC__ROW_CAPTURE_TO_BUILT},
    [B] = {DLSYNC__ROW_REFUSE_BUILT_TO_EAGER, DLSYNC__ROW_BUILT_TO_CAPTURE, DLSYNC__ROW_TWO_BUILT},
};

/* End: first is the consumer, then the producer. An eager producer cannot
 * wait for the consumer's graph. */
static const dlsync__row end_rows[3][3] = {
    [E] = {DLSYNC__ROW_EAGER_EAGER, DLSYNC__ROW_EAGER_TO_CAPTURE, DLSYNC__ROW_EAGER_TO_BUILT},
    [C] = {DLSYNC__ROW_REFUSE_END_TO_EAGER, DLSYNC__ROW_TWO_CAPTURES, DLSYNC__ROW_CAPTURE_TO_BUILT},
    [B] = {DLSYNC__ROW_REFUSE_END_TO_EAGER, DLSYNC__ROW_BUILT_TO_CAPTURE, DLSYNC__ROW_TWO_BUILT},
};

/* Fence wait, the fence's capture ended (or the fence eager or built): an
 * eager waiter waits for the record as launched. */
static const dlsync__row wait_rows[3][3] = {
    [E] = {DLSYNC__ROW_EAGER_EAGER, DLSYNC__ROW_EAGER_TO_CAPTURE, DLSYNC__ROW_EAGER_TO_BUILT},
    [C] = {DLSYNC__ROW_LAUNCHED_TO_EAGER, DLSYNC__ROW_TWO_CAPTURES, DLSYNC__ROW_CAPTURE_TO_BUILT},
    [B] = {DLSYNC__ROW_LAUNCHED_TO_EAGER, DLSYNC__ROW_BUILT_TO_CAPTURE, DLSYNC__ROW_TWO_BUILT},
};

static dlsync__row expected(dlsync__op op, int f, int t, bool same_stream, bool same_graph,
                            bool pending) {
  if (same_stream && op != DLSYNC__OP_FENCE_WAIT)
    return DLSYNC__ROW_SAME_STREAM;
  if (same_graph && f == C && t == C)
    return DLSYNC__ROW_SAME_CAPTURE;
  if (same_graph && f == B && t == B)
    return DLSYNC__ROW_SAME_BUILT;
  switch (op) {
  case DLSYNC__OP_END:
    if (pending && f != E && t != E)
      return DLSYNC__ROW_REFUSE_END_CROSS;
    return end_rows[f][t];
  case DLSYNC__OP_FENCE_WAIT:
    if (pending && f == C && t == E)
      return DLSYNC__ROW_REFUSE_CAPTURE_TO_EAGER;
    return wait_rows[f][t];
  default: /* ORDER, BEGIN: pending means nothing */
    return order_rows[f][t];
  }
}

static void every_combination_gives_its_row(void **state) {
  bool seen[DLSYNC__ROW_COUNT] = {false};
  unsigned combos = 0;
  (void)state;
  for (int op = 0; op < DLSYNC__OP_COUNT; op++)
    for (int f = 0; f < 3; f++)
      for (int t = 0; t < 3; t++)
        for (int bits = 0; bits < 8; bits++) {
          dlsync__table_in in;
          dlsync__row got, want;
          memset(&in, 0, sizeof in);
          in.op = (dlsync__op)op;
          in.first = kinds[f];
          in.then = kinds[t];
          in.same_stream = (bits & 1) != 0;
          in.same_graph = (bits & 2) != 0;
          in.first_pending = (bits & 4) != 0;
          got = dlsync__table_classify(&in);
          want = expected(in.op, f, t, in.same_stream, in.same_graph, in.first_pending);
          if (got != want)
            fail_msg("%s, first %d then %d, same stream %d, same graph %d, pending %d: %s, want %s",
                     dlsync__op_name(in.op), f, t, in.same_stream, in.same_graph, in.first_pending,
                     dlsync__row_name(got), dlsync__row_name(want));
          seen[got] = true;
          combos++;
        }
  assert_int_equal(combos, DLSYNC__OP_COUNT * 3 * 3 * 8);
  /* Every row is reached by some combination. */
  for (int r = 0; r < DLSYNC__ROW_COUNT; r++)
    if (!seen[r])
      fail_msg("row %s is never chosen", dlsync__row_name((dlsync__row)r));
}

/* The fast path serves a warm thread whose `then` stream is eager without
 * asking about `first`: that is right only if both rows it may be are plain
 * record/wait rows. The rows it carries out without the classifier are the
 * table's. */
static void the_fast_path_rows_are_plain(void **state) {
  dlsync__table_in in;
  (void)state;
  memset(&in, 0, sizeof in);
  for (int op = DLSYNC__OP_ORDER; op <= DLSYNC__OP_BEGIN; op++) {
    in.op = (dlsync__op)op;
    in.then = DLSYNC_LANE_EAGER;
    in.first = DLSYNC_LANE_EAGER;
    assert_true(dlsync__row_is_plain(dlsync__table_classify(&in)));
    in.first = DLSYNC_LANE_CAPTURING;
    assert_true(dlsync__row_is_plain(dlsync__table_classify(&in)));
  }
  /* End with both eager (the only end the fast path serves without
   * CAPTURE_STABLE), and a stable join (both in one capture). */
  in.op = DLSYNC__OP_END;
  in.first = in.then = DLSYNC_LANE_EAGER;
  assert_int_equal(dlsync__table_classify(&in), DLSYNC__ROW_EAGER_EAGER);
  in.first = in.then = DLSYNC_LANE_CAPTURING;
  in.same_graph = true;
  assert_true(dlsync__row_is_plain(dlsync__table_classify(&in)));
  /* dlsync_order's lean EAGER_TO_CAPTURE path (order/exchange.c,
   * fast_eager_to_capture) takes `first` eager and `then` capturing as that
   * row without classifying: the table must agree. */
  memset(&in, 0, sizeof in);
  in.op = DLSYNC__OP_ORDER;
  in.first = DLSYNC_LANE_EAGER;
  in.then = DLSYNC_LANE_CAPTURING;
  assert_int_equal(dlsync__table_classify(&in), DLSYNC__ROW_EAGER_TO_CAPTURE);
}

static void rows_have_names_nodes_and_words(void **state) {
  (void)state;
  for (int r = 0; r < DLSYNC__ROW_COUNT; r++) {
    const char *name = dlsync__row_name((dlsync__row)r);
    int nodes = dlsync__row_nodes((dlsync__row)r);
    assert_true(strncmp(name, "DLSYNC__ROW_", 12) == 0);
    assert_true(strlen(dlsync__row_text((dlsync__row)r)) > 10);
    for (int q = 0; q < r; q++)
      assert_string_not_equal(name, dlsync__row_name((dlsync__row)q));
    /* A refusal queues nothing; a plain row adds no node. */
    if (dlsync__row_is_refusal((dlsync__row)r) || dlsync__row_is_plain((dlsync__row)r))
      assert_int_equal(nodes, 0);
  }
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_TWO_CAPTURES), 2);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_TWO_BUILT), 2);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_CAPTURE_TO_BUILT), 2);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_BUILT_TO_CAPTURE), 2);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_EAGER_TO_CAPTURE), 1);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_EAGER_TO_BUILT), 1);
  assert_int_equal(dlsync__row_nodes(DLSYNC__ROW_SAME_BUILT), 0);
  assert_string_equal(dlsync__row_name(DLSYNC__ROW_COUNT), "DLSYNC__ROW_UNKNOWN");
  assert_string_equal(dlsync__row_name(DLSYNC__ROW_JOIN), "DLSYNC__ROW_JOIN");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(every_combination_gives_its_row),
      cmocka_unit_test(the_fast_path_rows_are_plain),
      cmocka_unit_test(rows_have_names_nodes_and_words),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
