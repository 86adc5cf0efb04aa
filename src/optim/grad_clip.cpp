// Global-norm gradient clipping (optim.grad_clip_norm), as a wrapper around whichever
// optimizer the config names: when the gradient's L2 norm exceeds the bound, the step
// uses the gradient scaled down to it (the model's gradient buffer is left as it was, so
// what an algorithm sends or averages is unchanged). The inner optimizer reads the
// gradient scaled as it steps (Optimizer::step_scaled): no model-sized copy, the same bits
// as a scaled copy gives. One that cannot gets the copy, made at the first step that clips.
#include <cmath>

#include "hearsay/error.h"
#include "hearsay/optim.h"

namespace hearsay {
namespace {

class GlobalNormClip final : public Optimizer {
 public:
  GlobalNormClip(std::unique_ptr<Optimizer> inner, Backend& backend, size_t n, float max_norm)
      : inner_(std::move(inner)), backend_(backend), n_(n), max_norm_(max_norm) {}

  const std::string& name() const override { return inner_->name(); }
  void step(float* w, const float* g, float lr) override {
    const double norm = std::sqrt(backend_.sum_squares(g, n_));
    if (norm > max_norm_) {
      const auto scale = static_cast<float>(max_norm_ / norm);
      if (inner_->step_scaled(w, g, lr, scale)) return;
      if (clipped_.bytes() == 0) clipped_ = DeviceBuffer(backend_, sizeof(float) * n_);
      backend_.copy(clipped_.data(), g, sizeof(float) * n_);
      backend_.scale(n_, scale, clipped_.f32());
      g = clipped_.f32();
    }
    inner_->step(w, g, lr);
  }
  int64_t steps() const override { return inner_->steps(); }
  OptimizerState save_state() const override { return inner_->save_state(); }
  void save_state_into(OptimizerState& into) const override { inner_->save_state_into(into); }
  std::vector<std::string> state_buffer_names() const override { return inner_->state_buffer_names(); }
  std::optional<std::map<std::string, const float*>> save_state_live(OptimizerState& into) const override {
    return inner_->save_state_live(into);
  }
  void load_state(const OptimizerState& state, const std::string& where) override { inner_->load_state(state, where); }
  bool state_is_saved() const override { return inner_->state_is_saved(); }
  uint64_t state_bytes() const override { return inner_->state_bytes() + clipped_.bytes(); }

 private:
  std::unique_ptr<Optimizer> inner_;
  Backend& backend_;
  size_t n_;
  float max_norm_;
  DeviceBuffer clipped_;  // allocated at the first step that clips, for an inner optimizer without step_scaled
};

}  // namespace

std::unique_ptr<Optimizer> clip_gradient_norm(std::unique_ptr<Optimizer> inner, Backend& backend, size_t n,
                                              float max_norm) {
  if (!(max_norm > 0.0f) || !std::isfinite(max_norm)) {
    throw InputError("optim.grad_clip_norm must be a positive number (0: no clipping), got " + std::to_string(max_norm));
  }
  return std::make_unique<GlobalNormClip>(std::move(inner), backend, n, max_norm);
}

}  // namespace hearsay
