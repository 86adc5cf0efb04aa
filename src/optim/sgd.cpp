// SGD with momentum, heavy-ball or Nesterov, and L2 weight decay folded into the gradient:
// the backend's sgd_update, one fused pass over the flat buffers.
#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay::optim {
namespace {

const std::string kSgdName = "sgd";
const std::string kVelocity = "velocity";

class Sgd final : public Optimizer {
 public:
  Sgd(Backend& backend, size_t n, const SgdParams& params)
      : backend_(backend), n_(n), params_(params) {
    // Without momentum the rule keeps no state: the kernel takes a null velocity.
    if (params_.momentum != 0.0f) velocity_ = DeviceBuffer(backend_, sizeof(float) * n_);
  }

  const std::string& name() const override { return kSgdName; }

  void step(float* w, const float* g, float lr) override { step_scaled(w, g, lr, 1.0f); }

  bool step_scaled(float* w, const float* g, float lr, float grad_scale) override {
    SgdParams p = params_;
    p.lr = lr;
    p.grad_scale = grad_scale;
    ++steps_;
    backend_.sgd_update(w, g, velocity_.f32(), n_, p);
    return true;
  }

  int64_t steps() const override { return steps_; }

  OptimizerState save_state() const override {
    OptimizerState s;
    save_state_into(s);
    return s;
  }

  std::vector<std::string> state_buffer_names() const override {
    if (velocity_.f32() == nullptr) return {};
    return {kVelocity};
  }

  void save_state_into(OptimizerState& s) const override {
    s.optimizer = kSgdName;
    s.steps = steps_;
    if (velocity_.f32() == nullptr) {
      s.buffers.clear();
      return;
    }
    std::vector<float> kept = std::move(s.buffers[kVelocity]);
    s.buffers.clear();
    download_floats_into(backend_, velocity_.f32(), n_, kept);
    s.buffers[kVelocity] = std::move(kept);
  }

  std::optional<std::map<std::string, const float*>> save_state_live(OptimizerState& s) const override {
    s.optimizer = kSgdName;
    s.steps = steps_;
    if (velocity_.f32() == nullptr) return std::map<std::string, const float*>{};
    return std::map<std::string, const float*>{{kVelocity, velocity_.f32()}};
  }

  void load_state(const OptimizerState& s, const std::string& where) override {
    check_state(s, kSgdName, {kVelocity}, n_, where);
    // A state saved without momentum (no velocity) leaves ours at zero; one saved with
    // momentum and resumed without it has nothing to restore into.
    const auto it = s.buffers.find(kVelocity);
    if (velocity_.f32() != nullptr && it != s.buffers.end()) {
      backend_.upload(velocity_.f32(), it->second.data(), sizeof(float) * n_);
    }
    steps_ = s.steps;
  }

 private:
  Backend& backend_;
  size_t n_;
  SgdParams params_;  // lr is replaced by the schedule's rate at each step
  DeviceBuffer velocity_;

 public:
  uint64_t state_bytes() const override { return velocity_.bytes(); }
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(Backend& backend, size_t n, const OptimizerSpec& spec) {
  require_fraction(kSgdName, "momentum", spec.momentum);
  if (spec.nesterov && spec.momentum == 0)
    throw bad_hyperparameter(kSgdName, "nesterov", "needs momentum > 0");
  require_non_negative(kSgdName, "weight_decay", spec.weight_decay);
  SgdParams p;
  p.momentum = spec.momentum;
  p.weight_decay = spec.weight_decay;
  p.nesterov = spec.nesterov;
  return std::make_unique<Sgd>(backend, n, p);
}

}  // namespace hearsay::optim
