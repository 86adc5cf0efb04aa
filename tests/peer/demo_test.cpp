// demo (src/peer/algorithms/demo.cpp, demo_transform.cpp): DeMo's block DCT and one step
// of its rule against a float64 reference; the per-block top-k; and on an in-process
// cluster its defining invariant (every peer holds the same model after every step) and
// its bytes (only the fast components travel).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "../../src/peer/algorithms/demo_transform.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::same_bits;

namespace {

// The orthonormal DCT-II of one block (a x b, row-major at x with row stride `stride`), in
// float64: Y[p][q] = s_p s_q sum_i sum_j X[i][j] cos(pi (2i+1) p / 2a) cos(pi (2j+1) q / 2b).
void dct_block_ref(const std::vector<double>& x, std::vector<double>& y, size_t off, size_t stride, size_t a, size_t b) {
  const double pi = std::acos(-1.0);
  auto s = [](size_t k, size_t n) { return k == 0 ? std::sqrt(1.0 / n) : std::sqrt(2.0 / n); };
  for (size_t p = 0; p < a; ++p) {
    for (size_t q = 0; q < b; ++q) {
      double sum = 0;
      for (size_t i = 0; i < a; ++i) {
        for (size_t j = 0; j < b; ++j) {
          sum += x[off + i * stride + j] * std::cos(pi * (2.0 * i + 1) * p / (2.0 * a)) * std::cos(pi * (2.0 * j + 1) * q / (2.0 * b));
        }
      }
      y[off + p * stride + q] = s(p, a) * s(q, b) * sum;
    }
  }
}

// The model of the tests: a weight [8, 12] (blocks 4 x 4 with chunk 4), a bias of 10
// (pieces of 2) and 6 elements no tensor names (pieces of 3).
std::vector<ParamView> layout() {
  return {{"w", 0, 96, {8, 12}}, {"b", 96, 10, {10}}};
}
constexpr size_t kN = 112;

std::vector<double> dct_ref(const std::vector<double>& x) {
  std::vector<double> y(kN);
  for (size_t r = 0; r < 8; r += 4) {
    for (size_t c = 0; c < 12; c += 4) dct_block_ref(x, y, r * 12 + c, 12, 4, 4);
  }
  for (size_t i = 96; i < 106; i += 2) dct_block_ref(x, y, i, 2, 1, 2);
  for (size_t i = 106; i < 112; i += 3) dct_block_ref(x, y, i, 3, 1, 3);
  return y;
}

// The transpose of dct_ref (the inverse of an orthonormal transform), by its matrix.
std::vector<double> idct_ref(const std::vector<double>& y) {
  std::vector<double> x(kN, 0.0);
  for (size_t j = 0; j < kN; ++j) {
    std::vector<double> e(kN, 0.0);
    e[j] = 1.0;
    const std::vector<double> col = dct_ref(e);  // column j of the transform
    for (size_t i = 0; i < kN; ++i) x[j] += col[i] * y[i];
  }
  return x;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

}  // namespace

TEST_CASE("demo transform: the block DCT matches a float64 DCT-II per block, and its inverse gives x back") {
  std::mt19937 rng(3);
  const std::vector<float> x = random_vector(kN, rng);
  const BlockDct dct(layout(), kN, 4);
  std::vector<float> y(kN), back(kN);
  dct.forward(x.data(), y.data());
  const std::vector<double> ref = dct_ref(std::vector<double>(x.begin(), x.end()));
  for (size_t i = 0; i < kN; ++i) CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5).scale(1.0));
  dct.inverse(y.data(), back.data());
  for (size_t i = 0; i < kN; ++i) CHECK(back[i] == doctest::Approx(x[i]).epsilon(1e-5).scale(1.0));
  CHECK(BlockDct::block_edge(784, 64) == 56);
  CHECK(BlockDct::block_edge(269, 64) == 1);
  CHECK(BlockDct::block_edge(10, 64) == 10);
}

TEST_CASE("demo transform: the top-k of every block, in increasing order, zeros never") {
  const BlockDct dct(layout(), kN, 4);
  std::vector<float> y(kN, 0.0f);
  // Block (0, 0) of the weight: rows 0-3, columns 0-3.
  y[0] = 1;
  y[13] = -5;
  y[26] = 3;
  y[39] = 0.5f;
  y[96] = 2;  // the bias's first piece (96, 97): only one nonzero
  const auto idx = dct.top_per_block(y.data(), 2);
  CHECK(idx == std::vector<uint32_t>{13, 26, 96});
}

