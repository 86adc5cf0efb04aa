// allreduce: synchronous all-reduce SGD, the baseline every comparison runs on the same
// transports. Each step g <- all-reduce(g) / n (collectives.cpp: hierarchical across
// sites, under the comparison's codec; PowerSGD with error feedback), then the optimizer
// step at the linearly scaled learning rate (n lr after a warm-up). Every peer waits for
// the others each step, so the slowest peer or link sets everyone's pace.
#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/allreduce.pb.h"

namespace hearsay {
namespace {

class AllReduce final : public Algorithm {
 public:
  AllReduce(const GossipSpec& s, const algorithms::AllreduceOptions& o)
      : linear_lr_(o.sync_lr_scaling() == "linear"), warmup_steps_(o.sync_lr_warmup_steps()) {
    if (s.codec.name == "powersgd") powersgd_ = std::make_unique<PowerSgdAllReduce>(s.codec.rank);
  }
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = e.gradient(batch, step);
    Backend& b = e.model().backend();
    const size_t n = e.model().num_params();
    const float inv = 1.0f / static_cast<float>(e.peers().size());
    if (!powersgd_ && b.is_host()) {
      // Summed where the gradient lies: no model-sized copy.
      float* g = e.model().grads();
      allreduce_sum_in_place(e, MessageKind::kGradient, g, n, step, 0, true);
      for (size_t i = 0; i < n; ++i) g[i] *= inv;
    } else {
      std::vector<float> g(n);
      b.download(g.data(), e.model().grads(), sizeof(float) * n);
      if (powersgd_) {
        g = powersgd_->average(e, std::move(g), step);
      } else {
        g = allreduce_sum(e, MessageKind::kGradient, std::move(g), step, 0, true);
        for (auto& v : g) v *= inv;
      }
      b.upload(e.model().grads(), g.data(), sizeof(float) * n);
    }
    e.optimizer().step(e.model().params(), e.model().grads(), lr * lr_scale(e, step));
    e.copies_equal();
    return s;
  }
  uint64_t held_bytes() const override { return powersgd_ ? powersgd_->held_bytes() : 0; }
  std::string save() const override { return powersgd_ ? powersgd_->save() : std::string(); }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    if (!powersgd_) throw InputError("checkpoint: allreduce state (PowerSGD's) given to allreduce without codec powersgd");
    StateReader r(state);
    powersgd_->load(r, e);
    if (!r.done()) throw InputError("checkpoint: allreduce PowerSGD state has bytes left over");
  }

 private:
  // The mean of n gradients is a batch n times larger: the learning rate grows linearly
  // from lr to n lr over the warm-up (Goyal et al., 2017), unless the options say none.
  float lr_scale(GossipEngine& e, uint64_t step) const {
    return sync_lr_scale(static_cast<int>(e.peers().size()), step, linear_lr_, warmup_steps_);
  }
  bool linear_lr_;
  int warmup_steps_;
  std::unique_ptr<PowerSgdAllReduce> powersgd_;
};

const bool registered = register_algorithm<algorithms::AllreduceOptions>({
    .name = "allreduce",
    .synchronous = true,
    .collective = true,
    .sums_sites_first = true,
    .equal_copies = true,
    .check =
        [](const algorithms::AllreduceOptions& o, const GossipSpec& s, int) {
          check_sync_lr_options(o.sync_lr_scaling(), o.sync_lr_warmup_steps());
          const std::string& c = s.codec.name;
          if (!summable_codec(c) && c != "powersgd") {
            throw InputError("allreduce: codec '" + c + "' cannot be summed on the way; use none, fp16, bf16, int8, int4 or powersgd");
          }
          if (s.adaptive.enabled) throw InputError("allreduce: adaptive compression is for the asynchronous algorithms; name one codec");
        },
    .make = [](const GossipSpec& s, const algorithms::AllreduceOptions& o) { return std::make_unique<AllReduce>(s, o); },
});

}  // namespace
}  // namespace hearsay
