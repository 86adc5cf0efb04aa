// Stochastic Gradient Push (Assran et al., ICML 2019), as the paper states it (OSGP's bounded delay). A peer keeps
// a numerator x and a push-sum weight w (w = 1 at the start); the de-biased model
// z = x / w is what the model buffer holds between steps, and where gradients are taken.
// Each step k:
//
//   g = grad F(z)
//   x <- x - lr g                (the optimizer's step, on the numerator)
//   keep 1/(1+m) of (x, w); push the same share to each of the round's m out-neighbours
//   (the one-peer exponential graph by default), numerator and weight in one message
//   x <- x + the numerators received;  w <- w + the weights received
//   z <- x / w
//
// Mass is conserved: the weights sum to N, and with no gradient the numerators' sum stays
// put. Nothing is dropped for staleness (a push is summed in however late it comes);
// pushes waiting on a slow link fold into one (their sum); a push whose send fails (link
// down, frame lost) comes back to its sender, who adds it to its own (x, w); a lossy model
// codec's rounding of a numerator comes back the same way, so a receiver adds exactly what
// its sender gave away. Peers do not wait for each round's pushes (the overlap, OSGP); the
// delay is bounded by gossip's overlap_tau, tau (1, the paper's): a peer does not start
// step k until the pushes its in-neighbours made in rounds k - tau and before have arrived
// and its own have left. Which peers push to it in a round is the topology's (a fixed
// one: its targets repeat with its period()); an in-neighbour that is not connected is
// not waited for, and one that owes a round for longer than sync_timeout_s (it joined
// late, or restarted from a checkpoint) is not waited for until it has caught up. A peer
// whose push would leave its weight below 1/16 (its in-neighbours slower than it, with
// tau = 0, no bound, not the paper's; or gone) keeps its mass until some arrives: a step
// of lr g on x moves z by lr g / w, and the paper's analysis assumes w bounded below, as
// its delay bound keeps it while its in-neighbours push. Mass is lost only where a receiver refuses a push (the update guard, a
// quarantine) or where a transport reported a frame sent that its receiver never took in
// (the receiver crashed).
#include <algorithm>
#include <optional>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/sgp.pb.h"

namespace hearsay {
namespace {

constexpr double kMinWeight = 1.0 / 16;

class Sgp final : public Algorithm {
 public:
  explicit Sgp(int overlap_tau) : overlap_tau_(overlap_tau) {}
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const uint64_t tau = static_cast<uint64_t>(overlap_tau_);
    if (tau > 0 && step >= tau) {
      e.wait_sent(step - tau);
      wait_for_in_neighbours(e, step - tau);
    }
    const BatchStats s = e.gradient(batch, step);  // at z
    Backend& b = e.model().backend();
    const size_t n = e.model().num_params();
    b.scale(n, static_cast<float>(w_), e.model().params());  // z -> x
    e.optimizer().step(e.model().params(), e.model().grads(), lr);
    push(e, step);
    take_in(e);
    b.scale(n, static_cast<float>(1.0 / w_), e.model().params());  // x -> z
    return s;
  }

  void settle(GossipEngine& e) override {
    Backend& b = e.model().backend();
    const size_t n = e.model().num_params();
    b.scale(n, static_cast<float>(w_), e.model().params());
    take_in(e);
    b.scale(n, static_cast<float>(1.0 / w_), e.model().params());
  }

  std::string save() const override { return StateWriter().put(w_).str(); }
  void load(const std::string& state, GossipEngine&) override {
    StateReader r(state);
    w_ = r.get();
    if (!(w_ > 0) || !r.done()) throw InputError("checkpoint: sgp state is not one positive push-sum weight");
  }

 private:
  int overlap_tau_;
  // With the model buffer holding x.
  void push(GossipEngine& e, uint64_t step) {
    if (step % static_cast<uint64_t>(e.spec().gossip_every) != 0) return;
    const auto targets = e.live_targets(static_cast<int64_t>(step));
    if (targets.empty()) return;
    const double keep = 1.0 / (1.0 + static_cast<double>(targets.size()));
    // The weight this push would leave: never below the floor. With the delay bound a
    // weight falls that low only while no in-neighbour is waited for (they are gone, or
    // lag); its out-neighbours then wait for this peer's push until sync_timeout_s.
    if (w_ * keep < kMinWeight) return;
    e.model().backend().scale(e.model().num_params(), static_cast<float>(keep), e.model().params());
    w_ *= keep;
    if (e.gossip_on_device()) {
      // One device copy for every target. Under model_codec none it travels raw (one
      // download for all links); a lossy model codec falls back to the host encoder, whose
      // rounding comes back to this peer as a host vector (GossipEngine::send_device).
      const auto share = e.snapshot_device(e.model().params(), e.model().num_params());
      for (int t : targets) {
        GossipEngine::Message m;
        m.kind = MessageKind::kPushSum;
        m.push_sum_weight = w_;
        e.send_device(t, std::move(m), share);
      }
      return;
    }
    const auto share = e.params_host();
    for (int t : targets) {
      GossipEngine::Message m;
      m.kind = MessageKind::kPushSum;
      m.push_sum_weight = w_;
      e.send(t, std::move(m), share);
    }
  }

  // The pushes that arrived: each sender's newest round noted; kept by the caller.
  std::vector<GossipEngine::Message> arrivals(GossipEngine& e) {
    auto got = e.take_async();
    for (const auto& m : got) {
      if (m.kind != MessageKind::kPushSum || m.from < 0) continue;
      const auto j = static_cast<size_t>(m.from);
      if (heard_.size() <= j) heard_.resize(e.peers().size(), -1);
      heard_[j] = std::max(heard_[j], static_cast<int64_t>(m.step));
    }
    return got;
  }

