// CHOCO-SGD (Koloskova, Stich, Jaggi, ICML 2019, Algorithm 2): compressed gossip with
// public copies. Peer i keeps x_i and public copies x^_j of itself and of each neighbour
// (all starting at 0). Round r of peer i:
//
//   x_i <- x_i - lr g_i                      (local steps: every step, rounds or not)
//   q_i = Q(x_i - x^_i)                      (encoded once: the same bytes to every neighbour)
//   x^_i <- x^_i + q_i                       (q_i as every receiver decodes it)
//   for each neighbour j, once its round-r delta is here:  x^_j <- x^_j + q_j
//   x_i <- x_i + gamma sum_j w_ij (x^_j - x^_i)   (w_ij = 1 / (1 + max(deg_i, deg_j)))
//
// Q is gossip.codec applied once per round (GossipEngine::encode_once), with no per-link
// error feedback: what Q leaves out stays in x_i - x^_i and goes in a later q, which is
// CHOCO's own error feedback. Sender and receivers add the same decoded q to x^_i, in the
// same order (the inbox never folds model deltas), so every copy of x^_i equals the
// sender's bit for bit. Metropolis-Hastings weights are symmetric and doubly stochastic on
// any undirected graph, so each round's consensus terms cancel over the peers: the sum of
// the x_i moves only by the local steps. For that, every peer's round r must use the
// copies as of round r: a round's consensus step waits for the neighbours' round-r deltas
// (local steps go on meanwhile, nothing blocks) and the next round starts after it, so a
// peer is at most one round ahead of a neighbour and holds at most a delta or two per
// neighbour. With gossip_every = k, a round starts at most every k steps. A directed
// topology (exponential) is refused with the reason at the first step.
//
// With `synchronous`, the step that begins a round also waits for the round's deltas (up
// to sync_timeout_s, and only while the neighbours it waits for are connected): the
// paper's lockstep, each step a whole round. A wait that runs out is logged
// (choco_lagging) and the round stays open, as without the option.
//
// CHOCO assumes reliable links: a delta lost on the way (a failed send, a refused update)
// leaves that receiver's copy off from the sender's; the receiver notices the gap in the
// round numbers, says so once and goes on with the copy it has.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/choco.pb.h"

namespace hearsay {
namespace {

class Choco final : public Algorithm {
 public:
  Choco(double consensus_step, bool synchronous) : consensus_step_(consensus_step), synchronous_(synchronous) {}
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    if (copies_.empty()) start(e);
    const BatchStats s = local_step(e, batch, lr, step);
    take(e);
    std::vector<float> xi;
    if (open_ && try_finish(e, xi)) open_ = false;
    if (!open_ && step % static_cast<uint64_t>(e.spec().gossip_every) == 0) {
      if (xi.empty()) xi = e.params_host();
      begin_round(e, xi);
      if (try_finish(e, xi)) open_ = false;
      if (open_ && synchronous_) wait_for_round(e, xi, step);
    }
    if (!xi.empty()) e.set_params_host(xi);
    return s;
  }

  // After the run: the deltas that arrived since the last step, and the open round's
  // consensus step if they complete it (no new round begins).
  void settle(GossipEngine& e) override {
    if (copies_.empty()) return;
    take(e);
    std::vector<float> xi;
    if (open_ && try_finish(e, xi)) open_ = false;
    if (!xi.empty()) e.set_params_host(xi);
  }

  uint64_t held_bytes() const override {
    uint64_t b = 0;
    for (const auto& [j, c] : copies_) {
      b += floats_held({&c.x});
      for (const auto& m : c.waiting) b += message_held_bytes(m);
    }
    return b;
  }

