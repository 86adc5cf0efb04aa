// The private interface behind GossipEngine: one implementation per algorithm
// (src/peer/algorithms/). An algorithm owns the training step and the communication
// around it; it reaches the model, the mixer and the network only through the engine.
#pragma once

#include <memory>
#include <string>

#include "message.h"

namespace hearsay {

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) = 0;
};

std::unique_ptr<Algorithm> make_adpsgd();
std::unique_ptr<Algorithm> make_gossip_grad();
std::unique_ptr<Algorithm> make_sgp();
std::unique_ptr<Algorithm> make_choco();
std::unique_ptr<Algorithm> make_allreduce();
std::unique_ptr<Algorithm> make_dpsgd();
std::unique_ptr<Algorithm> make_local_sgd(bool diloco);

// The plain local step: gradient, then the optimizer.
BatchStats local_step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr);
// Gradient only (into the model's gradient buffer).
BatchStats gradient_only(GossipEngine& e, const float* x, const int32_t* labels, int batch);
// Sum of `v` over all peers, by ring reduce-scatter and all-gather (2 (n-1) messages of
// n-th size each way); waits for the neighbours.
std::vector<float> ring_allreduce(GossipEngine& e, std::vector<float> v, uint64_t round);

}  // namespace hearsay
