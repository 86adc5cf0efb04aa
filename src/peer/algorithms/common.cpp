#include <chrono>

#include "../algorithm.h"

namespace hearsay {

BatchStats gradient_only(GossipEngine& e, const Batch& batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const BatchStats s = e.model().forward_backward(batch);
  e.add_compute_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return s;
}

BatchStats local_step(GossipEngine& e, const Batch& batch, float lr) {
  const BatchStats s = gradient_only(e, batch);
  e.optimizer().step(e.model().params(), e.model().grads(), lr);
  return s;
}

}  // namespace hearsay
