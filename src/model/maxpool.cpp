#include "maxpool.h"

namespace hearsay {

void MaxPoolLayer::prepare(Backend& backend, int max_batch) {
  argmax_ = DeviceBuffer(backend, sizeof(int32_t) * static_cast<size_t>(max_batch) * output_shape().size());
}

void MaxPoolLayer::forward(Backend& b, const float*, const float* x, float* y, int batch) {
  b.maxpool2_forward(x, batch, in_.h, in_.w, in_.c, y, argmax_.i32());
}

void MaxPoolLayer::backward(Backend& b, const float*, float*, const float*, const float*, float* dy,
                            float* dx, int batch) {
  if (dx != nullptr) b.maxpool2_backward(dy, argmax_.i32(), batch, in_.h, in_.w, in_.c, dx);
}

}  // namespace hearsay
