#include "dense.h"

#include <cmath>

namespace hearsay {

DenseLayer::DenseLayer(std::string name, Shape in, int out, Activation act)
    : Layer(std::move(name)), in_(in), in_dim_(static_cast<int>(in.size())), out_(out), act_(act) {}

std::vector<std::pair<std::string, std::vector<int>>> DenseLayer::param_shapes() const {
  return {{"weight", {out_, in_dim_}}, {"bias", {out_}}};
}

void DenseLayer::init(float* p, Rng& rng) const {
  // He-uniform for ReLU layers keeps activations' variance steady through depth; Glorot
  // for the output layer. Biases start at zero.
  const float bound = act_ == Activation::kRelu ? std::sqrt(6.0f / in_dim_)
                                                : std::sqrt(6.0f / (in_dim_ + out_));
  const size_t n = static_cast<size_t>(out_) * in_dim_;
  for (size_t i = 0; i < n; ++i) p[i] = rng.uniform(-bound, bound);
  for (int i = 0; i < out_; ++i) p[n + i] = 0.0f;
}

void DenseLayer::forward(Backend& b, const float* params, const float* x, float* y, int batch) {
  const float* w = params;
  const float* bias = params + static_cast<size_t>(out_) * in_dim_;
  b.gemm(false, true, batch, out_, in_dim_, 1.0f, x, in_dim_, w, in_dim_, 0.0f, y, out_);
  b.bias_activation(y, bias, batch, out_, act_);
}

void DenseLayer::backward(Backend& b, const float* params, float* grads, const float* x,
                          const float* y, float* dy, float* dx, int batch) {
  float* dw = grads;
  float* dbias = grads + static_cast<size_t>(out_) * in_dim_;
  b.activation_backward_bias_grad(dy, y, dbias, batch, out_, act_);
  b.gemm(true, false, out_, in_dim_, batch, 1.0f, dy, out_, x, in_dim_, 0.0f, dw, in_dim_);
  if (dx != nullptr) {
    b.gemm(false, false, batch, in_dim_, out_, 1.0f, dy, out_, params, in_dim_, 0.0f, dx, in_dim_);
  }
}

double DenseLayer::gemm_flops_per_sample(bool need_dx) const {
  const double one = 2.0 * in_dim_ * out_;
  return one * (need_dx ? 3 : 2);
}

}  // namespace hearsay
