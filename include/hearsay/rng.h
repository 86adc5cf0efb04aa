// A small deterministic random number generator (xoshiro256** seeded by splitmix64).
// Unlike the <random> distributions, its streams are identical on every platform and
// standard library, so a seed names the same run everywhere.
#pragma once

#include <cstddef>
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
  // out[i] = float(normal()) * scale for i in [0, n): the same values, bit for bit, as n
  // calls in turn, and the generator left where they would leave it. The uniforms are
  // drawn in order on this thread; the transform (two thirds of the time) runs on up to
  // `threads` threads (0: the machine's cores): a 1B-parameter model's initialisation
  // took a minute one value at a time.
  void normals(float* out, size_t n, float scale, unsigned threads = 0);
  // Gamma(shape, 1) (Marsaglia-Tsang); shape > 0.
  double gamma(double shape);

 private:
  uint64_t s_[4];
};

}  // namespace hearsay
