// 2x2 max pooling with stride 2; remembers which input won for the backward pass.
#pragma once

#include "layer.h"

namespace hearsay {

class MaxPoolLayer final : public Layer {
 public:
  MaxPoolLayer(std::string name, Shape in) : Layer(std::move(name)), in_(in) {}
  Shape input_shape() const override { return in_; }
  Shape output_shape() const override { return Shape{in_.h / 2, in_.w / 2, in_.c}; }
  void prepare(Backend& backend, int max_batch) override;
  void forward(Backend& b, const float* params, const float* x, float* y, int batch) override;
  void backward(Backend& b, const float* params, float* grads, const float* x, const float* y,
                float* dy, float* dx, int batch) override;

 private:
  Shape in_;
  DeviceBuffer argmax_;
};

}  // namespace hearsay