  // OSGP's bound: the pushes of this peer's in-neighbours in rounds up to `round` have
  // arrived (what came while waiting is kept for take_in).
  void wait_for_in_neighbours(GossipEngine& e, uint64_t round) {
    const size_t n = e.peers().size();
    heard_.resize(n, -1);
    owed_.resize(n, -1);
    lagging_.resize(n, 0);
    const auto every = static_cast<uint64_t>(e.spec().gossip_every);
    for (uint64_t q = next_round_; q <= round; ++q) {
      if (q % every != 0) continue;
      for (int j : in_neighbours(e, q)) owed_[static_cast<size_t>(j)] = static_cast<int64_t>(q);
    }
    next_round_ = round + 1;
    const auto owing = [&](size_t j) { return owed_[j] > heard_[j] && e.connected(static_cast<int>(j)); };
    const bool all = e.wait_until(
        [&] {
          for (auto& m : arrivals(e)) hold(std::move(m));
          for (size_t j = 0; j < n; ++j) {
            if (lagging_[j] && heard_[j] >= owed_[j]) lagging_[j] = 0;  // caught up: waited for again
            if (!lagging_[j] && owing(j)) return false;
          }
          return true;
        },
        e.spec().sync_timeout_s);
    if (all) return;
    for (size_t j = 0; j < n; ++j) {
      if (lagging_[j] || !owing(j)) continue;
      lagging_[j] = 1;
      auto ev = e.log().event("sgp_lagging");
      ev.add("step", static_cast<int64_t>(round) + overlap_tau_).add("neighbour", e.peers()[j]);
      e.log().write(ev.add("owed_round", owed_[j]).add("heard_round", heard_[j]));
    }
  }

  // Keeps an arrival taken while waiting for take_in, a sender's pushes summed into one
  // (as the inbox folds them), so that what a long wait holds stays one model a sender.
  void hold(GossipEngine::Message&& m) {
    if (m.kind == MessageKind::kPushSum) {
      for (auto& h : held_) {
        if (h.kind == MessageKind::kPushSum && h.from == m.from) return h.absorb(std::move(m));
      }
    }
    held_.push_back(std::move(m));
  }

  // The peers whose round-q targets include this one (the topology's period keys a cache).
  const std::vector<int>& in_neighbours(GossipEngine& e, uint64_t q) {
    const int64_t period = e.topology().period();
    static const std::vector<int> none;
    if (period <= 0) return none;
    const auto key = static_cast<size_t>(q % static_cast<uint64_t>(period));
    if (in_cache_.size() != static_cast<size_t>(period)) in_cache_.assign(static_cast<size_t>(period), {});
    auto& slot = in_cache_[key];
    if (!slot.has_value()) {
      Rng unused(0, 0);  // a fixed topology's targets draw nothing
      std::vector<int> in;
      for (int j = 0; j < static_cast<int>(e.peers().size()); ++j) {
        if (j == e.me()) continue;
        const auto t = e.topology().targets(j, static_cast<int64_t>(q), unused);
        if (std::find(t.begin(), t.end(), e.me()) != t.end()) in.push_back(j);
      }
      slot = std::move(in);
    }
    return *slot;
  }

  // With the model buffer holding x: the pushes that arrived and the mass given back.
  void take_in(GossipEngine& e) {
    std::vector<GossipEngine::Message> got = std::move(held_);
    held_.clear();
    for (auto& m : arrivals(e)) got.push_back(std::move(m));
    for (auto& m : got) {
      if (m.kind != MessageKind::kPushSum) continue;
      e.mixer().applied(e.clock(), m.clock);  // staleness recorded; push-sum mass is never dropped
      e.axpy_params(1.0, m);
      w_ += m.push_sum_weight;
    }
    const auto back = e.take_returned();
    if (!back.data.empty()) e.axpy_params(1.0, back.data);
    w_ += back.push_sum_weight;
  }

  double w_ = 1.0;
  // The delay bound's state, by peer index: the newest round heard from each peer, the
  // newest round each in-neighbour owes, and whether one is lagging (not waited for).
  std::vector<int64_t> heard_, owed_;
  std::vector<char> lagging_;
  uint64_t next_round_ = 0;  // the first round whose in-neighbours are not yet counted
  std::vector<GossipEngine::Message> held_;  // taken while waiting, for take_in
  std::vector<std::optional<std::vector<int>>> in_cache_;
};

}  // namespace

const bool registered = register_algorithm<algorithms::SgpOptions>({
    .name = "sgp",
    .joins_from_neighbour = true,
    .new_site_leader = true,  // its push-sum weight starts at 1 again (the dead leader's mass is lost anyway)
    .sends = {{MessageKind::kPushSum, Compression::kModel}},
    .check = [](const algorithms::SgpOptions& o, const GossipSpec& spec, int peers) {
      if (o.overlap_tau() < 0) throw OptionError("overlap_tau", "must be >= 0 (0: no bound), got " + std::to_string(o.overlap_tau()));
      if (o.overlap_tau() > 0 && peers >= 2 && make_engine_topology(spec, peers)->period() <= 0) {
        throw OptionError("overlap_tau", "the delay bound waits for each round's pushes from the peers that send to this one, "
                          "which topology '" + spec.topology.kind + "' draws at random; use a fixed topology (exponential, "
                          "the paper's; ring, torus, complete, star, random_regular) or overlap_tau: 0 (no bound)");
      }
    },
    .make = [](const GossipSpec&, const algorithms::SgpOptions& o) { return std::make_unique<Sgp>(o.overlap_tau()); },
});

}  // namespace hearsay
