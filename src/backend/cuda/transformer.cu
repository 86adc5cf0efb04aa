// The CUDA backend's transformer kernels (Backend's "Transformer kernels" section says what
// each computes). Row-wise ones (LayerNorm, softmax) give one warp to a row; attention's
// products are cuBLAS strided batched GEMMs over the heads of one sequence at a time.
#include "common.cuh"
#include "kernels.cuh"

namespace hearsay::cuda {
namespace {

constexpr float kLayerNormEps = 1e-5f;
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / 32;

__device__ float warp_sum(float v) {
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ float warp_max(float v) {
  for (int off = 16; off > 0; off /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}

unsigned warp_rows_grid(int rows) { return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock); }

__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens, const float* __restrict__ wte,
                                         const float* __restrict__ wpe, int rows, int context, int c, int vocab,
                                         float* __restrict__ y) {
  const size_t n = size_t(rows) * c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int r = int(i / c), k = int(i % c);
    const int tok = tokens[r];
    // An out-of-range token reads nothing and poisons its row, so the loss reports it.
    y[i] = tok >= 0 && tok < vocab ? wte[size_t(tok) * c + k] + wpe[size_t(r % context) * c + k] : NAN;
  }
}

__global__ void embedding_backward_kernel(const float* __restrict__ dy, const int32_t* __restrict__ tokens, int rows,
                                          int context, int c, float* __restrict__ dwte, float* __restrict__ dwpe) {
  const size_t n = size_t(rows) * c;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const int r = int(i / c), k = int(i % c);
    atomicAdd(&dwte[size_t(tokens[r]) * c + k], dy[i]);
    atomicAdd(&dwpe[size_t(r % context) * c + k], dy[i]);
  }
}

__global__ void layernorm_forward_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                         const float* __restrict__ beta, int rows, int c, float* __restrict__ y,
                                         float* __restrict__ mean, float* __restrict__ rstd) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* in = x + size_t(row) * c;
  float sum = 0.0f;
  for (int k = lane; k < c; k += 32) sum += in[k];
  const float m = warp_sum(sum) / c;
  float var = 0.0f;
  for (int k = lane; k < c; k += 32) var += (in[k] - m) * (in[k] - m);
  const float s = rsqrtf(warp_sum(var) / c + kLayerNormEps);
  float* out = y + size_t(row) * c;
  for (int k = lane; k < c; k += 32) out[k] = (in[k] - m) * s * gamma[k] + beta[k];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_kernel(const float* __restrict__ dy, const float* __restrict__ x,
                                          const float* __restrict__ gamma, const float* __restrict__ mean,
                                          const float* __restrict__ rstd, int rows, int c, float* __restrict__ dx,
                                          float* __restrict__ dgamma, float* __restrict__ dbeta) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* d = dy + size_t(row) * c;
  const float* in = x + size_t(row) * c;
  const float m = mean[row], s = rstd[row];
  float g_mean = 0.0f, g_xhat_mean = 0.0f;
  for (int k = lane; k < c; k += 32) {
    const float g = d[k] * gamma[k];
    g_mean += g;
    g_xhat_mean += g * (in[k] - m) * s;
  }
  g_mean = warp_sum(g_mean) / c;
  g_xhat_mean = warp_sum(g_xhat_mean) / c;
  float* dxr = dx + size_t(row) * c;
  for (int k = lane; k < c; k += 32) {
    const float xhat = (in[k] - m) * s;
    atomicAdd(&dgamma[k], d[k] * xhat);
    atomicAdd(&dbeta[k], d[k]);
    dxr[k] += s * (d[k] * gamma[k] - g_mean - xhat * g_xhat_mean);
  }
}

__global__ void bias_gelu_forward_kernel(float* __restrict__ pre, const float* __restrict__ bias,
                                         float* __restrict__ out, int rows, int cols) {
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = pre[i] + bias[i % cols];
    pre[i] = v;
    out[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

__global__ void gelu_backward_kernel(const float* dout, const float* __restrict__ pre, float* dpre, int rows,
                                     int cols) {
  const size_t n = size_t(rows) * cols;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float v = pre[i];
    const float th = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float dth = (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dpre[i] = dout[i] * (0.5f * (1.0f + th) + 0.5f * v * dth);
  }
}

// dbias[c] = sum over rows of d[r, c]: a thread per column, reading rows in order, so the
// sum is the same on every run.
__global__ void column_sum_kernel(const float* __restrict__ d, int rows, int cols, float* __restrict__ out) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float sum = 0.0f;
  for (int r = 0; r < rows; ++r) sum += d[size_t(r) * cols + col];
  out[col] = sum;
}

// Row i of each head's raw scores s [heads, t, t]: the log-sum-exp of its scaled scores over
// keys j <= i, read from lse_in when given, else computed into lse_out; then the
// probabilities in place, zero after i.
__global__ void causal_softmax_kernel(float* __restrict__ s, const float* __restrict__ lse_in, float* __restrict__ lse_out,
                                      int heads, int t, float scale) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= heads * t) return;
  const int i = row % t;
  float* r = s + size_t(row) * t;
  float l;
  if (lse_in != nullptr) {
    l = lse_in[row];
  } else {
    float mx = -INFINITY;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, r[j]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) sum += expf(scale * (r[j] - mx));
    l = scale * mx + logf(warp_sum(sum));
    if (lane == 0) lse_out[row] = l;
  }
  for (int j = lane; j < t; j += 32) r[j] = j <= i ? expf(scale * r[j] - l) : 0.0f;
}

