// A model another framework owns (the PyTorch front end): its flat parameter and gradient
// buffers are the framework's memory, which the engine reads and writes in place, and the
// framework computes each step's gradient itself. forward_backward() only hands the engine
// the stats of the gradient the framework put in the buffer (armed once per step), so
// every algorithm runs on it unchanged.
#pragma once

#include <string>
#include <vector>

#include "hearsay/trainable.h"

namespace hearsay {

class ExternalTrainable final : public Trainable {
 public:
  // Throws InputError when the views do not tile [0, n) in order or a buffer is null.
  ExternalTrainable(Backend& backend, float* params, float* grads, size_t n, std::vector<ParamView> views,
                    std::string description);

  // The gradient of the step about to run is in grads(), measured as `stats`.
  void arm(const BatchStats& stats);

  Backend& backend() const override { return backend_; }
  BatchKind batch_kind() const override { return BatchKind::kFeatures; }
  int max_batch() const override { return 0; }
  size_t num_params() const override { return n_; }
  const std::vector<ParamView>& param_views() const override { return views_; }
  float* params() const override { return params_; }
  float* grads() const override { return grads_; }
  // The armed stats; a second call in one step is a bug in an algorithm (HEARSAY_CHECK).
  BatchStats forward_backward(const Batch& batch) override;
  // The framework evaluates its own model: never called (HEARSAY_CHECK).
  BatchStats evaluate(const Batch& batch) override;
  std::string summary() const override { return description_; }

 private:
  Backend& backend_;
  float* params_;
  float* grads_;
  size_t n_;
  std::vector<ParamView> views_;
  std::string description_;
  bool armed_ = false;
  BatchStats stats_;
};

}  // namespace hearsay
