// The arithmetic that the CPU codecs and their CUDA twins must compute bit for bit alike:
// counter-based random numbers, random-k's strata, QSGD's code width, bf16 rounding.
// Plain C++ (no protobuf), so nvcc compiles it too.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define HEARSAY_HD __host__ __device__
#else
#define HEARSAY_HD
#endif

namespace hearsay::codec {

// A 32-bit hash of (seed, i): the i-th random number of a stream, computable in any order
// and on any device (splitmix64's finalizer over seed + golden-ratio multiples of i).
HEARSAY_HD inline uint32_t hash32(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}
// Uniform in [0, 1) from hash32 (24 bits, exact in float).
HEARSAY_HD inline float uniform01(uint64_t seed, uint64_t i) { return static_cast<float>(hash32(seed, i) >> 8) * (1.0f / 16777216.0f); }

// Random-k's indices: the tensor is cut into k strata and one index drawn in each, so they
// come out increasing and every element has a known probability (1 / its stratum's size).
HEARSAY_HD inline uint64_t stratum_begin(uint64_t b, uint64_t n, uint64_t k) { return b * n / k; }
HEARSAY_HD inline uint64_t randomk_index(uint64_t seed, uint64_t b, uint64_t n, uint64_t k) {
  const uint64_t lo = stratum_begin(b, n, k), size = stratum_begin(b + 1, n, k) - lo;
  return lo + hash32(seed, b) % size;
}

// QSGD: bits per element (sign + level in 0..s).
HEARSAY_HD inline int qsgd_bits(int levels) {
  int b = 1;
  while ((1 << (b - 1)) <= levels) ++b;
  return b;
}

// bf16: round to nearest even on the upper 16 bits; NaN stays NaN (a quiet one).
HEARSAY_HD inline uint16_t float_to_bf16(uint32_t bits) {
  const bool nan = (bits & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>(nan ? ((bits >> 16) | 0x40u) : rounded);
}

}  // namespace hearsay::codec
