// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019), the same rule as
// torch.optim.AdamW: the backend's adamw_update, decay, both moments and the
// bias-corrected update in one fused pass.
#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay::optim {
namespace {

const std::string kAdamWName = "adamw";
const std::string kFirstMoment = "m";
const std::string kSecondMoment = "v";

class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, size_t n, const AdamWParams& params)
      : backend_(backend),
        n_(n),
        params_(params),
        m_(backend_, sizeof(float) * n_),
        v_(backend_, sizeof(float) * n_) {}

  const std::string& name() const override { return kAdamWName; }

  void step(float* w, const float* g, float lr) override { step_scaled(w, g, lr, 1.0f); }

  bool step_scaled(float* w, const float* g, float lr, float grad_scale) override {
    AdamWParams p = params_;
    p.lr = lr;
    p.grad_scale = grad_scale;
    // The bias correction of step t divides by 1 - beta^t: the count goes first.
    ++steps_;
    backend_.adamw_update(w, g, m_.f32(), v_.f32(), n_, p, steps_);
    return true;
  }

  int64_t steps() const override { return steps_; }

  OptimizerState save_state() const override {
    OptimizerState s;
    save_state_into(s);
    return s;
  }

  std::vector<std::string> state_buffer_names() const override { return {kFirstMoment, kSecondMoment}; }

  void save_state_into(OptimizerState& s) const override {
    s.optimizer = kAdamWName;
    s.steps = steps_;
    std::vector<float> m = std::move(s.buffers[kFirstMoment]), v = std::move(s.buffers[kSecondMoment]);
    s.buffers.clear();
    download_floats_into(backend_, m_.f32(), n_, m);
    download_floats_into(backend_, v_.f32(), n_, v);
    s.buffers[kFirstMoment] = std::move(m);
    s.buffers[kSecondMoment] = std::move(v);
  }

  std::optional<std::map<std::string, const float*>> save_state_live(OptimizerState& s) const override {
    s.optimizer = kAdamWName;
    s.steps = steps_;
    return std::map<std::string, const float*>{{kFirstMoment, m_.f32()}, {kSecondMoment, v_.f32()}};
  }

  void load_state(const OptimizerState& s, const std::string& where) override {
    check_state(s, kAdamWName, {kFirstMoment, kSecondMoment}, n_, where);
    // Moments without the step count that made them (or a count without its moments)
    // would be bias-corrected wrongly: both or neither.
    for (const std::string& b : {kFirstMoment, kSecondMoment}) {
      if (s.buffers.count(b) == 0) {
        throw InputError(where + ": the state of optimizer 'adamw' lacks its buffer '" + b + "' (" +
                         (b == kFirstMoment ? "first" : "second") + " moment)");
      }
    }
    backend_.upload(m_.f32(), s.buffers.at(kFirstMoment).data(), sizeof(float) * n_);
    backend_.upload(v_.f32(), s.buffers.at(kSecondMoment).data(), sizeof(float) * n_);
    steps_ = s.steps;
  }

 private:
  Backend& backend_;
  size_t n_;
  AdamWParams params_;  // lr is replaced by the schedule's rate at each step
  DeviceBuffer m_, v_;

 public:
  uint64_t state_bytes() const override { return m_.bytes() + v_.bytes(); }
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(Backend& backend, size_t n, const OptimizerSpec& spec) {
  if (spec.nesterov)
    throw bad_hyperparameter(kAdamWName, "nesterov",
                             "applies to sgd only; adamw has no Nesterov variant");
  require_fraction(kAdamWName, "beta1", spec.beta1);
  require_fraction(kAdamWName, "beta2", spec.beta2);
  require_positive(kAdamWName, "eps", spec.eps);
  require_non_negative(kAdamWName, "weight_decay", spec.weight_decay);
  AdamWParams p;
  p.weight_decay = spec.weight_decay;
  p.beta1 = spec.beta1;
  p.beta2 = spec.beta2;
  p.eps = spec.eps;
  return std::make_unique<AdamW>(backend, n, p);
}

}  // namespace hearsay::optim