// dS = P (dP - rowsum(dO o)) in place of dP, one warp per (head, query) row.
__global__ void attention_score_grad_kernel(const float* __restrict__ p, float* __restrict__ dp,
                                            const float* __restrict__ dout, const float* __restrict__ out, int heads,
                                            int t, int c, int d) {
  const int row = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= heads * t) return;
  const int h = row / t, i = row % t;
  const float* o = out + size_t(i) * c + size_t(h) * d;
  const float* dO = dout + size_t(i) * c + size_t(h) * d;
  float di = 0.0f;
  for (int k = lane; k < d; k += 32) di += o[k] * dO[k];
  di = warp_sum(di);
  const float* pr = p + size_t(row) * t;
  float* dr = dp + size_t(row) * t;
  for (int j = lane; j < t; j += 32) dr[j] = pr[j] * (dr[j] - di);
}

}  // namespace

void launch_embedding_forward(cudaStream_t s, const int32_t* tokens, const float* wte, const float* wpe, int rows,
                              int context, int c, int vocab, float* y) {
  embedding_forward_kernel<<<grid_for(size_t(rows) * c), kBlock, 0, s>>>(tokens, wte, wpe, rows, context, c, vocab, y);
  CUDA_CHECK(cudaGetLastError());
}

void launch_embedding_backward(cudaStream_t s, const float* dy, const int32_t* tokens, int rows, int context, int c,
                               float* dwte, float* dwpe) {
  embedding_backward_kernel<<<grid_for(size_t(rows) * c), kBlock, 0, s>>>(dy, tokens, rows, context, c, dwte, dwpe);
  CUDA_CHECK(cudaGetLastError());
}

void launch_layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, int rows, int c,
                              float* y, float* mean, float* rstd) {
  layernorm_forward_kernel<<<warp_rows_grid(rows), kBlock, 0, s>>>(x, gamma, beta, rows, c, y, mean, rstd);
  CUDA_CHECK(cudaGetLastError());
}

void launch_layernorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean,
                               const float* rstd, int rows, int c, float* dx, float* dgamma, float* dbeta) {
  CUDA_CHECK(cudaMemsetAsync(dgamma, 0, sizeof(float) * c, s));
  CUDA_CHECK(cudaMemsetAsync(dbeta, 0, sizeof(float) * c, s));
  layernorm_backward_kernel<<<warp_rows_grid(rows), kBlock, 0, s>>>(dy, x, gamma, mean, rstd, rows, c, dx, dgamma, dbeta);
  CUDA_CHECK(cudaGetLastError());
}

void launch_bias_gelu_forward(cudaStream_t s, float* pre, const float* bias, float* out, int rows, int cols) {
  bias_gelu_forward_kernel<<<grid_for(size_t(rows) * cols), kBlock, 0, s>>>(pre, bias, out, rows, cols);
  CUDA_CHECK(cudaGetLastError());
}

void launch_gelu_backward_bias_grad(cudaStream_t s, const float* dout, const float* pre, float* dpre, float* dbias,
                                    int rows, int cols) {
  gelu_backward_kernel<<<grid_for(size_t(rows) * cols), kBlock, 0, s>>>(dout, pre, dpre, rows, cols);
  CUDA_CHECK(cudaGetLastError());
  column_sum_kernel<<<(cols + kBlock - 1) / kBlock, kBlock, 0, s>>>(dpre, rows, cols, dbias);
  CUDA_CHECK(cudaGetLastError());
}

void launch_causal_softmax(cudaStream_t s, float* scores, const float* lse_in, float* lse_out, int heads, int t,
                           float scale) {
  causal_softmax_kernel<<<warp_rows_grid(heads * t), kBlock, 0, s>>>(scores, lse_in, lse_out, heads, t, scale);
  CUDA_CHECK(cudaGetLastError());
}

void launch_attention_score_grad(cudaStream_t s, const float* p, float* dp, const float* dout, const float* out,
                                 int heads, int t, int c, int d) {
  attention_score_grad_kernel<<<warp_rows_grid(heads * t), kBlock, 0, s>>>(p, dp, dout, out, heads, t, c, d);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace hearsay::cuda
