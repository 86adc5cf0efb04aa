#include "cuda_backend.h"

#include <cmath>
#include <string>

#include "common.cuh"
#include "kernels.cuh"

namespace hearsay {
namespace {

using cuda::throw_cuda;

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device) : device_(device) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&blas_));
    CUBLAS_CHECK(cublasSetStream(blas_, stream_));
  }
  ~CudaBackend() override {
    attention_scratch_ = DeviceBuffer();  // freed while the backend is whole
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return "cuda:" + std::to_string(device_); }
  bool is_host() const override { return false; }

  void* allocate(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return p;
  }
  void deallocate(void* ptr) override { cudaFree(ptr); }
  void upload(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    // The host buffer may be reused at once by the caller; pageable copies are staged by
    // the driver, but we wait so the contract holds for pinned memory too.
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void download(void* dst, const void* src, size_t bytes) override {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0 && dst != src) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes != 0) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream_));
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    CUBLAS_CHECK(cublasSgemm(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                             n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
  }
  void axpy(size_t n, float alpha, const float* x, float* y) override { cuda::launch_axpy(stream_, n, alpha, x, y); }
  void scale(size_t n, float alpha, float* x) override { cuda::launch_scale(stream_, n, alpha, x); }
  void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) override {
    cuda::launch_bias_activation(stream_, y, bias, rows, cols, act);
  }
  void activation_backward_bias_grad(float* dy, const float* y, float* dbias, int rows, int cols, Activation act) override {
    cuda::launch_activation_backward_bias_grad(stream_, dy, y, dbias, rows, cols, act);
  }
  void softmax_cross_entropy(const float* logits, const int32_t* labels, int rows, int cols, float grad_scale, float* dlogits, float* stats) override {
    cuda::launch_softmax_cross_entropy(stream_, logits, labels, rows, cols, grad_scale, dlogits, stats);
  }
  void im2col(const float* x, int batch, int h, int w, int c, int k, int pad, float* cols) override {
    cuda::launch_im2col(stream_, x, batch, h, w, c, k, pad, cols);
  }
  void col2im(const float* cols, int batch, int h, int w, int c, int k, int pad, float* dx) override {
    cuda::launch_col2im(stream_, cols, batch, h, w, c, k, pad, dx);
  }
  void maxpool2_forward(const float* x, int batch, int h, int w, int c, float* y, int32_t* argmax) override {
    cuda::launch_maxpool2_forward(stream_, x, batch, h, w, c, y, argmax);
  }
  void maxpool2_backward(const float* dy, const int32_t* argmax, int batch, int h, int w, int c, float* dx) override {
    cuda::launch_maxpool2_backward(stream_, dy, argmax, batch, h, w, c, dx);
  }
  void sgd_update(float* w, const float* g, float* velocity, size_t n, const SgdParams& p) override {
    cuda::launch_sgd_update(stream_, w, g, velocity, n, p);
  }
  void adamw_update(float* w, const float* g, float* m, float* v, size_t n, const AdamWParams& p, int64_t t) override {
    HEARSAY_CHECK(t >= 1 && m != nullptr && v != nullptr, "adamw_update: t = " + std::to_string(t));
    const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(t)));
    const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(t)));
    cuda::launch_adamw_update(stream_, w, g, m, v, n, p, c1, c2);
  }

  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int rows, int context, int c,
                         int vocab, float* y) override {
    cuda::launch_embedding_forward(stream_, tokens, wte, wpe, rows, context, c, vocab, y);
  }
  void embedding_backward(const float* dy, const int32_t* tokens, int rows, int context, int c, float* dwte,
                          float* dwpe) override {
    cuda::launch_embedding_backward(stream_, dy, tokens, rows, context, c, dwte, dwpe);
  }
  void layernorm_forward(const float* x, const float* gamma, const float* beta, int rows, int c, float* y,
                         float* mean, float* rstd) override {
    cuda::launch_layernorm_forward(stream_, x, gamma, beta, rows, c, y, mean, rstd);
  }
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                          int rows, int c, float* dx, float* dgamma, float* dbeta) override {
    cuda::launch_layernorm_backward(stream_, dy, x, gamma, mean, rstd, rows, c, dx, dgamma, dbeta);
  }
  void bias_gelu_forward(float* pre, const float* bias, float* out, int rows, int cols) override {
    cuda::launch_bias_gelu_forward(stream_, pre, bias, out, rows, cols);
  }
  void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias, int rows,
                               int cols) override {
    cuda::launch_gelu_backward_bias_grad(stream_, dout, pre, dpre, dbias, rows, cols);
  }
  // One sequence at a time, its heads batched: the scores of all heads of a sequence
  // ([heads, t, t]) live in device scratch.
  void attention_forward(const float* qkv, int batch, int context, int c, int heads, float* out,
                         float* lse) override {
    const int t = context, d = c / heads, ld = 3 * c;
    const long long tt = static_cast<long long>(t) * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    float* scores = attention_scratch(heads, t);
    for (int b = 0; b < batch; ++b) {
      const float* q = qkv + static_cast<size_t>(b) * t * ld;
      gemm_batched(false, true, t, t, d, 1.0f, q, ld, d, q + c, ld, d, 0.0f, scores, t, tt, heads);
      cuda::launch_causal_softmax(stream_, scores, nullptr, lse + static_cast<size_t>(b) * heads * t, heads, t, scale);
      gemm_batched(false, false, t, d, t, 1.0f, scores, t, tt, q + 2 * c, ld, d, 0.0f,
                   out + static_cast<size_t>(b) * t * c, c, d, heads);
    }
  }
  void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse, int batch,
                          int context, int c, int heads, float* dqkv) override {
    const int t = context, d = c / heads, ld = 3 * c;
    const long long tt = static_cast<long long>(t) * t;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    float* p = attention_scratch(heads, t);
    float* dp = p + static_cast<size_t>(heads) * tt;
    for (int b = 0; b < batch; ++b) {
      const float* q = qkv + static_cast<size_t>(b) * t * ld;
      const float* dO = dout + static_cast<size_t>(b) * t * c;
      const float* o = out + static_cast<size_t>(b) * t * c;
      float* dq = dqkv + static_cast<size_t>(b) * t * ld;
      gemm_batched(false, true, t, t, d, 1.0f, q, ld, d, q + c, ld, d, 0.0f, p, t, tt, heads);
      cuda::launch_causal_softmax(stream_, p, lse + static_cast<size_t>(b) * heads * t, nullptr, heads, t, scale);
      gemm_batched(true, false, t, d, t, 1.0f, p, t, tt, dO, c, d, 0.0f, dq + 2 * c, ld, d, heads);
      gemm_batched(false, true, t, t, d, 1.0f, dO, c, d, q + 2 * c, ld, d, 0.0f, dp, t, tt, heads);
      cuda::launch_attention_score_grad(stream_, p, dp, dO, o, heads, t, c, d);
      gemm_batched(false, false, t, d, t, scale, dp, t, tt, q + c, ld, d, 0.0f, dq, ld, d, heads);
      gemm_batched(true, false, t, d, t, scale, dp, t, tt, q, ld, d, 0.0f, dq + c, ld, d, heads);
    }
  }
  double sum_squares(const float* x, size_t n) override {
    float norm = 0.0f;
    CUBLAS_CHECK(cublasSetPointerMode(blas_, CUBLAS_POINTER_MODE_HOST));
    CUBLAS_CHECK(cublasSnrm2(blas_, static_cast<int>(n), x, 1, &norm));
    return static_cast<double>(norm) * norm;
  }

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  DeviceBuffer attention_scratch_;  // two [heads, t, t] score matrices

  // Row-major strided batched C_i = op(A_i) op(B_i), as gemm() maps it onto column-major cuBLAS.
  void gemm_batched(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                    long long stride_a, const float* b, int ldb, long long stride_b, float beta, float* c, int ldc,
                    long long stride_c, int count) {
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas_, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                           trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k, &alpha, b, ldb, stride_b, a,
                                           lda, stride_a, &beta, c, ldc, stride_c, count));
  }
  float* attention_scratch(int heads, int t) {
    const size_t need = sizeof(float) * 2 * static_cast<size_t>(heads) * t * t;
    if (attention_scratch_.bytes() < need) attention_scratch_ = DeviceBuffer(*this, need);
    return attention_scratch_.f32();
  }
};

}  // namespace

int cuda_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::unique_ptr<Backend> create_cuda_backend(int device) {
  const int count = cuda_device_count();
  if (device >= count) {
    throw InputError("device 'cuda:" + std::to_string(device) + "': " +
                     (count == 0 ? std::string("no CUDA device is visible on this machine")
                                 : std::to_string(count) + " CUDA device(s) visible"));
  }
  return std::make_unique<CudaBackend>(device);
}

}  // namespace hearsay
