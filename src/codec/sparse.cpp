// Sparse codecs: top-k (exact, or by a threshold estimated from a sample as in Deep
// Gradient Compression) and random-k (indices drawn from a seed both sides know, so
// only values travel). Decoding touches only the sent elements.
//
// top-k payload: k values (bf16 by default, or fp32), then the k increasing indices as
// either delta varints (the first raw, then gaps >= 1) or a bitmap of n bits, whichever
// is smaller. Error feedback absorbs the values' rounding like the unsent elements.
#include <algorithm>
#include <cmath>

#include <stdexcept>

#include "codec_impl.h"
#include "hearsay/error.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace hearsay::codec {
namespace {

constexpr int kVarint = 0, kBitmap = 1;  // how top-k's indices are written

size_t varint_size(uint64_t v) {
  size_t s = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++s;
  }
  return s;
}

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

// Reads one varint of at most 10 bytes; false when the bytes run out or it overflows.
bool get_varint(const uint8_t*& p, const uint8_t* end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return shift < 63 || (b >> 1) == 0;
  }
  return false;
}

// Appends every i with |x[i]| >= t and x[i] != 0 to idx, in order.
void select_at_least(const float* x, size_t n, float t, std::vector<uint32_t>& idx) {
  size_t i = 0;
#if defined(__AVX2__)
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 vt = _mm256_set1_ps(t), zero = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    int m = _mm256_movemask_ps(_mm256_and_ps(_mm256_cmp_ps(a, vt, _CMP_GE_OQ), _mm256_cmp_ps(a, zero, _CMP_GT_OQ)));
    while (m != 0) {
      idx.push_back(static_cast<uint32_t>(i + __builtin_ctz(static_cast<unsigned>(m))));
      m &= m - 1;
    }
  }
#endif
  for (; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a >= t && a > 0) idx.push_back(static_cast<uint32_t>(i));
  }
}

// Keeps the k largest |x[idx]| of idx, still in increasing index order.
void keep_largest(const float* x, std::vector<uint32_t>& idx, size_t k, std::vector<float>& scratch) {
  if (idx.size() <= k) return;
  scratch.resize(idx.size());
  for (size_t j = 0; j < idx.size(); ++j) scratch[j] = std::fabs(x[idx[j]]);
  std::nth_element(scratch.begin(), scratch.begin() + static_cast<long>(k - 1), scratch.end(), std::greater<float>());
  const float t = scratch[k - 1];
  size_t above = 0;
  for (uint32_t i : idx) above += std::fabs(x[i]) > t;
  size_t ties = k - above, out = 0;
  for (uint32_t i : idx) {
    const float a = std::fabs(x[i]);
    if (a > t || (a == t && ties > 0 && ties--)) idx[out++] = i;
  }
  idx.resize(out);
}

class TopkCodec final : public Codec {
 public:
  TopkCodec(double density, bool exact, int value_bits, uint64_t seed)
      : density_(density), exact_(exact), value_bits_(value_bits), seed_(seed) {}
  CodecId id() const override { return CodecId::kTopk; }

  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const size_t k = n == 0 ? 0 : std::clamp<size_t>(static_cast<size_t>(std::llround(density_ * n)), 1, n);
    idx_.clear();
    // A sample needs about 64 elements above the threshold to place it well.
    const size_t m = std::max<size_t>(2048, static_cast<size_t>(64.0 / density_));
    if (exact_ || k == 0 || 4 * m >= n) {
      select_exact(x, n, k);
    } else {
      scratch_.resize(m);
      const uint64_t s = seed_ + 0x51ed27ull * ++calls_;
      for (size_t j = 0; j < m; ++j) scratch_[j] = std::fabs(x[hash32(s, j) % n]);
      const size_t rank = std::max<size_t>(1, static_cast<size_t>(std::llround(density_ * m)));
      std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<long>(rank - 1), scratch_.end(), std::greater<float>());
      select_at_least(x, n, scratch_[rank - 1], idx_);
      // A threshold far too low (a heavy tail the sample missed) is corrected exactly on
      // the few selected; one far too high just sends fewer.
      if (idx_.size() > k + k / 2) keep_largest(x, idx_, k, scratch_);
    }
    write(x, n, out, p);
  }

 private:
  void select_exact(const float* x, size_t n, size_t k) {
    if (k == 0) return;
    scratch_.resize(n);
    for (size_t i = 0; i < n; ++i) scratch_[i] = std::fabs(x[i]);
    std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<long>(k - 1), scratch_.end(), std::greater<float>());
    select_at_least(x, n, scratch_[k - 1], idx_);
    keep_largest(x, idx_, k, scratch_);
  }

  void write(const float* x, size_t n, std::vector<uint8_t>& out, CodecParams& p) {
    values_.resize(idx_.size());
    for (size_t j = 0; j < idx_.size(); ++j) values_[j] = x[idx_[j]];
    write_topk(idx_, values_.data(), n, density_, value_bits_, out, p);
  }

  double density_;
  bool exact_;
  int value_bits_;
  uint64_t seed_, calls_ = 0;
  std::vector<uint32_t> idx_;
  std::vector<float> scratch_, values_;
};

