// The synchronous baselines, on the same transports, for honest comparisons. Each waits
// for its neighbours every round (every H rounds for local_sgd and diloco), so the
// slowest peer or link sets everyone's pace.
//   allreduce  g <- all-reduce(g) / n (collectives.cpp: hierarchical across sites, under
//              the comparison's codec; PowerSGD with error feedback), then the optimizer
//              step at the linearly scaled learning rate (n lr after a warm-up)
//   dpsgd      gradient at x; x <- w_ii x + sum_j w_ij x_j over the neighbours, with
//              Metropolis-Hastings weights w_ij = 1/(1 + max(deg_i, deg_j)) (doubly
//              stochastic on any undirected graph); then the optimizer step with that
//              gradient (Lian et al., NeurIPS 2017)
//   local_sgd  H optimizer steps alone, then x <- all-reduce(x) / n (fp32)
//   diloco     H steps alone from the shared anchor a; then delta = a - mean(x);
//              v <- mu v + delta; a <- a - outer_lr (delta + mu v) (Nesterov); x <- a
#include <algorithm>

#include "../algorithm.h"

namespace hearsay {
namespace {

class AllReduce final : public Algorithm {
 public:
  explicit AllReduce(const GossipSpec& s) {
    if (s.codec.name == "powersgd") powersgd_ = std::make_unique<PowerSgdAllReduce>(s.codec.rank);
  }
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    const BatchStats s = gradient_only(e, x, labels, batch);
    Backend& b = e.model().backend();
    std::vector<float> g(e.model().num_params());
    b.download(g.data(), e.model().grads(), sizeof(float) * g.size());
    if (powersgd_) {
      g = powersgd_->average(e, std::move(g), step);
    } else {
      g = allreduce_sum(e, std::move(g), step, 0, true);
      const float inv = 1.0f / static_cast<float>(e.peers().size());
      for (auto& v : g) v *= inv;
    }
    b.upload(e.model().grads(), g.data(), sizeof(float) * g.size());
    e.sgd().step(e.model().params(), e.model().grads(), lr * lr_scale(e, step));
    return s;
  }
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
  // from lr to n lr over the warm-up (Goyal et al., 2017), unless the config says none.
  static float lr_scale(GossipEngine& e, uint64_t step) {
    const GossipSpec& s = e.spec();
    if (s.sync_lr_scaling != "linear") return 1.0f;
    const double n = static_cast<double>(e.peers().size());
    const double ramp = s.sync_lr_warmup_steps > 0 ? std::min(1.0, static_cast<double>(step) / s.sync_lr_warmup_steps) : 1.0;
    return static_cast<float>(1.0 + (n - 1.0) * ramp);
  }
  std::unique_ptr<PowerSgdAllReduce> powersgd_;
};

class Dpsgd final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    const BatchStats s = gradient_only(e, x, labels, batch);
    Topology& t = e.topology();
    const auto neighbours = t.neighbours(e.me());
    auto mine = e.params_host();
    for (int j : neighbours) e.send(j, wire::MODEL, mine, 0, true, step, 0);
    // Metropolis-Hastings: w_ij = 1 / (1 + max(deg_i, deg_j)), w_ii = 1 - sum_j w_ij.
    // Symmetric, so doubly stochastic on any undirected graph (check_algorithm_topology
    // refuses a directed one).
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
    e.sgd().step(e.model().params(), e.model().grads(), lr);
    return s;
  }
};

class LocalSgd final : public Algorithm {
 public:
  explicit LocalSgd(bool diloco) : diloco_(diloco) {}
  BatchStats step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr, uint64_t step) override {
    if (diloco_ && anchor_.empty()) anchor_ = e.params_host();
    const BatchStats s = local_step(e, x, labels, batch, lr);
    const uint64_t h = static_cast<uint64_t>(e.spec().local_steps);
    if (step % h != h - 1) return s;
    auto avg = allreduce_sum(e, e.params_host(), step / h, 0, false);
    const float inv = 1.0f / static_cast<float>(e.peers().size());
    for (auto& v : avg) v *= inv;
    if (!diloco_) {
      e.set_params_host(avg);
      return s;
    }
    const double mu = e.spec().outer_momentum, olr = e.spec().outer_lr;
    if (velocity_.empty()) velocity_.assign(avg.size(), 0.0f);
    for (size_t i = 0; i < avg.size(); ++i) {
      const float delta = anchor_[i] - avg[i];
      velocity_[i] = static_cast<float>(mu * velocity_[i] + delta);
      anchor_[i] -= static_cast<float>(olr * (delta + mu * velocity_[i]));
    }
    e.set_params_host(anchor_);
    return s;
  }

  std::string save() const override {
    StateWriter w;
    for (const auto* v : {&anchor_, &velocity_}) {
      w.put(v->empty() ? 0.0 : 1.0);
      if (!v->empty()) w.put(*v);
    }
    return w.str();
  }
  void load(const std::string& state, GossipEngine& e) override {
    if (state.empty()) return;
    StateReader r(state);
    for (auto* v : {&anchor_, &velocity_}) {
      if (r.get() != 0) *v = r.get_floats(e.model().num_params());
    }
    if (!r.done()) throw InputError("checkpoint: local_sgd/diloco state has bytes left over");
  }

 private:
  bool diloco_;
  std::vector<float> anchor_, velocity_;
};

}  // namespace

std::unique_ptr<Algorithm> make_allreduce(const GossipSpec& s) { return std::make_unique<AllReduce>(s); }
std::unique_ptr<Algorithm> make_dpsgd() { return std::make_unique<Dpsgd>(); }
std::unique_ptr<Algorithm> make_local_sgd(bool diloco) { return std::make_unique<LocalSgd>(diloco); }

}  // namespace hearsay
