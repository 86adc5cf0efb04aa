// CUDA twins of sparse.cpp: top-k selection (threshold from a sample, or exact by sorting)
// with order-preserving compaction, random-k from the shared seed, and scatter-add
// decoding that touches only the sent elements.
#include <thrust/copy.h>
#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include "../backend/cuda/common.cuh"
#include "codec_kernels.h"
#include "codec_math.h"

namespace hearsay::codec::cuda {
namespace {

using hearsay::cuda::grid_for;

__global__ void abs_sample_kernel(const float* __restrict__ x, size_t n, uint64_t seed, size_t m, float* __restrict__ sample) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < m; j += size_t(gridDim.x) * blockDim.x) {
    sample[j] = fabsf(x[hash32(seed, j) % n]);
  }
}

__global__ void gather_kernel(const float* __restrict__ x, const uint32_t* __restrict__ idx, size_t k, float* __restrict__ out) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < k; j += size_t(gridDim.x) * blockDim.x) out[j] = x[idx[j]];
}

// Indices are distinct (checked on the host), so no two threads add to one element.
__global__ void scatter_add_kernel(const uint32_t* __restrict__ idx, const float* __restrict__ v, size_t k, float scale,
                                   float* __restrict__ y) {
  for (size_t j = blockIdx.x * size_t(blockDim.x) + threadIdx.x; j < k; j += size_t(gridDim.x) * blockDim.x) {
    y[idx[j]] += scale * v[j];
  }
}

__global__ void randomk_gather_kernel(const float* __restrict__ x, size_t n, size_t k, uint64_t seed, bool unbiased,
                                      float* __restrict__ out) {
  for (size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x; b < k; b += size_t(gridDim.x) * blockDim.x) {
    const float w = unbiased ? static_cast<float>(stratum_begin(b + 1, n, k) - stratum_begin(b, n, k)) : 1.0f;
    out[b] = w * x[randomk_index(seed, b, n, k)];
  }
}

__global__ void randomk_scatter_add_kernel(const float* __restrict__ v, size_t n, size_t k, uint64_t seed, float scale,
                                           float* __restrict__ y) {
  for (size_t b = blockIdx.x * size_t(blockDim.x) + threadIdx.x; b < k; b += size_t(gridDim.x) * blockDim.x) {
    y[randomk_index(seed, b, n, k)] += scale * v[b];
  }
}

struct AbsValue {
  __host__ __device__ float operator()(float v) const { return fabsf(v); }
};

struct AtLeast {
  const float* x;
  float t;
  __host__ __device__ bool operator()(uint32_t i) const {
    const float a = fabsf(x[i]);
    return a >= t && a > 0.0f;
  }
};

}  // namespace

void launch_abs_sample(cudaStream_t s, const float* x, size_t n, uint64_t seed, size_t m, float* sample) {
  abs_sample_kernel<<<grid_for(m), 256, 0, s>>>(x, n, seed, m, sample);
  CUDA_CHECK(cudaGetLastError());
}

float kth_largest_abs(cudaStream_t s, const float* x, size_t n, size_t k, float* scratch) {
  const auto policy = thrust::cuda::par.on(s);
  thrust::transform(policy, x, x + n, scratch, AbsValue());
  thrust::sort(policy, scratch, scratch + n, thrust::greater<float>());
  float t = 0;
  CUDA_CHECK(cudaMemcpyAsync(&t, scratch + (k - 1), sizeof(float), cudaMemcpyDeviceToHost, s));
  CUDA_CHECK(cudaStreamSynchronize(s));
  return t;
}

size_t select_at_least(cudaStream_t s, const float* x, size_t n, float t, uint32_t* idx) {
  // copy_if is stable: the indices come out increasing, as the payload needs them.
  const auto end = thrust::copy_if(thrust::cuda::par.on(s), thrust::counting_iterator<uint32_t>(0),
                                   thrust::counting_iterator<uint32_t>(static_cast<uint32_t>(n)), idx, AtLeast{x, t});
  CUDA_CHECK(cudaStreamSynchronize(s));
  return static_cast<size_t>(end - idx);
}

void launch_gather(cudaStream_t s, const float* x, const uint32_t* idx, size_t k, float* out) {
  if (k == 0) return;
  gather_kernel<<<grid_for(k), 256, 0, s>>>(x, idx, k, out);
  CUDA_CHECK(cudaGetLastError());
}
void launch_scatter_add(cudaStream_t s, const uint32_t* idx, const float* v, size_t k, float scale, float* y) {
  if (k == 0) return;
  scatter_add_kernel<<<grid_for(k), 256, 0, s>>>(idx, v, k, scale, y);
  CUDA_CHECK(cudaGetLastError());
}
void launch_randomk_gather(cudaStream_t s, const float* x, size_t n, size_t k, uint64_t seed, bool unbiased, float* out) {
  if (k == 0) return;
  randomk_gather_kernel<<<grid_for(k), 256, 0, s>>>(x, n, k, seed, unbiased, out);
  CUDA_CHECK(cudaGetLastError());
}
void launch_randomk_scatter_add(cudaStream_t s, const float* v, size_t n, size_t k, uint64_t seed, float scale, float* y) {
  if (k == 0) return;
  randomk_scatter_add_kernel<<<grid_for(k), 256, 0, s>>>(v, n, k, seed, scale, y);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::codec::cuda
