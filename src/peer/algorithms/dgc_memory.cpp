// The arithmetic of DGC's memory, written as the sgd kernel writes momentum SGD (src/backend
// /cpu/cpu_backend.cpp, sgd_update) so that with every element sent and no masking the
// update is that kernel's, bit for bit (the test that pins the rule).
#include "dgc_memory.h"

#include <algorithm>
#include <cmath>

namespace hearsay {

DgcMemory::DgcMemory(size_t n, const DgcSettings& s) : s_(s), u_(n, 0.0f), v_(n, 0.0f) {}

double DgcMemory::density_at(uint64_t step) const {
  if (s_.warmup_steps <= 0 || s_.warmup_density <= s_.density || step >= static_cast<uint64_t>(s_.warmup_steps)) {
    return s_.density;
  }
  const int stages = static_cast<int>(std::ceil(std::log(s_.warmup_density / s_.density) / std::log(4.0) - 1e-9));
  const int stage = static_cast<int>(static_cast<double>(step) * stages / s_.warmup_steps);
  return std::max(s_.density, s_.warmup_density * std::pow(0.25, stage));
}

void DgcMemory::accumulate(std::vector<float>& g, const float* w, int peers) {
  const size_t n = g.size();
  if (s_.weight_decay != 0.0f) {
    for (size_t i = 0; i < n; ++i) g[i] += s_.weight_decay * w[i];
  }
  if (s_.clip_norm > 0) {
    double sq = 0;
    for (float x : g) sq += static_cast<double>(x) * x;
    const double limit = s_.clip_norm / std::sqrt(static_cast<double>(std::max(1, peers)));
    const double norm = std::sqrt(sq);
    if (norm > limit) {
      const float f = static_cast<float>(limit / norm);
      for (float& x : g) x *= f;
    }
  }
  const float m = s_.momentum;
  float* __restrict u = u_.data();
  float* __restrict v = v_.data();
  const float* __restrict gi = g.data();
  if (s_.nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float ui = m * u[i] + gi[i];
      u[i] = ui;
      v[i] += gi[i] + m * ui;
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float ui = m * u[i] + gi[i];
      u[i] = ui;
      v[i] += ui;
    }
  }
}

void DgcMemory::sent(const std::vector<float>& sent) { sent_part(0, sent.data(), sent.size()); }

void DgcMemory::sent_part(size_t at, const float* sent, size_t n) {
  if (at >= v_.size()) return;
  n = std::min(n, v_.size() - at);
  float* v = v_.data() + at;
  float* u = u_.data() + at;
  for (size_t i = 0; i < n; ++i) {
    if (sent[i] == 0.0f) continue;
    v[i] -= sent[i];
    if (s_.momentum_masking) u[i] = 0.0f;
  }
}

}  // namespace hearsay
