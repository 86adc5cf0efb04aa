#include "robust.h"

#include <algorithm>
#include <cmath>

namespace hearsay {
namespace {
constexpr size_t kLengths = 64;
}  // namespace

std::vector<float> RobustMixing::target(int from, const std::vector<float>& x, const std::vector<float>& y) {
  switch (spec_.robust) {
    case MixerSpec::Robust::kNone: return y;
    case MixerSpec::Robust::kCenteredClip: return clip(x, y);
    case MixerSpec::Robust::kTrimmedMean: return trimmed_mean(from, x, y);
  }
  return y;
}

std::vector<float> RobustMixing::clip(const std::vector<float>& x, const std::vector<float>& y) {
  double sq = 0;
  for (size_t i = 0; i < x.size(); ++i) sq += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
  const double length = std::sqrt(sq);
  lengths_.push_back(length);
  if (lengths_.size() > kLengths) lengths_.pop_front();
  std::vector<double> sorted(lengths_.begin(), lengths_.end());
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<long>(sorted.size() / 2), sorted.end());
  const double tau = spec_.clip_factor * sorted[sorted.size() / 2];
  if (length <= tau || length == 0) return y;
  ++clipped_;
  const double s = tau / length;
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<float>(x[i] + s * (double(y[i]) - x[i]));
  return out;
}

std::vector<float> RobustMixing::trimmed_mean(int from, const std::vector<float>& x, const std::vector<float>& y) {
  latest_[from] = y;
  const size_t m = latest_.size() + 1;
  const size_t cut = static_cast<size_t>(std::ceil(spec_.trim * static_cast<double>(m)));
  if (m < 2 * cut + 1) return y;  // too few models yet to trim anything away
  std::vector<const std::vector<float>*> models{&x};
  for (const auto& [peer, model] : latest_) models.push_back(&model);
  std::vector<float> out(x.size()), column(m);
  for (size_t i = 0; i < x.size(); ++i) {
    for (size_t k = 0; k < m; ++k) column[k] = (*models[k])[i];
    std::sort(column.begin(), column.end());
    double sum = 0;
    for (size_t k = cut; k < m - cut; ++k) sum += column[k];
    out[i] = static_cast<float>(sum / static_cast<double>(m - 2 * cut));
  }
  return out;
}

}  // namespace hearsay
