// Whole clusters in one process, on the inproc transport: every algorithm against the
// centralized optimum, consensus, stragglers and slow links.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/peer.h"

using namespace hearsay;

namespace {

// Logistic regression on separable-ish Gaussian blobs: convex, with a unique optimum.
const char* kLogreg = R"(
  name: "c"
  seed: 3
  model { kind: LOGREG }
  data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 2048 synthetic_dim: 16 num_classes: 4
         synthetic_separation: 0.6 }
  optim { lr: 0.1 momentum: 0.5 schedule: COSINE }
  train { batch_size: 16 epochs: 24 eval_every_steps: 1000000 }
  log { every_steps: 16 }
)";

config::Config base(const std::string& extra = "") { return parse_config(kLogreg, "cluster-test", {extra}); }

// The centralized reference: one peer on all the data with the same number of samples.
TrainResult centralized(const config::Config& c) {
  EventLog log("", "central");
  Peer p(c, log, nullptr);
  return p.run();
}

ClusterResult cluster(const std::string& algorithm, int n, const config::Config& c, std::vector<double> slowdown = {}) {
  ClusterSpec s;
  s.base = c;
  s.peers = n;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = algorithm == "sgp" ? "exponential" : algorithm == "adpsgd" ? "random" : "ring";
  s.gossip.local_steps = 4;
  s.slowdown = std::move(slowdown);
  return run_cluster(s);
}

double mean_acc(const ClusterResult& r) {
  double a = 0;
  for (const auto& p : r.peers) a += p.final_test_acc;
  return a / r.peers.size();
}

double mean_loss(const ClusterResult& r) {
  double a = 0;
  for (const auto& p : r.peers) a += p.final_test_loss;
  return a / r.peers.size();
}

}  // namespace

TEST_CASE("cluster: every algorithm on 8 peers reaches the centralized optimum of logistic regression") {
  // Centralized: 24 epochs over all 4096 samples. Each of 8 peers: 24 epochs of its 512,
  // so the cluster sees as many samples as the centralized run.
  const TrainResult ref = centralized(base());
  MESSAGE("centralized: test accuracy " << ref.final_test_acc << ", test loss " << ref.final_test_loss);
  for (const auto& algorithm : gossip_algorithms()) {
    CAPTURE(algorithm);
    // Steps here take microseconds, far less than a message hop between threads; a
    // slowdown of 20 gives them the compute-to-communication ratio of a real model.
    const ClusterResult r = cluster(algorithm, 8, base(), std::vector<double>(8, 20.0));
    MESSAGE(algorithm << ": mean test accuracy " << mean_acc(r) << ", mean test loss " << mean_loss(r)
                      << ", final consensus distance " << (r.consensus.empty() ? -1 : r.consensus.back().second));
    // Stated tolerance: test loss within 0.05 nats of the centralized run and accuracy
    // within 2 points.
    CHECK(mean_loss(r) <= ref.final_test_loss + 0.05);
    CHECK(mean_acc(r) >= ref.final_test_acc - 0.02);
  }
}
