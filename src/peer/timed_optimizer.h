// The optimizer as the algorithms see it (GossipEngine::optimizer): whichever optimizer is
// in force now (the peer's own, or a site leader's recording of it), with the time of every
// step added to a count the engine keeps. That count and the forward and backward passes'
// (GossipEngine::forward_backward) are a step's own computation: what compute utilisation
// (docs/LOGS.md) sets against the time spent waiting on neighbours or communicating.
#pragma once

#include <functional>

#include "hearsay/clock.h"
#include "hearsay/optim.h"

namespace hearsay {

class TimedOptimizer final : public Optimizer {
 public:
  TimedOptimizer(std::function<Optimizer&()> target, const Clock& clock, double& seconds)
      : target_(std::move(target)), clock_(clock), seconds_(seconds) {}
  const std::string& name() const override { return target_().name(); }
  void step(float* w, const float* g, float lr) override {
    const double t0 = clock_.now();
    target_().step(w, g, lr);
    seconds_ += clock_.now() - t0;
  }
  int64_t steps() const override { return target_().steps(); }
  OptimizerState save_state() const override { return target_().save_state(); }
  void save_state_into(OptimizerState& into) const override { target_().save_state_into(into); }
  std::vector<std::string> state_buffer_names() const override { return target_().state_buffer_names(); }
  void load_state(const OptimizerState& state, const std::string& where) override { target_().load_state(state, where); }
  bool state_is_saved() const override { return target_().state_is_saved(); }
  uint64_t state_bytes() const override { return target_().state_bytes(); }

 private:
  std::function<Optimizer&()> target_;
  const Clock& clock_;
  double& seconds_;
};

}  // namespace hearsay
