// Launchers for hearsay's own CUDA kernels. Each enqueues on `stream` and checks the launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "hearsay/backend.h"

namespace hearsay::cuda {

// elementwise.cu
void launch_axpy(cudaStream_t s, size_t n, float alpha, const float* x, float* y);
void launch_scale(cudaStream_t s, size_t n, float alpha, float* x);
void launch_bias_activation(cudaStream_t s, float* y, const float* bias, int rows, int cols, Activation act);
void launch_activation_backward_bias_grad(cudaStream_t s, float* dy, const float* y, float* dbias, int rows, int cols, Activation act);
void launch_sgd_update(cudaStream_t s, float* w, const float* g, float* v, size_t n, const SgdParams& p);
// c1 = 1 - beta1^t and c2 = 1 - beta2^t, the bias corrections of step t.
void launch_adamw_update(cudaStream_t s, float* w, const float* g, float* m, float* v, size_t n, const AdamWParams& p, float c1, float c2);

// loss.cu
void launch_softmax_cross_entropy(cudaStream_t s, const float* logits, const int32_t* labels, int rows, int cols, float grad_scale, float* dlogits, float* stats);

// conv.cu
void launch_im2col(cudaStream_t s, const float* x, int batch, int h, int w, int c, int k, int pad, float* cols);
void launch_col2im(cudaStream_t s, const float* cols, int batch, int h, int w, int c, int k, int pad, float* dx);
void launch_maxpool2_forward(cudaStream_t s, const float* x, int batch, int h, int w, int c, float* y, int32_t* argmax);
void launch_maxpool2_backward(cudaStream_t s, const float* dy, const int32_t* argmax, int batch, int h, int w, int c, float* dx);

}  // namespace hearsay::cuda
