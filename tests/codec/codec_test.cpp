#include <doctest/doctest.h>

#include <cstring>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hearsay/codec.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

using namespace hearsay;

namespace {

std::vector<float> normal_vector(size_t n, uint64_t seed, float scale = 1.0f) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = scale * static_cast<float>(rng.normal());
  return x;
}

CodecSpec spec_of(const std::string& name) {
  CodecSpec s;
  s.name = name;
  return s;
}

struct Encoded {
  std::vector<uint8_t> bytes;
  CodecParams params;
};

Encoded encode(Codec& c, const std::vector<float>& x, size_t offset = 0) {
  Encoded e;
  c.encode(x.data(), x.size(), offset, e.bytes, e.params);
  return e;
}

std::vector<float> decode(const Encoded& e, size_t n) {
  std::vector<float> y(n, 0.0f);
  const std::string err = decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), 1.0f, y.data(), n);
  REQUIRE_MESSAGE(err.empty(), err);
  return y;
}

// Decoding a bad payload must fail with a reason naming the codec and leave y as it was.
void check_rejected(const Encoded& e, size_t n, const std::string& codec, const std::string& why) {
  std::vector<float> y(n, 7.0f);
  const std::string err = decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), 1.0f, y.data(), n);
  INFO(why);
  CHECK(err.find("codec " + codec) == 0);
  CHECK(err.find(why) != std::string::npos);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
}

std::vector<ParamView> matrix_layout(int rows, int cols, size_t bias) {
  std::vector<ParamView> l(2);
  l[0] = {"fc.weight", 0, static_cast<size_t>(rows * cols), {rows, cols}};
  l[1] = {"fc.bias", static_cast<size_t>(rows * cols), bias, {static_cast<int>(bias)}};
  return l;
}

}  // namespace

TEST_CASE("codec none round-trips exactly and decode accumulates with the given scale") {
  auto x = normal_vector(1001, 1);
  auto c = make_codec(spec_of("none"), {}, 0);
  const auto e = encode(*c, x);
  CHECK(e.bytes.size() == 4 * x.size());
  CHECK(decode(e, x.size()) == x);
  std::vector<float> y(x.size(), 1.0f);
  REQUIRE(decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), -2.0f, y.data(), y.size()).empty());
  for (size_t i = 0; i < x.size(); ++i) CHECK(y[i] == 1.0f - 2.0f * x[i]);
}

TEST_CASE("codec fp16 and bf16 stay within half an ulp of their precision") {
  auto x = normal_vector(4099, 2, 3.0f);
  x[0] = 0.0f;
  x[1] = -1e-6f;  // fp16 subnormal
  x[2] = 60000.0f;
  for (const auto& [name, rel, bytes] : {std::tuple{"fp16", std::ldexp(1.0, -11), 2}, std::tuple{"bf16", std::ldexp(1.0, -8), 2}}) {
    INFO(name);
    auto c = make_codec(spec_of(name), {}, 0);
    const auto e = encode(*c, x);
    CHECK(e.bytes.size() == bytes * x.size());
    const auto y = decode(e, x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      // Relative half-ulp for normal numbers; fp16 subnormals have an absolute step 2^-24.
      const double bound = std::max(rel * std::fabs(x[i]), std::string(name) == "fp16" ? std::ldexp(1.0, -25) : 0.0);
      CHECK(std::fabs(double(y[i]) - x[i]) <= bound);
    }
  }
}

TEST_CASE("codec int8 errs at most half a step of its block's absmax / 127") {
  auto x = normal_vector(1000, 3);
  for (size_t i = 500; i < 756; ++i) x[i] *= 100;  // one block of large values beside small ones
  CodecSpec s = spec_of("int8");
  s.block = 256;
  auto c = make_codec(s, {}, 0);
  const auto e = encode(*c, x);
  CHECK(e.bytes.size() == 4 * 4 + x.size());
  const auto y = decode(e, x.size());
  for (size_t b = 0; b * 256 < x.size(); ++b) {
    float amax = 0;
    for (size_t i = b * 256; i < std::min(x.size(), b * 256 + 256); ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b * 256; i < std::min(x.size(), b * 256 + 256); ++i) CHECK(std::fabs(y[i] - x[i]) <= amax / 254 * 1.0001f);
  }
}

