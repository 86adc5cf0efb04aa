// Stochastic gradient push (Assran et al., ICML 2019), overlapped. A peer keeps a
// push-sum weight w (starting at 1) and the numerator x = w z, where z, the de-biased
// model, is what the model buffer holds and gradients are taken at. Each step:
//   z <- optimizer step on z with g(z)   (i.e. x <- x - w lr g(z): the step is taken on
//                                          the de-biased model, so a peer whose weight is
//                                          momentarily small does not take a huge step)
//   keep 1/(1+k) of (x, w), push the same share to each of the k out-neighbours of the
//   round (one-peer exponential graph by default), add in the (x, w) that arrived, and
//   z <- x / w.
// Mass is conserved (pending pushes to a slow link are summed, never dropped), so the
// de-biased models reach consensus on directed graphs without anyone waiting. A peer
// whose weight has fallen below 1/256 skips its push until mass arrives.
#include "../algorithm.h"

namespace hearsay {
namespace {

constexpr double kMinWeight = 1.0 / 256;

class Sgp final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    Backend& b = e.model().backend();
    const size_t n = e.model().num_params();
    const BatchStats s = local_step(e, x, labels, batch, lr);
    b.scale(n, static_cast<float>(w_), e.model().params());  // z -> x
    const auto targets = e.live_targets(static_cast<int64_t>(step));
    // A peer whose pushes have not been answered for a while (its in-neighbours are slow
    // or their mass is still in flight) holds on to what it has rather than halving its
    // weight toward zero, where x / w would blow up. Mass is still conserved.
    if (!targets.empty() && step % static_cast<uint64_t>(e.spec().gossip_every) == 0 && w_ >= kMinWeight) {
      const double keep = 1.0 / (1.0 + static_cast<double>(targets.size()));
      b.scale(n, static_cast<float>(keep), e.model().params());
      w_ *= keep;
      const auto share = e.params_host();
      for (int t : targets) e.send(t, wire::PUSH_SUM_WEIGHT, share, w_);
    }
    for (auto& m : e.take_async()) {
      if (m.kind != wire::PUSH_SUM_WEIGHT) continue;
      e.mixer().gradient(e.clock(), m.clock);  // recorded for the staleness statistics; mass is never dropped
      e.axpy_params(1.0, m.data);
      w_ += m.push_sum_weight;
    }
    b.scale(n, static_cast<float>(1.0 / w_), e.model().params());  // x -> z
    return s;
  }

  std::string save() const override { return StateWriter().put(w_).str(); }
  void load(const std::string& state, GossipEngine&) override {
    StateReader r(state);
    w_ = r.get();
    if (!(w_ > 0) || !r.done()) throw InputError("checkpoint: sgp state is not one positive push-sum weight");
  }

 private:
  double w_ = 1.0;
};

}  // namespace

std::unique_ptr<Algorithm> make_sgp() { return std::make_unique<Sgp>(); }

}  // namespace hearsay
