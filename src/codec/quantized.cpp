// Quantizing codecs: QSGD (Alistarh et al., 2017: s levels per bucket norm, stochastic
// rounding, unbiased) and scaled sign (1 bit per element; EF-SignSGD, Karimireddy et al.,
// 2019). Both bit-pack their codes, least significant bit first.
#include <algorithm>
#include <cmath>

#include "codec_impl.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace hearsay::codec {
namespace {

// --- QSGD -------------------------------------------------------------------------------
// Payload: one fp32 L2 norm per bucket, then per element `bits` bits: the level (0..s) in
// the low bits, the sign in the top one.
class QsgdCodec final : public Codec {
 public:
  QsgdCodec(int levels, int bucket, uint64_t seed) : s_(levels), bucket_(static_cast<size_t>(bucket)), seed_(seed) {}
  CodecId id() const override { return CodecId::kQsgd; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const int bits = qsgd_bits(s_);
    const size_t buckets = (n + bucket_ - 1) / bucket_;
    out.assign(buckets * 4 + (n * static_cast<size_t>(bits) + 7) / 8, 0);
    float* norms = reinterpret_cast<float*>(out.data());
    uint8_t* packed = out.data() + buckets * 4;
    const uint64_t seed = qsgd_call_seed(seed_, ++calls_);
    uint64_t acc = 0;
    int have = 0;
    size_t w = 0;
    for (size_t b = 0; b < buckets; ++b) {
      const size_t lo = b * bucket_, hi = std::min(n, lo + bucket_);
      double sq = 0;
      for (size_t i = lo; i < hi; ++i) sq += static_cast<double>(x[i]) * x[i];
      float norm = static_cast<float>(std::sqrt(sq));
      if (!std::isfinite(norm)) norm = 0;  // a bucket with NaN or Inf travels as zeros
      norms[b] = norm;
      const float k = norm > 0 ? static_cast<float>(s_) / norm : 0.0f;
      // Codes first, in a branch-free loop the compiler vectorises, then the packing.
      codes_.resize(hi - lo);
      uint16_t* c = codes_.data();
      const uint32_t top = static_cast<uint32_t>(s_), sign_bit = 1u << (bits - 1);
      for (size_t i = lo; i < hi; ++i) {
        uint32_t xb;
        std::memcpy(&xb, x + i, 4);
        const float r = std::fabs(x[i]) * k + uniform01(seed, i);
        const uint32_t level = std::min<uint32_t>(top, static_cast<uint32_t>(r));
        c[i - lo] = static_cast<uint16_t>(level | ((xb >> 31) != 0 && level > 0 ? sign_bit : 0u));
      }
      for (size_t j = 0; j < hi - lo; ++j) {
        acc |= static_cast<uint64_t>(c[j]) << have;
        have += bits;
        if (have >= 32) {
          const uint32_t word = static_cast<uint32_t>(acc);
          std::memcpy(packed + w, &word, 4);
          w += 4;
          acc >>= 32;
          have -= 32;
        }
      }
    }
    while (have > 0) {
      packed[w++] = static_cast<uint8_t>(acc);
      acc >>= 8;
      have -= 8;
    }
    qsgd_params(p, seed, s_, bucket_);
  }

 private:
  int s_;
  size_t bucket_;
  uint64_t seed_, calls_ = 0;
  std::vector<uint16_t> codes_;
};

// --- sign -------------------------------------------------------------------------------
// Payload: n bits, 1 where the element is negative; the scale (mean |x|) is values[0].
class SignCodec final : public Codec {
 public:
  CodecId id() const override { return CodecId::kSign; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    out.assign((n + 7) / 8, 0);
    uint8_t* bits = out.data();
    double sum = 0;
    size_t i = 0;
#if defined(__AVX2__)
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    // Sums in float lanes, flushed to double every 1024 elements to keep precision.
    for (; i + 8 <= n;) {
      const size_t stop = std::min(n - (n - i) % 8, i + 1024);
      for (; i < stop; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bits[i >> 3] = static_cast<uint8_t>(_mm256_movemask_ps(v));
        acc = _mm256_add_ps(acc, _mm256_and_ps(v, abs_mask));
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, acc);
      for (float l : lanes) sum += l;
      acc = _mm256_setzero_ps();
    }
#endif
    for (; i < n; ++i) {
      if (std::signbit(x[i])) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
      sum += std::fabs(x[i]);
    }
    double scale = n > 0 ? sum / static_cast<double>(n) : 0.0;
    if (!std::isfinite(scale)) scale = 0;  // NaN or Inf inputs travel as zeros
    begin_params(p, id()).add_values(static_cast<float>(scale));
  }
};

}  // namespace