TEST_CASE("codec int4 errs at most half a step of its block's absmax / 7, in half int8's bytes") {
  auto x = normal_vector(1001, 3);
  for (size_t i = 500; i < 756; ++i) x[i] *= 100;  // one block of large values beside small ones
  x[3] = std::nanf("");                             // the first block travels as zeros
  CodecSpec s = spec_of("int4");
  s.block = 256;
  auto c = make_codec(s, {}, 0);
  const auto e = encode(*c, x);
  CHECK(e.bytes.size() == 4 * 4 + (x.size() + 1) / 2);
  const auto y = decode(e, x.size());
  for (size_t i = 0; i < 256; ++i) CHECK(y[i] == 0.0f);
  bool some_exact_step = false;
  for (size_t b = 1; b * 256 < x.size(); ++b) {
    float amax = 0;
    for (size_t i = b * 256; i < std::min(x.size(), b * 256 + 256); ++i) amax = std::max(amax, std::fabs(x[i]));
    for (size_t i = b * 256; i < std::min(x.size(), b * 256 + 256); ++i) {
      CHECK(std::fabs(y[i] - x[i]) <= amax / 14 * 1.0001f);
      some_exact_step = some_exact_step || std::fabs(std::fabs(y[i]) - amax) <= amax * 1e-6f;
    }
  }
  CHECK(some_exact_step);  // each block's largest element lands on +-7 steps: the scale is absmax / 7
}

TEST_CASE("codec int8 and int4 send a block of subnormal values as zeros, not as the overflow of 1 / scale") {
  std::vector<float> x(64, 0.0f);
  x[1] = 1e-39f;  // subnormal: absmax / 7 is too, and its inverse is Inf
  x[2] = -3e-40f;
  for (const char* name : {"int8", "int4"}) {
    INFO(name);
    CodecSpec s = spec_of(name);
    s.block = 64;
    auto c = make_codec(s, {}, 0);
    const auto y = decode(encode(*c, x), x.size());
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("codec qsgd and random-k are unbiased: the mean of many decodes converges to the input") {
  const size_t n = 512, rounds = 4000;
  const auto x = normal_vector(n, 4);
  for (const char* name : {"qsgd", "randomk"}) {
    INFO(name);
    CodecSpec s = spec_of(name);
    s.levels = 4;
    s.density = 0.1;
    REQUIRE_FALSE(uses_error_feedback(s));
    auto c = make_codec(s, {}, 42);
    std::vector<double> mean(n, 0.0);
    for (size_t r = 0; r < rounds; ++r) {
      const auto y = decode(encode(*c, x), n);
      for (size_t i = 0; i < n; ++i) mean[i] += y[i] / double(rounds);
    }
    // Per-element standard deviation of one decode: qsgd at most norm / (2 s) (a level
    // step is norm / s); random-k |x| sqrt(1/d - 1). Tolerance: 5 standard errors.
    const double norm = std::sqrt(std::inner_product(x.begin(), x.end(), x.begin(), 0.0));
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      const double sd = std::string(name) == "qsgd" ? norm / (2 * s.levels) : std::fabs(x[i]) * std::sqrt(1 / s.density - 1);
      worst = std::max(worst, std::fabs(mean[i] - x[i]) / (sd / std::sqrt(double(rounds)) + 1e-12));
    }
    CHECK(worst < 5.0);
  }
}

TEST_CASE("codec topk exact sends exactly the k largest magnitudes, the sampled threshold about k") {
  const size_t n = 200000;
  const auto x = normal_vector(n, 5);
  std::vector<float> mags(n);
  std::transform(x.begin(), x.end(), mags.begin(), [](float v) { return std::fabs(v); });
  std::vector<float> sorted = mags;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  CodecSpec s = spec_of("topk");
  s.density = 0.01;
  const size_t k = 2000;

  s.exact_topk = true;
  s.value_bits = 32;  // values exactly, to compare them
  auto exact = make_codec(s, {}, 0);
  const auto y = decode(encode(*exact, x), n);
  size_t sent = 0;
  for (size_t i = 0; i < n; ++i) {
    if (y[i] == 0) continue;
    ++sent;
    CHECK(y[i] == x[i]);
    CHECK(mags[i] >= sorted[k - 1]);
  }
  CHECK(sent == k);

  s.exact_topk = false;
  auto approx = make_codec(s, {}, 7);
  for (int round = 0; round < 5; ++round) {
    const auto ya = decode(encode(*approx, x), n);
    size_t got = 0;
    float smallest = 1e30f;
    for (size_t i = 0; i < n; ++i) {
      if (ya[i] != 0) {
        ++got;
        smallest = std::min(smallest, mags[i]);
      }
    }
    CHECK(got >= k / 2);
    CHECK(got <= k + k / 2);
    CHECK(smallest >= sorted[2 * k]);  // only large elements, never a stray small one
  }
}

TEST_CASE("codec topk writes indices as delta varints when sparse and as a bitmap when dense") {
  const auto x = normal_vector(8000, 6);
  CodecSpec s = spec_of("topk");
  s.exact_topk = true;
  s.density = 0.01;
  auto sparse = make_codec(s, {}, 0);
  const auto a = encode(*sparse, x);
  CHECK(a.params.values(1) == 0);
  CHECK(a.bytes.size() < 80 * 2 + 80 * 3);
  s.density = 0.3;
  auto dense = make_codec(s, {}, 0);
  const auto b = encode(*dense, x);
  CHECK(b.params.values(1) == 1);
  CHECK(b.bytes.size() == 2400 * 2 + 1000);  // bf16 values, then the bitmap
  // bf16 values are within half a bf16 ulp of the input.
  const auto y = decode(b, x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != 0) CHECK(std::fabs(y[i] - x[i]) <= std::ldexp(std::fabs(x[i]), -8));
  }
}

