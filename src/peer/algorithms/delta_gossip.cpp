// delta_gossip: local steps composed with compressed gossip, the asynchronous counterpart of
// diloco with a compressed outer gradient. A round is H local steps with optim from the
// anchor a (the model at the round's start); then the peer's pseudo-gradient
// delta_i = a - x goes to its neighbours under gossip.codec (each link's encoder keeps
// what the codec left out, so error feedback spans rounds), and the peer moves to
// a - (delta_i + sum_j f(tau_j) delta_j) / n: the mean over the n peers of its own delta
// and those the others sent since its last round, each weighted by the staleness
// weighting (tau in logical steps; a delta not yet arrived counts as zero now and is
// taken in when it comes). On the complete graph (the only one it accepts: deltas, not
// models, are averaged, so nothing pulls apart copies back together) every peer takes in
// every delta once, so with constant weighting the copies differ only by what is in
// flight. No peer waits for another (docs/ALGORITHMS.md, "delta_gossip").
#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/delta_gossip.pb.h"

namespace hearsay {
namespace {

class DeltaGossip final : public Algorithm {
 public:
  explicit DeltaGossip(int local_steps) : h_(static_cast<uint64_t>(local_steps)) {}

  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    if (anchor_.empty()) anchor_ = e.params_host();
    const BatchStats s = local_step(e, batch, lr, step);
    if (step % h_ != h_ - 1) return s;
    const double inv = 1.0 / static_cast<double>(e.peers().size());
    if (e.updates_encode_once()) {
      // The parameters become the anchor at the round's end, so their buffer carries
      // delta = a - x meanwhile, encoded once from it for every target: no model-sized
      // copy beside the model and its anchor.
      const size_t n = anchor_.size();
      float* x = e.model().params();
      for (size_t i = 0; i < n; ++i) x[i] = anchor_[i] - x[i];
      e.note_own_gradient(x, n);
      const auto enc = e.encode_update_once(x, n);
      for (int t : e.live_targets(static_cast<int64_t>(step))) e.send_encoded(t, {.kind = MessageKind::kModelDelta}, enc);
      // Its own delta as every receiver decodes it, so that with every delta delivered the
      // copies are equal bit for bit (no error feedback here: the codec's rounding is
      // everyone's alike).
      std::vector<float> scratch;
      for_each_decoded(*enc, scratch, [&](size_t at, const float* y, size_t len) {
        for (size_t i = 0; i < len; ++i) anchor_[at + i] = static_cast<float>(anchor_[at + i] - inv * y[i]);
      });
    } else {
      // delta = a - x, made in the copy of x (no second model-sized vector), then shared by
      // every target's send.
      std::vector<float> delta = e.params_host();
      for (size_t i = 0; i < delta.size(); ++i) delta[i] = anchor_[i] - delta[i];
      e.note_own_gradient(delta);
      const auto shared = std::make_shared<const std::vector<float>>(std::move(delta));
      for (int t : e.live_targets(static_cast<int64_t>(step))) e.send_shared(t, {.kind = MessageKind::kModelDelta}, shared);
      const std::vector<float>& own = *shared;
      for (size_t i = 0; i < own.size(); ++i) anchor_[i] = static_cast<float>(anchor_[i] - inv * own[i]);
    }
    add_arrivals(e, inv, {&anchor_});
    e.set_params_host(anchor_);
    return s;
  }

  // After the run: the deltas that arrived since the last round, so that with every
  // delta delivered every peer has taken in each one once.
  void settle(GossipEngine& e) override {
    if (anchor_.empty()) return;
    std::vector<float> x = e.params_host();
    if (!add_arrivals(e, 1.0 / static_cast<double>(e.peers().size()), {&x, &anchor_})) return;
    e.set_params_host(x);
  }

  uint64_t held_bytes() const override { return floats_held({&anchor_}); }
  std::string save() const override { return StateWriter().put_optional(anchor_).str(); }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    r.get_optional(&anchor_, e.model().num_params());
    if (!r.done()) throw InputError("checkpoint: delta_gossip state has bytes left over");
  }

 private:
  // Each of `into` -= inv f(tau) delta_j for every delta that has arrived (several from one
  // neighbour fold into their sum: none is lost; none is dropped for its age), a segment
  // at a time (an arrival keeps the bytes it came in); whether any did.
  bool add_arrivals(GossipEngine& e, double inv, std::initializer_list<std::vector<float>*> into) {
    bool any = false;
    for (const auto& m : e.take_async()) {
      if (m.kind != MessageKind::kModelDelta || m.elements() != anchor_.size() || m.offset != 0) continue;
      // Weighted by staleness, never dropped for it: a delta left out is progress its
      // sender made and this peer never takes in, and the copies part for good.
      const uint64_t mine = e.clock();
      const double w = e.mixer().staleness_weight(mine > m.clock ? static_cast<int64_t>(mine - m.clock) : 0);
      e.mixer().applied(mine, m.clock);
      const double a = inv * w;
      e.for_each_part(m, [&](size_t at, const float* y, size_t n) {
        for (std::vector<float>* v : into) {
          float* out = v->data() + at;
          for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(out[i] - a * y[i]);
        }
      });
      any = true;
    }
    return any;
  }

  uint64_t h_;
  std::vector<float> anchor_;
};

const bool registered = register_algorithm<algorithms::DeltaGossipOptions>({
    .name = "delta_gossip",
    .joins_from_neighbour = true,
    .model_buffers = 1,  // its anchor (the last agreed model)
    .sends = {{MessageKind::kModelDelta, Compression::kUpdate}},
    .check =
        [](const algorithms::DeltaGossipOptions& o, const GossipSpec& s, int) {
          if (o.local_steps() < 1) throw OptionError("local_steps", "must be >= 1, got " + std::to_string(o.local_steps()));
          if (s.site_replicas) {
            throw InputError("delta_gossip: its mean is over every peer's delta; cluster.site_replicas (only the sites' leaders "
                             "taking part) is not supported with it");
          }
          if (s.topology.kind != "complete") {
            throw InputError("delta_gossip: averages deltas, not models, so its peers agree only if every peer takes in every "
                             "delta: use topology \"complete\" (got '" + s.topology.kind + "'); on a sparser graph use choco, or "
                             "gossip_grad with model averaging");
          }
        },
    .make = [](const GossipSpec&, const algorithms::DeltaGossipOptions& o) { return std::make_unique<DeltaGossip>(o.local_steps()); },
});

}  // namespace
}  // namespace hearsay
