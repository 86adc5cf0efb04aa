// "never_communicate": every peer takes its local steps and sends nothing: the control
// run of a comparison (what training alone on a shard gives), and the proof that an
// algorithm is one file and its options message, registered from outside src/.
#include "../../../src/peer/algorithm.h"
#include "../../../src/peer/algorithm_registry.h"
#include "never_communicate.pb.h"

namespace hearsay {
namespace {

class NeverCommunicate final : public Algorithm {
 public:
  explicit NeverCommunicate(double lr_scale) : lr_scale_(lr_scale) {}
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    return local_step(e, batch, static_cast<float>(lr * lr_scale_), step);
  }

 private:
  double lr_scale_;
};

const bool registered = register_algorithm<test::NeverCommunicateOptions>({
    .name = "never_communicate",
    .sends = {},
    .check =
        [](const test::NeverCommunicateOptions& o, const GossipSpec&, int) {
          if (!(o.lr_scale() >= 0)) throw OptionError("lr_scale", "must be >= 0");
        },
    .make = [](const GossipSpec&, const test::NeverCommunicateOptions& o) {
      return std::make_unique<NeverCommunicate>(o.lr_scale());
    },
});

}  // namespace
}  // namespace hearsay
