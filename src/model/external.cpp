#include "external.h"

#include "hearsay/error.h"

namespace hearsay {

ExternalTrainable::ExternalTrainable(Backend& backend, float* params, float* grads, size_t n, std::vector<ParamView> views,
                                     std::string description)
    : backend_(backend), params_(params), grads_(grads), n_(n), views_(std::move(views)), description_(std::move(description)) {
  if (params_ == nullptr || grads_ == nullptr) throw InputError("external model: a parameter or gradient buffer is null");
  if (params_ == grads_) throw InputError("external model: the parameter and gradient buffers are the same memory");
  if (n_ == 0) throw InputError("external model: it has no parameters");
  // Codecs and PowerSGD read the views as the layout of the buffer: they must cover it
  // exactly, in order, without gaps.
  size_t at = 0;
  for (const ParamView& v : views_) {
    if (v.offset != at) {
      throw InputError("external model: parameter '" + v.name + "' starts at " + std::to_string(v.offset) + ", expected " +
                       std::to_string(at) + " (views must tile the flat buffer in order)");
    }
    size_t elements = v.shape.empty() ? 0 : 1;
    for (int d : v.shape) elements *= d > 0 ? static_cast<size_t>(d) : 0;
    if (v.size == 0 || elements != v.size) {
      throw InputError("external model: parameter '" + v.name + "' has " + std::to_string(v.size) +
                       " elements but its shape holds " + std::to_string(elements));
    }
    at += v.size;
  }
  if (at != n_) {
    throw InputError("external model: the parameters' views cover " + std::to_string(at) + " of " + std::to_string(n_) +
                     " elements");
  }
}

void ExternalTrainable::arm(const BatchStats& stats) {
  stats_ = stats;
  armed_ = true;
}

BatchStats ExternalTrainable::forward_backward(const Batch&) {
  HEARSAY_CHECK(armed_, "an algorithm asked an external model for a second gradient in one step");
  armed_ = false;
  return stats_;
}

BatchStats ExternalTrainable::evaluate(const Batch&) {
  HEARSAY_CHECK(false, "the engine evaluated an external model; its framework evaluates it");
  return {};
}

}  // namespace hearsay
