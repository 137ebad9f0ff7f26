/* SPDX-License-Identifier: Apache-2.0 */
// A tiny kernel library that uses dlsync: it runs its kernel on a side stream
// of its own, ordered after the caller's stream with one exchange, so it is
// correct on plain streams and survives torch.cuda.graph (its side stream
// joins the caller's capture and is joined back).
#include <cuda_runtime.h>
#include <stdio.h>

#include <dlsync/dlsync.h>

__global__ void scale_kernel(float *dst, const float *src, size_t n, float a) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    dst[i] = a * src[i];
}

static cudaStream_t side;
static char last_error[512];

extern "C" const char *kl_last_error(void) { return last_error; }

// Creates the library's side stream; call once, outside any capture.
extern "C" int kl_init(void) {
  if (side == nullptr && cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess) {
    snprintf(last_error, sizeof last_error, "cudaStreamCreateWithFlags failed");
    return 1;
  }
  return 0;
}

// dst = a * src on the library's side stream, after the caller's stream's
// earlier work; the caller's later work runs after it. use_dlsync = 0 is the
// negative control: the same launch without any ordering.
extern "C" int kl_scale(float *dst, const float *src, size_t n, float a, void *caller_stream,
                        int use_dlsync) {
  dlsync_context *ctx = nullptr;
  dlsync_exchange *ex = nullptr;
  dlsync_lane producer = dlsync_lane_stream((struct CUstream_st *)caller_stream);
  dlsync_lane consumer = dlsync_lane_stream((struct CUstream_st *)side);
  if (use_dlsync) {
    if (dlsync_context_default(&ctx) != DLSYNC_SUCCESS ||
        dlsync_exchange_begin(&ex, ctx, &producer, &consumer) != DLSYNC_SUCCESS) {
      snprintf(last_error, sizeof last_error, "%s", dlsync_last_error());
      return 1;
    }
  }
  scale_kernel<<<264, 256, 0, side>>>(dst, src, n, a);
  if (cudaGetLastError() != cudaSuccess) {
    snprintf(last_error, sizeof last_error, "kernel launch failed");
    if (ex != nullptr)
      dlsync_exchange_end(ex);
    return 1;
  }
  if (use_dlsync && dlsync_exchange_end(ex) != DLSYNC_SUCCESS) {
    snprintf(last_error, sizeof last_error, "%s", dlsync_last_error());
    return 1;
  }
  return 0;
}
