// The local optimizer: SGD with momentum (heavy-ball or Nesterov) and weight decay over a
// model's flat buffers, and the learning-rate schedule that drives it.
#pragma once

#include <cstdint>

#include "hearsay/backend.h"

namespace hearsay {

struct LrSchedule {
  enum class Kind { kConstant, kStep, kCosine };
  Kind kind = Kind::kConstant;
  float base_lr = 0.05f;
  int64_t warmup_steps = 0;  // linear ramp from base_lr/warmup_steps up to base_lr
  int64_t step_size = 0;     // kStep: multiply by gamma every step_size steps
  float gamma = 0.1f;
  int64_t total_steps = 0;   // kCosine: decay from base_lr to min_lr over total_steps
  float min_lr = 0.0f;

  // Learning rate for the given 0-based step.
  float at(int64_t step) const;
};

class Sgd {
 public:
  // The velocity buffer (n floats) is allocated on `backend` when momentum > 0.
  Sgd(Backend& backend, size_t n, SgdParams params);

  // w -= lr * update(g); `lr` overrides params.lr for this step (from the schedule).
  void step(float* w, const float* g, float lr);
  const SgdParams& params() const { return params_; }
  float* velocity() const { return velocity_.f32(); }

 private:
  Backend& backend_;
  size_t n_;
  SgdParams params_;
  DeviceBuffer velocity_;
};

}  // namespace hearsay
