#include "common.cuh"
#include "kernels.cuh"

namespace hearsay::cuda {
namespace {

// One warp per row: the class dimension is small (10 for Fashion-MNIST), so a warp holds
// a row comfortably and the reductions stay in registers.
__global__ void softmax_xent_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels, int rows, int cols, float grad_scale, float* __restrict__ dlogits, float* __restrict__ stats) {
  const int warps_per_block = blockDim.x / 32;
  const int row = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* z = logits + size_t(row) * cols;
  float* d = dlogits + size_t(row) * cols;

  float zmax = -INFINITY;
  int best = 0;
  for (int c = lane; c < cols; c += 32) {
    if (z[c] > zmax) { zmax = z[c]; best = c; }
  }
  for (int off = 16; off > 0; off /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, zmax, off);
    const int other_idx = __shfl_xor_sync(0xffffffffu, best, off);
    if (other > zmax || (other == zmax && other_idx < best)) { zmax = other; best = other_idx; }
  }
  float sum = 0.0f;
  for (int c = lane; c < cols; c += 32) sum += __expf(z[c] - zmax);
  for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);

  const int label = labels[row];
  const float inv = 1.0f / sum;
  for (int c = lane; c < cols; c += 32) {
    float p = __expf(z[c] - zmax) * inv * grad_scale;
    if (c == label) p -= grad_scale;
    d[c] = p;
  }
  if (lane == 0) {
    const bool valid = label >= 0 && label < cols;
    atomicAdd(&stats[0], valid ? logf(sum) - (z[label] - zmax) : NAN);
    atomicAdd(&stats[1], best == label ? 1.0f : 0.0f);
  }
}

}  // namespace

void launch_softmax_cross_entropy(cudaStream_t s, const float* logits, const int32_t* labels, int rows, int cols, float grad_scale, float* dlogits, float* stats) {
  CUDA_CHECK(cudaMemsetAsync(stats, 0, 2 * sizeof(float), s));
  constexpr int kBlock = 256;
  const int rows_per_block = kBlock / 32;
  softmax_xent_kernel<<<(rows + rows_per_block - 1) / rows_per_block, kBlock, 0, s>>>(logits, labels, rows, cols, grad_scale, dlogits, stats);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::cuda
