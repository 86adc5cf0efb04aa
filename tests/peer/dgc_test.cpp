// dgc (src/peer/algorithms/dgc.cpp, dgc_memory.cpp): Deep Gradient Compression's rule and
// its defining invariants: with every element sent and no masking it is momentum SGD bit
// for bit (heavy ball and Nesterov), with masking plain SGD; the warm-up of sparsity
// follows the paper's stages; local clipping bounds each peer's gradient by N^(-1/2);
// every peer holds the same model after every step; it sends what its density says;
// and at density 1 it trains as allreduce with momentum SGD does.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "../../src/peer/algorithms/dgc_memory.h"
#include "hearsay/backend.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/optim.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::same_bits;

namespace {

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// `steps` DGC steps of one peer with every element sent (the whole velocity), applied
// as dgc.cpp applies them: w += (-lr) * sent.
std::vector<float> dgc_alone(const DgcSettings& s, std::vector<float> w, const std::vector<std::vector<float>>& grads, float lr) {
  auto backend = create_backend("cpu");
  DgcMemory mem(w.size(), s);
  for (const auto& grad : grads) {
    std::vector<float> g = grad;
    mem.accumulate(g, w.data(), 1);
    const std::vector<float> sent = mem.velocity();  // density 1: everything
    mem.sent(sent);
    backend->axpy(w.size(), -lr, sent.data(), w.data());
  }
  return w;
}

std::vector<float> sgd(float momentum, bool nesterov, std::vector<float> w, const std::vector<std::vector<float>>& grads, float lr) {
  auto backend = create_backend("cpu");
  OptimizerSpec spec;
  spec.name = "sgd";
  spec.momentum = momentum;
  spec.nesterov = nesterov;
  auto opt = create_optimizer(*backend, w.size(), spec);
  for (const auto& g : grads) opt->step(w.data(), g.data(), lr);
  return w;
}

const char* kSmall = R"(
  name: "dgc" seed: 5
  model { kind: MLP hidden: [32] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 16 num_classes: 4 }
  optim { optimizer: "sgd" lr: 0.05 }
  train { batch_size: 16 epochs: 0 eval_every_steps: 1000000 }
  log { every_steps: 1000 }
)";

ClusterResult run(const std::string& algorithm, const std::string& options, int steps, const CodecSpec& codec,
                  float momentum = 0.0f) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "dgc-test", {"train { max_steps: " + std::to_string(steps) + " }"}));
  s.base.optimizer.momentum = momentum;  // allreduce steps with it; dgc takes it for its momentum correction
  s.peers = 4;
  s.gossip.algorithm = algorithm;
  s.gossip.options = options;
  s.gossip.topology.kind = "ring";
  s.gossip.topology.site_of = {0, 0, 1, 1};
  s.gossip.codec = codec;
  return run_cluster(s);
}

CodecSpec topk(double density, int value_bits = 16) {
  CodecSpec c;
  c.name = "topk";
  c.density = density;
  c.value_bits = value_bits;
  return c;
}

}  // namespace

TEST_CASE("dgc memory: every element sent without masking is momentum SGD bit for bit, heavy ball and Nesterov") {
  std::mt19937 rng(7);
  const std::vector<float> w0 = random_vector(1000, rng);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 6; ++t) grads.push_back(random_vector(1000, rng));
  for (bool nesterov : {false, true}) {
    CAPTURE(nesterov);
    DgcSettings s;
    s.momentum = 0.9f;
    s.nesterov = nesterov;
    s.momentum_masking = false;
    s.density = 1.0;
    const auto dgc = dgc_alone(s, w0, grads, 0.05f);
    CHECK(same_bits(dgc, sgd(0.9f, nesterov, w0, grads, 0.05f)));
    CHECK(!same_bits(dgc, sgd(0.0f, false, w0, grads, 0.05f)));
  }
}

