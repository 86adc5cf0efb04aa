// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019), the same rule as
// torch.optim.AdamW: the backend's adamw_update, decay, both moments and the
// bias-corrected update in one fused pass.
#include <cmath>
#include <sstream>

#include "hearsay/error.h"
#include "optimizer_impl.h"

namespace hearsay::optim {
namespace {

const std::string kAdamWName = "adamw";
const std::string kFirstMoment = "m";
const std::string kSecondMoment = "v";

std::string shown(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

class AdamW final : public Optimizer {
 public:
  AdamW(Backend& backend, size_t n, const AdamWParams& params)
      : backend_(backend),
        n_(n),
        params_(params),
        m_(backend_, sizeof(float) * n_),
        v_(backend_, sizeof(float) * n_) {}

  const std::string& name() const override { return kAdamWName; }

  void step(float* w, const float* g, float lr) override {
    AdamWParams p = params_;
    p.lr = lr;
    // The bias correction of step t divides by 1 - beta^t: the count goes first.
    ++steps_;
    backend_.adamw_update(w, g, m_.f32(), v_.f32(), n_, p, steps_);
  }

  int64_t steps() const override { return steps_; }

  OptimizerState save_state() const override {
    OptimizerState s;
    s.optimizer = kAdamWName;
    s.steps = steps_;
    s.buffers[kFirstMoment] = download_floats(backend_, m_.f32(), n_);
    s.buffers[kSecondMoment] = download_floats(backend_, v_.f32(), n_);
    return s;
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
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_adamw(Backend& backend, size_t n, const OptimizerSpec& spec) {
  auto bad = [](const std::string& field, const std::string& why) {
    return InputError("optimizer 'adamw': " + field + " " + why);
  };
  if (spec.nesterov) throw bad("nesterov", "applies to sgd only; adamw has no Nesterov variant");
  if (!(spec.beta1 >= 0 && spec.beta1 < 1))
    throw bad("beta1", "must be in [0, 1), got " + shown(spec.beta1));
  if (!(spec.beta2 >= 0 && spec.beta2 < 1))
    throw bad("beta2", "must be in [0, 1), got " + shown(spec.beta2));
  if (!(spec.eps > 0) || !std::isfinite(spec.eps))
    throw bad("eps", "must be a positive number, got " + shown(spec.eps));
  if (!(spec.weight_decay >= 0) || !std::isfinite(spec.weight_decay)) {
    throw bad("weight_decay", "must be a finite number >= 0, got " + shown(spec.weight_decay));
  }
  AdamWParams p;
  p.weight_decay = spec.weight_decay;
  p.beta1 = spec.beta1;
  p.beta2 = spec.beta2;
  p.eps = spec.eps;
  return std::make_unique<AdamW>(backend, n, p);
}

}  // namespace hearsay::optim
