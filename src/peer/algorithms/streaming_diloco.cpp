// streaming_diloco (Douillard et al., 2025, "Streaming DiLoCo with overlapping
// communication"): DiLoCo whose model is cut into P fragments that synchronise on a
// staggered schedule, so that the bytes of one outer step are spread over the H inner
// steps and hidden behind them. Each peer keeps the shared anchor a (the last global
// model, per fragment). For fragment p, after inner steps t with (t + 1) mod H = p H / P:
//   delta_p = a_p - x_p, all-reduced (mean over the peers, through gossip.codec, across
//   sites hierarchically) while tau more inner steps run;
//   then v_p <- mu v_p + mean(delta_p); a_p <- a_p - outer_lr (mean(delta_p) + mu v_p);
//   x_p <- alpha x_p + (1 - alpha) a_p.
// With one fragment, tau = 0 and alpha = 0 it is diloco. Under cluster.site_replicas a site's peers
// average their gradients every inner step (GossipEngine::gradient), as diloco's. Fragments are the model's
// units (a transformer block, an embedding, a layer: fragments.h) dealt out in turn.
#include <algorithm>
#include <cmath>
#include <memory>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "fragments.h"
#include "hearsay/algorithms/streaming_diloco.pb.h"
#include "hearsay/mixer.h"

namespace hearsay {
namespace {

class StreamingDiloco final : public Algorithm {
 public:
  explicit StreamingDiloco(const algorithms::StreamingDilocoOptions& o, const MixerSpec& mixer)
      : h_(static_cast<uint64_t>(o.local_steps())), p_(o.fragments()), tau_(static_cast<uint64_t>(o.overlap_steps())),
        outer_lr_(o.outer_lr()), mu_(o.outer_momentum()),
        outer_codec_(o.outer_codec()) {
    // The outer result's share; staleness-aware, scaled by f(tau) of the cluster's mixer.
    global_share_ = 1.0 - o.mix_alpha();
    if (o.staleness_weighted()) {
      global_share_ *= staleness_weightings().get(mixer.weighting)(static_cast<double>(tau_), mixer);
    }
  }

  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    if (anchor_.empty()) {
      anchor_ = e.params_host();
      velocity_.assign(anchor_.size(), 0.0f);
      fragments_ = fragments_of(e.model(), p_);
    }
    const BatchStats s = local_step(e, batch, lr, step);
    if (pending_) {
      pending_->reduce.progress();  // never waits: whatever has arrived moves the ring on
      if (step >= pending_->apply_after) apply(e);
    }
    const uint64_t phase = (step + 1) % h_;
    for (int p = 0; p < p_; ++p) {
      if (phase != static_cast<uint64_t>(p) * h_ / static_cast<uint64_t>(p_)) continue;
      start(e, p, step);
      if (tau_ == 0) apply(e);
    }
    return s;
  }

  uint64_t held_bytes() const override { return floats_held({&anchor_, &velocity_}); }
  // After each fragment's outer step every peer holds the same outer model and momentum;
  // the model itself is each peer's own (its inner steps, its merge).
  bool model_equal_at_copies() const override { return false; }
  std::vector<std::vector<float>*> equal_state() override { return {&anchor_, &velocity_}; }
  std::string save() const override {
    StateWriter w;
    w.put(static_cast<double>(syncs_));
    w.put_optional(anchor_).put_optional(velocity_);
    return w.str();
  }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    syncs_ = static_cast<uint64_t>(r.get());
    r.get_optional(&anchor_, e.model().num_params());
    r.get_optional(&velocity_, e.model().num_params());
    if (!r.done()) throw InputError("checkpoint: streaming_diloco state has bytes left over");
    if (!anchor_.empty()) fragments_ = fragments_of(e.model(), p_);
  }

 private:
  struct Pending {
    int fragment;
    uint64_t apply_after;  // the inner step after which the outer step is applied
    AllReduce reduce;
  };

