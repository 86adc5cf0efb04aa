// Whole clusters in one process, on the inproc transport: every algorithm against the
// centralized optimum, consensus, stragglers and slow links.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <sstream>

#include "hearsay/config.pb.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/error.h"
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
  Peer p(peer_spec(c), log, nullptr);
  return p.run();
}

ClusterResult cluster(const std::string& algorithm, int n, const config::Config& c, std::vector<double> slowdown = {},
                      const std::string& options = "") {
  ClusterSpec s;
  s.base = peer_spec(c);
  s.peers = n;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = algorithm == "sgp"            ? "exponential"
                           : algorithm == "adpsgd"       ? "random"
                           : algorithm == "delta_gossip" ? "complete"  // the only graph it takes
                                                         : "ring";
  if (algorithm == "local_sgd" || algorithm == "diloco" || algorithm == "delta_gossip") s.gossip.options = "local_steps: 4";
  // dgc sparsifies with top-k: 7 of logistic regression's 68 parameters a step.
  if (algorithm == "dgc") {
    s.gossip.codec.name = "topk";
    s.gossip.codec.density = 0.1;
  }
  // Logistic regression is one unit: one fragment.
  if (algorithm == "streaming_diloco") s.gossip.options = "local_steps: 4 fragments: 1 overlap_steps: 1";
  if (!options.empty()) s.gossip.options = options;
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

TEST_CASE("cluster: on non-IID shards every algorithm beats peers that never communicate by several times their "
          "seed-to-seed spread") {
  // On IID shards 8 peers alone come within 0.05 nats of the optimum too, so the test above
  // cannot tell communication from none. Here each peer sees mostly one or two of the
  // four classes (Dirichlet 0.1): alone it cannot separate the others, and what an
  // algorithm communicates is what closes the gap.
  const std::string noniid = "data { partition: DIRICHLET dirichlet_alpha: 0.1 }";
  // The control, two seeds for its spread: local_sgd that would average after 10^6
  // steps, i.e. never.
  double control_acc[2], control_loss[2];
  for (int k = 0; k < 2; ++k) {
    ClusterSpec alone;
    alone.base = peer_spec(base(noniid + (k == 0 ? "" : " seed: 4")));
    alone.peers = 8;
    alone.gossip.algorithm = "local_sgd";
    alone.gossip.options = "local_steps: 1000000";
    const ClusterResult c = run_cluster(alone);
    control_acc[k] = mean_acc(c);
    control_loss[k] = mean_loss(c);
  }
  const double spread = std::max(std::abs(control_acc[0] - control_acc[1]), 0.01);
  const double loss_spread = std::abs(control_loss[0] - control_loss[1]);
  MESSAGE("alone: test accuracy " << control_acc[0] << " / " << control_acc[1] << ", test loss " << control_loss[0] << " / "
                                  << control_loss[1]);
  for (const auto& algorithm : gossip_algorithms()) {
    CAPTURE(algorithm);
    // A fixed emulated step of 1 ms rather than a slowdown of 20: a slowdown stretches what
    // a step measured, so on a loaded machine a descheduled peer slept 20x the time it lost
    // and its neighbours stepped on without it (choco, whose rounds wait for every
    // neighbour, ended at 0.50-0.61 beside two busy cores and failed 2 of 4 full runs;
    // with the fixed step 0.79-0.80 in 3 of 3 such runs).
    const ClusterResult r = cluster(algorithm, 8, base(noniid + " train { emulated_step_s: 0.001 }"));
    MESSAGE(algorithm << ": mean test accuracy " << mean_acc(r) << ", mean test loss " << mean_loss(r));
    // Margins: twice the control's accuracy spread above its better seed (about 0.08;
    // the asynchronous algorithms' own run-to-run spread here reaches 0.14, choco's
    // 0.66-0.80), and at least 0.5 nats or three times its loss spread below its better
    // seed's loss (measured: 0.5-0.93 against 2.15).
    CHECK(mean_acc(r) >= std::max(control_acc[0], control_acc[1]) + 2 * spread);
    CHECK(mean_loss(r) <= std::min(control_loss[0], control_loss[1]) - std::max(0.5, 3 * loss_spread));
  }
}

TEST_CASE("cluster: the consensus distance falls as the learning rate decays") {
  // With a cosine schedule the gossip keeps mixing while the steps that pull peers apart
  // shrink, so the distance between peers must end far below its peak. sgp with its
  // paper's bounded delay (overlap_tau 1): without it (x <- x - lr grad F(z), z = x / w) a
  // peer whose weight w fell small moved z by lr g / w, and the distance between the z's
  // ended at 0.47-0.62 of its peak in 3 of 3 runs. Its defining invariant, conserved
  // mass, is tested below.
  for (const std::string algorithm : {"adpsgd", "gossip_grad", "sgp"}) {
    CAPTURE(algorithm);
    // A fixed emulated step of 2 ms, not a slowdown: a slowdown stretches what a step
    // measured, so on a loaded 2-core machine a descheduled peer slept 50x the time it
    // lost, fell past tau_max behind the others and dropped their updates; it stepped
    // alone and the distance rose over the last 200 steps (gossip_grad ended at 0.42-0.56
    // of its peak in 3 of 16 runs beside another copy of this test and a busy core; CI
    // failed on it). With a fixed step a peer that lost time catches up, as a GPU's pace
    // does: 20 of 20 such runs ended at 0.011-0.021 of the peak, adpsgd below 0.001.
    const ClusterResult r = cluster(algorithm, 8, base("optim { momentum: 0 } train { emulated_step_s: 0.002 }"));
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

TEST_CASE("cluster: with one peer 10x slower, asynchronous peers keep their pace, and allreduce and sgp's bounded "
          "delay do not") {
  // An MLP on 256 features, stretched 10x, makes computation dominate a step as on a
  // real model; the straggler computes 10x slower still. The test measures pace, not
  // accuracy: the learning rate (the same for every algorithm) is one at which sgp's
  // unbounded overlap (overlap_tau 0, not the paper's) beside a straggler does not diverge
  // (at 0.1 it did, now and then, on a loaded machine, which ended the run before its pace
  // was measured). sgp as its paper states it (overlap_tau 1) waits for its in-neighbours'
  // pushes of the step before: the straggler paces every peer it pushes to.
  const auto c = base("model { kind: MLP hidden: [128] } data { synthetic_dim: 256 } train { epochs: 4 } optim { lr: 0.03 }");
  const std::vector<double> even(4, 10.0);
  std::vector<double> straggler(4, 10.0);
  straggler[3] = 100.0;
  for (const std::string algorithm : {"adpsgd", "gossip_grad", "sgp", "allreduce"}) {
    CAPTURE(algorithm);
    double before = 0, after = 0, slow = 0;
    // The two runs' rates each vary up to 2x from run to run on a shared 2-core machine
    // (the same algorithm's baseline measured 773 to 1561 steps/s): an asynchronous
    // algorithm that falls short is measured once more, the pair afresh. One that waits
    // for the straggler stays near its 10% however often it is measured.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const std::string options = algorithm == "sgp" ? "overlap_tau: 0" : "";
      const ClusterResult base_run = cluster(algorithm, 4, c, even, options);
      const ClusterResult slow_run = cluster(algorithm, 4, c, straggler, options);
      before = median_of(fast_rates(base_run, -1));
      after = median_of(fast_rates(slow_run, 3));
      slow = slow_run.peers[3].steps_per_s;
      MESSAGE(algorithm << ": fast peers " << before << " steps/s alone, " << after << " beside a 10x slower peer (" << slow
                        << " steps/s): " << after / before);
      if (algorithm == "allreduce" || after >= 0.85 * before) break;
    }
    if (algorithm == "allreduce") {
      CHECK(after < 1.5 * slow);  // everyone runs at the straggler's pace
    } else {
      // The goal is 90% (docs/BENCHMARKS.md records the measured ratios); the assertion
      // leaves 5 points for the noise of a shared 2-core machine.
      CHECK(after >= 0.85 * before);
    }
  }
  // The paper's bound: on the exponential graph of 4 the straggler pushes to a peer every
  // other round, which waits for it, and the others wait for that peer in turn.
  const ClusterResult bounded = cluster("sgp", 4, c, straggler);
  const double paced = median_of(fast_rates(bounded, 3)), slow = bounded.peers[3].steps_per_s;
  MESSAGE("sgp, overlap_tau 1: fast peers " << paced << " steps/s beside the straggler's " << slow);
  CHECK(paced < 2.5 * slow);
}

TEST_CASE("cluster: with one link 100x slower, memory stays bounded and the run still converges") {
  ClusterSpec s;
  s.base = peer_spec(base());
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
  s.base = peer_spec(base());
  s.peers = 4;
  s.gossip.algorithm = "adpsgd";
  s.gossip.topology.kind = "random";
  // A fixed 2 ms step, whatever the build: the others are still training (3 s in all)
  // when the late peer asks one of them.
  s.base.train.emulated_step_s = 0.002;
  // Joins once the others have taken 128 steps (of 1,536), however slow the build: a delay
  // in seconds (0.25 s) was, under ASan on a loaded CI machine, over before the neighbour
  // the late peer pulled had trained (loss 2.18 against 2.21 at initialisation).
  s.start_after_steps = {0, 0, 0, 128};
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
  // A fixed 2 ms step (a few hundred a second, whatever the build): dense int8 gradients
  // to peer2 would need over 2 MB/s of its 0.25. (A slowdown would multiply the codecs'
  // time too, which under a sanitizer slows the steps until int8 fits.)
  s.base = peer_spec(base("data { synthetic_dim: 2000 synthetic_train: 2048 } train { epochs: 6 emulated_step_s: 0.002 }"));
  s.peers = 3;
  s.gossip.algorithm = "gossip_grad";
  s.gossip.topology.kind = "complete";
  s.gossip.options = "average_every: 0";
  s.gossip.adaptive.enabled = true;
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

TEST_CASE("cluster: an emulated step pads the step's work, not its waits: a fast all-reduce peer waiting on an 8x slower one "
          "overruns in at most 2 of its 32 steps, where counting its waits as work overruns nearly every one") {
  test::TempDir dir;
  ClusterSpec s;
  // 1024 samples in 2 shards of 16-row batches: 32 steps a peer, each 4 ms of emulated work
  // (32 ms for the slow peer), against microseconds of real work on logistic regression.
  s.base = peer_spec(base("data { synthetic_train: 1024 } train { epochs: 1 emulated_step_s: 0.004 }"));
  s.peers = 2;
  s.gossip.algorithm = "allreduce";
  s.gossip.topology.kind = "ring";
  s.slowdown = {1.0, 8.0};
  s.log_dir = dir.path();
  const ClusterResult r = run_cluster(s);
  REQUIRE(r.peers[0].steps == 32);
  // The fast peer waits about 28 ms a step for the slow one's gradient. Counted as work,
  // that wait would overrun its 4 ms in nearly every step; it is not work.
  std::istringstream log(test::read_file(dir.file("peer0.jsonl")));
  double overruns = -1;
  for (std::string line; std::getline(log, line);) {
    const auto at = line.find(R"("compute_overruns":)");
    if (line.find(R"("event":"end")") != std::string::npos && at != std::string::npos) {
      overruns = std::stod(line.substr(at + std::string(R"("compute_overruns":)").size()));
    }
  }
  MESSAGE("the fast peer's steps over their emulated 4 ms: " << overruns << " of 32");
  CHECK(overruns >= 0);
  // Its real work is microseconds: a step overruns only where the machine took the thread
  // away for 4 ms, which 2 of 32 allows; with the waits counted as work, 31 of 32 overran.
  CHECK(overruns <= 2);
  // And the pace is the slow peer's: the wait is still waited.
  CHECK(r.peers[0].steps_per_s == doctest::Approx(r.peers[1].steps_per_s).epsilon(0.15));
  CHECK(r.peers[0].steps_per_s < 1.0 / 0.02);
}
