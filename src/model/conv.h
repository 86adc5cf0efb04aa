// 2-D convolution, stride 1, "same" zero padding, by im2col + one GEMM over the whole
// batch: cols [B*H*W, k*k*Cin] x W^T [k*k*Cin, Cout] gives the NHWC output directly.
#pragma once

#include "layer.h"

namespace hearsay {

class ConvLayer final : public Layer {
 public:
  ConvLayer(std::string name, Shape in, int out_channels, int kernel, Activation act);
  Shape input_shape() const override { return in_; }
  Shape output_shape() const override { return Shape{in_.h, in_.w, out_c_}; }
  std::vector<std::pair<std::string, std::vector<int>>> param_shapes() const override;
  void init(float* host_params, Rng& rng) const override;
  void prepare(Backend& backend, int max_batch) override;
  void forward(Backend& b, const float* params, const float* x, float* y, int batch) override;
  void backward(Backend& b, const float* params, float* grads, const float* x, const float* y,
                float* dy, float* dx, int batch) override;
  double gemm_flops_per_sample(bool need_dx) const override;

 private:
  int patch() const { return k_ * k_ * in_.c; }

  Shape in_;
  int out_c_, k_, pad_;
  Activation act_;
  DeviceBuffer cols_;  // im2col of the last forward input, reused by backward
};

}  // namespace hearsay
