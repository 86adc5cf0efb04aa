// CHOCO-SGD (Koloskova, Stich, Jaggi, ICML 2019): compressed model gossip with public
// copies. Peer i keeps x_i and public copies x^_j of itself and of its topology
// neighbours (everyone's copy of x^_j is the same, since each is built from the same
// compressed differences). Each step:
//   x_i <- optimizer step;  q_i = Q(x_i - x^_i);  x^_i += q_i;  send q_i to neighbours
//   for each arrived q_j: x^_j += q_j
//   x_i <- x_i + gamma * sum_j 1/(1 + deg) (x^_j - x^_i)
// Q is the link's codec (gossip.codec) with its error feedback: the difference goes to
// the outbox whole and each link sends what its codec carries, keeping the rest in its
// residual for later. A receiver's copy of x^_i so lags the sender's by that residual,
// which error feedback keeps bounded and eventually delivers (with codec none the copies
// agree exactly). Differences pending on a slow link are summed, which keeps the copies
// in step. With gossip_every = k, differences are sent every k steps, the consensus step
// still taken every step against the copies as they stand.
#include <map>

#include "../algorithm.h"

namespace hearsay {
namespace {

class Choco final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    const auto neighbours = e.topology().neighbours(e.me());
    if (copies_.empty()) {
      // Everyone starts from the same initial model, so the public copies do too.
      const auto x0 = e.params_host();
      copies_[e.me()] = x0;
      for (int j : neighbours) copies_[j] = x0;
    }
    const BatchStats s = local_step(e, x, labels, batch, lr);
    auto xi = e.params_host();
    auto& mine = copies_[e.me()];
    // Every gossip_every steps: the difference accumulated since the last send.
    if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0) {
      std::vector<float> q(xi.size());
      for (size_t k = 0; k < q.size(); ++k) q[k] = xi[k] - mine[k];
      mine = xi;
      for (int j : neighbours) e.send(j, wire::MODEL_DELTA, q);
    }
    for (auto& m : e.take_async()) {
      if (m.kind != wire::MODEL_DELTA) continue;
      auto it = copies_.find(m.from);
      if (it == copies_.end()) continue;
      e.mixer().gradient(e.clock(), m.clock);  // for the staleness statistics; differences are never dropped
      for (size_t k = 0; k < it->second.size() && k < m.data.size(); ++k) it->second[k] += m.data[k];
    }
    const double w = e.spec().consensus_step / (1.0 + static_cast<double>(neighbours.size()));
    for (int j : neighbours) {
      const auto& other = copies_[j];
      for (size_t k = 0; k < xi.size(); ++k) xi[k] += static_cast<float>(w * (other[k] - mine[k]));
    }
    e.set_params_host(xi);
    return s;
  }

  std::string save() const override {
    StateWriter w;
    w.put(static_cast<double>(copies_.size()));
    for (const auto& [j, v] : copies_) w.put(static_cast<double>(j)).put(v);
    return w.str();
  }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    copies_.clear();
    const double count = r.get();
    for (double i = 0; i < count; ++i) {
      const double j = r.get();
      if (!(j >= 0 && j < static_cast<double>(e.peers().size()))) throw InputError("checkpoint: choco copy of an unknown peer");
      copies_[static_cast<int>(j)] = r.get_floats(e.model().num_params());
    }
    if (!r.done()) throw InputError("checkpoint: choco state has bytes left over");
  }

 private:
  std::map<int, std::vector<float>> copies_;
};

}  // namespace

std::unique_ptr<Algorithm> make_choco() { return std::make_unique<Choco>(); }

}  // namespace hearsay