  // Sends fragment p's outer gradient on its way (rounds count the syncs, in the order
  // every peer starts them).
  void start(GossipEngine& e, int p, uint64_t step) {
    HEARSAY_CHECK(!pending_, "streaming_diloco: a fragment's sync started before the last one was applied");
    // The fragment's parameters read straight into its outer gradient: no host copy of the
    // whole model (a fragment is 1/P of it).
    const Fragment& f = fragments_[static_cast<size_t>(p)];
    size_t len = 0;
    for (const auto& [at, n] : f) len += n;
    std::vector<float> delta(len);
    size_t k = 0;
    for (const auto& [at, n] : f) {
      e.read_params(at, n, delta.data() + k);
      for (size_t i = 0; i < n; ++i) delta[k + i] = anchor_[at + i] - delta[k + i];
      k += n;
    }
    pending_.reset(new Pending{p, step + tau_, AllReduce(e, MessageKind::kModelDelta, std::move(delta), syncs_++, 0, true,
                                                                 ReduceScope::kCluster, outer_codec_)});
    pending_->reduce.progress();
  }

  // The outer step on the pending fragment's anchor, and the merge into the model, a
  // tensor of the fragment at a time.
  void apply(GossipEngine& e) {
    const Fragment& f = fragments_[static_cast<size_t>(pending_->fragment)];
    const std::vector<float> sum = pending_->reduce.finish();
    pending_.reset();
    const float inv = 1.0f / static_cast<float>(e.peers().size());
    std::vector<float> x;
    size_t k = 0;
    for (const auto& [at, n] : f) {
      x.resize(n);
      e.read_params(at, n, x.data());
      for (size_t i = 0; i < n; ++i, ++k) {
        const size_t j = at + i;
        const float delta = sum[k] * inv;
        velocity_[j] = static_cast<float>(mu_ * velocity_[j] + delta);
        anchor_[j] -= static_cast<float>(outer_lr_ * (delta + mu_ * velocity_[j]));
        x[i] = static_cast<float>((1.0 - global_share_) * x[i] + global_share_ * anchor_[j]);
      }
      e.write_params(at, n, x.data());
    }
    e.copies_equal();
  }

  uint64_t h_;
  int p_;
  uint64_t tau_;
  double outer_lr_, mu_, global_share_;
  std::string outer_codec_;
  std::vector<float> anchor_, velocity_;
  std::vector<Fragment> fragments_;
  uint64_t syncs_ = 0;
  std::unique_ptr<Pending> pending_;
};

const bool registered = register_algorithm<algorithms::StreamingDilocoOptions>({
    .name = "streaming_diloco",
    .synchronous = true,
    .collective = true,
    .model_buffers = 2,  // the outer model and its momentum
    .equal_copies = true,
    .check =
        [](const algorithms::StreamingDilocoOptions& o, const GossipSpec& s, int) {
          if (o.local_steps() < 1) throw OptionError("local_steps", "must be >= 1, got " + std::to_string(o.local_steps()));
          if (o.fragments() < 1 || o.fragments() > o.local_steps()) {
            throw OptionError("fragments", "must be in [1, local_steps], got " + std::to_string(o.fragments()));
          }
          if (o.overlap_steps() < 0 || o.overlap_steps() >= std::max(1, o.local_steps() / o.fragments())) {
            throw OptionError("overlap_steps", "must be in [0, local_steps / fragments), got " + std::to_string(o.overlap_steps()));
          }
          if (!(o.mix_alpha() >= 0 && o.mix_alpha() < 1)) throw OptionError("mix_alpha", "must be in [0, 1)");
          if (!(o.outer_lr() > 0) || !std::isfinite(o.outer_lr())) throw OptionError("outer_lr", "must be a positive number");
          if (!(o.outer_momentum() >= 0 && o.outer_momentum() < 1)) throw OptionError("outer_momentum", "must be in [0, 1)");
          check_diloco_replica_and_codecs(s, o.replica(), o.outer_codec());
        },
    .make = [](const GossipSpec& g, const algorithms::StreamingDilocoOptions& o) {
      return std::make_unique<StreamingDiloco>(o, g.mixer);
    },
});

}  // namespace
}  // namespace hearsay
