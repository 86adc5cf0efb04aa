// dpsgd: synchronous decentralized SGD (Lian et al., NeurIPS 2017). Each step: the
// gradient at x; x <- w_ii x + sum_j w_ij x_j over the neighbours, with Metropolis-Hastings
// weights w_ij = 1/(1 + max(deg_i, deg_j)) (doubly stochastic on any undirected graph);
// then the optimizer step with that gradient. Every peer waits for its neighbours' models
// each round.
#include <algorithm>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/dpsgd.pb.h"

namespace hearsay {
namespace {

class Dpsgd final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = e.gradient(batch, step);
    Topology& t = e.topology();
    const auto neighbours = t.neighbours(e.me());
    auto mine = e.params_host();
    const auto sent = std::make_shared<const std::vector<float>>(mine);  // one copy for every neighbour
    for (int j : neighbours) e.send_shared(j, {.kind = MessageKind::kModel, .synchronous = true, .round = step}, sent);
    // Metropolis-Hastings: w_ij = 1 / (1 + max(deg_i, deg_j)), w_ii = 1 - sum_j w_ij.
    // Symmetric, so doubly stochastic on any undirected graph (the registry's
    // undirected_topology refuses a directed one).
    const double deg = static_cast<double>(neighbours.size());
    double self = 1.0;
    std::vector<double> mixed(mine.size(), 0.0);
    for (int j : neighbours) {
      const double w = 1.0 / (1.0 + std::max(deg, static_cast<double>(t.neighbours(j).size())));
      self -= w;
      const auto m = e.wait_sync(j, step, 0);
      for (size_t i = 0; i < mixed.size() && i < m.data.size(); ++i) mixed[i] += w * m.data[i];
    }
    for (size_t i = 0; i < mixed.size(); ++i) mine[i] = static_cast<float>(mixed[i] + self * mine[i]);
    e.set_params_host(mine);
    e.optimizer().step(e.model().params(), e.model().grads(), lr);
    return s;
  }
};

// No new_site_leader: its sites' leaders wait on each other every round (a dead leader stops its
// neighbours' sites as well).
const bool registered = register_algorithm<algorithms::DpsgdOptions>({
    .name = "dpsgd",
    .synchronous = true,
    .undirected_topology = true,
    .make = [](const GossipSpec&, const algorithms::DpsgdOptions&) { return std::make_unique<Dpsgd>(); },
});

}  // namespace
}  // namespace hearsay