TEST_CASE("demo memory: one step of two peers matches a float64 reference: momentum, fast components, what is left, the direction") {
  std::mt19937 rng(11);
  const float beta = 0.9f;
  const int k = 3;
  std::vector<DemoMemory> peers{DemoMemory(layout(), kN, 4, beta), DemoMemory(layout(), kN, 4, beta)};
  std::vector<std::vector<double>> m_ref(2, std::vector<double>(kN, 0.0));
  std::vector<float> sum(kN, 0.0f);
  std::vector<double> sum_ref(kN, 0.0);
  // Two steps, so the momentum carries what the first step left.
  for (int t = 0; t < 2; ++t) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    std::fill(sum_ref.begin(), sum_ref.end(), 0.0);
    for (int p = 0; p < 2; ++p) {
      const std::vector<float> g = random_vector(kN, rng);
      for (size_t i = 0; i < kN; ++i) m_ref[p][i] = beta * m_ref[p][i] + g[i];
      const std::vector<float>& y = peers[p].accumulate(g.data());
      const std::vector<double> y_ref = dct_ref(m_ref[p]);
      for (size_t i = 0; i < kN; ++i) REQUIRE(y[i] == doctest::Approx(y_ref[i]).epsilon(1e-4).scale(1.0));
      const auto idx = peers[p].fast_components(k);
      CHECK(idx.size() == 6 * 3 + 5 * 2 + 2 * 3);  // 6 weight blocks of 16, 5 pieces of 2, 2 of 3
      std::vector<float> sent(kN, 0.0f);
      std::vector<double> sent_ref(kN, 0.0);
      for (uint32_t i : idx) {
        sent[i] = y[i];
        sent_ref[i] = y_ref[i];
      }
      peers[p].sent(sent);
      const std::vector<double> back = idct_ref(sent_ref);
      for (size_t i = 0; i < kN; ++i) m_ref[p][i] -= back[i];
      for (size_t i = 0; i < kN; ++i) CHECK(peers[p].momentum()[i] == doctest::Approx(m_ref[p][i]).epsilon(1e-4).scale(1.0));
      for (size_t i = 0; i < kN; ++i) {
        sum[i] += sent[i];
        sum_ref[i] += sent_ref[i];
      }
    }
    for (double& v : sum_ref) v /= 2;
    const std::vector<double> q_ref = idct_ref(sum_ref);
    const std::vector<float> q = peers[0].direction(sum, 2, false);
    const std::vector<float> s = peers[0].direction(sum, 2, true);
    for (size_t i = 0; i < kN; ++i) {
      CHECK(q[i] == doctest::Approx(q_ref[i]).epsilon(1e-4).scale(1.0));
      if (std::fabs(q_ref[i]) > 1e-4) CHECK(s[i] == (q_ref[i] > 0 ? 1.0f : -1.0f));
    }
  }
}

namespace {

const char* kSmall = R"(
  name: "demo" seed: 6
  model { kind: MLP hidden: [64] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 64 num_classes: 4 }
  optim { optimizer: "sgd" lr: 0.001 }
  train { batch_size: 16 epochs: 0 eval_every_steps: 1000000 }
  log { every_steps: 1000 }
)";

ClusterResult run(const std::string& options, int steps) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "demo-test", {"train { max_steps: " + std::to_string(steps) + " }"}));
  s.peers = 4;
  s.gossip.algorithm = "demo";
  s.gossip.options = options;
  s.gossip.topology.kind = "ring";
  s.gossip.topology.site_of = {0, 0, 1, 1};
  return run_cluster(s);
}

}  // namespace

TEST_CASE("demo: every peer holds the same model bit for bit after its steps, and fewer components send fewer bytes") {
  const ClusterResult few = run("chunk: 16 topk: 2", 8);
  REQUIRE(few.final_params.size() == 4);
  CHECK(!same_bits(few.initial_params[0], few.final_params[0]));
  for (int i = 1; i < 4; ++i) CHECK(same_bits(few.final_params[0], few.final_params[i]));
  const ClusterResult many = run("chunk: 16 topk: 64 value_bits: 32", 8);
  for (int i = 1; i < 4; ++i) CHECK(same_bits(many.final_params[0], many.final_params[i]));
  // 2 of 256 coefficients a block (bf16) against 64 (fp32): well over 10x fewer bytes.
  for (size_t i = 0; i < 4; ++i) CHECK(few.peers[i].bytes_sent * 10 < many.peers[i].bytes_sent);
}
