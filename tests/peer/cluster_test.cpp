// Whole clusters in one process, on the inproc transport: every algorithm against the
// centralized optimum, consensus, stragglers and slow links.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/peer.h"
#include "test_util.h"

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

TEST_CASE("cluster: the consensus distance falls as the learning rate decays") {
  // With a cosine schedule the gossip keeps mixing while the steps that pull peers apart
  // shrink, so the distance between peers must end far below its peak.
  for (const std::string algorithm : {"adpsgd", "gossip_grad", "sgp"}) {
    CAPTURE(algorithm);
    const ClusterResult r = cluster(algorithm, 8, base("optim { momentum: 0 }"), std::vector<double>(8, 20.0));
    REQUIRE(r.consensus.size() > 10);
    double peak = 0;
    for (const auto& [step, d] : r.consensus) peak = std::max(peak, d);
    const double last = r.consensus.back().second;
    MESSAGE(algorithm << ": consensus distance peak " << peak << ", final " << last);
    CHECK(last < peak / 3);
  }
}

namespace {

std::vector<double> fast_rates(const ClusterResult& r, int slow) {
  std::vector<double> v;
  for (size_t i = 0; i < r.peers.size(); ++i) {
    if (static_cast<int>(i) != slow) v.push_back(r.peers[i].steps_per_s);
  }
  return v;
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

TEST_CASE("cluster: with one peer 10x slower, asynchronous peers keep their pace and allreduce does not") {
  // An MLP on 256 features, stretched 10x, makes computation dominate a step as on a
  // real model; the straggler computes 10x slower still.
  const auto c = base("model { kind: MLP hidden: [128] } data { synthetic_dim: 256 } train { epochs: 4 }");
  const std::vector<double> even(4, 10.0);
  std::vector<double> straggler(4, 10.0);
  straggler[3] = 100.0;
  for (const std::string algorithm : {"adpsgd", "gossip_grad", "sgp", "allreduce"}) {
    CAPTURE(algorithm);
    const ClusterResult base_run = cluster(algorithm, 4, c, even);
    const ClusterResult slow_run = cluster(algorithm, 4, c, straggler);
    const double before = median_of(fast_rates(base_run, -1));
    const double after = median_of(fast_rates(slow_run, 3));
    const double slow = slow_run.peers[3].steps_per_s;
    MESSAGE(algorithm << ": fast peers " << before << " steps/s alone, " << after << " beside a 10x slower peer (" << slow
                      << " steps/s): " << after / before);
    if (algorithm == "allreduce") {
      CHECK(after < 1.5 * slow);  // everyone runs at the straggler's pace
    } else {
      // The goal is 90% (docs/BENCHMARKS.md records the measured ratios); the assertion
      // leaves 5 points for the noise of a shared 2-core machine.
      CHECK(after >= 0.85 * before);
    }
  }
}

TEST_CASE("cluster: with one link 100x slower, memory stays bounded and the run still converges") {
  ClusterSpec s;
  s.base = base();
  s.peers = 4;
  s.gossip.algorithm = "gossip_grad";
  s.gossip.topology.kind = "ring";
  s.slowdown = std::vector<double>(4, 20.0);
  // Every link at 100 Mbit/s except 0 -> 1 at 1 Mbit/s: its gradients arrive far slower
  // than they are made.
  s.link.bandwidth_bps = 100e6;
  LinkModel slow;
  slow.bandwidth_bps = 1e6;
  slow.latency_s = 0.01;
  s.links[{0, 1}] = slow;
  const ClusterResult r = run_cluster(s);
  const TrainResult ref = centralized(base());
  const size_t model_bytes = (16 * 4 + 4) * sizeof(float);
  for (const auto& p : r.peers) {
    // At most one message in flight and one pending per kind per link, plus one per
    // sender and kind in the inbox: a few models' worth, whatever the link's speed.
    CHECK(p.max_buffered_bytes <= 16 * model_bytes);
    CHECK(p.final_test_loss <= ref.final_test_loss + 0.05);
  }
}

TEST_CASE("cluster: a peer that joins late starts from a neighbour's model") {
  ClusterSpec s;
  s.base = base();
  s.peers = 4;
  s.gossip.algorithm = "adpsgd";
  s.gossip.topology.kind = "random";
  s.slowdown = std::vector<double>(4, 20.0);
  s.start_delay_s = {0, 0, 0, 0.08};
  const ClusterResult r = run_cluster(s);
  // Every peer starts from the same random initialisation; its loss on a first batch:
  const double initial = centralized(base("train { max_steps: 1 }")).losses.front();
  // The late peer's first step already uses a trained neighbour's model.
  MESSAGE("first loss: at initialisation " << initial << ", late peer " << r.peers[3].losses.front());
  CHECK(r.peers[3].losses.front() < 0.8 * initial);
}

namespace {

// The last value of `field` in the `codec` events peer0 wrote for link `to`, or "" if none.
std::string last_codec_choice(const std::string& log, const std::string& to) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) {
    if (line.find("\"event\":\"codec\"") == std::string::npos || line.find("\"link\":\"" + to + "\"") == std::string::npos) continue;
    const auto at = line.find("\"codec\":\"", line.find("\"link\""));
    if (at != std::string::npos) last = line.substr(at + 9, line.find('"', at + 9) - at - 9);
  }
  return last;
}

}  // namespace

TEST_CASE("cluster: adaptive compression gives a fast link a dense codec and a slow link top-k, and says why") {
  test::TempDir dir;
  ClusterSpec s;
  // 16 features x 4 classes is too small to need compressing anywhere; 2000 x 4 is not.
  s.base = base("data { synthetic_dim: 2000 synthetic_train: 2048 } train { epochs: 6 }");
  s.peers = 3;
  s.gossip.algorithm = "gossip_grad";
  s.gossip.topology.kind = "complete";
  s.gossip.average_every = 0;
  s.gossip.adaptive.enabled = true;
  s.slowdown = std::vector<double>(3, 20.0);
  s.log_dir = dir.path();
  // peer0 <-> peer2 crosses a 2 Mbit/s WAN link; the others are unlimited.
  LinkModel wan;
  wan.bandwidth_bps = 2e6;
  wan.latency_s = 0.005;
  s.links[{0, 2}] = wan;
  s.links[{2, 0}] = wan;
  const ClusterResult r = run_cluster(s);
  const std::string log = dir.file("peer0.jsonl");
  const std::string slow = last_codec_choice(log, "peer2"), fast = last_codec_choice(log, "peer1");
  MESSAGE("peer0's link to peer1 (unlimited): '" << fast << "', to peer2 (2 Mbit/s): '" << slow << "'");
  CHECK(slow == "topk");
  CHECK((fast == "" || fast == "none" || fast == "fp16"));
  const std::string text = test::read_file(log);
  CHECK(text.find("topk at density") != std::string::npos);  // the reason is logged
  for (const auto& p : r.peers) CHECK(p.final_test_acc > 0.7);
}