  // Copies (peer, x^), then how many deltas each copy has taken, then the round state.
  std::string save() const override {
    StateWriter w;
    w.put(static_cast<double>(copies_.size()));
    for (const auto& [j, c] : copies_) w.put(static_cast<double>(j)).put(c.x);
    w.put(static_cast<double>(copies_.size()));
    for (const auto& [j, c] : copies_) w.put(static_cast<double>(j)).put(static_cast<double>(c.rounds));
    w.put(static_cast<double>(round_)).put(open_ ? 1.0 : 0.0);
    return w.str();
  }

  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    copies_.clear();
    const double count = r.get();
    for (double i = 0; i < count; ++i) {
      const double j = r.get();
      if (!(j >= 0 && j < static_cast<double>(e.peers().size()))) throw InputError("checkpoint: choco copy of an unknown peer");
      copies_[static_cast<int>(j)].x = r.get_floats(e.model().num_params());
    }
    if (r.get() != count) throw InputError("checkpoint: choco state counts its copies twice, differently");
    for (double i = 0; i < count; ++i) {
      const auto it = copies_.find(static_cast<int>(r.get()));
      if (it == copies_.end()) throw InputError("checkpoint: choco round count for a copy it does not hold");
      it->second.rounds = static_cast<uint64_t>(r.get());
    }
    round_ = static_cast<uint64_t>(r.get());
    open_ = r.get() != 0;
    if (!r.done()) throw InputError("checkpoint: choco state has bytes left over");
    weights(e);
  }

 private:
  double consensus_step_;
  bool synchronous_;
  struct Copy {
    std::vector<float> x;                      // x^_j
    uint64_t rounds = 0;                       // deltas added to it (the sender's round)
    std::deque<GossipEngine::Message> waiting; // arrived deltas of later rounds, in order
    double w = 0;                              // w_ij (0 for the own copy)
  };

  void take(GossipEngine& e) {
    for (auto& m : e.take_async()) {
      if (m.kind != MessageKind::kModelDelta || copies_.count(m.from) == 0 || m.from == e.me()) continue;
      e.mixer().applied(e.clock(), m.clock);  // for the staleness statistics; deltas are never dropped
      copies_[m.from].waiting.push_back(std::move(m));
    }
  }

  void start(GossipEngine& e) {
    // Each round waits for every neighbour's delta, so the topology must be undirected:
    // the registry's undirected_topology makes the engine refuse a directed one.
    const std::vector<float> zero(e.model().num_params(), 0.0f);
    copies_[e.me()].x = zero;
    for (int j : e.topology().neighbours(e.me())) copies_[j].x = zero;
    weights(e);
  }

  void weights(GossipEngine& e) {
    const double mine = static_cast<double>(e.topology().neighbours(e.me()).size());
    for (auto& [j, c] : copies_) {
      if (j == e.me()) continue;
      const double theirs = static_cast<double>(e.topology().neighbours(j).size());
      c.w = 1.0 / (1.0 + std::max(mine, theirs));
    }
  }

  // q = Q(x_i - x^_i), x^_i += q, q to every neighbour.
  void begin_round(GossipEngine& e, const std::vector<float>& xi) {
    Copy& mine = copies_[e.me()];
    std::vector<float> diff(xi.size());
    for (size_t k = 0; k < diff.size(); ++k) diff[k] = xi[k] - mine.x[k];
    const auto q = e.encode_once(diff);
    for (size_t k = 0; k < mine.x.size(); ++k) mine.x[k] += q->decoded[k];
    ++round_;
    mine.rounds = round_;
    open_ = true;
    for (const auto& [j, c] : copies_) {
      if (j == e.me()) continue;
      GossipEngine::Message h;
      h.kind = MessageKind::kModelDelta;
      h.round = round_;
      e.send_encoded(j, std::move(h), q);
    }
  }

