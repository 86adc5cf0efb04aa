// delta_gossip (src/peer/algorithms/delta_gossip.cpp): local steps composed with
// compressed asynchronous gossip. On in-process clusters: once every delta has arrived
// every peer holds the same model (each took in each delta once), it sends once a round,
// under top-k it still pulls the peers together and trains, and it refuses a graph on
// which its copies would drift apart.
#include <doctest/doctest.h>

#include <cmath>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"

using namespace hearsay;

namespace {

const char* kSmall = R"(
  name: "dg" seed: 4
  model { kind: MLP hidden: [32] }
  data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 256 synthetic_dim: 16 num_classes: 4 }
  optim { optimizer: "sgd" lr: 0.05 momentum: 0.9 }
  train { batch_size: 16 epochs: 0 eval_every_steps: 1000000 }
  log { every_steps: 1000 }
)";

ClusterResult run(const std::string& algorithm, const std::string& options, int steps, const std::string& codec = "none") {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "delta-gossip-test", {"train { max_steps: " + std::to_string(steps) + " }"}));
  s.peers = 4;
  s.gossip.algorithm = algorithm;
  s.gossip.options = options;
  s.gossip.topology.kind = "complete";
  s.gossip.codec.name = codec;
  s.gossip.codec.density = 0.05;
  s.gossip.mixer.weighting = "constant";
  // The guard's norm bound compares a neighbour's delta with this peer's latest: early in
  // a run a late round's delta is several times smaller than an early one, and an honest
  // early delta arriving late can be refused (and so missed: docs/ALGORITHMS.md).
  s.gossip.guard.max_norm_ratio = 0;
  // Steps of microseconds are far shorter than a message hop between threads; 20x gives
  // them a real model's ratio of compute to communication.
  s.slowdown = std::vector<double>(4, 20.0);
  return run_cluster(s);
}

// Mean over peers of the distance to the peers' mean model.
double spread(const ClusterResult& r) {
  const size_t n = r.final_params[0].size(), k = r.final_params.size();
  std::vector<double> mean(n, 0.0);
  for (const auto& p : r.final_params) {
    for (size_t i = 0; i < n; ++i) mean[i] += p[i] / static_cast<double>(k);
  }
  double total = 0;
  for (const auto& p : r.final_params) {
    double d = 0;
    for (size_t i = 0; i < n; ++i) d += (p[i] - mean[i]) * (p[i] - mean[i]);
    total += std::sqrt(d);
  }
  return total / static_cast<double>(k);
}


// The largest difference between any peer's final parameters and peer 0's.
double disagreement(const ClusterResult& r) {
  double most = 0;
  for (const auto& p : r.final_params) {
    for (size_t i = 0; i < p.size(); ++i) most = std::max(most, static_cast<double>(std::fabs(p[i] - r.final_params[0][i])));
  }
  return most;
}

}  // namespace

TEST_CASE("delta_gossip: once every delta has arrived every peer holds the same model, and it sends once a round") {
  // 40 steps, rounds of 4: the last step ends a round; settle takes in the deltas still
  // on the wire. With constant weighting and no codec each peer has then applied every
  // peer's every delta once, divided by n: the same model up to the order of the sums.
  const ClusterResult alone = run("delta_gossip", "local_steps: 1000", 40);
  const ClusterResult rounds = run("delta_gossip", "local_steps: 4", 40);
  const ClusterResult every = run("delta_gossip", "local_steps: 1", 40);  // for its bytes
  REQUIRE(rounds.final_params.size() == 4);
  MESSAGE("largest disagreement: without rounds " << disagreement(alone) << ", rounds of 4 " << disagreement(rounds)
                                                  << ", spread " << spread(alone) << " / " << spread(rounds));
  CHECK(disagreement(alone) > 1e-2);
  CHECK(disagreement(rounds) < 1e-5);
  // (Rounds of 1 are not held to it: a peer that has finished takes in at most 16
  // messages a sender until it settles, and a sender 20 steps behind sends more.)
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    CHECK(rounds.peers[i].bytes_sent > 0);
    // 10 rounds against 40, the same tensors on the same links.
    CHECK(rounds.peers[i].bytes_sent * 3 < every.peers[i].bytes_sent);
  }
}

TEST_CASE("delta_gossip: under top-k with error feedback it still pulls the peers together and trains") {
  const ClusterResult alone = run("delta_gossip", "local_steps: 1000", 48);
  const ClusterResult topk = run("delta_gossip", "local_steps: 4", 48, "topk");
  CHECK(spread(topk) < 0.5 * spread(alone));
  for (const auto& p : topk.peers) {
    REQUIRE(p.losses.size() > 10);
    CHECK(p.losses.back() < p.losses.front());
  }
}

TEST_CASE("delta_gossip: a graph other than the complete one is refused, saying why") {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "delta-gossip-test", {"train { max_steps: 4 }"}));
  s.peers = 4;
  s.gossip.algorithm = "delta_gossip";
  s.gossip.topology.kind = "ring";
  CHECK_THROWS_WITH_AS(run_cluster(s), doctest::Contains("use topology \"complete\""), InputError);
}
