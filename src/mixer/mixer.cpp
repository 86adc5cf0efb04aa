#include "hearsay/mixer.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

#include "hearsay/error.h"
#include "hearsay/registry.h"

namespace hearsay {
namespace {

constexpr size_t kMaxTaus = 4096;

double percentile(std::vector<int64_t>& v, double q) {
  if (v.empty()) return 0;
  const size_t k = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  std::nth_element(v.begin(), v.begin() + static_cast<long>(k), v.end());
  return static_cast<double>(v[k]);
}

}  // namespace

// hearsay's own weightings, there before any lookup (a function's static).
NamedRegistry<StalenessWeighting>& staleness_weightings() {
  static NamedRegistry<StalenessWeighting> all(
      "mixer weighting", {{"constant", [](double, const MixerSpec&) { return 1.0; }},
                          {"polynomial", [](double t, const MixerSpec& s) { return 1.0 / std::pow(1.0 + t, s.alpha); }},
                          {"exponential", [](double t, const MixerSpec& s) { return std::exp(-s.lambda * t); }},
                          {"inverse", [](double t, const MixerSpec&) { return 1.0 / std::max(1.0, t); }}});
  return all;
}

MixerSpec::Robust parse_robust(const std::string& name) {
  if (name == "none") return MixerSpec::Robust::kNone;
  if (name == "centered_clip") return MixerSpec::Robust::kCenteredClip;
  if (name == "trimmed_mean") return MixerSpec::Robust::kTrimmedMean;
  throw InputError("mixer robust '" + name + "': unknown; use none, centered_clip or trimmed_mean");
}

Mixer::Mixer(MixerSpec spec) : spec_(spec) {
  weight_of_ = staleness_weightings().get(spec_.weighting);
  if (!(spec_.clip_factor > 0) || !(spec_.trim >= 0 && spec_.trim < 0.5)) {
    throw InputError("mixer: clip_factor must be > 0 and trim in [0, 0.5)");
  }
  if (!(spec_.alpha >= 0) || !(spec_.lambda >= 0) || spec_.tau_max < 0 || !(spec_.max_share > 0 && spec_.max_share <= 1)) {
    throw InputError("mixer: alpha and lambda must be >= 0, tau_max >= 0, max_share in (0, 1]");
  }
}

double Mixer::staleness_weight(int64_t tau) const {
  return weight_of_(static_cast<double>(std::max<int64_t>(0, tau)), spec_);
}

Mixer::Decision Mixer::record(int64_t tau, double weight, bool may_drop) {
  std::lock_guard<std::mutex> lock(mu_);
  ++seen_;
  staleness_.add(tau);
  // Algorithm R: the first kMaxTaus are kept; the seen_-th then replaces a kept one at
  // random with probability kMaxTaus / seen_, so every tau of the window is kept with the
  // same probability and the percentiles are those of the whole window.
  if (taus_.size() < kMaxTaus) {
    taus_.push_back(tau);
  } else if (const uint64_t j = rng_.below(seen_); j < kMaxTaus) {
    taus_[j] = tau;
  }
  if (may_drop && tau > spec_.tau_max) {
    ++dropped_;
    return {true, tau, 0.0};
  }
  ++applied_;
  weight_sum_ += weight;
  return {false, tau, weight};
}

Mixer::Decision Mixer::model(uint64_t my_clock, uint64_t their_clock, double base, uint64_t my_samples,
                             uint64_t their_samples) {
  const int64_t tau = my_clock > their_clock ? static_cast<int64_t>(my_clock - their_clock) : 0;
  double share = base;
  if (spec_.weight_by_samples && my_samples + their_samples > 0) {
    share = 2.0 * base * static_cast<double>(their_samples) / static_cast<double>(my_samples + their_samples);
  }
  share = std::clamp(share * staleness_weight(tau), 0.0, spec_.max_share);
  return record(tau, share);
}

Mixer::Decision Mixer::gradient(uint64_t my_clock, uint64_t their_clock) {
  const int64_t tau = my_clock > their_clock ? static_cast<int64_t>(my_clock - their_clock) : 0;
  return record(tau, staleness_weight(tau));
}

void Mixer::applied(uint64_t my_clock, uint64_t their_clock) {
  record(my_clock > their_clock ? static_cast<int64_t>(my_clock - their_clock) : 0, 1.0, false);
}

void Mixer::count_coalesced(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  coalesced_ += n;
}

void Mixer::count_dropped(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  dropped_ += n;
}

StalenessHistogram Mixer::staleness() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staleness_;
}

Mixer::Stats Mixer::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.applied = applied_;
  s.dropped = dropped_;
  s.coalesced = coalesced_;
  s.weight_mean = applied_ > 0 ? weight_sum_ / static_cast<double>(applied_) : 0;
  s.tau_p50 = percentile(taus_, 0.5);
  s.tau_p90 = percentile(taus_, 0.9);
  s.tau_p99 = percentile(taus_, 0.99);
  s.tau_max = taus_.empty() ? 0 : static_cast<double>(*std::max_element(taus_.begin(), taus_.end()));
  taus_.clear();
  applied_ = dropped_ = coalesced_ = seen_ = 0;
  weight_sum_ = 0;
  return s;
}

}  // namespace hearsay
