#include "conv.h"

#include <cmath>

namespace hearsay {

ConvLayer::ConvLayer(std::string name, Shape in, int out_channels, int kernel, Activation act)
    : Layer(std::move(name)), in_(in), out_c_(out_channels), k_(kernel), pad_(kernel / 2), act_(act) {}

std::vector<std::pair<std::string, std::vector<int>>> ConvLayer::param_shapes() const {
  return {{"weight", {out_c_, patch()}}, {"bias", {out_c_}}};
}

void ConvLayer::init(float* p, Rng& rng) const {
  const float bound = std::sqrt(6.0f / patch());
  const size_t n = static_cast<size_t>(out_c_) * patch();
  for (size_t i = 0; i < n; ++i) p[i] = rng.uniform(-bound, bound);
  for (int i = 0; i < out_c_; ++i) p[n + i] = 0.0f;
}

void ConvLayer::prepare(Backend& backend, int max_batch) {
  cols_ = DeviceBuffer(backend, sizeof(float) * static_cast<size_t>(max_batch) * in_.h * in_.w * patch());
}

void ConvLayer::forward(Backend& b, const float* params, const float* x, float* y, int batch) {
  const int rows = batch * in_.h * in_.w;
  b.im2col(x, batch, in_.h, in_.w, in_.c, k_, pad_, cols_.f32());
  b.gemm(false, true, rows, out_c_, patch(), 1.0f, cols_.f32(), patch(), params, patch(), 0.0f, y, out_c_);
  b.bias_activation(y, params + static_cast<size_t>(out_c_) * patch(), rows, out_c_, act_);
}

void ConvLayer::backward(Backend& b, const float* params, float* grads, const float* x,
                         const float* y, float* dy, float* dx, int batch) {
  const int rows = batch * in_.h * in_.w;
  float* dw = grads;
  b.activation_backward_bias_grad(dy, y, grads + static_cast<size_t>(out_c_) * patch(), rows, out_c_, act_);
  // cols_ still holds im2col(x) from the forward pass of this batch.
  b.gemm(true, false, out_c_, patch(), rows, 1.0f, dy, out_c_, cols_.f32(), patch(), 0.0f, dw, patch());
  if (dx != nullptr) {
    b.gemm(false, false, rows, patch(), out_c_, 1.0f, dy, out_c_, params, patch(), 0.0f, cols_.f32(), patch());
    b.col2im(cols_.f32(), batch, in_.h, in_.w, in_.c, k_, pad_, dx);
  }
}

double ConvLayer::gemm_flops_per_sample(bool need_dx) const {
  const double one = 2.0 * in_.h * in_.w * patch() * out_c_;
  return one * (need_dx ? 3 : 2);
}

}  // namespace hearsay
