/* SPDX-License-Identifier: Apache-2.0 */
// The C++ header (include/dlsync/dlsync.hpp) on the fake driver: the guard
// orders both ways and ends in its destructor, keeps the first failure's
// status and message, joins a side stream back into a capture, moves without
// ending twice; fences retain and release; graph positions keep their
// frontier. A plain main: prints each failed check and returns 1.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <utility>

#include "dlsync/dlsync.hpp"
#include "fake/fake_session.hpp"

using fake_session::ctx;
using fake_session::D;
using fake_session::failures;
static CUstream &P = fake_session::first, &C = fake_session::second;

static void open_fake() {
  fake_session::open();
}

static void close_fake() {
  fake_session::close();
}

static void guard_orders_both_ways_and_ends_in_its_destructor() {
  open_fake();
  uint64_t produce = fake_work(P, "produce", nullptr), consume, mutate;
  {
    dlsync::exchange ex(P, C, 0, ctx);
    CHECK(ex.ok());
    CHECK(ex.active());
    CHECK(std::strcmp(ex.message(), "") == 0);
    consume = fake_work(C, "consume", nullptr);
  }
  mutate = fake_work(P, "mutate", nullptr);
  CHECK(fake_happens_before(produce, consume));
  CHECK(fake_happens_before(consume, mutate));
  close_fake();
}

static void without_the_guard_nothing_is_ordered() { // the fake can tell: the test can fail
  open_fake();
  uint64_t produce = fake_work(P, "produce", nullptr);
  uint64_t consume = fake_work(C, "consume", nullptr);
  CHECK(!fake_happens_before(produce, consume));
  close_fake();
}

static void explicit_end_returns_the_status_once() {
  open_fake();
  dlsync::exchange ex(P, C, DLSYNC_EXCHANGE_CAPTURE_STABLE, ctx);
  CHECK(ex.ok());
  CHECK(ex.end() == DLSYNC_SUCCESS);
  CHECK(!ex.active());
  unsigned calls = static_cast<unsigned>(fake_calls_total());
  CHECK(ex.end() == DLSYNC_SUCCESS);
  CHECK(fake_calls_total() == calls); // the second end calls nothing
  close_fake();
}

static void a_failed_begin_is_kept_and_the_destructor_does_nothing() {
  open_fake();
  fake_fail_always("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  {
    dlsync::exchange ex(P, C, 0, ctx);
    CHECK(!ex.ok());
    CHECK(!ex.active());
    CHECK(ex.status() == DLSYNC_ERROR_DRIVER);
    CHECK(std::strstr(ex.message(), "cuEventRecord") != nullptr);
    CHECK(std::strcmp(ex.status_name(), "DLSYNC_ERROR_DRIVER") == 0);
    fake_fail_clear();
    // A later failure on this thread does not change what the guard kept.
    dlsync_exchange *none = nullptr;
    CHECK(dlsync_exchange_begin(&none, ctx, nullptr, nullptr) != DLSYNC_SUCCESS);
    CHECK(std::strstr(ex.message(), "cuEventRecord") != nullptr);
    CHECK(ex.end() == DLSYNC_ERROR_DRIVER);
  }
  close_fake();
}

static void a_failed_end_is_reported_by_end() {
  open_fake();
  dlsync::exchange ex(P, C, 0, ctx);
  CHECK(ex.ok());
  fake_fail_always("cuStreamWaitEvent", CUDA_ERROR_LAUNCH_FAILED);
  CHECK(ex.end() == DLSYNC_ERROR_DRIVER);
  CHECK(std::strstr(ex.message(), "cuStreamWaitEvent") != nullptr);
  fake_fail_clear();
  close_fake();
}