TEST_CASE("dgc memory: with momentum factor masking, every element sent is plain SGD (the momentum is masked away)") {
  std::mt19937 rng(8);
  const std::vector<float> w0 = random_vector(500, rng);
  std::vector<std::vector<float>> grads;
  for (int t = 0; t < 5; ++t) grads.push_back(random_vector(500, rng));
  DgcSettings s;
  s.momentum = 0.9f;
  s.momentum_masking = true;
  s.density = 1.0;
  CHECK(same_bits(dgc_alone(s, w0, grads, 0.05f), sgd(0.0f, false, w0, grads, 0.05f)));
}

TEST_CASE("dgc memory: what is not sent stays in the velocity, what is sent leaves it, and masking zeroes its momentum") {
  DgcSettings s;
  s.momentum = 0.5f;
  DgcMemory mem(4, s);
  std::vector<float> g{1, 2, 3, 4};
  mem.accumulate(g, nullptr, 1);
  mem.sent({0, 0, 3, 0});  // element 2 sent
  CHECK(mem.velocity() == std::vector<float>{1, 2, 0, 4});
  CHECK(mem.momentum() == std::vector<float>{1, 2, 0, 4});
  std::vector<float> g2{0, 0, 0, 0};
  mem.accumulate(g2, nullptr, 1);
  // u = 0.5 u; v += u: the unsent keep growing by their momentum, the sent one stays 0.
  CHECK(mem.velocity() == std::vector<float>{1.5f, 3, 0, 6});
}

TEST_CASE("dgc memory: the warm-up of sparsity falls 4x a stage from 25% to the final density, as the paper's 75% to 99.9%") {
  DgcSettings s;
  s.warmup_steps = 400;
  s.warmup_density = 0.25;
  s.density = 0.001;
  const DgcMemory mem(1, s);
  CHECK(mem.density_at(0) == 0.25);
  CHECK(mem.density_at(99) == 0.25);
  CHECK(mem.density_at(100) == 0.0625);
  CHECK(mem.density_at(200) == 0.015625);
  CHECK(mem.density_at(399) == 0.00390625);
  CHECK(mem.density_at(400) == 0.001);
  CHECK(mem.density_at(100000) == 0.001);
  s.warmup_steps = 0;
  CHECK(DgcMemory(1, s).density_at(0) == 0.001);
}

TEST_CASE("dgc memory: local gradient clipping holds each peer's gradient to clip_norm / sqrt(N)") {
  DgcSettings s;
  s.momentum = 0.0f;
  s.clip_norm = 2.0;
  DgcMemory mem(2, s);
  std::vector<float> g{30, 40};  // norm 50
  mem.accumulate(g, nullptr, 4);
  const auto& v = mem.velocity();
  CHECK(std::hypot(v[0], v[1]) == doctest::Approx(1.0).epsilon(1e-6));  // 2 / sqrt(4)
  CHECK(v[0] / v[1] == doctest::Approx(0.75));
  std::vector<float> small{0.3f, 0.4f};
  DgcMemory mem2(2, s);
  mem2.accumulate(small, nullptr, 4);
  CHECK(mem2.velocity() == std::vector<float>{0.3f, 0.4f});  // under the bound: untouched
}

TEST_CASE("dgc: every peer holds the same model bit for bit after its steps, and sends about its density's bytes") {
  const ClusterResult sparse = run("dgc", "warmup_steps: 4 warmup_density: 0.25", 12, topk(0.01), 0.9f);
  REQUIRE(sparse.final_params.size() == 4);
  CHECK(!same_bits(sparse.initial_params[0], sparse.final_params[0]));
  for (int i = 1; i < 4; ++i) CHECK(same_bits(sparse.final_params[0], sparse.final_params[i]));
  const ClusterResult dense = run("dgc", "", 12, topk(1.0, 32), 0.9f);
  for (int i = 1; i < 4; ++i) CHECK(same_bits(dense.final_params[0], dense.final_params[i]));
  // 1% of the values (bf16 and a varint each) against all of them as fp32 and a bitmap,
  // warm-up included, frames' headers on both: at least 10x fewer bytes.
  for (int i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(sparse.peers[static_cast<size_t>(i)].bytes_sent * 10 < dense.peers[static_cast<size_t>(i)].bytes_sent);
  }
}

