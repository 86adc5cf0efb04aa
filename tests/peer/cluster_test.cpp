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
    const ClusterResult r = cluster(algorithm, 8, base(noniid), std::vector<double>(8, 20.0));
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

namespace {

// Peers that start apart and take (almost) no gradient steps: what the gossip alone does to
// their models. lr 1e-30 moves no fp32 parameter of this size.
// `adjust` changes the spec before the run (a codec, a consensus step).
ClusterResult averaging_only(const std::string& algorithm, const std::string& topology, int n = 8,
                             const std::function<void(ClusterSpec&)>& adjust = {}) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(R"(
    name: "avg" seed: 11
    model { kind: MLP hidden: [16] }
    data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 8 num_classes: 4 }
    optim { lr: 1e-30 momentum: 0 }
    train { batch_size: 16 epochs: 16 eval_every_steps: 1000000 }
    log { every_steps: 16 }
  )", "averaging-test"));
  s.peers = n;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = topology;
  s.gossip.mixer.weighting = "polynomial";  // staleness-weighted shares, as by default
  s.distinct_init = true;
  s.slowdown = std::vector<double>(n, 20.0);
  if (adjust) adjust(s);
  return run_cluster(s);
}

std::vector<double> mean_of(const std::vector<std::vector<float>>& models) {
  std::vector<double> m(models[0].size(), 0.0);
  for (const auto& x : models) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += x[i];
  }
  for (auto& v : m) v /= static_cast<double>(models.size());
  return m;
}

double distance(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

// Mean distance of the peers' models from their mean.
double spread(const std::vector<std::vector<float>>& models) {
  const auto m = mean_of(models);
  double total = 0;
  for (const auto& x : models) total += distance(std::vector<double>(x.begin(), x.end()), m);
  return total / static_cast<double>(models.size());
}

// The averaging invariant: the models meet (spread below 1e-3 of where it started) on the
// mean they started with (moved less than 1e-4 of the starting spread).
void check_mean_kept_and_consensus(const ClusterResult& r) {
  const double start_spread = spread(r.initial_params), end_spread = spread(r.final_params);
  const double moved = distance(mean_of(r.initial_params), mean_of(r.final_params));
  MESSAGE("spread " << start_spread << " -> " << end_spread << "; the mean moved " << moved);
  CHECK(end_spread < 1e-3 * start_spread);
  CHECK(moved < 1e-4 * start_spread);
}

}  // namespace

TEST_CASE("cluster: adpsgd averages in atomic pairs: with no gradient the mean of the models stays put and every "
          "model converges to it") {
  // The mean is conserved up to fp32 rounding (a pair's exchange conserves the sum exactly
  // in real arithmetic) and the exchanges cut off when the peers stop, which are tiny once
  // the models agree.
  check_mean_kept_and_consensus(averaging_only("adpsgd", "random"));
}

namespace {

// choco's saved state (src/peer/algorithms/choco.cpp): its public copies x^_j (its own
// among them), then how many deltas each copy has taken, when the state says.
struct PublicCopy {
  std::vector<float> x;
  double rounds = -1;  // -1: not in the state
};

std::map<int, PublicCopy> public_copies(const std::string& state) {
  size_t at = 0;
  auto get = [&] {
    double v = 0;
    REQUIRE(at + sizeof v <= state.size());
    std::memcpy(&v, state.data() + at, sizeof v);
    at += sizeof v;
    return v;
  };
  std::map<int, PublicCopy> out;
  for (double count = get(); count > 0; --count) {
    const int j = static_cast<int>(get());
    const size_t n = static_cast<size_t>(get());
    REQUIRE(at + 4 * n <= state.size());
    out[j].x.resize(n);
    std::memcpy(out[j].x.data(), state.data() + at, 4 * n);
    at += 4 * n;
  }
  if (at < state.size()) {
    for (double count = get(); count > 0; --count) {
      const int j = static_cast<int>(get());
      out[j].rounds = get();
    }
  }
  return out;
}

// A lossy codec with a residual that would differ per link (top-k, 10%); 768 steps, so
// that the rounds cut off when the peers stop are tiny.
constexpr double kChocoConsensusStep = 0.3;  // gamma

void choco_topk(ClusterSpec& s) {
  s.base.train.epochs = 48;
  s.gossip.codec.name = "topk";
  s.gossip.codec.density = 0.1;
  s.gossip.options = "consensus_step: " + std::to_string(kChocoConsensusStep);
}

}  // namespace

