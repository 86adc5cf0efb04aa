// Fully connected layer y = act(x W^T + b), W [out, in]; bias and activation fused.
#pragma once

#include "layer.h"

namespace hearsay {

class DenseLayer final : public Layer {
 public:
  DenseLayer(std::string name, Shape in, int out, Activation act);
  Shape input_shape() const override { return in_; }
  Shape output_shape() const override { return Shape{1, 1, out_}; }
  std::vector<std::pair<std::string, std::vector<int>>> param_shapes() const override;
  void init(float* host_params, Rng& rng) const override;
  void forward(Backend& b, const float* params, const float* x, float* y, int batch) override;
  void backward(Backend& b, const float* params, float* grads, const float* x, const float* y,
                float* dy, float* dx, int batch) override;
  double gemm_flops_per_sample(bool need_dx) const override;

 private:
  Shape in_;
  int in_dim_, out_;
  Activation act_;
};

}  // namespace hearsay