TEST_CASE("dgc: at density 1 without masking it trains as allreduce with momentum SGD (the same steps, sums in another order)") {
  const ClusterResult dgc = run("dgc", "momentum_masking: false", 10, topk(1.0, 32), 0.9f);
  CodecSpec none;
  const ClusterResult ar = run("allreduce", "", 10, none, 0.9f);
  REQUIRE(dgc.final_params.size() == 4);
  REQUIRE(ar.final_params.size() == 4);
  double most = 0, moved = 0;
  for (size_t i = 0; i < dgc.final_params[0].size(); ++i) {
    most = std::max(most, static_cast<double>(std::fabs(dgc.final_params[0][i] - ar.final_params[0][i])));
    moved = std::max(moved, static_cast<double>(std::fabs(ar.final_params[0][i] - ar.initial_params[0][i])));
  }
  CHECK(moved > 1e-2);
  CHECK(most < 1e-5);
  // With masking on (the paper's rule) it is no longer allreduce's momentum SGD.
  const ClusterResult masked = run("dgc", "", 10, topk(1.0, 32), 0.9f);
  double apart = 0;
  for (size_t i = 0; i < masked.final_params[0].size(); ++i) {
    apart = std::max(apart, static_cast<double>(std::fabs(masked.final_params[0][i] - ar.final_params[0][i])));
  }
  CHECK(apart > 1e-3);
}

TEST_CASE("dgc and demo: dgc takes optim's momentum but not adamw or a codec other than top-k, demo refuses optim's momentum, at the field") {
  const std::string base = R"(
    name: "c" seed: 1 model { kind: MLP hidden: [8] }
    data { format: SYNTHETIC synthetic_train: 64 synthetic_test: 16 synthetic_dim: 4 num_classes: 2 }
    train { batch_size: 8 epochs: 1 }
    cluster { id: "c" peers { name: "a" address: "127.0.0.1:1" } peers { name: "b" address: "127.0.0.1:2" }
  )";
  auto error = [&](const std::string& optim, const std::string& gossip) {
    try {
      parse_config(base + gossip + " }\n" + optim, "bad.textproto");
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string dgc = R"(gossip { algorithm: "dgc" codec { name: "topk" density: 0.01 } })";
  CHECK(error("optim { optimizer: \"sgd\" lr: 0.1 momentum: 0.9 nesterov: true weight_decay: 0.0001 }", dgc) == "accepted");
  const std::string adamw = error("optim { optimizer: \"adamw\" lr: 0.1 }", dgc);
  CHECK(adamw.find("bad.textproto:") != std::string::npos);
  CHECK(adamw.find("optim.optimizer must be sgd") != std::string::npos);
  const std::string no_topk = error("optim { optimizer: \"sgd\" lr: 0.1 }", R"(gossip { algorithm: "dgc" })");
  CHECK(no_topk.find("top-k") != std::string::npos);
  const std::string plain = "optim { optimizer: \"sgd\" lr: 0.01 momentum: 0 }";
  CHECK(error(plain, R"(gossip { algorithm: "demo" })") == "accepted");
  const std::string demo = error("optim { optimizer: \"sgd\" lr: 0.1 momentum: 0.9 }", R"(gossip { algorithm: "demo" })");
  CHECK(demo.find("bad.textproto:") != std::string::npos);
  CHECK(demo.find("optim.momentum") != std::string::npos);
  CHECK(demo.find("keeps its own momentum") != std::string::npos);
  const std::string chunk = error(plain, R"(gossip { algorithm: "demo" [hearsay.algorithms.demo] { chunk: 0 } })");
  CHECK(chunk.find("chunk") != std::string::npos);
  CHECK(chunk.find("bad.textproto:") != std::string::npos);
}