class RandomkCodec final : public Codec {
 public:
  RandomkCodec(double density, bool unbiased, uint64_t seed) : density_(density), unbiased_(unbiased), seed_(seed) {}
  CodecId id() const override { return CodecId::kRandomk; }
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const uint64_t k = n == 0 ? 0 : std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(density_ * n)), 1, n);
    const uint64_t s = randomk_call_seed(seed_, ++calls_);
    out.resize(4 * k);
    float* v = reinterpret_cast<float*>(out.data());
    for (uint64_t b = 0; b < k; ++b) {
      // Unbiased: an element drawn with probability 1/size is sent times size.
      const float w = unbiased_ ? static_cast<float>(stratum_begin(b + 1, n, k) - stratum_begin(b, n, k)) : 1.0f;
      v[b] = w * x[randomk_index(s, b, n, k)];
    }
    randomk_params(p, s, k, unbiased_);
  }

 private:
  double density_;
  bool unbiased_;
  uint64_t seed_, calls_ = 0;
};

}  // namespace

void write_topk(const std::vector<uint32_t>& idx, const float* values, size_t n, double density, int value_bits,
                std::vector<uint8_t>& out, CodecParams& p) {
  const size_t k = idx.size(), vb = static_cast<size_t>(value_bits / 8);
  size_t varint_bytes = 0;
  for (size_t j = 0; j < k; ++j) varint_bytes += varint_size(j == 0 ? idx[0] : idx[j] - idx[j - 1]);
  const size_t bitmap_bytes = (n + 7) / 8;
  const int coding = varint_bytes <= bitmap_bytes ? kVarint : kBitmap;
  out.clear();
  out.reserve(vb * k + std::min(varint_bytes, bitmap_bytes));
  out.resize(vb * k);
  if (vb == 4) {
    if (k > 0) std::memcpy(out.data(), values, 4 * k);
  } else {
    uint16_t* h = reinterpret_cast<uint16_t*>(out.data());
    for (size_t j = 0; j < k; ++j) {
      uint32_t bits;
      std::memcpy(&bits, values + j, 4);
      h[j] = float_to_bf16(bits);
    }
  }
  if (coding == kVarint) {
    for (size_t j = 0; j < k; ++j) put_varint(out, j == 0 ? idx[0] : idx[j] - idx[j - 1]);
  } else {
    out.resize(vb * k + bitmap_bytes, 0);
    uint8_t* bits = out.data() + vb * k;
    for (uint32_t i : idx) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
  begin_params(p, CodecId::kTopk).add_values(static_cast<double>(k));
  p.add_values(coding);
  p.add_values(density);
  p.add_values(value_bits);
}

}  // namespace hearsay::codec

namespace hearsay {
void encode_sparse(const std::vector<uint32_t>& indices, const float* values, size_t n, int value_bits,
                   std::vector<uint8_t>& out, CodecParams& params) {
  if (value_bits != 16 && value_bits != 32) throw InputError("encode_sparse: value_bits must be 16 or 32, got " + std::to_string(value_bits));
  for (size_t j = 0; j < indices.size(); ++j) {
    if (indices[j] >= n || (j > 0 && indices[j] <= indices[j - 1])) {
      throw std::logic_error("encode_sparse: index " + std::to_string(j) + " is out of range or not increasing");
    }
  }
  const double density = n == 0 ? 1.0 : static_cast<double>(indices.size()) / static_cast<double>(n);
  codec::write_topk(indices, values, n, density, value_bits, out, params);
}
}  // namespace hearsay

