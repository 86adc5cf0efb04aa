// Robust model mixing (docs/ALGORITHMS.md, "Hostile and broken updates"): what an
// incoming model is mixed toward, so that one Byzantine neighbour whose models pass the
// norm check (sign-flipped, scaled a little, random of the right norm) cannot drag the
// others away.
//
//   centered_clip  self-centered clipping (He, Karimireddy and Jaggi, 2022): the model
//                  mixed toward is x + clip(y - x, tau): the difference is cut to length
//                  tau = clip_factor x the median length of the last 64 differences seen
//                  (from every neighbour, so an outlier cannot set its own allowance).
//   trimmed_mean   coordinate-wise trimmed mean (Yin et al., ICML 2018) of this peer's
//                  model and the latest model of every neighbour heard from: per
//                  coordinate the ceil(trim x m) largest and smallest of the m values are
//                  dropped before averaging.
// Not thread-safe: the step loop owns it.
#pragma once

#include <deque>
#include <map>
#include <vector>

#include "hearsay/mixer.h"

namespace hearsay {

class RobustMixing {
 public:
  explicit RobustMixing(const MixerSpec& spec) : spec_(spec) {}
  // The model to mix toward instead of `y` (from neighbour `from`), given our own `x`.
  // Returns y itself when the spec says "none".
  std::vector<float> target(int from, const std::vector<float>& x, const std::vector<float>& y);
  // Differences clipped so far (centered_clip), for the log.
  uint64_t clipped() const { return clipped_; }

 private:
  std::vector<float> clip(const std::vector<float>& x, const std::vector<float>& y);
  std::vector<float> trimmed_mean(int from, const std::vector<float>& x, const std::vector<float>& y);

  MixerSpec spec_;
  std::deque<double> lengths_;                 // the last 64 difference lengths
  std::map<int, std::vector<float>> latest_;   // trimmed_mean: each neighbour's newest model
  uint64_t clipped_ = 0;
};

}  // namespace hearsay
