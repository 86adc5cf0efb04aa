#include "callback_optimizer.h"

#include "hearsay/error.h"

namespace hearsay {
namespace {

class CallbackOptimizer final : public Optimizer {
 public:
  CallbackOptimizer(Backend& backend, float* params, float* grads, size_t n, std::function<void(float)> step)
      : backend_(backend), params_(params), grads_(grads), n_(n), step_(std::move(step)) {}

  const std::string& name() const override { return name_; }
  void step(float* w, const float* g, float lr) override {
    HEARSAY_CHECK(w == params_, "an algorithm stepped an external model's optimizer on another parameter buffer");
    if (g != grads_) backend_.copy(grads_, g, sizeof(float) * n_);
    // The framework's optimizer runs on its own stream of work: what the engine queued on
    // the device must be done first.
    backend_.synchronize();
    step_(lr);
    ++steps_;
  }
  int64_t steps() const override { return steps_; }
  // The framework's optimizer keeps its state in the framework's checkpoints.
  OptimizerState save_state() const override { return {name_, steps_, {}}; }
  void load_state(const OptimizerState& state, const std::string& where) override {
    if (state.optimizer != name_ || !state.buffers.empty() || state.steps < 0) {
      throw InputError(where + ": optimizer state of '" + state.optimizer + "' given to a framework's optimizer");
    }
    steps_ = state.steps;
  }
  bool state_is_saved() const override { return false; }

 private:
  const std::string name_ = "external";
  Backend& backend_;
  float* params_;
  float* grads_;
  size_t n_;
  std::function<void(float)> step_;
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Optimizer> make_callback_optimizer(Backend& backend, float* params, float* grads, size_t n,
                                                   std::function<void(float lr)> step) {
  return std::make_unique<CallbackOptimizer>(backend, params, grads, n, std::move(step));
}

}  // namespace hearsay
