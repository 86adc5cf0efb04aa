// Dense codecs that keep every element at lower precision: none (fp32), fp16, bf16, and
// int8 and int4 with one absmax scale per block. Their loops run 8 elements at a time with AVX2
// and F16C where the build has them (HEARSAY_NATIVE), with a scalar twin otherwise.
#include <algorithm>
#include <cmath>

#include "codec_impl.h"

#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#include <immintrin.h>
#define HEARSAY_CODEC_AVX2 1
#endif

namespace hearsay::codec {
namespace {

std::string check_size(CodecId id, size_t bytes, size_t want, size_t n) {
  if (bytes == want) return {};
  return fault(id, "payload of " + std::to_string(bytes) + " bytes for " + std::to_string(n) + " elements; expected " +
                       std::to_string(want));
}

// --- none, fp16, bf16 ------------------------------------------------------------------
// Each keeps every element on its own in a fixed number of bytes, with no parameters
// beyond its id, so one encoder serves all three; they differ in the conversion of a run
// of elements alone.
using ConvertRun = void (*)(const float* x, size_t n, uint8_t* out);

void copy_fp32(const float* x, size_t n, uint8_t* o) {
  if (n > 0) std::memcpy(o, x, n * 4);
}

void to_fp16(const float* x, size_t n, uint8_t* o) {
  size_t i = 0;
#ifdef HEARSAY_CODEC_AVX2
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 2 * i), h);
  }
#endif
  for (; i < n; ++i) {
    const uint16_t h = float_to_half(x[i]);
    std::memcpy(o + 2 * i, &h, 2);
  }
}

void to_bf16(const float* x, size_t n, uint8_t* out) {
  uint16_t* o = reinterpret_cast<uint16_t*>(out);  // vector storage is suitably aligned
  const uint32_t* b = reinterpret_cast<const uint32_t*>(x);
  // Branch-free, so the compiler vectorises it.
  for (size_t i = 0; i < n; ++i) o[i] = float_to_bf16(b[i]);
}

class ElementwiseCodec final : public Codec {
 public:
  ElementwiseCodec(CodecId id, size_t bytes_per_element, ConvertRun convert)
      : id_(id), bytes_per_element_(bytes_per_element), convert_(convert) {}
  CodecId id() const override { return id_; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    begin_params(p, id_);
    out.resize(n * bytes_per_element_);
    convert_(x, n, out.data());
  }

 private:
  CodecId id_;
  size_t bytes_per_element_;
  ConvertRun convert_;
};

// Below this a block's absmax gives a scale whose inverse is not finite (subnormal).
constexpr float kSmallestScaledAbsmax = 1e-30f;

