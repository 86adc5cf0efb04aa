// GossipEngine's model arithmetic: the parameters to and from the host, mixing a neighbour's
// model in, moving toward it, axpy into parameters and gradients, and the distances logged.

#include <algorithm>
#include <limits>
#include <cmath>

#include "algorithm.h"
#include "hearsay/build_config.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "mailboxes.h"
#include "update_guard.h"
#include "../mixer/robust.h"

namespace hearsay {

std::vector<float> GossipEngine::params_host() { return model_.get_params(); }
void GossipEngine::set_params_host(const std::vector<float>& p) {
  params_written();
  model_.set_params(p);
}

void GossipEngine::measured_params(const double (&lanes)[8], bool whole) {
  if (!whole) return;
  double total = 0;
  for (double l : lanes) total += l;
  params_sq_ = total;
  params_sq_step_ = steps_;
}

void GossipEngine::mix_params(const std::vector<float>& y, double w) {
  Backend& b = model_.backend();
  if (b.is_host()) {
    // One pass over the model (scale, then add w y, as the backend's two calls round it).
    float* x = model_.params();
    const float keep = static_cast<float>(1.0 - w), share = static_cast<float>(w);
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    size_t i = 0;
    for (; i + 8 <= y.size(); i += 8) {
      for (int j = 0; j < 8; ++j) {
        x[i + j] = keep * x[i + j] + share * y[i + j];
        lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
      }
    }
    for (; i < y.size(); ++i) {
      x[i] = keep * x[i] + share * y[i];
      lanes[0] += static_cast<double>(x[i]) * x[i];
    }
    measured_params(lanes, y.size() == model_.num_params());
    return;
  }
  b.scale(y.size(), static_cast<float>(1.0 - w), model_.params());
  b.axpy(y.size(), static_cast<float>(w), on_backend(y), model_.params());
}

const float* GossipEngine::on_backend(const std::vector<float>& y) {
  // A host backend reads host memory as it is: a copy would cost a pass over the model.
  Backend& b = model_.backend();
  if (b.is_host()) return y.data();
  // Made at first use: a host peer never holds it.
  if (scratch_.bytes() == 0) scratch_ = DeviceBuffer(b, sizeof(float) * model_.num_params());
  b.upload(scratch_.data(), y.data(), sizeof(float) * y.size());
  return scratch_.f32();
}

void GossipEngine::mix_neighbour_model(int from, const std::vector<float>& y, double w) {
  if (spec_.mixer.robust == MixerSpec::Robust::kNone) return mix_params(y, w);
  mix_params(robust_->target(from, params_host(), y), w);
}

void GossipEngine::move_toward_neighbour(int from, const std::vector<float>& base, const std::vector<float>& y, double w) {
  if (spec_.mixer.robust == MixerSpec::Robust::kNone && model_.backend().is_host()) {
    // One pass over the model, with no difference held (it is y - base, rounded as before).
    float* x = model_.params();
    const float a = static_cast<float>(w);
    const size_t n = std::min(y.size(), base.size());
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        x[i + j] += a * (y[i + j] - base[i + j]);
        lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
      }
    }
    for (; i < n; ++i) {
      x[i] += a * (y[i] - base[i]);
      lanes[0] += static_cast<double>(x[i]) * x[i];
    }
    measured_params(lanes, n == model_.num_params());
    return;
  }
  std::vector<float> diff;
  if (spec_.mixer.robust == MixerSpec::Robust::kNone) {
    diff.resize(y.size());
    for (size_t i = 0; i < diff.size(); ++i) diff[i] = y[i] - base[i];
  } else {
    diff = robust_->target(from, base, y);
    for (size_t i = 0; i < diff.size(); ++i) diff[i] -= base[i];
  }
  axpy_params(w, diff);
}

void GossipEngine::axpy_host(double a, const std::vector<float>& y, float* device_dst) {
  model_.backend().axpy(y.size(), static_cast<float>(a), on_backend(y), device_dst);
}

void GossipEngine::axpy_params(double a, const std::vector<float>& y) { axpy_host(a, y, model_.params()); }
void GossipEngine::axpy_grads(double a, const std::vector<float>& y) { axpy_host(a, y, model_.grads()); }

void GossipEngine::note_model_distance(const std::string& peer, const std::vector<float>& y) {
  // The log reports one distance per neighbour and window: measuring every arrival would
  // copy the whole model off the device each time for numbers nobody reads.
  if (distances_.count(peer) != 0) return;
  std::vector<float> copied;
  const float* x = model_.params();
  if (!model_.backend().is_host()) {
    copied = params_host();
    x = copied.data();
  }
  const size_t n = std::min(model_.num_params(), y.size());
  double d = 0;
  for (size_t i = 0; i < n; ++i) d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  distances_[peer] = std::sqrt(d);
}

}  // namespace hearsay
