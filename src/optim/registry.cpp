// The one list of optimizers: hearsay's own, in the order messages name them, and any a
// program adds with optimizers().add(). The config loader, the peer and the checkpoint
// reader all ask here; no other list of optimizer names exists.
#include "hearsay/registry.h"
#include "optimizer_impl.h"

namespace hearsay {

// Built on first use (a function's static), so adding from another file's namespace-scope
// initializer finds it ready whatever the order of initialization.
NamedRegistry<OptimizerFactory>& optimizers() {
  static NamedRegistry<OptimizerFactory> all("optimizer", {{"sgd", optim::make_sgd}, {"adamw", optim::make_adamw}});
  return all;
}

std::unique_ptr<Optimizer> create_optimizer(Backend& backend, size_t n, const OptimizerSpec& spec) {
  std::unique_ptr<Optimizer> opt = optimizers().get(spec.name)(backend, n, spec);
  if (spec.grad_clip_norm != 0.0f) opt = clip_gradient_norm(std::move(opt), backend, n, spec.grad_clip_norm);
  return opt;
}

}  // namespace hearsay
