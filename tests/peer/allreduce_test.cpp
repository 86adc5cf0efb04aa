// allreduce as a fair baseline (src/peer/algorithms/collectives.cpp and
// powersgd_allreduce.cpp): under every codec it may use, flat or across sites, every
// peer's model stays the same bit for bit; PowerSGD sends far fewer bytes; and what it
// learns on non-IID shards beats peers that never communicate.
#include <doctest/doctest.h>

#include <cstring>

#include "hearsay/config.pb.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/error.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::same_bits;

namespace {

ClusterSpec spec(const std::string& text, const std::string& codec, std::vector<int> site_of, const std::string& algorithm = "allreduce") {
  ClusterSpec s;
  s.base = peer_spec(parse_config(text, "allreduce-test"));
  s.peers = 4;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = "ring";
  s.gossip.topology.site_of = std::move(site_of);
  s.gossip.codec.name = codec;
  return s;
}

const char* kSmall = R"(
  name: "ar" seed: 5
  model { kind: MLP hidden: [32] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 512 synthetic_dim: 24 num_classes: 4 }
  optim { lr: 0.05 momentum: 0.9 }
  train { batch_size: 16 epochs: 2 eval_every_steps: 1000000 }
  log { every_steps: 16 }
)";

}  // namespace

TEST_CASE("allreduce: under every codec, in one site, across two and across four of one peer each, every peer's model stays the same bit for bit") {
  for (const std::string codec : {"none", "fp16", "bf16", "int8", "powersgd"}) {
    for (const auto& sites : {std::vector<int>{}, std::vector<int>{0, 0, 1, 1}, std::vector<int>{0, 1, 1, 1}, std::vector<int>{0, 1, 2, 3}}) {
      CAPTURE(codec);
      CAPTURE(sites.size());
      const ClusterResult r = run_cluster(spec(kSmall, codec, sites));
      REQUIRE(r.final_params.size() == 4);
      CHECK(!same_bits(r.initial_params[0], r.final_params[0]));  // it trained
      for (int i = 1; i < 4; ++i) CHECK(same_bits(r.final_params[0], r.final_params[static_cast<size_t>(i)]));
      for (const auto& p : r.peers) CHECK(p.final_test_acc > 0.6);
    }
  }
}

TEST_CASE("allreduce: codec powersgd sends at least 20x fewer bytes per step than none on the 784-256-256-10 MLP") {
  const char* mlp = R"(
    name: "bytes" seed: 2
    model { kind: MLP hidden: [256, 256] }
    data { format: SYNTHETIC synthetic_train: 1024 synthetic_test: 64 synthetic_dim: 784 num_classes: 10 }
    optim { lr: 0.01 momentum: 0.9 }
    train { batch_size: 64 epochs: 1 eval_every_steps: 1000000 }
    log { every_steps: 16 }
  )";
  double per_step[2] = {0, 0};
  int k = 0;
  for (const std::string codec : {"none", "powersgd"}) {
    const ClusterResult r = run_cluster(spec(mlp, codec, {0, 0, 1, 1}));
    double bytes = 0, steps = 0;
    for (const auto& p : r.peers) {
      bytes += static_cast<double>(p.bytes_sent);
      steps += static_cast<double>(p.steps);
    }
    per_step[k++] = bytes / steps;
  }
  MESSAGE("bytes per peer per step: none " << per_step[0] << ", powersgd " << per_step[1] << " (" << per_step[0] / per_step[1]
                                           << "x fewer)");
  CHECK(per_step[0] / per_step[1] >= 20.0);
}

TEST_CASE("allreduce: on non-IID shards, every codec beats peers that never communicate by a wide margin") {
  // Each peer sees mostly one or two of four classes (Dirichlet 0.1): alone, a peer cannot
  // tell the classes it hardly saw apart.
  const char* noniid = R"(
    name: "noniid" seed: 7
    model { kind: MLP hidden: [32] }
    data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 1024 synthetic_dim: 16 num_classes: 4
           synthetic_separation: 0.6 partition: DIRICHLET dirichlet_alpha: 0.1 }
    optim { lr: 0.05 momentum: 0.5 }
    train { batch_size: 16 epochs: 4 eval_every_steps: 1000000 }
    log { every_steps: 16 }
  )";
  auto mean_acc = [](const ClusterResult& r) {
    double a = 0;
    for (const auto& p : r.peers) a += p.final_test_acc;
    return a / static_cast<double>(r.peers.size());
  };
  // The control: local_sgd that would average only after 10^6 steps, i.e. never.
  ClusterSpec alone = spec(noniid, "none", {0, 0, 1, 1}, "local_sgd");
  alone.gossip.options = "local_steps: 1000000";
  const double control = mean_acc(run_cluster(alone));
  for (const std::string codec : {"none", "fp16", "int8", "powersgd"}) {
    const double acc = mean_acc(run_cluster(spec(noniid, codec, {0, 0, 1, 1})));
    MESSAGE(codec << ": " << acc << " against " << control << " alone");
    CHECK(acc > control + 0.15);
  }
}

TEST_CASE("allreduce and diloco's outer average: a peer whose parts are absurd (x 1e30, finite) is refused before they are "
          "added, with a refused event naming it, in one site and across two") {
  for (const std::string algorithm : {"allreduce", "diloco"}) {
    for (const std::vector<int>& sites : {std::vector<int>{0, 0, 0, 0}, std::vector<int>{0, 0, 1, 1}}) {
      CAPTURE(algorithm);
      CAPTURE(sites.back());
      test::TempDir dir;
      ClusterSpec s = spec(kSmall, "none", sites, algorithm);
      if (algorithm == "diloco") s.gossip.options = "local_steps: 2";
      s.byzantine = {"none", "none", "none", "absurd"};
      s.gossip.sync_timeout_s = 3;  // the others then wait for whoever refused, and give up
      s.log_dir = dir.path();
      CHECK_THROWS_WITH_AS(run_cluster(s), doctest::Contains("refused peer peer3's update for round"), InputError);
      // Whoever took a part of peer3's first said why, in its log, before adding it.
      std::string logs;
      for (const std::string name : {"peer0", "peer1", "peer2"}) logs += test::read_file(dir.file(name + ".jsonl"));
      CHECK(logs.find(R"("event":"refused","neighbour":"peer3")") != std::string::npos);
      CHECK(logs.find(R"("reason":"norm: )") != std::string::npos);
      CHECK(logs.find(R"("event":"diverged")") == std::string::npos);
    }
  }
}