// The block's largest magnitude, or a non-finite value if it holds one.
float block_absmax(const float* x, size_t n) {
  float m = 0;
  bool finite = true;
  size_t i = 0;
#ifdef HEARSAY_CODEC_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f), inf = _mm256_set1_ps(INFINITY);
  __m256 acc = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    acc = _mm256_max_ps(acc, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // Inf, or NaN (unordered)
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (float l : lanes) m = std::max(m, l);
  finite = _mm256_movemask_ps(bad) == 0;
#endif
  for (; i < n; ++i) {
    finite = finite && std::isfinite(x[i]);
    m = std::max(m, std::fabs(x[i]));
  }
  return finite ? m : INFINITY;
}

// --- int8 -----------------------------------------------------------------------------
// Layout: one fp32 scale per block (absmax / 127), then one int8 per element.
class Int8Codec final : public Codec {
 public:
  explicit Int8Codec(int block) : block_(static_cast<size_t>(block)) {}
  CodecId id() const override { return CodecId::kInt8; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    begin_params(p, id());
    p.add_values(static_cast<double>(block_));
    const size_t blocks = (n + block_ - 1) / block_;
    out.resize(blocks * 4 + n);
    float* scales = reinterpret_cast<float*>(out.data());
    int8_t* q = reinterpret_cast<int8_t*>(out.data() + blocks * 4);
    for (size_t b = 0; b < blocks; ++b) {
      const size_t lo = b * block_, len = std::min(block_, n - lo);
      const float amax = block_absmax(x + lo, len);
      // A block of NaN or Inf, or one so small that 1 / s overflows, travels as zeros.
      const float s = std::isfinite(amax) && amax >= kSmallestScaledAbsmax ? amax / 127.0f : 0.0f;
      scales[b] = s;
      if (s > 0) {
        quantize(x + lo, len, 1.0f / s, q + lo);
      } else {
        std::memset(q + lo, 0, len);
      }
    }
  }

 private:
  static void quantize(const float* x, size_t n, float inv, int8_t* q) {
    size_t i = 0;
#ifdef HEARSAY_CODEC_AVX2
    const __m256 vinv = _mm256_set1_ps(inv);
    for (; i + 16 <= n; i += 16) {
      const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
      const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
      const __m256i w = _mm256_packs_epi32(a, b);              // lanes: a0-3 b0-3 a4-7 b4-7
      const __m128i lo = _mm256_castsi256_si128(w), hi = _mm256_extracti128_si256(w, 1);
      __m128i bytes = _mm_packs_epi16(lo, hi);                 // a0-3 b0-3 a4-7 b4-7 as int8
      bytes = _mm_shuffle_epi32(bytes, _MM_SHUFFLE(3, 1, 2, 0));  // a0-3 a4-7 b0-3 b4-7
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + i), bytes);
    }
#endif
    for (; i < n; ++i) q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
  }
  size_t block_;
};

// --- int4 -----------------------------------------------------------------------------
// For 4-bit outer gradients as Streaming DiLoCo sends them (Douillard et al., 2025; the
// paper's are E3M0 floats, these a block-scaled integer of the same width): one fp32
// scale per block (absmax / 7), then each element rounded to the
// nearest of -7 .. 7 in four bits (two's complement), two to a byte, the even element
// in the low half. Half int8's bytes, at about 18x its error.
class Int4Codec final : public Codec {
 public:
  explicit Int4Codec(int block) : block_(static_cast<size_t>(block)) {}
  CodecId id() const override { return CodecId::kInt4; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    begin_params(p, id());
    p.add_values(static_cast<double>(block_));
    const size_t blocks = (n + block_ - 1) / block_;
    out.assign(blocks * 4 + (n + 1) / 2, 0);
    uint8_t* packed = out.data() + blocks * 4;
    for (size_t b = 0; b < blocks; ++b) {
      const size_t lo = b * block_, hi = std::min(n, lo + block_);
      const float amax = block_absmax(x + lo, hi - lo);
      const float s = std::isfinite(amax) && amax >= kSmallestScaledAbsmax ? amax / 7.0f : 0.0f;  // as int8's
      std::memcpy(out.data() + 4 * b, &s, 4);
      if (!(s > 0)) continue;
      const float inv = 1.0f / s;
      for (size_t i = lo; i < hi; ++i) {
        const int q = static_cast<int>(std::clamp(std::nearbyint(x[i] * inv), -7.0f, 7.0f));
        packed[i / 2] |= static_cast<uint8_t>((q & 0xf) << (4 * (i % 2)));
      }
    }
  }

 private:
  size_t block_;
};

}  // namespace

