// AD-PSGD (Lian et al., ICML 2018): after each local step a peer sends its model to one
// neighbour and asks for that neighbour's model back; each side, on receipt, moves its
// model toward the other's: x <- (1 - w) x + w y, w = 1/2 scaled by the staleness
// weight. Nobody waits: requests and replies are applied between steps, whenever they
// arrive, so there is no deadlock whatever the graph.
#include "../algorithm.h"

namespace hearsay {
namespace {

class Adpsgd final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    for (auto& m : e.take_async()) {
      if (m.kind != wire::MODEL) continue;
      if (m.reply_requested) e.send(m.from, wire::MODEL, e.params_host());  // our model before mixing
      const auto d = e.mixer().model(e.clock(), m.clock, 0.5, e.samples_seen(), m.samples);
      if (d.drop) continue;
      e.note_model_distance(e.peers()[m.from], m.data);
      e.mix_neighbour_model(m.from, m.data, d.weight);
    }
    const BatchStats s = local_step(e, x, labels, batch, lr);
    if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0) {
      const auto params = e.params_host();
      for (int t : e.live_targets(static_cast<int64_t>(step))) {
        e.send(t, wire::MODEL, params, 0, false, 0, 0, /*reply_requested=*/true);
      }
    }
    return s;
  }
};

}  // namespace

std::unique_ptr<Algorithm> make_adpsgd() { return std::make_unique<Adpsgd>(); }

}  // namespace hearsay
