/* SPDX-License-Identifier: Apache-2.0 */
/* The C++ tests' session on the fake driver (test_cpp, test_xla_ffi,
 * test_tvm_ffi): a context on the fake, two non-blocking streams, CHECK
 * counting failures, and a close that checks what every test must leave
 * behind (no illegal call, no dangling event use, no live event, no leak). */
#ifndef DLSYNC_TESTS_FAKE_SESSION_HPP
#define DLSYNC_TESTS_FAKE_SESSION_HPP

#include <cuda.h>

#include <cstdio>

#include "dlsync/dlsync.h"
#include "fake_driver.h" /* beside this header */

extern "C" dlsync_status dlsync__context_create_with_driver(dlsync_context **out,
                                                            const dlsync_context_config *config,
                                                            const dlsync__driver *drv);

namespace fake_session {
inline int failures;
inline const dlsync__driver *D;
inline dlsync_context *ctx;
inline CUstream first, second; /* the session's two streams */
} // namespace fake_session

#define CHECK(cond)                                                                         \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: %s: failed: %s\n", __FILE__, __LINE__, __func__, #cond); \
      fake_session::failures++;                                                             \
    }                                                                                       \
  } while (0)

namespace fake_session {
inline void open() {
  fake_reset(2);
  D = fake_driver();
  ctx = nullptr;
  CHECK(dlsync__context_create_with_driver(&ctx, nullptr, D) == DLSYNC_SUCCESS);
  first = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  second = fake_stream_create(0, CU_STREAM_NON_BLOCKING);
  fake_log_reset();
}

inline void close() {
  char leaks[256] = {0};
  fake_fail_clear();
  CHECK(fake_illegal_calls() == 0);
  CHECK(fake_dangling_event_uses() == 0);
  CHECK(dlsync_context_destroy(ctx) == DLSYNC_SUCCESS);
  fake_stream_destroy(first);
  fake_stream_destroy(second);
  fake_run_destructors();
  CHECK(fake_live_events() == 0);
  if (fake_leak_report(leaks, sizeof leaks) != 0) {
    std::fprintf(stderr, "leaked: %s\n", leaks);
    failures++;
  }
}
} // namespace fake_session

#endif