namespace hearsay::codec {

std::unique_ptr<Codec> make_topk(double density, bool exact, int value_bits, uint64_t seed) {
  return std::make_unique<TopkCodec>(density, exact, value_bits, seed);
}
std::unique_ptr<Codec> make_randomk(double density, bool unbiased, uint64_t seed) {
  return std::make_unique<RandomkCodec>(density, unbiased, seed);
}

std::string topk_indices(const CodecParams& prm, const uint8_t* p, size_t bytes, size_t n, std::vector<uint32_t>* idx) {
  constexpr CodecId id = CodecId::kTopk;
  if (auto e = check_values(id, prm, 4); !e.empty()) return e;
  const double kd = prm.values(0), coding = prm.values(1), value_bits = prm.values(3);
  if (kd < 0 || kd > static_cast<double>(n) || kd != std::floor(kd)) {
    return fault(id, "k = " + std::to_string(kd) + " is not an integer in [0, " + std::to_string(n) + "]");
  }
  if (value_bits != 16 && value_bits != 32) return fault(id, "value bits " + std::to_string(value_bits) + " are neither 16 (bf16) nor 32 (fp32)");
  const size_t k = static_cast<size_t>(kd), vb = value_bits == 16 ? 2 : 4;
  if (bytes < vb * k) return fault(id, "payload of " + std::to_string(bytes) + " bytes cannot hold " + std::to_string(k) + " values");
  const uint8_t* q = p + vb * k;
  const uint8_t* end = p + bytes;
  if (idx != nullptr) idx->clear();
  if (coding == kVarint) {
    uint64_t i = 0;
    for (size_t j = 0; j < k; ++j) {
      uint64_t d;
      if (!get_varint(q, end, d)) return fault(id, "index " + std::to_string(j) + " is cut off or overflows");
      if (j > 0 && d == 0) return fault(id, "index " + std::to_string(j) + " is not above the one before it");
      if (d >= n || (j > 0 && i + d >= n)) return fault(id, "index " + std::to_string(j) + " lies beyond the " + std::to_string(n) + " elements");
      i = j == 0 ? d : i + d;
      if (idx != nullptr) idx->push_back(static_cast<uint32_t>(i));
    }
    if (q != end) return fault(id, std::to_string(end - q) + " bytes left over after the indices");
    return {};
  }
  if (coding == kBitmap) {
    const size_t map = (n + 7) / 8;
    if (static_cast<size_t>(end - q) != map) return fault(id, "bitmap of " + std::to_string(end - q) + " bytes for " + std::to_string(n) + " elements");
    size_t ones = 0;
    for (size_t b = 0; b < map; ++b) ones += static_cast<size_t>(__builtin_popcount(q[b]));
    if (ones != k) return fault(id, "bitmap marks " + std::to_string(ones) + " elements, k = " + std::to_string(k));
    if (n % 8 != 0 && (q[map - 1] >> (n % 8)) != 0) return fault(id, "bitmap marks elements beyond the " + std::to_string(n));
    if (idx != nullptr) {
      for (size_t b = 0; b < map; ++b) {
        for (unsigned m = q[b]; m != 0; m &= m - 1) idx->push_back(static_cast<uint32_t>(8 * b + static_cast<size_t>(__builtin_ctz(m))));
      }
    }
    return {};
  }
  return fault(id, "index coding " + std::to_string(coding) + " is neither 0 (varint) nor 1 (bitmap)");
}

std::string decode_topk(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  // The indices, checked in full before anything is added: O(k) memory, never O(n).
  thread_local std::vector<uint32_t> idx;
  if (auto e = topk_indices(prm, p, bytes, n, y == nullptr ? nullptr : &idx); !e.empty() || y == nullptr) return e;
  if (prm.values(3) == 32) {
    const float* v = reinterpret_cast<const float*>(p);
    for (size_t j = 0; j < idx.size(); ++j) y[idx[j]] += scale * v[j];
  } else {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    for (size_t j = 0; j < idx.size(); ++j) {
      const uint32_t bits = static_cast<uint32_t>(h[j]) << 16;
      float v;
      std::memcpy(&v, &bits, 4);
      y[idx[j]] += scale * v;
    }
  }
  return {};
}

std::string decode_randomk(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  constexpr CodecId id = CodecId::kRandomk;
  if (auto e = check_values(id, prm, 1); !e.empty()) return e;
  const double kd = prm.values(0);
  if (kd < 0 || kd > static_cast<double>(n) || kd != std::floor(kd) || (kd == 0 && n > 0)) {
    return fault(id, "k = " + std::to_string(kd) + " is not an integer in [1, " + std::to_string(n) + "]");
  }
  const uint64_t k = static_cast<uint64_t>(kd);
  if (bytes != 4 * k) return fault(id, "payload of " + std::to_string(bytes) + " bytes for k = " + std::to_string(k) + "; expected " + std::to_string(4 * k));
  if (y == nullptr) return {};
  const float* v = reinterpret_cast<const float*>(p);
  for (uint64_t b = 0; b < k; ++b) y[randomk_index(prm.seed(), b, n, k)] += scale * v[b];
  return {};
}

}  // namespace hearsay::codec
