// Deep Gradient Compression's per-peer memory (Lin et al., ICLR 2018, Algorithm 1 with
// its four techniques): the momentum u and the accumulated velocity v. What dgc.cpp sends
// is the top-k of v; the rest stays in v for later steps. Kept apart from the algorithm so
// that its rule is tested alone (tests/peer/dgc_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace hearsay {

struct DgcSettings {
  float momentum = 0.9f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  double clip_norm = 0.0;     // the cluster-wide L2 norm; each peer clips to clip_norm / sqrt(N)
  bool momentum_masking = true;
  int warmup_steps = 0;
  double warmup_density = 0.25;
  double density = 0.001;     // after the warm-up
};

class DgcMemory {
 public:
  DgcMemory(size_t n, const DgcSettings& s);
  // The density of step `step` (0-based): warmup_density, 4x sparser a stage, in equal
  // stages over warmup_steps until it reaches `density` (the paper's 75%, 93.75%, 98.4%,
  // 99.6%, 99.9% sparsity for 0.25 -> 0.001).
  double density_at(uint64_t step) const;
  // Local gradient clipping (to clip_norm / sqrt(peers)), weight decay (g + wd w) and
  // momentum correction: u <- m u + g; v <- v + u (Nesterov: v <- v + g + m u). `g` is
  // changed in place; `w` the parameters (for the weight decay).
  void accumulate(std::vector<float>& g, const float* w, int peers);
  // What v holds now: the vector to sparsify.
  const std::vector<float>& velocity() const { return v_; }
  // `sent` is what the receivers decode (zero where nothing was sent): v loses it (so the
  // values' rounding stays in v, as every codec's error feedback keeps it), and with
  // momentum factor masking u is zeroed where something was sent.
  void sent(const std::vector<float>& sent);
  // The same for sent values [at, at + n) (a segment of the encoded update, decoded).
  void sent_part(size_t at, const float* sent, size_t n);
  const std::vector<float>& momentum() const { return u_; }
  // For checkpoints.
  std::vector<float>& momentum_mut() { return u_; }
  std::vector<float>& velocity_mut() { return v_; }

 private:
  DgcSettings s_;
  std::vector<float> u_, v_;
};

}  // namespace hearsay
