// dgc: Deep Gradient Compression (Lin et al., ICLR 2018) as its paper states it, on the
// top-k codec, with the peers' optimizer's settings (sgd: momentum, Nesterov, weight
// decay, grad_clip_norm), applied here rather than by the optimizer, since the momentum
// must sit before the sparsifier. Each step every peer takes its gradient, clips it locally, folds it into
// its momentum u and its velocity v (momentum correction: the velocity, not the gradient,
// is what accumulates), and sends the top-k of v (gossip.codec's density after the
// warm-up of sparsity) to every other peer; v keeps the rest, u is masked where v was
// sent (momentum factor masking). Every peer then steps on the mean of all the peers'
// sparse vectors, summed in peer order, with plain SGD at the synchronous learning rate
// (as allreduce's): every peer applies the same update and the copies stay equal
// (docs/ALGORITHMS.md, "dgc").
#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "dgc_memory.h"
#include "hearsay/algorithms/dgc.pb.h"

namespace hearsay {
namespace {

DgcSettings settings(const GossipSpec& s, const algorithms::DgcOptions& o) {
  DgcSettings d;
  d.momentum = s.optimizer.momentum;
  d.nesterov = s.optimizer.nesterov;
  d.weight_decay = s.optimizer.weight_decay;
  d.clip_norm = s.optimizer.grad_clip_norm;
  d.momentum_masking = o.momentum_masking();
  d.warmup_steps = o.warmup_steps();
  d.warmup_density = o.warmup_density();
  d.density = s.codec.density;
  return d;
}

class Dgc final : public Algorithm {
 public:
  Dgc(const GossipSpec& s, const algorithms::DgcOptions& o)
      : settings_(settings(s, o)), codec_(s.codec), linear_lr_(o.sync_lr_scaling() == "linear"),
        warmup_steps_(o.sync_lr_warmup_steps()) {}

  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = e.gradient(batch, step);
    const size_t n = e.model().num_params();
    if (!memory_) memory_ = std::make_unique<DgcMemory>(n, settings_);
    Backend& b = e.model().backend();
    const int peers = static_cast<int>(e.peers().size());
    {
      // The gradient's host copy lives only until the memory has taken it in; the
      // parameters (for the weight decay) are read where they are on a host backend.
      std::vector<float> g = download_floats(b, e.model().grads(), n);
      std::vector<float> w;
      const float* params = nullptr;
      if (settings_.weight_decay != 0.0f) {
        if (!b.is_host()) w = e.params_host();
        params = b.is_host() ? e.model().params() : w.data();
      }
      memory_->accumulate(g, params, peers);
    }
    CodecSpec spec = codec_;
    spec.density = memory_->density_at(step);
    // No dense decoded copy of the update: what was sent leaves v a segment at a time.
    const auto mine = e.encode_once(memory_->velocity(), spec, 0, false);
    std::vector<float> scratch;
    for_each_decoded(*mine, scratch, [&](size_t at, const float* y, size_t count) { memory_->sent_part(at, y, count); });
    std::vector<float> sum = gather_sum(e, MessageKind::kGradient, mine, step, 0);
    const float rate = lr * sync_lr_scale(peers, step, linear_lr_, warmup_steps_) / static_cast<float>(peers);
    e.axpy_params(-static_cast<double>(rate), sum);
    return s;
  }

  uint64_t held_bytes() const override {
    return memory_ ? floats_held({&memory_->momentum(), &memory_->velocity()}) : 0;
  }
  std::string save() const override {
    if (!memory_) return {};
    return StateWriter().put(memory_->momentum()).put(memory_->velocity()).str();
  }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    const size_t n = e.model().num_params();
    memory_ = std::make_unique<DgcMemory>(n, settings_);
    StateReader r(state);
    memory_->momentum_mut() = r.get_floats(n);
    memory_->velocity_mut() = r.get_floats(n);
    if (!r.done()) throw InputError("checkpoint: dgc state has bytes left over");
  }

 private:
  DgcSettings settings_;
  CodecSpec codec_;
  bool linear_lr_;
  int warmup_steps_;
  std::unique_ptr<DgcMemory> memory_;
};

const bool registered = register_algorithm<algorithms::DgcOptions>({
    .name = "dgc",
    .synchronous = true,
    .collective = true,
    .steps_without_optimizer = true,
    .model_buffers = 2,  // its momentum and its accumulated gradient
    .check =
        [](const algorithms::DgcOptions& o, const GossipSpec& s, int) {
          if (s.optimizer.name != "sgd") {
            throw InputError("dgc: its momentum correction is momentum SGD's; optim.optimizer must be sgd, got '" + s.optimizer.name + "'");
          }
          if (o.warmup_steps() < 0) throw OptionError("warmup_steps", "must be >= 0 (0: no warm-up of sparsity)");
          if (!(o.warmup_density() > 0 && o.warmup_density() <= 1)) {
            throw OptionError("warmup_density", "must be in (0, 1], got " + std::to_string(o.warmup_density()));
          }
          check_sync_lr_options(o.sync_lr_scaling(), o.sync_lr_warmup_steps());
          if (s.codec.name != "topk") {
            throw InputError("dgc: sparsifies with top-k; set cluster.gossip.codec { name: \"topk\" density: ... } (got '" +
                             s.codec.name + "')");
          }
          if (s.adaptive.enabled) throw InputError("dgc: adaptive compression is for the asynchronous algorithms; its density is its own");
          if (s.site_replicas) {
            throw InputError("dgc: an all-gather over every peer; cluster.site_replicas (a site's peers as one replica) is not "
                             "supported with it");
          }
        },
    .make = [](const GossipSpec& s, const algorithms::DgcOptions& o) { return std::make_unique<Dgc>(s, o); },
});

}  // namespace
}  // namespace hearsay
