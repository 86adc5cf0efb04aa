// Stochastic Gradient Push (Assran et al., ICML 2019), as the paper states it. A peer keeps
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
// its sender gave away. Peers never wait for pushes to arrive (the overlap); its delay
// bound tau is gossip.overlap_tau: a peer does not start step k while a push it made at
// step k - tau or before is still unsent (0: no bound); the paper's OSGP also waits for
// the pushes its in-neighbours made tau steps before, which is not built (docs/ALGORITHMS.md,
// "Where the faithful rule loses"). A peer whose push would leave its weight below 1/16
// (its in-neighbours slower than it, or gone) keeps its mass until some arrives: a step of lr g on x moves z by lr g / w, and the paper's analysis assumes w
// bounded below (peers in near lock-step); that conserves mass too. Mass is lost only where a
// receiver refuses a push (the update guard, a quarantine) or where a transport reported a
// frame sent that its receiver never took in (the receiver crashed).
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
    if (tau > 0 && step >= tau) e.wait_sent(step - tau);
    const BatchStats s = site_gradient(e, batch, step);  // at z
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
    if (w_ * keep < kMinWeight) return;  // the weight this push would leave: never below the floor
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

  // With the model buffer holding x: the pushes that arrived and the mass given back.
  void take_in(GossipEngine& e) {
    for (auto& m : e.take_async()) {
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
};

}  // namespace

const bool registered = register_algorithm<algorithms::SgpOptions>({
    .name = "sgp",
    .joins_from_neighbour = true,
    .sends = {{MessageKind::kPushSum, Compression::kModel}},
    .check = [](const algorithms::SgpOptions& o, const GossipSpec&, int) {
      if (o.overlap_tau() < 0) throw OptionError("overlap_tau", "must be >= 0 (0: no bound), got " + std::to_string(o.overlap_tau()));
    },
    .make = [](const GossipSpec&, const algorithms::SgpOptions& o) { return std::make_unique<Sgp>(o.overlap_tau()); },
});

}  // namespace hearsay