TEST_CASE("codec topk index encoding round-trips every density from 1e-5 to 1, in the smaller of varints and a bitmap") {
  // n = 200,000: 2 indices at 1e-5, every one at 1. Random index sets (not only top-k's),
  // through encode_sparse, the path DeMo's per-block picks take.
  const size_t n = 200000;
  Rng rng(21);
  for (double density : {1e-5, 3e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1, 0.125, 0.2, 0.5, 0.9, 1.0}) {
    CAPTURE(density);
    std::vector<uint32_t> idx;
    for (uint32_t i = 0; i < n; ++i) {
      if (rng.uniform() < density) idx.push_back(i);
    }
    if (idx.empty()) idx.push_back(static_cast<uint32_t>(n - 1));
    std::vector<float> values(idx.size());
    for (size_t j = 0; j < idx.size(); ++j) values[j] = static_cast<float>(j % 97) + 0.5f;
    std::vector<uint8_t> bytes;
    CodecParams p;
    encode_sparse(idx, values.data(), n, 32, bytes, p);
    std::vector<float> y(n, 0.0f);
    REQUIRE(decode_accumulate(p, bytes.data(), bytes.size(), 1.0f, y.data(), n).empty());
    size_t j = 0;
    for (size_t i = 0; i < n; ++i) {
      if (j < idx.size() && idx[j] == i) {
        REQUIRE(y[i] == values[j]);
        ++j;
      } else {
        REQUIRE(y[i] == 0.0f);
      }
    }
    // The index part is the smaller coding: at most the bitmap, and varints (gaps under
    // 128 take one byte) wherever they are smaller.
    const size_t index_bytes = bytes.size() - 4 * idx.size();
    CHECK(index_bytes <= (n + 7) / 8);
    size_t varints = 0;
    for (size_t k = 0; k < idx.size(); ++k) {
      uint64_t gap = k == 0 ? idx[0] : idx[k] - idx[k - 1];
      for (varints += 1; gap >= 0x80; gap >>= 7) ++varints;
    }
    CHECK(index_bytes == std::min(varints, (n + 7) / 8));
    MESSAGE("density " << density << ": " << static_cast<double>(index_bytes) / static_cast<double>(idx.size())
                       << " index bytes per kept element");
  }
}