static void the_side_stream_joins_the_capture_and_is_joined_back() {
  open_fake();
  CHECK(D->StreamBeginCapture(P, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUgraphNode produce = nullptr, consume = nullptr;
  fake_work(P, "produce", &produce);
  {
    dlsync::exchange ex(P, C, 0, ctx);
    CHECK(ex.ok());
    CHECK(dlsync::capturing(C, ctx)); // C joined P's capture
    fake_work(C, "consume", &consume);
  }
  CUgraph g = nullptr;
  CHECK(D->StreamEndCapture(P, &g) == CUDA_SUCCESS); // not UNJOINED
  CHECK(!dlsync::capturing(C, ctx));
  CHECK(g != nullptr);
  if (g != nullptr) {
    CHECK(produce != nullptr && consume != nullptr && fake_graph_has_path(g, produce, consume));
    CHECK(D->GraphDestroy(g) == CUDA_SUCCESS);
  }
  close_fake();
}

static void a_moved_guard_ends_once() {
  open_fake();
  uint64_t produce = fake_work(P, "produce", nullptr), consume, mutate;
  {
    dlsync::exchange outer;
    CHECK(!outer.active() && outer.ok());
    {
      dlsync::exchange ex(P, C, 0, ctx);
      outer = std::move(ex);
      CHECK(!ex.active()); // NOLINT(bugprone-use-after-move): the moved-from state is defined
      dlsync::exchange moved(std::move(outer));
      CHECK(moved.active() && !outer.active());
      outer = std::move(moved);
    } // ex and moved end nothing here
    consume = fake_work(C, "consume", nullptr);
    CHECK(outer.active());
  }
  mutate = fake_work(P, "mutate", nullptr);
  CHECK(fake_happens_before(produce, consume));
  CHECK(fake_happens_before(consume, mutate));
  close_fake();
}

static void fences_retain_release_and_order() {
  open_fake();
  uint64_t produce = fake_work(P, "produce", nullptr);
  {
    dlsync::fence f(P, ctx);
    CHECK(f.ok() && f.valid());
    dlsync_fence_kind kind = DLSYNC_FENCE_BUILT;
    CHECK(f.kind(&kind) == DLSYNC_SUCCESS && kind == DLSYNC_FENCE_EAGER);
    dlsync::fence copy = f; // retains
    dlsync::fence moved(std::move(f));
    CHECK(!f.valid()); // NOLINT(bugprone-use-after-move)
    CHECK(f.wait(C) == DLSYNC_ERROR_INVALID_ARGUMENT);
    CHECK(copy.wait(C) == DLSYNC_SUCCESS);
    CHECK(moved.native() == copy.native());
  } // both references released: the event goes back (close checks it)
  uint64_t consume = fake_work(C, "consume", nullptr);
  CHECK(fake_happens_before(produce, consume));
  close_fake();
}

static void a_failed_fence_keeps_its_message() {
  open_fake();
  fake_fail_always("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  dlsync::fence f(P, ctx);
  CHECK(!f.ok() && !f.valid());
  CHECK(std::strstr(f.message(), "cuEventRecord") != nullptr);
  fake_fail_clear();
  close_fake();
}

static void graph_positions_keep_their_frontier() {
  open_fake();
  CUgraph g = nullptr;
  CHECK(D->GraphCreate(&g, 0) == CUDA_SUCCESS);
  CUgraphNode first = fake_graph_add_work(g, nullptr, 0, "first");
  dlsync::graph_position<4> pos(g, &first, 1);
  CHECK(pos.ok() && pos.size() == 1 && *pos.begin() == first);
  dlsync::graph_position<1> too_small(g, pos.begin(), 2);
  CHECK(!too_small.ok());
  {
    dlsync::exchange ex(pos.lane(), pos.lane(), 0, ctx); // same graph: edges only
    CHECK(ex.ok());
  }
  CHECK(pos.size() >= 1);
  CHECK(D->GraphDestroy(g) == CUDA_SUCCESS);
  close_fake();
}

static void env_stream_scope_restores() {
  void *got = nullptr;
  {
    dlsync::env_stream_scope s(DLSYNC_DLPACK_DEVICE_CUDA, 0, reinterpret_cast<void *>(0x1234));
    CHECK(s.status() == DLSYNC_SUCCESS);
    CHECK(dlsync_env_stream_get(&got, DLSYNC_DLPACK_DEVICE_CUDA, 0) == DLSYNC_SUCCESS);
    CHECK(got == reinterpret_cast<void *>(0x1234));
  }
  CHECK(dlsync_env_stream_get(&got, DLSYNC_DLPACK_DEVICE_CUDA, 0) == DLSYNC_SUCCESS);
  CHECK(got == nullptr);
  dlsync_env_stream_clear();
}

#if DLSYNC_HPP_EXCEPTIONS
static void the_throwing_constructor_throws_with_the_status() {
  open_fake();
  fake_fail_always("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  bool thrown = false;
  try {
    dlsync::exchange ex(dlsync::throw_on_error, P, C, 0, ctx);
  } catch (const dlsync::error &e) {
    thrown = e.status() == DLSYNC_ERROR_DRIVER &&
             std::strstr(e.what(), "DLSYNC_ERROR_DRIVER: ") != nullptr;
  }
  CHECK(thrown);
  fake_fail_clear();
  dlsync::exchange ok(dlsync::throw_on_error, P, C, 0, ctx);
  CHECK(ok.active());
  CHECK(ok.end() == DLSYNC_SUCCESS);
  close_fake();
}
#endif

static void the_many_guard_orders_every_producer() {
  open_fake();
  CUstream Q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  uint64_t p1 = fake_work(P, "produce 1", nullptr), p2 = fake_work(Q, "produce 2", nullptr);
  uint64_t consume, m1, m2;
  {
    const dlsync::stream_t producers[] = {P, Q};
    dlsync::exchange_many ex(producers, 2, C, 0, ctx);
    CHECK(ex.ok() && ex.active());
    consume = fake_work(C, "consume", nullptr);
  }
  m1 = fake_work(P, "mutate 1", nullptr);
  m2 = fake_work(Q, "mutate 2", nullptr);
  CHECK(fake_happens_before(p1, consume) && fake_happens_before(p2, consume));
  CHECK(fake_happens_before(consume, m1) && fake_happens_before(consume, m2));
  {
    dlsync::stream_t many[65];
    for (auto &m : many)
      m = P;
    dlsync::exchange_many ex(many, 65, C, 0, ctx);
    CHECK(ex.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !ex.active());
    CHECK(std::strstr(ex.message(), "more than 64") != nullptr);
  }
  fake_stream_destroy(Q);
  close_fake();
}

static void the_fanout_guard_orders_every_consumer() {
  open_fake();
  CUstream Q = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  uint64_t produce = fake_work(P, "produce", nullptr), c1, c2, mutate;
  {
    const dlsync::stream_t consumers[] = {C, Q};
    dlsync::exchange_fanout ex(P, consumers, 2, 0, ctx);
    CHECK(ex.ok() && ex.active());
    c1 = fake_work(C, "consume 1", nullptr);
    c2 = fake_work(Q, "consume 2", nullptr);
  }
  mutate = fake_work(P, "mutate", nullptr);
  CHECK(fake_happens_before(produce, c1) && fake_happens_before(produce, c2));
  CHECK(fake_happens_before(c1, mutate) && fake_happens_before(c2, mutate));
  {
    dlsync::stream_t many[65];
    for (auto &m : many)
      m = C;
    dlsync::exchange_fanout ex(P, many, 65, 0, ctx);
    CHECK(ex.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !ex.active());
    CHECK(std::strstr(ex.message(), "more than 64") != nullptr);
    dlsync::exchange_fanout none(P, static_cast<const dlsync::stream_t *>(nullptr), 2, 0, ctx);
    CHECK(none.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !none.active());
    CHECK(std::strstr(none.message(), "consumers is NULL") != nullptr);
    const dlsync::stream_t dup[] = {C, C};
    dlsync::exchange_fanout twice(P, dup, 2, 0, ctx);
    CHECK(twice.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !twice.active());
  }
#if DLSYNC_HPP_EXCEPTIONS
  bool threw = false;
  try {
    const dlsync::stream_t self[] = {P};
    dlsync::exchange_fanout ex(dlsync::throw_on_error, P, self, 1, 0, ctx);
  } catch (const dlsync::error &e) {
    threw = e.status() == DLSYNC_ERROR_INVALID_ARGUMENT;
  }
  CHECK(threw);
#endif
  fake_stream_destroy(Q);
  close_fake();
}

static void capturing_says_when_it_cannot_answer() {
  dlsync_context *none = nullptr;
  bool yes = true;
  if (dlsync_context_default(&none) != DLSYNC_ERROR_NO_DRIVER) {
    std::printf("test_cpp: a driver is here: the no-driver case of capturing() is not run\n");
    return;
  }
  CHECK(dlsync::capturing(&yes, P) == DLSYNC_ERROR_NO_DRIVER && !yes);
#if DLSYNC_HPP_EXCEPTIONS
  bool threw = false;
  try {
    (void)dlsync::capturing(P);
  } catch (const dlsync::error &e) {
    threw = e.status() == DLSYNC_ERROR_NO_DRIVER;
  }
  CHECK(threw);
#endif
}

// A NULL producer array with n >= 1 is refused as the C call refuses it, by
// both constructors; nothing is queued and the guard is not active.
static void the_many_guard_refuses_null_producers() {
  open_fake();
  for (std::size_t n : {std::size_t{1}, std::size_t{2}, std::size_t{64}}) {
    const dlsync::stream_t *none = nullptr;
    unsigned long calls = fake_calls_total();
    dlsync::exchange_many ex(none, n, C, 0, ctx);
    CHECK(ex.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !ex.active());
    CHECK(std::strstr(ex.message(), "producers is NULL") != nullptr);
    CHECK(fake_calls_total() == calls);
    dlsync_lane consumer = dlsync_lane_stream(C);
    dlsync::exchange_many lanes(static_cast<dlsync_lane *>(nullptr), n, consumer, 0, ctx);
    CHECK(lanes.status() == DLSYNC_ERROR_INVALID_ARGUMENT && !lanes.active());
    CHECK(std::strstr(lanes.message(), "producers is NULL") != nullptr);
  }
#if DLSYNC_HPP_EXCEPTIONS
  bool threw = false;
  try {
    dlsync::exchange_many ex(dlsync::throw_on_error, static_cast<const dlsync::stream_t *>(nullptr),
                             1, C, 0, ctx);
  } catch (const dlsync::error &e) {
    threw = e.status() == DLSYNC_ERROR_INVALID_ARGUMENT;
  }
  CHECK(threw);
#endif
  close_fake();
}

int main() {
  guard_orders_both_ways_and_ends_in_its_destructor();
  the_many_guard_orders_every_producer();
  the_fanout_guard_orders_every_consumer();
  capturing_says_when_it_cannot_answer();
  without_the_guard_nothing_is_ordered();
  explicit_end_returns_the_status_once();
  a_failed_begin_is_kept_and_the_destructor_does_nothing();
  a_failed_end_is_reported_by_end();
  the_side_stream_joins_the_capture_and_is_joined_back();
  a_moved_guard_ends_once();
  fences_retain_release_and_order();
  a_failed_fence_keeps_its_message();
  graph_positions_keep_their_frontier();
  env_stream_scope_restores();
#if DLSYNC_HPP_EXCEPTIONS
  the_throwing_constructor_throws_with_the_status();
#endif
  the_many_guard_refuses_null_producers();
  fake_shutdown();
  if (failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("test_cpp: all checks passed\n");
  return 0;
}