  // Adds each neighbour's deltas up to this round to its copy; once every copy is at this
  // round, the consensus step (into xi, read when needed). Returns whether it was taken.
  bool try_finish(GossipEngine& e, std::vector<float>& xi) {
    bool ready = true;
    for (auto& [j, c] : copies_) {
      if (j == e.me()) continue;
      while (!c.waiting.empty() && c.rounds < round_) {
        GossipEngine::Message& m = c.waiting.front();
        if (m.round <= c.rounds) {
          e.mixer().count_dropped(1);  // a round this copy has already taken (a resent round)
        } else {
          if (m.round != c.rounds + 1 && !warned_gap_) {
            std::fprintf(stderr, "hearsay: peer %s: choco: %s's public copy skipped rounds %llu to %llu (a delta was lost); "
                         "it may differ from %s's own from now on\n", e.peers()[e.me()].c_str(), e.peers()[j].c_str(),
                         static_cast<unsigned long long>(c.rounds + 1), static_cast<unsigned long long>(m.round - 1),
                         e.peers()[j].c_str());
            warned_gap_ = true;
          }
          e.for_each_part(m, [&](size_t at, const float* y, size_t n) {
            for (size_t k = 0; k < n && at + k < c.x.size(); ++k) c.x[at + k] += y[k];
          });
          c.rounds = m.round;
        }
        c.waiting.pop_front();
      }
      ready = ready && c.rounds >= round_;
    }
    if (!ready) return false;
    if (xi.empty()) xi = e.params_host();
    const Copy& mine = copies_[e.me()];
    const double gamma = consensus_step_;
    std::vector<double> sum(xi.size(), 0.0);
    for (const auto& [j, c] : copies_) {
      if (j == e.me()) continue;
      for (size_t k = 0; k < sum.size(); ++k) sum[k] += c.w * (static_cast<double>(c.x[k]) - mine.x[k]);
    }
    for (size_t k = 0; k < xi.size(); ++k) xi[k] = static_cast<float>(xi[k] + gamma * sum[k]);
    return true;
  }

  // The lockstep: waits for the open round's deltas and takes its consensus step into xi.
  // Gives up at sync_timeout_s, or at once when a neighbour it waits for is not connected
  // (its delta may never come); the round then stays open.
  void wait_for_round(GossipEngine& e, std::vector<float>& xi, uint64_t step) {
    const auto behind = [&] {
      std::vector<int> out;
      for (const auto& [j, c] : copies_) {
        if (j != e.me() && c.rounds < round_) out.push_back(j);
      }
      return out;
    };
    e.wait_until(
        [&] {
          take(e);
          if (try_finish(e, xi)) return true;
          for (int j : behind()) {
            if (!e.connected(j)) return true;
          }
          return false;
        },
        e.spec().sync_timeout_s);
    const std::vector<int> missing = behind();
    open_ = !missing.empty();
    for (int j : missing) {
      auto ev = e.log().event("choco_lagging");
      ev.add("step", static_cast<int64_t>(step)).add("round", static_cast<int64_t>(round_)).add("neighbour", e.peers()[j]);
      e.log().write(ev.add("connected", e.connected(j)));
    }
  }

  std::map<int, Copy> copies_;  // x^_j for this peer and each neighbour
  uint64_t round_ = 0;          // this peer's rounds begun
  bool open_ = false;           // round_ has begun, its consensus step not yet taken
  bool warned_gap_ = false;
};

}  // namespace

// No new_site_leader: its public copies must stay in step with each neighbour's copy of them.
const bool registered = register_algorithm<algorithms::ChocoOptions>({
    .name = "choco",
    .undirected_topology = true,
    .joins_from_neighbour = true,
    .model_buffers = 2,  // its own public copy and at least one neighbour's
    .sends = {{MessageKind::kModelDelta, Compression::kUpdate}},
    .check = [](const algorithms::ChocoOptions& o, const GossipSpec&, int) {
      if (!(o.consensus_step() > 0 && o.consensus_step() <= 1)) throw OptionError("consensus_step", "must be in (0, 1]");
    },
    .make = [](const GossipSpec&, const algorithms::ChocoOptions& o) { return std::make_unique<Choco>(o.consensus_step(), o.synchronous()); },
});

}  // namespace hearsay