TEST_CASE("cluster: choco's public copies: every receiver's copy of x^_i is the sender's own, bit for bit, under top-k") {
  const ClusterResult r = averaging_only("choco", "ring", 8, choco_topk);
  std::vector<std::map<int, PublicCopy>> copies;
  for (const auto& state : r.algorithm_state) copies.push_back(public_copies(state));
  int compared = 0, differ = 0, lagging = 0;
  double max_diff = 0;
  for (size_t i = 0; i < copies.size(); ++i) {
    const auto own = copies[i].find(static_cast<int>(i));
    REQUIRE(own != copies[i].end());
    for (size_t k = 0; k < copies.size(); ++k) {
      const auto theirs = copies[k].find(static_cast<int>(i));
      if (k == i || theirs == copies[k].end()) continue;
      // A copy that has not yet taken the sender's last deltas (in flight when the run
      // ended) is not comparable.
      if (theirs->second.rounds != own->second.rounds) {
        ++lagging;
        continue;
      }
      ++compared;
      REQUIRE(theirs->second.x.size() == own->second.x.size());
      if (std::memcmp(theirs->second.x.data(), own->second.x.data(), 4 * own->second.x.size()) != 0) ++differ;
      for (size_t e = 0; e < own->second.x.size(); ++e) {
        max_diff = std::max(max_diff, static_cast<double>(std::fabs(theirs->second.x[e] - own->second.x[e])));
      }
    }
  }
  MESSAGE("copies compared " << compared << " (lagging " << lagging << "), differing " << differ << ", largest difference "
                             << max_diff);
  CHECK(compared >= 4);  // about half are at the sender's last round when the run stops
  CHECK(differ == 0);
}

// The peers' own rounds (their public copy of themselves counts them).
std::vector<double> own_rounds(const ClusterResult& r) {
  std::vector<double> rounds;
  for (size_t i = 0; i < r.algorithm_state.size(); ++i) {
    rounds.push_back(public_copies(r.algorithm_state[i])[static_cast<int>(i)].rounds);
  }
  return rounds;
}

TEST_CASE("cluster: choco in lockstep (synchronous) keeps the average of the models and brings them to consensus, "
          "under top-k") {
  // Every step is a whole round, whatever the machine's load: the consensus reached
  // depends on the rounds alone. No slowdown: each round waits for the messages anyway.
  const ClusterResult r = averaging_only("choco", "ring", 8, [](ClusterSpec& s) {
    choco_topk(s);
    s.gossip.options += " synchronous: true";
    s.slowdown = std::vector<double>(8, 1.0);
  });
  const auto rounds = own_rounds(r);
  MESSAGE("rounds " << *std::min_element(rounds.begin(), rounds.end()) << " to "
                    << *std::max_element(rounds.begin(), rounds.end()));
  CHECK(*std::min_element(rounds.begin(), rounds.end()) == 768);
  check_mean_kept_and_consensus(r);
}