TEST_CASE("codec sign and qsgd bit-pack their codes") {
  const auto x = normal_vector(1003, 8);
  auto sign = make_codec(spec_of("sign"), {}, 0);
  const auto e = encode(*sign, x);
  CHECK(e.bytes.size() == 126);
  const auto y = decode(e, x.size());
  double l1 = 0;
  for (float v : x) l1 += std::fabs(v);
  for (size_t i = 0; i < x.size(); ++i) {
    CHECK(std::signbit(y[i]) == std::signbit(x[i]));
    CHECK(std::fabs(y[i]) == doctest::Approx(l1 / x.size()).epsilon(1e-5));
  }
  CodecSpec q = spec_of("qsgd");
  q.levels = 7;  // 3 level bits + sign
  q.block = 512;
  auto qsgd = make_codec(q, {}, 1);
  CHECK(encode(*qsgd, x).bytes.size() == 2 * 4 + (1003 * 4 + 7) / 8);
}

TEST_CASE("codec error feedback: what was sent plus the final residual equals the sum of the inputs") {
  const size_t n = 3000;
  for (const char* name : {"fp16", "bf16", "int8", "topk", "randomk", "sign", "powersgd"}) {
    INFO(name);
    CodecSpec s = spec_of(name);
    s.error_feedback = "on";
    s.density = 0.05;
    s.rank = 2;
    LinkEncoder enc(s, matrix_layout(50, 50, 500), 9);
    REQUIRE(enc.error_feedback());
    std::vector<double> inputs(n, 0.0), sent(n, 0.0);
    for (int round = 0; round < 30; ++round) {
      const auto x = normal_vector(n, 100 + round);
      for (size_t i = 0; i < n; ++i) inputs[i] += x[i];
      // Two segments, as a large update travels.
      for (const auto& [off, len] : enc.codec().segments(n, 2500)) {
        std::vector<uint8_t> bytes;
        CodecParams p;
        enc.encode(x.data() + off, len, off, n, bytes, p);
        std::vector<float> y(len, 0.0f);
        REQUIRE(decode_accumulate(p, bytes.data(), bytes.size(), 1.0f, y.data(), len).empty());
        for (size_t i = 0; i < len; ++i) sent[off + i] += y[i];
      }
    }
    double worst = 0, residual_norm = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(sent[i] + enc.residual()[i] - inputs[i]));
      residual_norm += double(enc.residual()[i]) * enc.residual()[i];
    }
    CHECK(worst < 1e-3);
    CHECK(residual_norm > 0);  // something was held back, so the identity was tested
  }
}

TEST_CASE("codec powersgd recovers a rank-r matrix exactly and sends the bias raw") {
  const int rows = 64, cols = 48, r = 3;
  Rng rng(11);
  std::vector<float> a(rows * r), b(cols * r), x(rows * cols + 10);
  for (auto& v : a) v = static_cast<float>(rng.normal());
  for (auto& v : b) v = static_cast<float>(rng.normal());
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      float s = 0;
      for (int k = 0; k < r; ++k) s += a[i * r + k] * b[j * r + k];
      x[i * cols + j] = s;
    }
  }
  for (int i = 0; i < 10; ++i) x[rows * cols + i] = static_cast<float>(i) - 4.5f;
  CodecSpec s = spec_of("powersgd");
  s.rank = r;
  auto c = make_codec(s, matrix_layout(rows, cols, 10), 3);
  const auto e = encode(*c, x);
  CHECK(e.bytes.size() == ((rows + cols) * r + 10) * 4);
  const auto y = decode(e, x.size());
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]);
    norm += double(x[i]) * x[i];
  }
  CHECK(std::sqrt(err / norm) < 1e-5);
  for (int i = 0; i < 10; ++i) CHECK(y[rows * cols + i] == x[rows * cols + i]);
}

