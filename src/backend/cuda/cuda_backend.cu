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

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
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
