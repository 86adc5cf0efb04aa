#include "hearsay/rng.h"

#include <algorithm>
#include <thread>
#include <vector>
#include <cmath>

namespace hearsay {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__extension__ typedef unsigned __int128 u128;

uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed, uint64_t stream) {
  uint64_t x = seed ^ (stream * 0xd1342543de82ef95ULL);
  for (auto& s : s_) s = splitmix64(x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

float Rng::uniform(float lo, float hi) {
  return lo + static_cast<float>(uniform()) * (hi - lo);
}

uint64_t Rng::below(uint64_t n) {
  u128 m = static_cast<u128>(next_u64()) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = -n % n;
    while (low < threshold) {
      m = static_cast<u128>(next_u64()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

namespace {

// Box-Muller from two uniforms: one definition for normal() and normals(), so both give
// the same bits.
double box_muller(double u1, double u2) { return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2); }

}  // namespace

double Rng::normal() {
  // One value per call keeps the stream simple to reason about.
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  return box_muller(u1, u2);
}

void Rng::normals(float* out, size_t n, float scale, unsigned threads) {
  if (threads == 0) threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<double> u(2 * std::min(n, kChunk));
  for (size_t begin = 0; begin < n; begin += kChunk) {
    const size_t len = std::min(kChunk, n - begin);
    for (size_t i = 0; i < len; ++i) {
      double u1 = uniform();
      while (u1 <= 0.0) u1 = uniform();
      u[2 * i] = u1;
      u[2 * i + 1] = uniform();
    }
    const auto transform = [&](size_t from, size_t to) {
      for (size_t i = from; i < to; ++i) out[begin + i] = static_cast<float>(box_muller(u[2 * i], u[2 * i + 1])) * scale;
    };
    const unsigned t = len < 65536 ? 1u : threads;
    std::vector<std::thread> helpers;
    for (unsigned k = 1; k < t; ++k) helpers.emplace_back(transform, len * k / t, len * (k + 1) / t);
    transform(0, len / t);
    for (auto& h : helpers) h.join();
  }
}

double Rng::gamma(double shape) {
  if (shape < 1.0) {
    // Boost: Gamma(a) = Gamma(a + 1) * U^(1/a).
    double u = uniform();
    while (u <= 0.0) u = uniform();
    return gamma(shape + 1.0) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace hearsay