TEST_CASE("codec powersgd cuts segments on layer boundaries") {
  std::vector<ParamView> l = {{"a", 0, 600, {20, 30}}, {"b", 600, 20, {20}}, {"c", 620, 1000, {10, 100}}, {"d", 1620, 10, {10}}};
  auto c = make_codec(spec_of("powersgd"), l, 0);
  const auto segs = c->segments(1630, 700);
  // c alone exceeds the size but stays whole; d starts a segment of its own.
  REQUIRE(segs.size() == 3);
  CHECK(segs[0] == std::pair<size_t, size_t>{0, 620});
  CHECK(segs[1] == std::pair<size_t, size_t>{620, 1000});
  CHECK(segs[2] == std::pair<size_t, size_t>{1620, 10});
}

TEST_CASE("codec decoders reject every malformed payload and write nothing") {
  const size_t n = 1000;
  const auto x = normal_vector(n, 12);
  auto enc = [&](const std::string& name, double density = 0.01) {
    CodecSpec s = spec_of(name);
    s.density = density;
    s.exact_topk = true;
    return encode(*make_codec(s, matrix_layout(20, 40, 200), 1), x);
  };
  // A payload one byte short, for every codec.
  for (const auto& name : codec_names()) {
    auto e = enc(name);
    e.bytes.pop_back();
    std::vector<float> y(n, 7.0f);
    const std::string err = decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), 1.0f, y.data(), n);
    INFO(name, ": ", err);
    CHECK(err.find("codec " + name) == 0);
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
  }
  {
    auto e = enc("none");
    e.params.set_codec_id(77);
    std::vector<float> y(n);
    CHECK(decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), 1.0f, y.data(), n) == "codec id 77: unknown");
  }
  {  // top-k, varint indices: the last one beyond the tensor; a zero gap
    auto e = enc("topk");
    REQUIRE(e.params.values(1) == 0);
    auto far = e;
    far.bytes.back() = 0x7f;  // last gap of 127 more than it was: past element 999
    far.bytes.push_back(0x7f);
    far.bytes[far.bytes.size() - 2] |= 0x80;
    check_rejected(far, n, "topk", "beyond");
    auto repeat = e;
    repeat.bytes.back() = 0;
    check_rejected(repeat, n, "topk", "not above");
  }
  {  // top-k, bitmap: a mark past the end; a count that disagrees with k
    auto e = enc("topk", 0.5);
    REQUIRE(e.params.values(1) == 1);
    auto wrong_k = e;
    wrong_k.bytes.back() ^= 0x01;
    check_rejected(wrong_k, n, "topk", "k =");
    auto k_big = e;
    k_big.params.set_values(0, n + 1);
    check_rejected(k_big, n, "topk", "is not an integer in");
  }
  {
    auto e = enc("int8");
    float nan = std::nanf("");
    std::memcpy(e.bytes.data(), &nan, 4);
    check_rejected(e, n, "int8", "NaN, Inf or negative scale");
  }
  {
    auto e = enc("int4");
    float neg = -1.0f;
    std::memcpy(e.bytes.data(), &neg, 4);
    check_rejected(e, n, "int4", "NaN, Inf or negative scale");
    auto short_payload = enc("int4");
    short_payload.bytes.pop_back();
    check_rejected(short_payload, n, "int4", "bytes for");
  }
  {
    auto e = enc("sign");
    e.params.set_values(0, INFINITY);
    check_rejected(e, n, "sign", "NaN or Inf");
  }
  {
    auto e = enc("qsgd");
    float inf = INFINITY;
    std::memcpy(e.bytes.data(), &inf, 4);
    check_rejected(e, n, "qsgd", "NaN, Inf or negative norm");
  }
  {
    auto e = enc("powersgd");
    REQUIRE(e.params.values(1) == 1);
    e.params.set_values(3, 999);  // rows: the matrix no longer fits
    check_rejected(e, n, "powersgd", "does not fit");
  }
  {
    auto e = enc("randomk");
    e.params.set_values(0, 0.5);
    check_rejected(e, n, "randomk", "is not an integer");
  }
}

TEST_CASE("codec specs with an unknown name or a value out of range are refused") {
  CHECK_THROWS_WITH_AS(check_codec_spec(spec_of("zip")), doctest::Contains("codec 'zip': unknown"), InputError);
  CodecSpec s = spec_of("topk");
  s.density = 0;
  CHECK_THROWS_WITH_AS(check_codec_spec(s), doctest::Contains("density"), InputError);
  s = spec_of("int8");
  s.error_feedback = "maybe";
  CHECK_THROWS_WITH_AS(check_codec_spec(s), doctest::Contains("error_feedback"), InputError);
}

