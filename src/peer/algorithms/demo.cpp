// demo: DeMo, Decoupled Momentum Optimization (Peng, Quesnelle, Kingma 2024) as its paper
// states it. Each peer keeps its own momentum m <- beta m + g; extracts its fast
// components, the top-k of an orthonormal DCT over fixed-size blocks of every tensor
// (demo_transform.h); sends only those (values and indices, as a top-k payload) to every
// other peer; takes what it sent out of its momentum (m <- m - IDCT(q)); and steps on
// the decoded mean of what every peer sent, Q = IDCT(sum q / n): x <- x (1 - lr wd) -
// lr sign(Q) (signum, as the paper's experiments; or Q itself). The sum runs in peer
// order on every peer, so the copies stay equal (docs/ALGORITHMS.md, "demo").
#include <cmath>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "demo_transform.h"
#include "hearsay/algorithms/demo.pb.h"

namespace hearsay {
namespace {

class Demo final : public Algorithm {
 public:
  explicit Demo(const algorithms::DemoOptions& o) : o_(o) {}

  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = e.gradient(batch, step);
    const size_t n = e.model().num_params();
    start(e, n);
    Backend& b = e.model().backend();
    std::vector<float> copied;  // the gradient, where it is not host memory
    const float* g = e.model().grads();
    if (!b.is_host()) {
      copied.resize(n);
      b.download(copied.data(), g, sizeof(float) * n);
      g = copied.data();
    }
    const std::vector<float>& y = memory_->accumulate(g);
    // What is sent is decoded (as the receivers decode it) over the coefficients it was
    // read from, a segment at a time; then the sum of every peer's over them too.
    const auto mine = encode(e, y, memory_->fast_components(o_.topk()), memory_->coefficients_mut());
    memory_->sent_in_place();
    gather_sum_into(e, MessageKind::kGradient, mine, step, 0, memory_->coefficients_mut(), n);
    const std::vector<float>& d = memory_->direction_in_place(static_cast<int>(e.peers().size()), o_.sign());
    if (o_.weight_decay() != 0 && b.is_host()) {
      // x <- x - lr wd x where the parameters lie.
      float* x = e.model().params();
      const float a = static_cast<float>(-static_cast<double>(lr) * o_.weight_decay());
      for (size_t i = 0; i < n; ++i) x[i] += a * x[i];
      e.params_written();
    } else if (o_.weight_decay() != 0) {
      e.axpy_params(-static_cast<double>(lr) * o_.weight_decay(), e.params_host());
    }
    e.axpy_params(-static_cast<double>(lr), d);
    return s;
  }
  uint64_t held_bytes() const override { return memory_ ? memory_->held_bytes() : 0; }
  std::string save() const override { return memory_ ? StateWriter().put(memory_->momentum()).str() : std::string(); }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    const size_t n = e.model().num_params();
    start(e, n);
    StateReader r(state);
    memory_->momentum_mut() = r.get_floats(n);
    if (!r.done()) throw InputError("checkpoint: demo state has bytes left over");
  }

 private:
  void start(GossipEngine& e, size_t n) {
    if (!memory_) memory_ = std::make_unique<DemoMemory>(e.model().param_views(), n, o_.chunk(), static_cast<float>(o_.momentum()));
  }

  // The coefficients y[idx] as top-k payloads over the engine's segments, and what a
  // receiver decodes from them.
  // Each segment is read before its decoded values are written over `decoded_into`.
  std::shared_ptr<const GossipEngine::Encoded> encode(GossipEngine& e, const std::vector<float>& y, const std::vector<uint32_t>& idx,
                                                      float* decoded_into) {
    size_t j = 0;
    std::vector<uint32_t> local;
    std::vector<float> values;
    return build_encoded(y.size(), even_segments(y.size(), e.spec().segment_elements),
                         [&](size_t begin, size_t len, std::vector<uint8_t>& payload, CodecParams& params) {
                           local.clear();
                           values.clear();
                           for (; j < idx.size() && idx[j] < begin + len; ++j) {
                             local.push_back(static_cast<uint32_t>(idx[j] - begin));
                             values.push_back(y[idx[j]]);
                           }
                           encode_sparse(local, values.data(), len, o_.value_bits(), payload, params);
                         },
                         decoded_into);
  }

  algorithms::DemoOptions o_;
  std::unique_ptr<DemoMemory> memory_;
};

const bool registered = register_algorithm<algorithms::DemoOptions>({
    .name = "demo",
    .synchronous = true,
    .collective = true,
    .owns_update = true,
    .steps_without_optimizer = true,
    .model_buffers = 2,  // its momentum and its transform's coefficients (DemoMemory)
    .check =
        [](const algorithms::DemoOptions& o, const GossipSpec& s, int) {
          if (!(o.momentum() >= 0 && o.momentum() < 1)) throw OptionError("momentum", "must be in [0, 1), got " + std::to_string(o.momentum()));
          if (o.chunk() < 1 || o.chunk() > 4096) throw OptionError("chunk", "must be in [1, 4096], got " + std::to_string(o.chunk()));
          if (o.topk() < 1) throw OptionError("topk", "must be >= 1, got " + std::to_string(o.topk()));
          if (!(o.weight_decay() >= 0) || !std::isfinite(o.weight_decay())) throw OptionError("weight_decay", "must be >= 0");
          if (o.value_bits() != 16 && o.value_bits() != 32) throw OptionError("value_bits", "must be 16 or 32, got " + std::to_string(o.value_bits()));
          if (s.site_replicas) {
            throw InputError("demo: an all-gather over every peer; cluster.site_replicas (a site's peers as one replica) is not "
                             "supported with it");
          }
        },
    .make = [](const GossipSpec&, const algorithms::DemoOptions& o) { return std::make_unique<Demo>(o); },
});

}  // namespace
}  // namespace hearsay
