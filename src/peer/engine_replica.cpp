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

void GossipEngine::read_params(size_t offset, size_t n, float* dst) {
  HEARSAY_CHECK(offset + n <= model_.num_params(), "read_params: [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                                        ") beyond the model's " + std::to_string(model_.num_params()));
  model_.backend().download(dst, model_.params() + offset, sizeof(float) * n);
}

void GossipEngine::write_params(size_t offset, size_t n, const float* src) {
  HEARSAY_CHECK(offset + n <= model_.num_params(), "write_params: [" + std::to_string(offset) + ", +" + std::to_string(n) +
                                                         ") beyond the model's " + std::to_string(model_.num_params()));
  params_written();
  model_.backend().upload(model_.params() + offset, src, sizeof(float) * n);
}

void GossipEngine::measured_params(const double (&lanes)[8], bool whole) {
  if (!whole) return;
  double total = 0;
  for (double l : lanes) total += l;
  params_sq_ = total;
  params_sq_step_ = steps_;
}

// x[at, at + n) <- (1 - w) x + w y, adding the new values' squares into `lanes` (host backend).
static void mix_part(float* x, const float* y, size_t n, double w, double (&lanes)[8]) {
  // One pass over the part (scale, then add w y, as the backend's two calls round it).
  const float keep = static_cast<float>(1.0 - w), share = static_cast<float>(w);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      x[i + j] = keep * x[i + j] + share * y[i + j];
      lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
    }
  }
  for (; i < n; ++i) {
    x[i] = keep * x[i] + share * y[i];
    lanes[0] += static_cast<double>(x[i]) * x[i];
  }
}

// x[at, at + n) += w (y - base), the same way.
static void move_part(float* x, const float* base, const float* y, size_t n, float w, double (&lanes)[8]) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) {
      x[i + j] += w * (y[i + j] - base[i + j]);
      lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
    }
  }
  for (; i < n; ++i) {
    x[i] += w * (y[i] - base[i]);
    lanes[0] += static_cast<double>(x[i]) * x[i];
  }
}

void GossipEngine::mix_params(const std::vector<float>& y, double w) {
  Backend& b = model_.backend();
  if (b.is_host()) {
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    mix_part(model_.params(), y.data(), y.size(), w, lanes);
    measured_params(lanes, y.size() == model_.num_params());
    return;
  }
  b.scale(y.size(), static_cast<float>(1.0 - w), model_.params());
  b.axpy(y.size(), static_cast<float>(w), on_backend(y), model_.params());
}

