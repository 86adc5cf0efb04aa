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

// transformer.cu
void launch_embedding_forward(cudaStream_t s, const int32_t* tokens, const float* wte, const float* wpe, int rows, int context, int c, int vocab, float* y);
void launch_embedding_backward(cudaStream_t s, const float* dy, const int32_t* tokens, int rows, int context, int c, float* dwte, float* dwpe);
void launch_layernorm_forward(cudaStream_t s, const float* x, const float* gamma, const float* beta, int rows, int c, float* y, float* mean, float* rstd);
void launch_layernorm_backward(cudaStream_t s, const float* dy, const float* x, const float* gamma, const float* mean, const float* rstd, int rows, int c, float* dx, float* dgamma, float* dbeta);
void launch_bias_gelu_forward(cudaStream_t s, float* pre, const float* bias, float* out, int rows, int cols);
void launch_gelu_backward_bias_grad(cudaStream_t s, const float* dout, const float* pre, float* dpre, float* dbias, int rows, int cols);
// Over heads x t rows of raw scores [heads, t, t]: each row's log-sum-exp of the scaled,
// causally masked scores, read from lse_in when not null (the backward pass), else
// computed into lse_out; then the probabilities in place.
void launch_causal_softmax(cudaStream_t s, float* scores, const float* lse_in, float* lse_out, int heads, int t, float scale);
// dS = P (dP - rowsum(dO o)) in place of dP, for the heads of one sequence.
void launch_attention_score_grad(cudaStream_t s, const float* p, float* dp, const float* dout, const float* out, int heads, int t, int c, int d);

}  // namespace hearsay::cuda
