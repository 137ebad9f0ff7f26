/* SPDX-License-Identifier: Apache-2.0 */
// The example launcher's kernel (libdlsync_launcher_kernel.so, loaded with
// ctypes): dst = a * src after a spin of `spin` clock cycles, so that a
// tensor released too early is reused while the kernel still waits to read it.
#include <cuda_runtime.h>

#include <cstddef>

namespace {
__global__ void spin_scale(float *dst, const float *src, size_t n, float a, long long spin) {
  if (spin > 0) {
    long long t0 = clock64();
    while (clock64() - t0 < spin) {
    }
  }
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    dst[i] = a * src[i];
}
} // namespace

extern "C" int ln_spin_scale(float *dst, const float *src, size_t n, float a, long long spin,
                             void *stream) {
  spin_scale<<<264, 256, 0, (cudaStream_t)stream>>>(dst, src, n, a, spin);
  return (int)cudaGetLastError();
}

extern "C" int ln_stream_sync(void *stream) {
  return (int)cudaStreamSynchronize((cudaStream_t)stream);
}

extern "C" const char *ln_error_string(int rc) { return cudaGetErrorString((cudaError_t)rc); }
