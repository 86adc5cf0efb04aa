// CUDA twins of precision.cpp: fp16, bf16 and blockwise int8, writing the same payloads.
#include <cuda_fp16.h>

#include "../backend/cuda/common.cuh"
#include "codec_kernels.h"
#include "codec_math.h"

namespace hearsay::codec::cuda {
namespace {

using hearsay::cuda::grid_for;

#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void fp16_encode_kernel(const float* __restrict__ x, size_t n, uint16_t* __restrict__ out) {
  GRID_STRIDE(i, n) out[i] = __half_as_ushort(__float2half_rn(x[i]));
}
__global__ void fp16_decode_kernel(const uint16_t* __restrict__ in, size_t n, float scale, float* __restrict__ y) {
  GRID_STRIDE(i, n) y[i] += scale * __half2float(__ushort_as_half(in[i]));
}
__global__ void bf16_encode_kernel(const float* __restrict__ x, size_t n, uint16_t* __restrict__ out) {
  GRID_STRIDE(i, n) out[i] = float_to_bf16(__float_as_uint(x[i]));
}
__global__ void bf16_decode_kernel(const uint16_t* __restrict__ in, size_t n, float scale, float* __restrict__ y) {
  GRID_STRIDE(i, n) y[i] += scale * __uint_as_float(static_cast<uint32_t>(in[i]) << 16);
}
__global__ void fp32_decode_kernel(const float* __restrict__ in, size_t n, float scale, float* __restrict__ y) {
  GRID_STRIDE(i, n) y[i] += scale * in[i];
}

constexpr int kThreads = 256;

// One thread block per codec block: the absmax (and whether any value is not finite),
// then the quantized values. A block with NaN or Inf travels as zeros, as on the CPU.
__global__ void int8_encode_kernel(const float* __restrict__ x, size_t n, size_t block, float* __restrict__ scales,
                                   int8_t* __restrict__ q) {
  __shared__ float partial[kThreads];
  const size_t lo = blockIdx.x * block;
  const size_t len = min(block, n - lo);
  float m = 0.0f;
  int bad = 0;
  for (size_t i = threadIdx.x; i < len; i += kThreads) {
    const float a = fabsf(x[lo + i]);
    bad |= !isfinite(a);
    m = fmaxf(m, a);
  }
  partial[threadIdx.x] = m;
  bad = __syncthreads_or(bad);
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] = fmaxf(partial[threadIdx.x], partial[threadIdx.x + stride]);
    __syncthreads();
  }
  const float s = bad ? 0.0f : partial[0] / 127.0f;
  const float inv = s > 0.0f ? 1.0f / s : 0.0f;
  if (threadIdx.x == 0) scales[blockIdx.x] = s;
  for (size_t i = threadIdx.x; i < len; i += kThreads) {
    const int v = inv > 0.0f ? __float2int_rn(__fmul_rn(x[lo + i], inv)) : 0;
    q[lo + i] = static_cast<int8_t>(max(-127, min(127, v)));
  }
}

__global__ void int8_decode_kernel(const float* __restrict__ scales, const int8_t* __restrict__ q, size_t n, size_t block,
                                   float scale, float* __restrict__ y) {
  GRID_STRIDE(i, n) y[i] += scale * scales[i / block] * static_cast<float>(q[i]);
}

}  // namespace

void launch_fp16_encode(cudaStream_t s, const float* x, size_t n, uint16_t* out) {
  fp16_encode_kernel<<<grid_for(n), 256, 0, s>>>(x, n, out);
  CUDA_CHECK(cudaGetLastError());
}
void launch_fp16_decode(cudaStream_t s, const uint16_t* in, size_t n, float scale, float* y) {
  fp16_decode_kernel<<<grid_for(n), 256, 0, s>>>(in, n, scale, y);
  CUDA_CHECK(cudaGetLastError());
}
void launch_bf16_encode(cudaStream_t s, const float* x, size_t n, uint16_t* out) {
  bf16_encode_kernel<<<grid_for(n), 256, 0, s>>>(x, n, out);
  CUDA_CHECK(cudaGetLastError());
}
void launch_bf16_decode(cudaStream_t s, const uint16_t* in, size_t n, float scale, float* y) {
  bf16_decode_kernel<<<grid_for(n), 256, 0, s>>>(in, n, scale, y);
  CUDA_CHECK(cudaGetLastError());
}
void launch_fp32_decode(cudaStream_t s, const float* in, size_t n, float scale, float* y) {
  fp32_decode_kernel<<<grid_for(n), 256, 0, s>>>(in, n, scale, y);
  CUDA_CHECK(cudaGetLastError());
}
void launch_int8_encode(cudaStream_t s, const float* x, size_t n, size_t block, float* scales, int8_t* q) {
  const size_t blocks = (n + block - 1) / block;
  if (blocks == 0) return;
  int8_encode_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, n, block, scales, q);
  CUDA_CHECK(cudaGetLastError());
}
void launch_int8_decode(cudaStream_t s, const float* scales, const int8_t* q, size_t n, size_t block, float scale, float* y) {
  int8_decode_kernel<<<grid_for(n), 256, 0, s>>>(scales, q, n, block, scale, y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::codec::cuda
