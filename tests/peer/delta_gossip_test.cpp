// delta_gossip (src/peer/algorithms/delta_gossip.cpp): local steps composed with
// compressed asynchronous gossip. On in-process clusters: once every delta has arrived
// every peer has moved by the same amount (each took in each delta once), it sends once a round,
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

ClusterResult run(const std::string& algorithm, const std::string& options, int steps, const std::string& codec = "none",
                  bool distinct_init = false) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "delta-gossip-test", {"train { max_steps: " + std::to_string(steps) + " }"}));
  s.peers = 4;
  s.gossip.algorithm = algorithm;
  s.gossip.options = options;
  s.gossip.topology.kind = "complete";
  s.gossip.codec.name = codec;
  s.gossip.codec.density = 0.05;
  s.gossip.mixer.weighting = "constant";
  // Steps of microseconds are far shorter than a message hop between threads; 20x gives
  // them a real model's ratio of compute to communication.
  s.slowdown = std::vector<double>(4, 20.0);
  s.distinct_init = distinct_init;
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


// The largest difference between any peer's displacement (final minus initial
// parameters) and peer 0's.
double disagreement(const ClusterResult& r) {
  double most = 0;
  for (size_t k = 0; k < r.final_params.size(); ++k) {
    const auto& p = r.final_params[k];
    const auto& p0 = r.initial_params[k];
    for (size_t i = 0; i < p.size(); ++i) {
      const double moved = static_cast<double>(p[i]) - p0[i];
      const double moved0 = static_cast<double>(r.final_params[0][i]) - r.initial_params[0][i];
      most = std::max(most, std::fabs(moved - moved0));
    }
  }
  return most;
}

}  // namespace

TEST_CASE("delta_gossip: once every delta has arrived every peer has moved by the same amount, and it sends once a round") {
  // 40 steps, rounds of 4: the last step ends a round; settle takes in the deltas still
  // on the wire. With constant weighting and no codec each peer has then applied every
  // peer's every delta once, divided by n: the same displacement up to the order of the
  // sums. The peers start from models of their own (distinct_init), so that no peer
  // starts from a copy of a neighbour that has already taken in deltas (a late joiner's
  // copy, which the thread start's skew could otherwise give, counts them twice).
  const ClusterResult alone = run("delta_gossip", "local_steps: 1000", 40, "none", true);
  const ClusterResult rounds = run("delta_gossip", "local_steps: 4", 40, "none", true);
  const ClusterResult every = run("delta_gossip", "local_steps: 1", 40, "none", true);  // for its bytes
  REQUIRE(rounds.final_params.size() == 4);
  MESSAGE("largest difference of displacements: without rounds " << disagreement(alone) << ", rounds of 4 " << disagreement(rounds)
                                                  << ", spread " << spread(alone) << " / " << spread(rounds));
  CHECK(disagreement(alone) > 1e-2);
  CHECK(disagreement(rounds) < 1e-5);
  // (Rounds of 1 are not held to it: a peer that has finished takes in at most 16
  // messages a sender until it settles, and a sender 20 steps behind sends more.)
  for (size_t i = 0; i < 4; ++i) {
    CAPTURE(i);
    // 10 rounds, each a delta of n floats to 3 peers: at most that, with each frame's
    // header and the admission handshake (under 1 KB a message, generously); a peer that
    // sent every step (40 deltas a link) would need about 4x as much. Rounds of 1 send
    // more (fewer than 4x: a busy link folds its deltas into one, so not a fixed ratio).
    const double delta_bytes = 4.0 * static_cast<double>(rounds.final_params[0].size());
    CHECK(static_cast<double>(rounds.peers[i].bytes_sent) > 10 * 3 * delta_bytes * 0.5);
    CHECK(static_cast<double>(rounds.peers[i].bytes_sent) < 10 * 3 * (delta_bytes + 1024) + 4096);
    CHECK(rounds.peers[i].bytes_sent < every.peers[i].bytes_sent);
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
