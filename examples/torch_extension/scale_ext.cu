/* SPDX-License-Identifier: Apache-2.0 */
// A PyTorch C++ extension that is also a kernel library with a stream of its
// own: it reads torch's current stream, launches its kernel on its own
// stream, and orders the two with one dlsync::exchange guard (dlsync.hpp).
// Registered as a custom op, dlsync_example::scale(Tensor x, float a, bool
// use_dlsync) -> Tensor, so it is called eagerly, under torch.cuda.graph (its
// stream joins torch's capture and is joined back by the guard's end) and
// from torch.compile(mode="reduce-overhead") (CUDA graphs again).
// use_dlsync=false is the negative control: the same launch, not ordered.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <mutex>

#include <dlsync/dlsync.hpp>

namespace {

__global__ void scale_kernel(float *dst, const float *src, int64_t n, float a) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    dst[i] = a * src[i];
}

// One stream of the library's own per device, made on first use: call the op
// once eagerly before any capture.
cudaStream_t own_stream(int device) {
  static std::mutex lock;
  static cudaStream_t streams[64];
  std::lock_guard<std::mutex> hold(lock);
  TORCH_CHECK(device >= 0 && device < 64, "dlsync_example: device ", device, " out of range");
  if (streams[device] == nullptr) {
    c10::cuda::CUDAGuard on(device);
    cudaError_t rc = cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking);
    TORCH_CHECK(rc == cudaSuccess, "dlsync_example: cudaStreamCreateWithFlags: ",
                cudaGetErrorString(rc));
  }
  return streams[device];
}

at::Tensor scale(const at::Tensor &x, double a, bool use_dlsync) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "dlsync_example::scale takes a contiguous float32 CUDA tensor");
  c10::cuda::CUDAGuard on(x.device());
  cudaStream_t caller = at::cuda::getCurrentCUDAStream(x.device().index()).stream();
  cudaStream_t mine = own_stream(x.device().index());
  // Allocated on the caller's stream: torch frees and reuses it there, after
  // the guard's end has ordered that stream after our kernel.
  at::Tensor out = at::empty_like(x);
  int64_t n = x.numel();
  if (!use_dlsync) { // the control
    scale_kernel<<<264, 256, 0, mine>>>(out.data_ptr<float>(), x.data_ptr<float>(), n, (float)a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
  }
  dlsync::exchange ex(caller, mine); // mine waits for caller's earlier work
  TORCH_CHECK(ex.ok(), "dlsync_example: exchange begin: ", ex.status_name(), ": ", ex.message());
  scale_kernel<<<264, 256, 0, mine>>>(out.data_ptr<float>(), x.data_ptr<float>(), n, (float)a);
  cudaError_t launched = cudaGetLastError();
  dlsync_status ended = ex.end(); // caller's later work waits for mine; joins a capture back
  TORCH_CHECK(launched == cudaSuccess, "dlsync_example: launch: ", cudaGetErrorString(launched));
  TORCH_CHECK(ended == DLSYNC_SUCCESS, "dlsync_example: exchange end: ", ex.status_name(), ": ",
              ex.message());
  return out;
}

at::Tensor scale_meta(const at::Tensor &x, double, bool) { return at::empty_like(x); }

} // namespace

TORCH_LIBRARY(dlsync_example, m) {
  m.def("scale(Tensor x, float a, bool use_dlsync) -> Tensor");
}

TORCH_LIBRARY_IMPL(dlsync_example, CUDA, m) { m.impl("scale", &scale); }

TORCH_LIBRARY_IMPL(dlsync_example, Meta, m) { m.impl("scale", &scale_meta); }