std::unique_ptr<Codec> make_int4(int block) { return std::make_unique<Int4Codec>(block); }
std::unique_ptr<Codec> make_none() { return std::make_unique<ElementwiseCodec>(CodecId::kNone, 4, copy_fp32); }
std::unique_ptr<Codec> make_fp16() { return std::make_unique<ElementwiseCodec>(CodecId::kFp16, 2, to_fp16); }
std::unique_ptr<Codec> make_bf16() { return std::make_unique<ElementwiseCodec>(CodecId::kBf16, 2, to_bf16); }
std::unique_ptr<Codec> make_int8(int block) { return std::make_unique<Int8Codec>(block); }

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: Inf
  if (ax < 0x38800000u) {
    // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(ax >> 23);  // 14 .. 24
    const uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return static_cast<uint16_t>(sign | (q + (rem > half || (rem == half && (q & 1u)))));
  }
  const uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t bits;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(m), -24);
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  } else if (e == 31) {
    bits = sign | 0x7f800000u | (m << 13);
  } else {
    bits = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// --- decoders ---------------------------------------------------------------------------

std::string decode_none(const CodecParams&, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  if (auto e = check_size(CodecId::kNone, bytes, n * 4, n); !e.empty() || y == nullptr) return e;
  const float* v = reinterpret_cast<const float*>(p);  // frame payloads are 8-byte aligned
  for (size_t i = 0; i < n; ++i) y[i] += scale * v[i];
  return {};
}

std::string decode_fp16(const CodecParams&, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  if (auto e = check_size(CodecId::kFp16, bytes, n * 2, n); !e.empty() || y == nullptr) return e;
  size_t i = 0;
#ifdef HEARSAY_CODEC_AVX2
  const __m256 s = _mm256_set1_ps(scale);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(s, v, _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += scale * half_to_float(load<uint16_t>(p + 2 * i));
  return {};
}

std::string decode_bf16(const CodecParams&, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  if (auto e = check_size(CodecId::kBf16, bytes, n * 2, n); !e.empty() || y == nullptr) return e;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    y[i] += scale * v;
  }
  return {};
}

namespace {

// int8's and int4's common header: the block size (the one value), the payload's size for
// `code_bytes` of codes after the scales, and a finite, non-negative scale per block.
// Sets *block; empty or the fault.
std::string check_block_scales(CodecId id, const CodecParams& prm, const uint8_t* p, size_t bytes, size_t n,
                               size_t code_bytes, size_t* block) {
  if (auto e = check_values(id, prm, 1); !e.empty()) return e;
  const double blk = prm.values(0);
  if (blk < 1 || blk > (1 << 20) || blk != std::floor(blk)) return fault(id, "block size " + std::to_string(blk) + " is not an integer in [1, 2^20]");
  *block = static_cast<size_t>(blk);
  const size_t blocks = (n + *block - 1) / *block;
  if (auto e = check_size(id, bytes, blocks * 4 + code_bytes, n); !e.empty()) return e;
  for (size_t b = 0; b < blocks; ++b) {
    const float s = load<float>(p + 4 * b);
    if (!std::isfinite(s) || s < 0) return fault(id, "block " + std::to_string(b) + " has a NaN, Inf or negative scale");
  }
  return {};
}

}  // namespace

std::string decode_int4(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  size_t block = 0;
  if (auto e = check_block_scales(CodecId::kInt4, prm, p, bytes, n, (n + 1) / 2, &block); !e.empty() || y == nullptr) return e;
  const size_t blocks = (n + block - 1) / block;
  const uint8_t* packed = p + blocks * 4;
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * block, hi = std::min(n, lo + block);
    const float s = scale * load<float>(p + 4 * b);
    for (size_t i = lo; i < hi; ++i) {
      const int nibble = (packed[i / 2] >> (4 * (i % 2))) & 0xf;
      y[i] += s * static_cast<float>(nibble >= 8 ? nibble - 16 : nibble);  // -8 decodes too: bounded by 8 x scale
    }
  }
  return {};
}

std::string decode_int8(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  size_t block = 0;
  if (auto e = check_block_scales(CodecId::kInt8, prm, p, bytes, n, n, &block); !e.empty() || y == nullptr) return e;
  const size_t blocks = (n + block - 1) / block;
  const float* scales = reinterpret_cast<const float*>(p);
  const int8_t* q = reinterpret_cast<const int8_t*>(p + blocks * 4);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t lo = b * block, hi = std::min(n, lo + block);
    const float s = scale * scales[b];
    for (size_t i = lo; i < hi; ++i) y[i] += s * static_cast<float>(q[i]);
  }
  return {};
}

}  // namespace hearsay::codec
