// What the codec files share: each codec's encoder factory and decoder, the counter-based
// random numbers that sender and receiver (CPU and CUDA alike) compute the same, and the
// helpers for checking payloads.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "hearsay/codec.h"

namespace hearsay::codec {

// A 32-bit hash of (seed, i): the i-th random number of a stream, computable in any order
// and on any device. (A murmur3-style finalizer over a splitmix-mixed key.)
inline uint32_t hash32(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>((z ^ (z >> 31)) >> 32);
}
// Uniform in [0, 1) from hash32.
inline float uniform01(uint64_t seed, uint64_t i) { return static_cast<float>(hash32(seed, i) >> 8) * (1.0f / 16777216.0f); }

// The error message every decoder returns: "codec NAME: reason".
std::string fault(CodecId id, const std::string& reason);
// Number of `values` a codec expects, and whether each is finite.
std::string check_values(CodecId id, const wire::CodecParams& p, int count);
inline bool finite(double v) { return std::isfinite(v); }

template <typename T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// --- Encoders -------------------------------------------------------------------------
std::unique_ptr<Codec> make_none();
std::unique_ptr<Codec> make_fp16();
std::unique_ptr<Codec> make_bf16();
std::unique_ptr<Codec> make_int8(int block);
std::unique_ptr<Codec> make_qsgd(int levels, int bucket, uint64_t seed);
std::unique_ptr<Codec> make_topk(double density, bool exact, uint64_t seed);
std::unique_ptr<Codec> make_randomk(double density, bool unbiased, uint64_t seed);
std::unique_ptr<Codec> make_sign();
std::unique_ptr<Codec> make_powersgd(int rank, std::vector<ParamView> layout, uint64_t seed);

// --- Decoders: y += scale * decoded; empty string or the fault. With y null they only
// check the payload (the CUDA decoders check on the host, then apply on the device).
using Decoder = std::string (*)(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_none(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_fp16(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_bf16(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_int8(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_qsgd(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_topk(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_randomk(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_sign(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_powersgd(const wire::CodecParams&, const uint8_t*, size_t, float, float*, size_t);

// top-k's payload from its increasing indices and their values (CPU and CUDA encoders).
void write_topk(const std::vector<uint32_t>& idx, const float* values, size_t n, double density, std::vector<uint8_t>& out,
                wire::CodecParams& p);
// Checks a top-k payload and, with idx, lists its indices.
std::string topk_indices(const wire::CodecParams& p, const uint8_t* payload, size_t bytes, size_t n, std::vector<uint32_t>* idx);

// Random-k's indices: the tensor is cut into k strata and one index drawn in each, so they
// come out increasing and every element has a known probability (1 / its stratum's size).
inline uint64_t stratum_begin(uint64_t b, uint64_t n, uint64_t k) { return b * n / k; }
inline uint64_t randomk_index(uint64_t seed, uint64_t b, uint64_t n, uint64_t k) {
  const uint64_t lo = stratum_begin(b, n, k), size = stratum_begin(b + 1, n, k) - lo;
  return lo + hash32(seed, b) % size;
}

// QSGD: bits per element (sign + level in 0..s).
inline int qsgd_bits(int levels) {
  int b = 1;
  while ((1 << (b - 1)) <= levels) ++b;
  return b;
}

// fp16 <-> fp32, scalar (round to nearest even, saturating to +-inf like the hardware).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

}  // namespace hearsay::codec
