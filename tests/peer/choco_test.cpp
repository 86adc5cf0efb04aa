// CHOCO-SGD's defining invariants (Koloskova et al. 2019): every receiver's copy of a peer's
// public x^ is that peer's own, bit for bit; the average of the models is kept while they
// meet, in lockstep and with local steps going on.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "averaging.h"
#include "hearsay/cluster.h"
#include "test_util.h"

using namespace hearsay;
using namespace hearsay::test;

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

TEST_CASE("choco: public copies: every receiver's copy of x^_i is the sender's own, bit for bit, under top-k") {
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

TEST_CASE("choco: in lockstep (synchronous) keeps the average of the models and brings them to consensus, "
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
TEST_CASE("choco: in lockstep waits no longer for a neighbour that is gone, and once for the rounds it stops") {
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

TEST_CASE("choco: with local steps going on keeps the average of the models and moves them toward consensus, "
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
