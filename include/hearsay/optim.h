// The local optimizer over a model's flat buffers: SGD with momentum (heavy-ball or
// Nesterov) and weight decay, or AdamW (SgdParams::kind); and the learning-rate schedule
// that drives it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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

// "sgd" or "adamw": the name checkpoints and messages use for a kind.
const char* optimizer_kind_name(OptimizerKind kind);

// One optimizer class for every kind (the engine calls step() and nothing else), named
// after its first kind. Its state lives on the backend: SGD's velocity (when momentum >
// 0), AdamW's first and second moments and its step count.
class Sgd {
 public:
  // Host copy of the optimizer's state, for checkpoints. Buffers a kind does not use are
  // empty.
  struct State {
    OptimizerKind kind = OptimizerKind::kSgd;
    std::vector<float> velocity;  // kSgd with momentum > 0
    std::vector<float> m, v;      // kAdamW
    int64_t steps = 0;            // steps taken (AdamW's bias correction counts them)
  };

  // Allocates the state buffers (n floats each) on `backend`: the velocity for kSgd when
  // momentum > 0, the two moments for kAdamW; all start at zero.
  Sgd(Backend& backend, size_t n, SgdParams params);

  // w -= lr * update(g); `lr` overrides params.lr for this step (from the schedule).
  void step(float* w, const float* g, float lr);
  const SgdParams& params() const { return params_; }
  OptimizerKind kind() const { return params_.kind; }
  // Device buffers, null where the kind does not use them.
  float* velocity() const { return velocity_.f32(); }
  float* first_moment() const { return m_.f32(); }
  float* second_moment() const { return v_.f32(); }
  int64_t steps() const { return steps_; }

  // Downloads the state (synchronizes the backend).
  State state() const;
  // Uploads a saved state. Throws InputError, naming `where`, when its kind is not this
  // optimizer's or a buffer's length is not n. An SGD state without a velocity (saved
  // without momentum) leaves the velocity at zero.
  void restore(const State& s, const std::string& where);

 private:
  Backend& backend_;
  size_t n_;
  SgdParams params_;
  DeviceBuffer velocity_;
  DeviceBuffer m_, v_;
  int64_t steps_ = 0;
};

}  // namespace hearsay