// CHOCO's graph is fixed: a neighbour gone stops every round that needs it. Its neighbours
// (peer1, peer3) see its link down and stop waiting at once; their own open round then
// never ends, so peer0, whose round needs theirs, waits once, for sync_timeout_s, and
// goes on without lockstep from there: one wait, not one a round.
TEST_CASE("cluster: choco in lockstep waits no longer for a neighbour that is gone, and once for the rounds it stops") {
  test::TempDir dir;
  const ClusterResult r = averaging_only("choco", "ring", 4, [&](ClusterSpec& s) {
    choco_topk(s);
    s.base.train.epochs = 16;  // 512 steps
    s.gossip.options += " synchronous: true";
    s.gossip.sync_timeout_s = 2;
    s.slowdown = std::vector<double>(4, 1.0);
    s.crash_after_steps = {0, 0, 32, 0};
    s.log_dir = dir.path();
  });
  const auto lagging = [&](const std::string& peer) {
    std::istringstream in(test::read_file(dir.file(peer + ".jsonl")));
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) {
      if (line.find(R"("event":"choco_lagging")") != std::string::npos) out.push_back(line);
    }
    return out;
  };
  // One wait each: every event of a peer comes from the same step. A wait that ends
  // because peer2 is gone also names a neighbour whose delta had not come yet.
  const auto one_wait = [](const std::vector<std::string>& events) {
    for (const auto& e : events) MESSAGE(e);
    REQUIRE(!events.empty());
    const auto step_of = [](const std::string& e) { return e.substr(e.find(R"("step":)"), e.find(R"(,"round")") - e.find(R"("step":)")); };
    for (const auto& e : events) CHECK(step_of(e) == step_of(events[0]));
  };
  MESSAGE("wall " << r.wall_s << " s");
  CHECK(r.wall_s < 10);  // one 2 s wait, not 480
  for (const std::string peer : {"peer1", "peer3"}) {
    const auto events = lagging(peer);
    one_wait(events);
    const std::string gone = R"("neighbour":"peer2","connected":false)";
    CHECK(std::any_of(events.begin(), events.end(), [&](const std::string& e) { return e.find(gone) != std::string::npos; }));
  }
  const auto events = lagging("peer0");
  one_wait(events);
  for (const auto& e : events) CHECK(e.find(R"("connected":true)") != std::string::npos);
}

TEST_CASE("cluster: choco with local steps going on keeps the average of the models and moves them toward consensus, "
          "under top-k") {
  // Steps paced at 2 ms, so that rounds keep coming on a loaded machine: a round finishes
  // in whichever step finds its deltas in, and how many do depends on the machine (70 of
  // 768 quiet, 5 to 12 beside a build under AddressSanitizer with 20x slowed 0.1 ms steps).
  const ClusterResult r = averaging_only("choco", "ring", 8, [](ClusterSpec& s) {
    choco_topk(s);
    s.base.train.emulated_step_s = 0.002;
    s.slowdown = std::vector<double>(8, 1.0);
  });
  const auto before = mean_of(r.initial_params), after = mean_of(r.final_params);
  const double start_spread = spread(r.initial_params), end_spread = spread(r.final_params);
  const double moved = distance(before, after);
  const auto rounds = own_rounds(r);
  MESSAGE("spread " << start_spread << " -> " << end_spread << "; the mean moved " << moved << "; rounds "
                    << *std::min_element(rounds.begin(), rounds.end()) << " to "
                    << *std::max_element(rounds.begin(), rounds.end()));
  CHECK(end_spread < 0.5 * start_spread);  // toward consensus
  // A round's consensus terms cancel over the peers once every peer has taken that round.
  // When the run stops, a peer may be one round ahead of a neighbour (choco.cpp): its last
  // step, gamma sum_j w_ij (x^_j - x^_i) with sum_j w_ij < 1, has no counterpart yet. That
  // one uncancelled round moves the mean by less than gamma times the copies' distance,
  // about the final spread; a mean that drifted round after round would be far above it.
  CHECK(moved < 1e-4 * start_spread + kChocoConsensusStep * end_spread);
}

