// Gradient gossip: each step a peer pushes its minibatch gradient to its neighbours and
// adds, to its own, the gradients that arrived, each scaled by the staleness weight
// f(tau); the optimizer (momentum included) steps on that sum with lr / (1 + k), k the
// number of neighbours a peer sends to, so a step is an average over the gradients it
// combines and a neighbour's gradient gains the same momentum as one's own.
// Every average_every steps models are exchanged and averaged (share 1/2, staleness
// weighted) to bound the drift that lost or stale gradients leave.
#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/gossip_grad.pb.h"

namespace hearsay {
namespace {

class GossipGrad final : public Algorithm {
 public:
  explicit GossipGrad(int average_every) : average_every_(average_every) {}
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const auto targets = e.live_targets(static_cast<int64_t>(step));
    const double scale = 1.0 / (1.0 + static_cast<double>(targets.size()));
    std::vector<GossipEngine::Message> gradients;
    for (auto& m : e.take_async()) {
      if (m.kind == MessageKind::kGradient) {
        gradients.push_back(std::move(m));
      } else if (m.kind == MessageKind::kModel) {
        const auto d = e.mixer().model(e.clock(), m.clock, 0.5, e.samples_seen(), m.samples);
        if (d.drop) continue;
        e.note_model_distance(e.peers()[m.from], m);
        e.mix_neighbour_model(m.from, m, d.weight);
      }
    }
    const BatchStats s = e.gradient(batch, step);
    if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0 && e.gossip_on_device()) {
      // One device copy for every target; each link's codec encodes it on the device.
      const auto g = e.snapshot_device(e.model().grads(), e.model().num_params());
      e.note_own_gradient(*g);
      for (int t : targets) e.send_device(t, {.kind = MessageKind::kGradient}, g);
    } else if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0 && e.updates_encode_once()) {
      // Encoded once from the gradient where it lies, the same bytes for every target.
      const float* g = e.model().grads();
      e.note_own_gradient(g, e.model().num_params());
      const auto enc = e.encode_update_once(g, e.model().num_params());
      for (int t : targets) e.send_encoded(t, {.kind = MessageKind::kGradient}, enc);
    } else if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0) {
      std::vector<float> g = download_floats(e.model().backend(), e.model().grads(), e.model().num_params());
      e.note_own_gradient(g);
      // One copy for every target (each link's encoder reads it; a fold copies first).
      const auto shared = std::make_shared<const std::vector<float>>(std::move(g));
      for (int t : targets) e.send_shared(t, {.kind = MessageKind::kGradient}, shared);
    }
    for (const auto& m : gradients) {
      const auto d = e.mixer().gradient(e.clock(), m.clock);
      if (!d.drop) e.axpy_grads(d.weight, m);
    }
    e.optimizer().step(e.model().params(), e.model().grads(), static_cast<float>(lr * scale));
    const int every = average_every_;
    if (every > 0 && step % static_cast<uint64_t>(every) == static_cast<uint64_t>(every - 1) && e.gossip_on_device()) {
      const auto params = e.snapshot_device(e.model().params(), e.model().num_params());
      for (int t : targets) e.send_device(t, {.kind = MessageKind::kModel}, params);
    } else if (every > 0 && step % static_cast<uint64_t>(every) == static_cast<uint64_t>(every - 1) && e.models_encode_once()) {
      const auto params = e.encode_model();  // in gossip.model_codec, once for every target
      for (int t : targets) e.send_encoded(t, {.kind = MessageKind::kModel}, params);
    } else if (every > 0 && step % static_cast<uint64_t>(every) == static_cast<uint64_t>(every - 1)) {
      const auto params = std::make_shared<const std::vector<float>>(e.params_host());
      for (int t : targets) e.send_shared(t, {.kind = MessageKind::kModel}, params);
    }
    return s;
  }

 private:
  int average_every_;
};

}  // namespace

const bool registered = register_algorithm<algorithms::GossipGradOptions>({
    .name = "gossip_grad",
    .joins_from_neighbour = true,
    .new_site_leader = true,  // it keeps nothing a neighbour relies on
    .sends = {{MessageKind::kGradient, Compression::kUpdate}, {MessageKind::kModel, Compression::kModel}},
    .check = [](const algorithms::GossipGradOptions& o, const GossipSpec&, int) {
      if (o.average_every() < 0) throw OptionError("average_every", "must be >= 0 (0: no model averaging), got " + std::to_string(o.average_every()));
    },
    .make = [](const GossipSpec&, const algorithms::GossipGradOptions& o) { return std::make_unique<GossipGrad>(o.average_every()); },
});

}  // namespace hearsay
