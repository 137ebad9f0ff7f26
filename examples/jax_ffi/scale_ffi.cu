/* SPDX-License-Identifier: Apache-2.0 */
// An XLA FFI handler that runs its kernel on a stream of its own, declared
// command-buffer compatible, so that XLA traces it into a CUDA graph on a
// capturing stream when command buffers are on for custom calls.
//
//   dlsync_scale(x) -> y = 2 x, with attribute `ordering`:
//     0  dlsync: XLA's stream after the side stream's earlier work
//        (dlsync_order), then dlsync::xla_ffi::side forks the side stream from
//        XLA's and joins it back (capture-aware; the same code eagerly and
//        traced)
//     1  by hand, the way a stream scope of a Python kernel framework does
//        it: XLA's stream waits for the side stream's earlier work, the side
//        stream for XLA's, then XLA's for the side stream's, each a plain
//        cudaEventRecord / cudaStreamWaitEvent. Eagerly correct; traced, the
//        first wait makes XLA's capturing stream depend on uncaptured work
//        (cudaErrorStreamCaptureIsolation, 905).
//     2  none: the kernel is not ordered at all (wrong results with a slow
//        producer ahead).
//     3  dlsync, the fork and join only (dlsync::xla_ffi::side without the
//        first order): for a handler whose kernel needs none of its side
//        stream's earlier work.
//
// Exported C functions, for ctypes: the handler symbol dlsync_scale, and
// dlsync_jax_example_init (creates the side stream and the events; call once
// before the first jit), dlsync_jax_example_captured_calls (how many calls
// found XLA's stream capturing, i.e. ran under command-buffer tracing).
#include <cuda_runtime.h>

#include <atomic>
#include <string>

#include "xla/ffi/api/ffi.h"

#include <dlsync/xla_ffi.h>

namespace ffi = xla::ffi;

namespace {

cudaStream_t side_stream;
cudaEvent_t ev_side_before, ev_xla, ev_side_after;
std::atomic<long> captured_calls{0};

__global__ void scale_kernel(float *y, const float *x, size_t n, float a) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    y[i] = a * x[i];
}

ffi::Error cuda_error(cudaError_t rc, const char *what) {
  return ffi::Error::Internal(std::string("dlsync_scale: ") + what + ": " + cudaGetErrorName(rc) +
                              " (" + std::to_string((int)rc) + "): " + cudaGetErrorString(rc));
}

void launch(float *y, const float *x, size_t n) {
  scale_kernel<<<264, 256, 0, side_stream>>>(y, x, n, 2.0f);
}

ffi::Error scale_impl(cudaStream_t xla, ffi::Buffer<ffi::F32> x, ffi::ResultBuffer<ffi::F32> y,
                      int32_t ordering) {
  if (side_stream == nullptr)
    return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                      "dlsync_scale: call dlsync_jax_example_init() before the first call");
  if (x.element_count() != y->element_count())
    return ffi::Error::InvalidArgument("dlsync_scale: x and y differ in size");
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(xla, &cs) == cudaSuccess && cs == cudaStreamCaptureStatusActive)
    captured_calls.fetch_add(1);
  const size_t n = x.element_count();
  float *out = y->typed_data();
  const float *in = x.typed_data();
  cudaError_t rc;
  switch (ordering) {
  case 3: {
    dlsync::xla_ffi::side fork(xla, side_stream);
    if (ffi::Error e = fork.error(); e.failure())
      return e;
    launch(out, in, n);
    rc = cudaGetLastError();
    ffi::Error joined = fork.join();
    if (rc != cudaSuccess)
      return cuda_error(rc, "launch");
    return joined;
  }
  case 0: {
    // The same three orders as by hand. First XLA's stream after the side
    // stream's earlier (eager) work: traced, an external wait in XLA's
    // capture instead of a dependency on uncaptured work.
    dlsync_context *ctx = nullptr;
    dlsync_lane before = dlsync::stream_lane((void *)side_stream);
    dlsync_lane then = dlsync::stream_lane((void *)xla);
    if (dlsync_context_default(&ctx) != DLSYNC_SUCCESS ||
        dlsync_order(ctx, &before, &then) != DLSYNC_SUCCESS)
      return ffi::Error::Internal(std::string("dlsync_scale: ordering XLA's stream after the "
                                              "side stream's earlier work: ") +
                                  dlsync_status_name(dlsync_last_status()) + ": " +
                                  dlsync_last_error());
    // Then the side stream after XLA's work, and (join) XLA's after the side's.
    dlsync::xla_ffi::side fork(xla, side_stream, ctx);
    if (ffi::Error e = fork.error(); e.failure())
      return e;
    launch(out, in, n);
    rc = cudaGetLastError();
    ffi::Error joined = fork.join();
    if (rc != cudaSuccess)
      return cuda_error(rc, "launch");
    return joined;
  }
  case 1:
    if ((rc = cudaEventRecord(ev_side_before, side_stream)) != cudaSuccess)
      return cuda_error(rc, "cudaEventRecord(side)");
    if ((rc = cudaStreamWaitEvent(xla, ev_side_before, 0)) != cudaSuccess)
      return cuda_error(rc, "cudaStreamWaitEvent(xla, side's earlier work)");
    if ((rc = cudaEventRecord(ev_xla, xla)) != cudaSuccess)
      return cuda_error(rc, "cudaEventRecord(xla)");
    if ((rc = cudaStreamWaitEvent(side_stream, ev_xla, 0)) != cudaSuccess)
      return cuda_error(rc, "cudaStreamWaitEvent(side, xla)");
    launch(out, in, n);
    if ((rc = cudaGetLastError()) != cudaSuccess)
      return cuda_error(rc, "launch");
    if ((rc = cudaEventRecord(ev_side_after, side_stream)) != cudaSuccess)
      return cuda_error(rc, "cudaEventRecord(side)");
    if ((rc = cudaStreamWaitEvent(xla, ev_side_after, 0)) != cudaSuccess)
      return cuda_error(rc, "cudaStreamWaitEvent(xla, side)");
    return ffi::Error::Success();
  case 2:
    launch(out, in, n);
    if ((rc = cudaGetLastError()) != cudaSuccess)
      return cuda_error(rc, "launch");
    return ffi::Error::Success();
  default:
    return ffi::Error::InvalidArgument("dlsync_scale: ordering is 0 (dlsync), 1 (by hand), 2 "
                                       "(none) or 3 (dlsync fork only), not " +
                                       std::to_string(ordering));
  }
}

} // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(dlsync_scale, scale_impl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int32_t>("ordering"),
                              {ffi::Traits::kCmdBufferCompatible});

extern "C" int dlsync_jax_example_init(int device) {
  if (side_stream != nullptr)
    return 0;
  if (cudaSetDevice(device) != cudaSuccess ||
      cudaStreamCreateWithFlags(&side_stream, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreateWithFlags(&ev_side_before, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&ev_xla, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventCreateWithFlags(&ev_side_after, cudaEventDisableTiming) != cudaSuccess)
    return (int)cudaGetLastError();
  return 0;
}

extern "C" long dlsync_jax_example_captured_calls(void) {
  return captured_calls.load();
}
