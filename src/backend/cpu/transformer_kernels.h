// The CPU backend's transformer kernels (Backend's "Transformer kernels" section says what
// each computes): single passes the compiler vectorises, and OpenBLAS sgemm for
// attention's products, one head at a time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hearsay::cpu {

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int rows, int context, int c,
                       int vocab, float* y);
void embedding_backward(const float* dy, const int32_t* tokens, int rows, int context, int c, float* dwte,
                        float* dwpe);
void layernorm_forward(const float* x, const float* gamma, const float* beta, int rows, int c, float* y,
                       float* mean, float* rstd);
void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, int rows, int c, float* dx, float* dgamma, float* dbeta);
void bias_gelu_forward(float* pre, const float* bias, float* out, int rows, int cols);
void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias, int rows, int cols);
// scratch: attention_scratch_floats(context) floats.
size_t attention_scratch_floats(int context);
void attention_forward(const float* qkv, int batch, int context, int c, int heads, float* out, float* lse,
                       float* scratch);
void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse, int batch,
                        int context, int c, int heads, float* dqkv, float* scratch);
double sum_squares(const float* x, size_t n);

}  // namespace hearsay::cpu