std::unique_ptr<Codec> make_qsgd(int levels, int bucket, uint64_t seed) { return std::make_unique<QsgdCodec>(levels, bucket, seed); }
std::unique_ptr<Codec> make_sign() { return std::make_unique<SignCodec>(); }

std::string decode_qsgd(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  constexpr CodecId id = CodecId::kQsgd;
  if (auto e = check_values(id, prm, 2); !e.empty()) return e;
  const double sd = prm.values(0), bd = prm.values(1);
  if (sd < 1 || sd > 32767 || sd != std::floor(sd)) return fault(id, "levels = " + std::to_string(sd) + " is not an integer in [1, 32767]");
  if (bd < 1 || bd > (1 << 20) || bd != std::floor(bd)) return fault(id, "bucket = " + std::to_string(bd) + " is not an integer in [1, 2^20]");
  const int s = static_cast<int>(sd), bits = qsgd_bits(s);
  const size_t bucket = static_cast<size_t>(bd), buckets = (n + bucket - 1) / bucket;
  const size_t want = buckets * 4 + (n * static_cast<size_t>(bits) + 7) / 8;
  if (bytes != want) return fault(id, "payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) + " elements; expected " + std::to_string(want));
  const float* norms = reinterpret_cast<const float*>(p);
  for (size_t b = 0; b < buckets; ++b) {
    if (!std::isfinite(norms[b]) || norms[b] < 0) return fault(id, "bucket " + std::to_string(b) + " has a NaN, Inf or negative norm");
  }
  const uint8_t* packed = p + buckets * 4;
  const size_t packed_bytes = bytes - buckets * 4;
  const uint32_t mask = (1u << bits) - 1, level_mask = (1u << (bits - 1)) - 1, sign_bit = 1u << (bits - 1);
  // Element i's code: one unaligned 32-bit load (a code spans at most 3 bytes), byte by
  // byte only at the very end of the payload.
  auto code_at = [&](size_t i) {
    const uint64_t bit = static_cast<uint64_t>(i) * static_cast<uint64_t>(bits);
    const size_t byte = static_cast<size_t>(bit >> 3);
    uint32_t v = 0;
    if (byte + 4 <= packed_bytes) {
      std::memcpy(&v, packed + byte, 4);
    } else {
      for (size_t k = byte; k < packed_bytes; ++k) v |= static_cast<uint32_t>(packed[k]) << (8 * (k - byte));
    }
    return (v >> (bit & 7)) & mask;
  };
  // Every level is checked before any is added.
  for (size_t i = 0; i < n; ++i) {
    const uint32_t level = code_at(i) & level_mask;
    if (level > static_cast<uint32_t>(s)) {
      return fault(id, "element " + std::to_string(i) + " has level " + std::to_string(level) + " above " + std::to_string(s));
    }
  }
  if (y == nullptr) return {};
  for (size_t b = 0; b < buckets; ++b) {
    const size_t lo = b * bucket, hi = std::min(n, lo + bucket);
    const float step = scale * norms[b] / static_cast<float>(s);
    for (size_t i = lo; i < hi; ++i) {
      const uint32_t code = code_at(i);
      const float v = step * static_cast<float>(code & level_mask);
      y[i] += (code & sign_bit) ? -v : v;
    }
  }
  return {};
}

std::string decode_sign(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  constexpr CodecId id = CodecId::kSign;
  if (auto e = check_values(id, prm, 1); !e.empty()) return e;
  if (prm.values(0) < 0) return fault(id, "scale " + std::to_string(prm.values(0)) + " is negative");
  if (bytes != (n + 7) / 8) return fault(id, "payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) + " elements; expected " + std::to_string((n + 7) / 8));
  if (y == nullptr) return {};
  const float m = scale * static_cast<float>(prm.values(0));
  size_t i = 0;
#if defined(__AVX2__)
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 pos = _mm256_set1_ps(m), neg = _mm256_set1_ps(-m);
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_and_si256(_mm256_set1_epi32(p[i >> 3]), lane_bit);
    const __m256 negative = _mm256_castsi256_ps(_mm256_cmpeq_epi32(b, lane_bit));
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_blendv_ps(pos, neg, negative)));
  }
#endif
  for (; i < n; ++i) y[i] += (p[i >> 3] >> (i & 7)) & 1u ? -m : m;
  return {};
}

}  // namespace hearsay::codec
