// diloco (Douillard et al., 2023): H inner steps alone from the shared anchor a (the inner
// optimizer is optim: AdamW in the paper); then the outer gradient delta = mean over the
// peers of (a - x), all-reduced through gossip.codec (hierarchically across sites);
// v <- mu v + delta; a <- a - outer_lr (delta + mu v) (outer Nesterov); x <- a. Every peer
// waits for the others at each outer step. Under a codec that cannot be summed on the way
// (topk, randomk, sign, qsgd, powersgd) the outer gradient travels as a sparse all-gather
// with error feedback across outer steps (CompressedSum): local steps composed with
// compression. Under cluster.site_replicas a site's peers
// average their gradients every inner step (GossipEngine::gradient) and so train as one replica.
#include <cmath>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/diloco.pb.h"

namespace hearsay {
namespace {

class Diloco final : public Algorithm {
 public:
  Diloco(const GossipSpec& s, const algorithms::DilocoOptions& o)
      : h_(static_cast<uint64_t>(o.local_steps())), outer_lr_(o.outer_lr()), mu_(o.outer_momentum()),
        outer_codec_(o.outer_codec()) {
    const std::string codec = outer_codec_.empty() ? s.codec.name : outer_codec_;
    if (!summable_codec(codec)) compressed_ = std::make_unique<CompressedSum>(codec);
  }
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    if (anchor_.empty()) anchor_ = e.params_host();
    const BatchStats s = local_step(e, batch, lr, step);
    if (step % h_ != h_ - 1) return s;
    const size_t n = e.model().num_params();
    if (!compressed_ && e.model().backend().is_host()) {
      // The parameters are replaced by the anchor at the end of an outer step, so their
      // buffer carries the outer gradient meanwhile: no model-sized copy beside it.
      // The update guard's reference stays the model's norm, measured before that.
      e.hold_model_norm();
      float* x = e.model().params();
      for (size_t i = 0; i < n; ++i) x[i] = anchor_[i] - x[i];
      allreduce_sum_in_place(e, MessageKind::kModelDelta, x, n, step / h_, 0, true, ReduceScope::kCluster, outer_codec_);
      outer_step(x, n, e.peers().size());
      e.write_params(0, n, anchor_.data());
      e.copies_equal();
      return s;
    }
    std::vector<float> delta = e.params_host();
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = anchor_[i] - delta[i];
    const auto sum = compressed_ ? compressed_->sum(e, MessageKind::kModelDelta, delta, step / h_, 0)
                                 : allreduce_sum(e, MessageKind::kModelDelta, std::move(delta), step / h_, 0, true,
                                                 ReduceScope::kCluster, outer_codec_);
    outer_step(sum.data(), sum.size(), e.peers().size());
    e.set_params_host(anchor_);
    e.copies_equal();
    return s;
  }

  uint64_t held_bytes() const override { return floats_held({&anchor_, &velocity_}); }
  std::vector<std::vector<float>*> equal_state() override { return {&anchor_, &velocity_}; }
  std::string save() const override {
    StateWriter w;
    w.put_optional(anchor_).put_optional(velocity_);
    if (compressed_) w.put_optional(compressed_->residual());
    return w.str();
  }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    r.get_optional(&anchor_, e.model().num_params());
    r.get_optional(&velocity_, e.model().num_params());
    if (compressed_ && !r.done()) r.get_optional(&compressed_->residual(e), e.model().num_params());
    if (!r.done()) throw InputError("checkpoint: diloco state has bytes left over");
  }

 private:
  // The outer Nesterov step on the anchor from the sum of the peers' outer gradients.
  void outer_step(const float* sum, size_t n, size_t peers) {
    if (velocity_.empty()) velocity_.assign(n, 0.0f);
    const float inv = 1.0f / static_cast<float>(peers);
    for (size_t i = 0; i < n; ++i) {
      const float delta = sum[i] * inv;
      velocity_[i] = static_cast<float>(mu_ * velocity_[i] + delta);
      anchor_[i] -= static_cast<float>(outer_lr_ * (delta + mu_ * velocity_[i]));
    }
  }
  uint64_t h_;
  double outer_lr_, mu_;
  std::string outer_codec_;
  std::unique_ptr<CompressedSum> compressed_;  // an outer codec that cannot be summed: a sparse all-gather
  std::vector<float> anchor_, velocity_;
};

const bool registered = register_algorithm<algorithms::DilocoOptions>({
    .name = "diloco",
    .synchronous = true,
    .collective = true,
    .model_buffers = 2,  // the outer model and its momentum
    .equal_copies = true,
    .check =
        [](const algorithms::DilocoOptions& o, const GossipSpec& s, int) {
          if (o.local_steps() < 1) throw OptionError("local_steps", "must be >= 1, got " + std::to_string(o.local_steps()));
          if (!(o.outer_lr() > 0) || !std::isfinite(o.outer_lr())) throw OptionError("outer_lr", "must be a positive number");
          if (!(o.outer_momentum() >= 0 && o.outer_momentum() < 1)) throw OptionError("outer_momentum", "must be in [0, 1)");
          check_diloco_replica_and_codecs(s, o.replica(), o.outer_codec(), true);
        },
    .make = [](const GossipSpec& s, const algorithms::DilocoOptions& o) { return std::make_unique<Diloco>(s, o); },
});

}  // namespace
}  // namespace hearsay
