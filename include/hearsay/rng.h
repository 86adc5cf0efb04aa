// A small deterministic random number generator (xoshiro256** seeded by splitmix64).
// Unlike the <random> distributions, its streams are identical on every platform and
// standard library, so a seed names the same run everywhere.
#pragma once

#include <cstdint>

namespace hearsay {

class Rng {
 public:
  explicit Rng(uint64_t seed, uint64_t stream = 0);

  uint64_t next_u64();
  // Uniform in [0, 1).
  double uniform();
  // Uniform in [lo, hi).
  float uniform(float lo, float hi);
  // Uniform integer in [0, n); n > 0. Unbiased (Lemire's method).
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller).
  double normal();
  // Gamma(shape, 1) (Marsaglia-Tsang); shape > 0.
  double gamma(double shape);

 private:
  uint64_t s_[4];
};

}  // namespace hearsay
