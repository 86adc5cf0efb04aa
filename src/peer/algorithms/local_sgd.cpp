// local_sgd: H optimizer steps alone, then x <- all-reduce(x) / n (fp32); every peer
// waits for the others at each average.
#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/local_sgd.pb.h"

namespace hearsay {
namespace {

class LocalSgd final : public Algorithm {
 public:
  explicit LocalSgd(int local_steps) : h_(static_cast<uint64_t>(local_steps)) {}
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = local_step(e, batch, lr, step);
    if (step % h_ == h_ - 1) {
      e.set_params_host(average_models(e, step / h_));
      e.copies_equal();
    }
    return s;
  }

 private:
  uint64_t h_;
};

const bool registered = register_algorithm<algorithms::LocalSgdOptions>({
    .name = "local_sgd",
    .synchronous = true,
    .collective = true,
    .equal_copies = true,
    .check =
        [](const algorithms::LocalSgdOptions& o, const GossipSpec&, int) {
          if (o.local_steps() < 1) throw OptionError("local_steps", "must be >= 1, got " + std::to_string(o.local_steps()));
        },
    .make = [](const GossipSpec&, const algorithms::LocalSgdOptions& o) { return std::make_unique<LocalSgd>(o.local_steps()); },
});

}  // namespace
}  // namespace hearsay
