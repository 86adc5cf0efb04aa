// The CUDA codecs against their CPU twins: the same payloads (bit for bit where the
// arithmetic allows), the same decoded values, and the same refusals. Built where CUDA is;
// without a device every case is skipped with the reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "hearsay/backend.h"
#include "hearsay/device_codec.h"
#include "hearsay/rng.h"
#include "test_skip.h"

using namespace hearsay;

namespace {

bool have_device() {
  const auto d = available_devices();
  return std::find(d.begin(), d.end(), "cuda:0") != d.end();
}
constexpr const char* kNoDevice = "the CUDA codecs are built but no CUDA device is visible";

std::vector<float> normal_vector(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

std::vector<ParamView> layout() {
  return {{"w", 0, 300 * 200, {300, 200}}, {"b", 60000, 300, {300}}, {"w2", 60300, 10 * 300, {10, 300}}};
}

}  // namespace

TEST_CASE("device codecs encode what the CPU codecs encode and decode to the same values") {
  if (!have_device()) HEARSAY_SKIP(kNoDevice);
  auto gpu = create_backend("cuda:0");
  const size_t n = 63300;
  const auto x = normal_vector(n, 1);
  DeviceBuffer dx(*gpu, 4 * n), dy(*gpu, 4 * n);
  gpu->upload(dx.data(), x.data(), 4 * n);
  for (const std::string name : {"none", "fp16", "bf16", "int8", "qsgd", "topk", "topk_exact", "randomk", "sign", "powersgd"}) {
    CAPTURE(name);
    CodecSpec s;
    s.name = name == "topk_exact" ? "topk" : name;
    s.exact_topk = name == "topk_exact";
    s.density = 0.01;
    auto cpu = make_codec(s, layout(), 5);
    auto dev = make_device_codec(s, layout(), 5);
    std::vector<uint8_t> a, b;
    CodecParams pa, pb;
    cpu->encode(x.data(), n, 0, a, pa);
    dev->encode(dx.f32(), n, 0, b, pb);
    REQUIRE(a.size() == b.size());
    CHECK(pa.codec_id() == pb.codec_id());
    const bool bitwise = name != "qsgd" && name != "sign" && name != "powersgd";
    if (bitwise) CHECK(a == b);
    // Decoding: the CPU payload on both sides, and each side's own payload.
    std::vector<float> want(n, 0.5f), got(n, 0.5f), own(n, 0.5f);
    REQUIRE(decode_accumulate(pa, a.data(), a.size(), 2.0f, want.data(), n).empty());
    gpu->upload(dy.data(), got.data(), 4 * n);
    REQUIRE(device_decode_accumulate(pa, a.data(), a.size(), 2.0f, dy.f32(), n).empty());
    gpu->download(got.data(), dy.data(), 4 * n);
    REQUIRE(decode_accumulate(pb, b.data(), b.size(), 2.0f, own.data(), n).empty());
    double worst = 0, worst_own = 0;
    for (size_t i = 0; i < n; ++i) {
      worst = std::max(worst, std::fabs(double(want[i]) - got[i]));
      worst_own = std::max(worst_own, std::fabs(double(want[i]) - own[i]));
    }
    CHECK(worst < 1e-4);
    // QSGD may round an element on the boundary of a level the other way (a level step of
    // its bucket's norm / s, times the decode scale 2); the others agree closely.
    CHECK(worst_own < (name == "qsgd" ? 2.0 * 23 / 16 + 1e-3 : 1e-3));
  }
}

TEST_CASE("device decoding refuses a bad payload and leaves the tensor untouched") {
  if (!have_device()) HEARSAY_SKIP(kNoDevice);
  auto gpu = create_backend("cuda:0");
  const size_t n = 1000;
  const auto x = normal_vector(n, 2);
  CodecSpec s;
  s.name = "topk";
  s.exact_topk = true;
  auto cpu = make_codec(s, {}, 1);
  std::vector<uint8_t> payload;
  CodecParams p;
  cpu->encode(x.data(), n, 0, payload, p);
  payload.back() = 0;  // a repeated index
  std::vector<float> y(n, 3.0f);
  DeviceBuffer dy(*gpu, 4 * n);
  gpu->upload(dy.data(), y.data(), 4 * n);
  const std::string err = device_decode_accumulate(p, payload.data(), payload.size(), 1.0f, dy.f32(), n);
  CHECK(err.find("codec topk") == 0);
  gpu->download(y.data(), dy.data(), 4 * n);
  CHECK(std::all_of(y.begin(), y.end(), [](float v) { return v == 3.0f; }));
}
