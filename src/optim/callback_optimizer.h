// The optimizer of a model another framework owns (the PyTorch front end): its step is a
// call into that framework, whose optimizer updates the shared parameter buffer from the
// shared gradient buffer and keeps its own state (torch's state_dict, not hearsay's).
#pragma once

#include <functional>
#include <memory>

#include "hearsay/optim.h"

namespace hearsay {

// `step(lr)` updates `params` from `grads` (n floats on `backend`). An algorithm (or the
// gradient-clipping wrapper) may hand the optimizer another gradient buffer; it is copied
// into `grads` first, since the framework reads its own.
std::unique_ptr<Optimizer> make_callback_optimizer(Backend& backend, float* params, float* grads, size_t n,
                                                   std::function<void(float lr)> step);

}  // namespace hearsay
