/* SPDX-License-Identifier: Apache-2.0 */
// The example extension's kernel and its launcher (plain C++, no nanobind):
// compiled by nvcc into a static library that the nanobind module links.
#include <cuda_runtime.h>

#include <cstddef>

namespace {
__global__ void scale_kernel(float *dst, const float *src, size_t n, float a) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride)
    dst[i] = a * src[i];
}
} // namespace

int nb_example_launch_scale(float *dst, const float *src, size_t n, float a, void *stream) {
  scale_kernel<<<264, 256, 0, (cudaStream_t)stream>>>(dst, src, n, a);
  return (int)cudaGetLastError();
}

int nb_example_stream_create(void **out) {
  cudaStream_t s = nullptr;
  cudaError_t rc = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  *out = s;
  return (int)rc;
}

const char *nb_example_error_string(int rc) {
  return cudaGetErrorString((cudaError_t)rc);
}
