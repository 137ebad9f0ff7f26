/* SPDX-License-Identifier: Apache-2.0 */
// include/dlsync/xla_ffi.h against the real xla/ffi/api/ffi.h (jaxlib's, found
// through jax.ffi.include_dir() or DLSYNC_XLA_FFI_INCLUDE_DIR; the ctest is a
// skip otherwise) on the fake driver: the fork orders both ways, joins a side
// stream back into XLA's capture, refuses NULL streams with kInvalidArgument
// and nothing queued, and hands a driver failure back as an ffi::Error naming
// the call. A plain main: prints each failed check and returns 1.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "xla/ffi/api/ffi.h"

#include "dlsync/xla_ffi.h"
#include "fake/fake_session.hpp"

namespace ffi = xla::ffi;

using fake_session::ctx;
using fake_session::D;
using fake_session::failures;
static CUstream &X = fake_session::first, &S = fake_session::second;

static void open_fake() {
  fake_session::open();
}

static void close_fake() {
  fake_session::close();
}

static void the_fork_orders_both_ways() {
  open_fake();
  uint64_t produce = fake_work(X, "produce", nullptr), consume, after;
  {
    dlsync::xla_ffi::side fork(X, S, ctx);
    CHECK(fork.error().success());
    CHECK(fork.ok() && fork.active());
    consume = fake_work(S, "consume", nullptr);
    CHECK(fork.join().success());
    CHECK(!fork.active());
  }
  after = fake_work(X, "after", nullptr);
  CHECK(fake_happens_before(produce, consume));
  CHECK(fake_happens_before(consume, after));
  close_fake();
}

static void without_the_fork_nothing_is_ordered() { // the fake can tell: the test can fail
  open_fake();
  uint64_t produce = fake_work(X, "produce", nullptr);
  uint64_t consume = fake_work(S, "consume", nullptr);
  CHECK(!fake_happens_before(produce, consume));
  close_fake();
}

static void traced_the_side_stream_joins_xlas_capture_and_is_joined_back() {
  open_fake();
  CHECK(D->StreamBeginCapture(X, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
  CUgraphNode produce = nullptr, consume = nullptr;
  fake_work(X, "produce", &produce);
  {
    dlsync::xla_ffi::side fork(X, S, ctx);
    CHECK(fork.error().success());
    CHECK(dlsync::capturing(S, ctx));
    fake_work(S, "consume", &consume);
    CHECK(fork.join().success());
  }
  CUgraph g = nullptr;
  CHECK(D->StreamEndCapture(X, &g) == CUDA_SUCCESS); // not UNJOINED
  CHECK(!dlsync::capturing(S, ctx));
  CHECK(g != nullptr);
  if (g != nullptr) {
    CHECK(produce != nullptr && consume != nullptr && fake_graph_has_path(g, produce, consume));
    CHECK(D->GraphDestroy(g) == CUDA_SUCCESS);
  }
  close_fake();
}

static void null_streams_are_refused_and_nothing_is_queued() {
  open_fake();
  unsigned calls = static_cast<unsigned>(fake_calls_total());
  dlsync::xla_ffi::side a(nullptr, S, ctx), b(X, nullptr, ctx);
  for (dlsync::xla_ffi::side *f : {&a, &b}) {
    ffi::Error e = f->error();
    CHECK(e.failure() && e.errc() == ffi::ErrorCode::kInvalidArgument);
    CHECK(e.message().find("NULL stream") != std::string::npos);
    CHECK(!f->ok() && !f->active());
    CHECK(f->join().errc() == ffi::ErrorCode::kInvalidArgument);
  }
  CHECK(fake_calls_total() == calls);
  close_fake();
}

static void a_driver_failure_is_an_ffi_error_naming_the_call() {
  open_fake();
  fake_fail_always("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  {
    dlsync::xla_ffi::side fork(X, S, ctx);
    ffi::Error e = fork.error();
    CHECK(e.failure() && e.errc() == ffi::ErrorCode::kInternal);
    CHECK(e.message().find("dlsync: ordering the side stream after XLA's stream: "
                           "DLSYNC_ERROR_DRIVER: ") == 0);
    CHECK(e.message().find("cuEventRecord") != std::string::npos);
    CHECK(!fork.active());
    CHECK(fork.join().failure()); // the fork's failure, kept
  }
  fake_fail_clear();
  close_fake();
}

static void status_codes_map_to_ffi_codes() {
  using dlsync::xla_ffi::error_code;
  CHECK(error_code(DLSYNC_SUCCESS) == ffi::ErrorCode::kOk);
  CHECK(error_code(DLSYNC_ERROR_INVALID_ARGUMENT) == ffi::ErrorCode::kInvalidArgument);
  CHECK(error_code(DLSYNC_ERROR_CAPTURE_ORDER) == ffi::ErrorCode::kFailedPrecondition);
  CHECK(error_code(DLSYNC_ERROR_OUT_OF_MEMORY) == ffi::ErrorCode::kResourceExhausted);
  CHECK(error_code(DLSYNC_ERROR_NO_DRIVER) == ffi::ErrorCode::kUnavailable);
  CHECK(error_code(DLSYNC_ERROR_DRIVER) == ffi::ErrorCode::kInternal);
}

int main() {
  the_fork_orders_both_ways();
  without_the_fork_nothing_is_ordered();
  traced_the_side_stream_joins_xlas_capture_and_is_joined_back();
  null_streams_are_refused_and_nothing_is_queued();
  a_driver_failure_is_an_ffi_error_naming_the_call();
  status_codes_map_to_ffi_codes();
  fake_shutdown();
  if (failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("test_xla_ffi: all checks passed\n");
  return 0;
}
