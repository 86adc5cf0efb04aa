// CUDA twins of quantized.cpp: QSGD and scaled sign, writing the same bit-packed payloads
// (codes least significant bit first; 32-bit words are little-endian, so their bytes are
// the CPU's bytes).
#include "../backend/cuda/common.cuh"
#include "codec_kernels.h"
#include "codec_math.h"

namespace hearsay::codec::cuda {
namespace {

using hearsay::cuda::grid_for;
constexpr int kThreads = 256;

// One thread block per bucket: its L2 norm, then each element's code ORed into place.
__global__ void qsgd_encode_kernel(const float* __restrict__ x, size_t n, size_t bucket, int levels, int bits, uint64_t seed,
                                   float* __restrict__ norms, uint32_t* __restrict__ words) {
  __shared__ double partial[kThreads];
  const size_t lo = blockIdx.x * bucket;
  const size_t len = min(bucket, n - lo);
  double sq = 0;
  for (size_t i = threadIdx.x; i < len; i += kThreads) sq += static_cast<double>(x[lo + i]) * x[lo + i];
  partial[threadIdx.x] = sq;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  float norm = static_cast<float>(sqrt(partial[0]));
  if (!isfinite(norm)) norm = 0.0f;
  if (threadIdx.x == 0) norms[blockIdx.x] = norm;
  const float k = norm > 0.0f ? static_cast<float>(levels) / norm : 0.0f;
  for (size_t j = threadIdx.x; j < len; j += kThreads) {
    const size_t i = lo + j;
    // No fused multiply-add: the CPU rounds the product and the sum separately.
    const float r = __fadd_rn(__fmul_rn(fabsf(x[i]), k), uniform01(seed, i));
    const uint32_t level = min(static_cast<uint32_t>(levels), static_cast<uint32_t>(r));
    const uint32_t code = level | (signbit(x[i]) && level > 0 ? 1u << (bits - 1) : 0u);
    const uint64_t bit = static_cast<uint64_t>(i) * bits;
    const uint32_t off = static_cast<uint32_t>(bit & 31);
    atomicOr(&words[bit >> 5], code << off);
    if (off + bits > 32) atomicOr(&words[(bit >> 5) + 1], code >> (32 - off));
  }
}

__global__ void qsgd_decode_kernel(const float* __restrict__ norms, const uint8_t* __restrict__ packed, size_t n, size_t bucket,
                                   int levels, int bits, float scale, float* __restrict__ y) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const uint64_t bit = static_cast<uint64_t>(i) * bits;
    // A code spans at most 3 bytes (bits <= 16); read byte by byte, never past the payload.
    uint32_t v = 0;
    const uint64_t first = bit >> 3, last = (bit + bits - 1) >> 3;
    for (uint64_t b = first; b <= last; ++b) v |= static_cast<uint32_t>(packed[b]) << (8 * (b - first));
    const uint32_t code = (v >> (bit & 7)) & ((1u << bits) - 1);
    const uint32_t level = code & ((1u << (bits - 1)) - 1);
    const float m = norms[i / bucket] * static_cast<float>(level) / static_cast<float>(levels);
    y[i] += scale * ((code >> (bits - 1)) ? -m : m);
  }
}

// Each warp packs 32 consecutive signs with one ballot and adds its |x| to the total.
__global__ void sign_encode_kernel(const float* __restrict__ x, size_t n, uint32_t* __restrict__ words, double* abs_sum) {
  const unsigned lane = threadIdx.x & 31;
  const size_t warp = (blockIdx.x * size_t(blockDim.x) + threadIdx.x) >> 5;
  const size_t warps = (size_t(gridDim.x) * blockDim.x) >> 5;
  double sum = 0;
  for (size_t base = warp * 32; base < n; base += warps * 32) {
    const size_t i = base + lane;
    const float v = i < n ? x[i] : 0.0f;
    const unsigned negative = __ballot_sync(0xffffffffu, i < n && signbit(v));
    if (lane == 0) words[base >> 5] = negative;
    sum += fabs(static_cast<double>(v));
  }
  for (int d = 16; d > 0; d /= 2) sum += __shfl_down_sync(0xffffffffu, sum, d);
  if (lane == 0) atomicAdd(abs_sum, sum);
}

// The sum of squares in double, a warp at a time (the engine's norm checks: a GPU peer
// measures its gradient and model where they live instead of downloading them).
__global__ void sum_squares_kernel(const float* __restrict__ x, size_t n, double* sum) {
  double sq = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const double v = x[i];
    sq += v * v;
  }
  for (int d = 16; d > 0; d /= 2) sq += __shfl_down_sync(0xffffffffu, sq, d);
  if ((threadIdx.x & 31) == 0) atomicAdd(sum, sq);
}

__global__ void sign_decode_kernel(const uint8_t* __restrict__ bits, size_t n, float m, float* __restrict__ y) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    y[i] += (bits[i >> 3] >> (i & 7)) & 1u ? -m : m;
  }
}

}  // namespace

void launch_qsgd_encode(cudaStream_t s, const float* x, size_t n, size_t bucket, int levels, uint64_t seed, float* norms,
                        uint32_t* words) {
  const size_t buckets = (n + bucket - 1) / bucket;
  if (buckets == 0) return;
  qsgd_encode_kernel<<<static_cast<unsigned>(buckets), kThreads, 0, s>>>(x, n, bucket, levels, qsgd_bits(levels), seed, norms, words);
  CUDA_CHECK(cudaGetLastError());
}
void launch_qsgd_decode(cudaStream_t s, const float* norms, const uint8_t* packed, size_t n, size_t bucket, int levels,
                        float scale, float* y) {
  qsgd_decode_kernel<<<grid_for(n), 256, 0, s>>>(norms, packed, n, bucket, levels, qsgd_bits(levels), scale, y);
  CUDA_CHECK(cudaGetLastError());
}
void launch_sign_encode(cudaStream_t s, const float* x, size_t n, uint32_t* words, double* abs_sum) {
  sign_encode_kernel<<<grid_for((n + 31) / 32 * 32), 256, 0, s>>>(x, n, words, abs_sum);
  CUDA_CHECK(cudaGetLastError());
}
void launch_sum_squares(cudaStream_t s, const float* x, size_t n, double* sum) {
  sum_squares_kernel<<<grid_for(n), 256, 0, s>>>(x, n, sum);
  CUDA_CHECK(cudaGetLastError());
}
void launch_sign_decode(cudaStream_t s, const uint8_t* bits, size_t n, float magnitude, float* y) {
  sign_decode_kernel<<<grid_for(n), 256, 0, s>>>(bits, n, magnitude, y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::codec::cuda