namespace {

// sgp's saved state (src/peer/algorithms/sgp.cpp) begins with its push-sum weight w.
double push_sum_weight(const std::string& state) {
  double w = 0;
  REQUIRE(state.size() >= sizeof w);
  std::memcpy(&w, state.data(), sizeof w);
  return w;
}

// Every way a push can be late or lost: latency with jitter; one link (0 -> 1) slower
// than the pushes sent over it, so they fold into one pending message (coalescing); one
// peer 2x slower; 5% of frames lost, and a 0.2 s outage of the link 2 -> 3, both reported
// to the sender as failed sends; numerators in fp16. 1,024 steps (about 0.5 s), so that
// the run outlasts the delays.
void hostile_links(ClusterSpec& s) {
  s.base.train.epochs = 64;
  s.link.latency_s = 0.002;
  s.link.jitter_s = 0.001;
  s.link.loss = 0.05;
  LinkModel slow = s.link;
  slow.bandwidth_bps = 1e6;  // a push takes about 4 ms, one is made every 3 steps (1.5 ms)
  s.links[{0, 1}] = slow;
  LinkModel down = s.link;
  down.outages = {{0.05, 0.25}};
  s.links[{2, 3}] = down;
  s.slowdown[5] *= 2;
  s.gossip.model_codec = "fp16";
  // Without the delay bound: a push the emulated link loses (it tells the sender, whose
  // mass comes back) is owed to its receiver until sync_timeout_s, and at 5% loss the
  // bound would stall the run on every one (docs/ALGORITHMS.md, sgp). Mass is kept the
  // same way either way; the bound's own runs are the centralized and consensus tests.
  s.gossip.options = "overlap_tau: 0";
}

}  // namespace

TEST_CASE("cluster: sgp conserves push-sum mass: with no gradient, the sum of the weights stays N and the sum of the "
          "numerators stays put through delays, coalescing, failed sends and loss, and every de-biased model converges "
          "to the initial mean") {
  const int n = 8;
  const ClusterResult r = averaging_only("sgp", "exponential", n, hostile_links);
  // Numerators x_i = w_i z_i (the model holds z_i); at the start w_i = 1.
  double weights = 0;
  std::vector<std::vector<float>> x_end;
  for (int i = 0; i < n; ++i) {
    const double w = push_sum_weight(r.algorithm_state[i]);
    weights += w;
    x_end.push_back(r.final_params[i]);
    for (auto& v : x_end.back()) v = static_cast<float>(v * w);
  }
  const auto start = mean_of(r.initial_params);
  const double start_spread = spread(r.initial_params), end_spread = spread(r.final_params);
  const double x_moved = distance(mean_of(x_end), start), z_off = distance(mean_of(r.final_params), start);
  MESSAGE("sum of w " << weights << " (N = " << n << ", off by " << weights - n << "); mean of x moved " << x_moved
                      << ", mean of z is " << z_off << " off the initial mean; spread " << start_spread << " -> "
                      << end_spread);
  // w travels as a double: double rounding only. x is rescaled (z <-> x) and summed in
  // fp32 every step: a thousand steps of roundings of 6e-8, far below 1e-4 of the spread.
  // The z_i agree to about 1e-4 of the spread: each push's fp16 rounding stays with its
  // sender, so the receiver's x / w is a little off until the next pushes mix it.
  CHECK(std::fabs(weights - n) < 1e-9 * n);
  CHECK(x_moved < 1e-4 * start_spread);
  // How close the peers come within the run's steps depends on how many pushes arrive per
  // step, a ratio of compute to message time that ThreadSanitizer's slowdown distorts
  // (one TSan run ended at 0.13 of the spread); conservation above holds whatever the
  // timing and is checked there too.
  if (!test::kSanitized) {
    CHECK(end_spread < 1e-3 * start_spread);  // consensus
    CHECK(z_off < 1e-3 * start_spread);       // ... on the initial mean
  }
}

TEST_CASE("cluster: dpsgd's Metropolis-Hastings weights keep the mean of the models on a graph of unequal degrees and "
          "bring every model to it") {
  // The star: the hub has 7 neighbours, each spoke 1. Weights 1/(1 + degree) are not
  // doubly stochastic there, and the models would meet elsewhere than their mean.
  check_mean_kept_and_consensus(averaging_only("dpsgd", "star"));  // fp32 rounding only
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