void GossipEngine::for_each_part(const Message& m, const std::function<void(size_t at, const float* y, size_t n)>& fn) {
  if (!m.kept_only()) {
    fn(m.offset, m.data.data(), m.data.size());
    return;
  }
  for_each_decoded(*m.payloads, part_scratch_, fn);
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
    const size_t n = std::min(y.size(), base.size());
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    move_part(model_.params(), base.data(), y.data(), n, static_cast<float>(w), lanes);
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

void GossipEngine::move_toward_neighbour(int from, const std::vector<float>& base, const Message& m, double w) {
  if (!m.kept_only() || spec_.mixer.robust != MixerSpec::Robust::kNone || !model_.backend().is_host()) {
    if (!m.kept_only()) return move_toward_neighbour(from, base, m.data, w);
    Message whole = m;  // a robust rule needs the whole vector
    decode_kept(whole);
    return move_toward_neighbour(from, base, whole.data, w);
  }
  double lanes[8] = {};
  size_t covered = 0;
  for_each_part(m, [&](size_t at, const float* y, size_t n) {
    n = std::min(n, base.size() - std::min(base.size(), at));
    move_part(model_.params() + at, base.data() + at, y, n, static_cast<float>(w), lanes);
    covered += n;
  });
  measured_params(lanes, covered == model_.num_params());
}

void GossipEngine::move_toward_neighbour(int from, const Encoded& base, const Message& m, double w) {
  bool aligned = m.kept_only() && spec_.mixer.robust == MixerSpec::Robust::kNone && model_.backend().is_host() &&
                 base.segments.size() == m.payloads->segments.size();
  for (size_t k = 0; aligned && k < base.segments.size(); ++k) {
    aligned = base.segments[k].offset == m.payloads->segments[k].offset && base.segments[k].length == m.payloads->segments[k].length;
  }
  if (!aligned) {
    // Cut differently (or a robust rule, which needs the whole vectors): decoded whole.
    std::vector<float> whole(model_.num_params(), 0.0f);
    for_each_decoded(base, base_scratch_, [&](size_t at, const float* y, size_t n) {
      std::copy(y, y + std::min(n, whole.size() - std::min(at, whole.size())), whole.begin() + static_cast<long>(std::min(at, whole.size())));
    });
    return move_toward_neighbour(from, whole, m, w);
  }
  double lanes[8] = {};
  size_t covered = 0, k = 0;
  for_each_part(m, [&](size_t at, const float* y, size_t n) {
    const float* b = decode_segment(base.segments[k++], base_scratch_);
    n = std::min(n, model_.num_params() - std::min(model_.num_params(), at));
    move_part(model_.params() + at, b, y, n, static_cast<float>(w), lanes);
    covered += n;
  });
  measured_params(lanes, covered == model_.num_params());
}

void GossipEngine::axpy_host(double a, const std::vector<float>& y, float* device_dst) {
  model_.backend().axpy(y.size(), static_cast<float>(a), on_backend(y), device_dst);
}

void GossipEngine::axpy_host(double a, const Message& m, float* host_dst) {
  if (!m.kept_only()) return axpy_host(a, m.data, host_dst);
  // Kept payloads exist only on a host backend (the inbox keeps them there alone).
  HEARSAY_CHECK(model_.backend().is_host(), "kept payloads on a device backend");
  for_each_part(m, [&](size_t at, const float* y, size_t n) { model_.backend().axpy(n, static_cast<float>(a), y, host_dst + at); });
}

void GossipEngine::mix_host(int from, const Message& m, double w) {
  if (!m.kept_only()) return mix_neighbour_model(from, m.data, w);
  if (spec_.mixer.robust != MixerSpec::Robust::kNone) {
    Message whole = m;  // a robust rule needs the whole vector
    decode_kept(whole);
    return mix_neighbour_model(from, whole.data, w);
  }
  HEARSAY_CHECK(model_.backend().is_host(), "kept payloads on a device backend");
  double lanes[8] = {};
  size_t covered = 0;
  for_each_part(m, [&](size_t at, const float* y, size_t n) {
    mix_part(model_.params() + at, y, n, w, lanes);
    covered += n;
  });
  measured_params(lanes, covered == model_.num_params());
}

void GossipEngine::axpy_params(double a, const std::vector<float>& y) { axpy_host(a, y, model_.params()); }
void GossipEngine::axpy_grads(double a, const std::vector<float>& y) { axpy_host(a, y, model_.grads()); }

void GossipEngine::note_model_distance(const std::string& peer, const Message& m) {
  // The log reports one distance per neighbour and window: measuring every arrival would
  // copy the whole model off the device each time for numbers nobody reads.
  if (distances_.count(peer) != 0) return;
  std::vector<float> copied;
  const float* x = model_.params();
  if (!model_.backend().is_host()) {
    copied = params_host();
    x = copied.data();
  }
  double d = 0;
  for_each_part(m, [&](size_t at, const float* y, size_t n) {
    n = std::min(n, model_.num_params() - std::min(model_.num_params(), at));
    for (size_t i = 0; i < n; ++i) d += (double(x[at + i]) - y[i]) * (double(x[at + i]) - y[i]);
  });
  distances_[peer] = std::sqrt(d);
}

}  // namespace hearsay
