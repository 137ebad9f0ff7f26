/* SPDX-License-Identifier: Apache-2.0 */
// A TVM FFI kernel module with a stream of its own: scale(x, y, a, mode)
// writes y = a * x, its kernel on the module's stream, forked from TVM FFI's
// env stream of x's device (what tvm_ffi sets to the caller's current stream,
// PyTorch's under torch.cuda.graph).
//   mode 0: dlsync::tvm_ffi::side forks and joins (capture-aware)
//   mode 1: the control, the kernel on the module's stream unordered
// Loaded with tvm_ffi.load_module; dlsync_tvm_example_stream() is the
// module's stream (made on first use: call once eagerly before a capture).
#include <cuda_runtime.h>

#include <mutex>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

#include <dlsync/tvm_ffi.h>

namespace {

__global__ void scale_kernel(float *y, const float *x, int64_t n, float a) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    y[i] = a * x[i];
}

cudaStream_t own_stream(int device) {
  static std::mutex lock;
  static cudaStream_t streams[64];
  std::lock_guard<std::mutex> hold(lock);
  if (device < 0 || device >= 64)
    TVM_FFI_THROW(ValueError) << "dlsync_tvm_example: device " << device << " out of range";
  if (streams[device] == nullptr) {
    int previous = 0;
    cudaGetDevice(&previous);
    cudaSetDevice(device);
    cudaError_t rc = cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking);
    cudaSetDevice(previous);
    if (rc != cudaSuccess)
      TVM_FFI_THROW(RuntimeError) << "dlsync_tvm_example: cudaStreamCreateWithFlags: "
                                  << cudaGetErrorString(rc);
  }
  return streams[device];
}

bool is_cuda_f32(const tvm::ffi::TensorView &t) {
  DLDataType f32{kDLFloat, 32, 1};
  return t.device().device_type == kDLCUDA && t.dtype().code == f32.code &&
         t.dtype().bits == f32.bits && t.dtype().lanes == f32.lanes && t.IsContiguous();
}

void scale(tvm::ffi::TensorView x, tvm::ffi::TensorView y, double a, int64_t mode) {
  if (!is_cuda_f32(x) || !is_cuda_f32(y))
    TVM_FFI_THROW(TypeError) << "dlsync_tvm_example.scale takes contiguous float32 CUDA tensors";
  if (x.numel() != y.numel() || x.device().device_id != y.device().device_id)
    TVM_FFI_THROW(ValueError) << "dlsync_tvm_example.scale: x and y differ in size or device";
  if (mode != 0 && mode != 1)
    TVM_FFI_THROW(ValueError) << "dlsync_tvm_example.scale: mode is 0 (dlsync) or 1 (control), not "
                              << mode;
  int device = x.device().device_id;
  cudaStream_t mine = own_stream(device);
  cudaSetDevice(device);
  auto launch = [&] {
    scale_kernel<<<264, 256, 0, mine>>>(static_cast<float *>(y.data_ptr()),
                                        static_cast<const float *>(x.data_ptr()), x.numel(),
                                        static_cast<float>(a));
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess)
      TVM_FFI_THROW(RuntimeError) << "dlsync_tvm_example: launch: " << cudaGetErrorString(rc);
  };
  if (mode == 1) { // the control
    launch();
    return;
  }
  dlsync::tvm_ffi::side fork(x.device(), mine); // mine after the env stream's work
  launch();
  fork.join(); // the env stream's later work after mine; joins a capture back
}

int64_t module_stream(int64_t device) {
  return static_cast<int64_t>(reinterpret_cast<uintptr_t>(own_stream(static_cast<int>(device))));
}

} // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(scale, scale);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(stream, module_stream);
