/* SPDX-License-Identifier: Apache-2.0 */
// include/dlsync/tvm_ffi.h against apache-tvm-ffi's headers and libtvm_ffi
// (found through tvm_ffi.libinfo or DLSYNC_TVM_FFI_INCLUDE_DIR /
// DLSYNC_TVM_FFI_LIBRARY; the ctest is a skip otherwise) on the fake driver:
// the fork reads TVM FFI's env stream and orders both ways, joins a side
// stream back into the env stream's capture, refuses a device that is not
// CUDA and a NULL side stream with ValueError and nothing queued, and throws
// a driver failure as RuntimeError naming the call. A plain main.
#include <cuda.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "dlsync/tvm_ffi.h"
#include "fake/fake_session.hpp"

using fake_session::ctx;
using fake_session::D;
using fake_session::failures;
static CUstream &E = fake_session::first, &S = fake_session::second;
static const DLDevice cuda0 = {kDLCUDA, 0};

static void open_fake() {
  fake_session::open();
  CHECK(TVMFFIEnvSetStream(kDLCUDA, 0, E, nullptr) == 0);
}

static void close_fake() {
  CHECK(TVMFFIEnvSetStream(kDLCUDA, 0, nullptr, nullptr) == 0);
  fake_session::close();
}

/* Runs f; true when it threw tvm::ffi::Error of `kind` whose message has `text`. */
template <typename F> static bool throws(F &&f, const char *kind, const char *text) {
  try {
    f();
  } catch (const tvm::ffi::Error &e) {
    bool ok = e.kind() == kind && e.message().find(text) != std::string::npos;
    if (!ok)
      std::fprintf(stderr, "threw %s: %s\n", e.kind().c_str(), e.message().c_str());
    return ok;
  }
  return false;
}

static void the_fork_reads_the_env_stream_and_orders_both_ways() {
  open_fake();
  CHECK(dlsync::tvm_ffi::env_stream(cuda0) == static_cast<void *>(E));
  uint64_t produce = fake_work(E, "produce", nullptr), consume, after;
  {
    dlsync::tvm_ffi::side fork(cuda0, S, ctx);
    CHECK(fork.active());
    consume = fake_work(S, "consume", nullptr);
    fork.join();
    CHECK(!fork.active());
  }
  after = fake_work(E, "after", nullptr);
  CHECK(fake_happens_before(produce, consume));
  CHECK(fake_happens_before(consume, after));
  close_fake();
}

static void without_the_fork_nothing_is_ordered() { // the fake can tell: the test can fail
  open_fake();
  uint64_t produce = fake_work(E, "produce", nullptr);
  uint64_t consume = fake_work(S, "consume", nullptr);
  CHECK(!fake_happens_before(produce, consume));
  close_fake();
}

static void under_capture_the_side_stream_joins_and_is_joined_back() {
  open_fake();
  CHECK(D->StreamBeginCapture(E, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CUgraphNode produce = nullptr, consume = nullptr;
  fake_work(E, "produce", &produce);
  {
    dlsync::tvm_ffi::side fork(cuda0, S, ctx);
    CHECK(dlsync::capturing(S, ctx));
    fake_work(S, "consume", &consume);
    fork.join();
  }
  CUgraph g = nullptr;
  CHECK(D->StreamEndCapture(E, &g) == CUDA_SUCCESS); // not UNJOINED
  CHECK(g != nullptr);
  if (g != nullptr) {
    CHECK(produce != nullptr && consume != nullptr && fake_graph_has_path(g, produce, consume));
    CHECK(D->GraphDestroy(g) == CUDA_SUCCESS);
  }
  close_fake();
}

static void bad_input_is_a_value_error_and_nothing_is_queued() {
  open_fake();
  unsigned calls = static_cast<unsigned>(fake_calls_total());
  CHECK(throws(
      [] {
        dlsync::tvm_ffi::side fork(DLDevice{kDLCPU, 0}, S, ctx);
      },
      "ValueError", "device type 1 is not CUDA"));
  CHECK(throws([] { dlsync::tvm_ffi::side fork(cuda0, nullptr, ctx); }, "ValueError",
               "the side stream is NULL"));
  CHECK(fake_calls_total() == calls);
  close_fake();
}

static void a_driver_failure_is_a_runtime_error_naming_the_call() {
  open_fake();
  fake_fail_always("cuEventRecord", CUDA_ERROR_LAUNCH_FAILED);
  CHECK(throws([] { dlsync::tvm_ffi::side fork(cuda0, S, ctx); }, "RuntimeError",
               "dlsync: ordering the side stream after TVM FFI's env stream of cuda:0: "
               "DLSYNC_ERROR_DRIVER: "));
  CHECK(throws([] { dlsync::tvm_ffi::side fork(cuda0, S, ctx); }, "RuntimeError", "cuEventRecord"));
  fake_fail_clear();
  close_fake();
}

int main() {
  the_fork_reads_the_env_stream_and_orders_both_ways();
  without_the_fork_nothing_is_ordered();
  under_capture_the_side_stream_joins_and_is_joined_back();
  bad_input_is_a_value_error_and_nothing_is_queued();
  a_driver_failure_is_a_runtime_error_naming_the_call();
  fake_shutdown();
  if (failures != 0) {
    std::fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  std::printf("test_tvm_ffi: all checks passed\n");
  return 0;
}