TEST_CASE("adaptive compression gives a fast link fp32 or fp16 and a slow WAN link the top-k density it can carry") {
  AdaptiveSpec a;
  a.enabled = true;
  a.step_fraction = 0.5;
  const size_t n = 269322;  // the MLP 784-256-256-10
  const CodecSpec base = spec_of("none");
  // 1 Gbit/s inside a site, 20 ms steps: 1.25 MB per update fits fp32 (1.08 MB).
  auto lan = choose_codec(a, base, n, 125e6, 0.02);
  CHECK(lan.spec.name == "none");
  // 480 Mbit/s: 0.6 MB; fp32 does not fit, fp16 (0.54 MB) does.
  CHECK(choose_codec(a, base, n, 60e6, 0.02).spec.name == "fp16");
  CHECK(choose_codec(a, base, n, 30e6, 0.02).spec.name == "int8");
  // 20 Mbit/s WAN: 25 kB per update; top-k at about 25000 / (n * 6) ~ 1.5%.
  auto wan = choose_codec(a, base, n, 2.5e6, 0.02);
  CHECK(wan.spec.name == "topk");
  CHECK(wan.expected_bytes <= wan.budget_bytes);
  CHECK(wan.expected_bytes > 0.8 * wan.budget_bytes);
  CHECK(wan.reason.find("topk at density") != std::string::npos);
  // Whole models are never sparsified: the slow link gets int8, the lightest dense codec.
  CHECK(choose_codec(a, base, n, 2.5e6, 0.02, true).spec.name == "int8");
  CHECK(choose_codec(a, base, n, 60e6, 0.02, true).spec.name == "fp16");
  // Nothing measured yet: the configured codec stays.
  CHECK(choose_codec(a, spec_of("int8"), n, 0, 0.02).spec.name == "int8");
}

TEST_CASE("codec decoders survive random corruption: each payload is applied whole or refused whole") {
  const size_t n = 777;
  const auto x = normal_vector(n, 13);
  Rng rng(99);
  size_t refused = 0, applied = 0;
  for (const auto& name : codec_names()) {
    CodecSpec s = spec_of(name);
    s.density = 0.05;
    s.levels = 5;
    s.block = 64;
    auto c = make_codec(s, matrix_layout(20, 30, 177), 3);
    for (int trial = 0; trial < 300; ++trial) {
      auto e = encode(*c, x);
      // Flip bytes, cut or extend the payload, or bend a parameter value.
      switch (rng.below(4)) {
        case 0:
          for (int f = 0; f < 3 && !e.bytes.empty(); ++f) e.bytes[rng.below(e.bytes.size())] ^= static_cast<uint8_t>(1 + rng.below(255));
          break;
        case 1:
          e.bytes.resize(rng.below(e.bytes.size() + 1));
          break;
        case 2:
          e.bytes.resize(e.bytes.size() + 1 + rng.below(16), 0xff);
          break;
        default:
          if (e.params.values_size() > 0) {
            const int v = static_cast<int>(rng.below(e.params.values_size()));
            const double bent[] = {-1, 0, 1e18, NAN, e.params.values(v) + 1, e.params.values(v) * 2};
            e.params.set_values(v, bent[rng.below(6)]);
          } else {
            e.params.set_codec_id(static_cast<uint32_t>(rng.below(20)));
          }
      }
      std::vector<float> y(n, 7.0f);
      const std::string err = decode_accumulate(e.params, e.bytes.data(), e.bytes.size(), 1.0f, y.data(), n);
      CHECK(err == check_payload(e.params, e.bytes.data(), e.bytes.size(), n));
      if (err.empty()) {
        ++applied;
      } else {
        ++refused;
        CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 7.0f; }));
      }
    }
  }
  MESSAGE(refused << " corrupted payloads refused, " << applied << " still well-formed and applied");
  CHECK(refused > 1000);
}
