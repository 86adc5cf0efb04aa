#include "common.cuh"
#include "kernels.cuh"

namespace hearsay::cuda {
namespace {

__global__ void axpy_kernel(size_t n, float alpha, const float* __restrict__ x, float* __restrict__ y) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    y[i] += alpha * x[i];
  }
}

__global__ void scale_kernel(size_t n, float alpha, float* __restrict__ x) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    x[i] *= alpha;
  }
}

__global__ void bias_activation_kernel(float* __restrict__ y, const float* __restrict__ bias, size_t rows, int cols, bool relu) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    float v = y[i];
    if (bias != nullptr) v += bias[i % cols];
    y[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

// One block covers 32 columns; threads (tx, ty) walk rows ty, ty+8, ... of column tx, so
// each warp reads 32 consecutive floats. The mask and the column sum share the pass.
constexpr int kTileCols = 32;
constexpr int kTileRows = 8;

__global__ void activation_backward_bias_grad_kernel(float* __restrict__ dy, const float* __restrict__ y, float* __restrict__ dbias, int rows, int cols, bool relu) {
  __shared__ float partial[kTileRows][kTileCols + 1];
  const int col = blockIdx.x * kTileCols + threadIdx.x;
  float sum = 0.0f;
  if (col < cols) {
    for (int r = threadIdx.y; r < rows; r += kTileRows) {
      const size_t i = size_t(r) * cols + col;
      float d = dy[i];
      if (relu && y[i] <= 0.0f) {
        d = 0.0f;
        dy[i] = 0.0f;
      }
      sum += d;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols && dbias != nullptr) {
    float total = 0.0f;
    for (int r = 0; r < kTileRows; ++r) total += partial[r][threadIdx.x];
    dbias[col] = total;
  }
}

__global__ void sgd_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ v, size_t n, float lr, float m, float wd, bool nesterov, float gs) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * gs + wd * w[i];
    if (v == nullptr) {
      w[i] -= lr * gi;
    } else {
      const float vi = m * v[i] + gi;
      v[i] = vi;
      w[i] -= lr * (nesterov ? gi + m * vi : vi);
    }
  }
}

// AdamW, one pass: decoupled decay, both moments, the bias-corrected update (the same
// arithmetic as the CPU backend's adamw_update; c1 and c2 come from the host).
__global__ void adamw_kernel(float* __restrict__ w, const float* __restrict__ g, float* __restrict__ m, float* __restrict__ v, size_t n, float lr, float decay, float b1, float b2, float eps, float c1, float c2, float gs) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float gi = g[i] * gs;
    const float mi = b1 * m[i] + (1.0f - b1) * gi;
    const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] * decay - lr * (mi / c1) / (sqrtf(vi / c2) + eps);
  }
}

}  // namespace

void launch_axpy(cudaStream_t s, size_t n, float alpha, const float* x, float* y) {
  axpy_kernel<<<grid_for(n), 256, 0, s>>>(n, alpha, x, y);
  CUDA_CHECK(cudaGetLastError());
}

void launch_scale(cudaStream_t s, size_t n, float alpha, float* x) {
  scale_kernel<<<grid_for(n), 256, 0, s>>>(n, alpha, x);
  CUDA_CHECK(cudaGetLastError());
}

void launch_bias_activation(cudaStream_t s, float* y, const float* bias, int rows, int cols, Activation act) {
  const size_t n = size_t(rows) * cols;
  bias_activation_kernel<<<grid_for(n), 256, 0, s>>>(y, bias, rows, cols, act == Activation::kRelu);
  CUDA_CHECK(cudaGetLastError());
}

void launch_activation_backward_bias_grad(cudaStream_t s, float* dy, const float* y, float* dbias, int rows, int cols, Activation act) {
  const dim3 block(kTileCols, kTileRows);
  const dim3 grid((cols + kTileCols - 1) / kTileCols);
  activation_backward_bias_grad_kernel<<<grid, block, 0, s>>>(dy, y, dbias, rows, cols, act == Activation::kRelu);
  CUDA_CHECK(cudaGetLastError());
}

void launch_sgd_update(cudaStream_t s, float* w, const float* g, float* v, size_t n, const SgdParams& p) {
  float* velocity = p.momentum == 0.0f ? nullptr : v;
  sgd_kernel<<<grid_for(n), 256, 0, s>>>(w, g, velocity, n, p.lr, p.momentum, p.weight_decay, p.nesterov, p.grad_scale);
  CUDA_CHECK(cudaGetLastError());
}

void launch_adamw_update(cudaStream_t s, float* w, const float* g, float* m, float* v, size_t n, const AdamWParams& p, float c1, float c2) {
  adamw_kernel<<<grid_for(n), 256, 0, s>>>(w, g, m, v, n, p.lr, 1.0f - p.lr * p.weight_decay, p.beta1, p.beta2, p.eps, c1, c2, p.grad_scale);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::cuda
