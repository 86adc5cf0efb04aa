// What the optimizers in src/optim share and the registry needs: each optimizer's factory
// (one per file), the checks of the hyper-parameters a factory reads, and the checks every
// load_state() makes before it touches the device.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "hearsay/error.h"
#include "hearsay/optim.h"

namespace hearsay::optim {

// The factories registry.cpp lists. Each throws InputError naming the field when a
// hyper-parameter it reads is out of range.
std::unique_ptr<Optimizer> make_sgd(Backend& backend, size_t n, const OptimizerSpec& spec);
std::unique_ptr<Optimizer> make_adamw(Backend& backend, size_t n, const OptimizerSpec& spec);

// The InputError for hyper-parameter `field` of optimizer `name`:
// "optimizer 'NAME': FIELD WHY".
InputError bad_hyperparameter(const std::string& name, const std::string& field,
                              const std::string& why);
// The ranges the optimizers' hyper-parameters take, each checked one way for all of them:
// each throws bad_hyperparameter, with the value it got, unless `value` is in [0, 1)
// (momentum, Adam's betas), finite and > 0 (eps), or finite and >= 0 (weight decay).
void require_fraction(const std::string& name, const std::string& field, double value);
void require_positive(const std::string& name, const std::string& field, double value);
void require_non_negative(const std::string& name, const std::string& field, double value);

// Throws InputError naming `where` unless `state` was saved by optimizer `name`, its step
// count is not negative, every buffer it holds is one of `kept`, and each holds n values.
void check_state(const OptimizerState& state, const std::string& name,
                 const std::vector<std::string>& kept, size_t n, const std::string& where);

}  // namespace hearsay::optim
