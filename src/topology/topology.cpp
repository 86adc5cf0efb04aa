#include "hearsay/topology.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <stdexcept>

#include "hearsay/error.h"
#include "hearsay/registry.h"
#include "hearsay/rng.h"

namespace hearsay {
namespace {

std::vector<int> all_but(int n, int peer) {
  std::vector<int> v;
  for (int j = 0; j < n; ++j) {
    if (j != peer) v.push_back(j);
  }
  return v;
}

int random_other(int n, int peer, Rng& rng) {
  const int j = static_cast<int>(rng.below(n - 1));
  return j >= peer ? j + 1 : j;
}

class Ring final : public Topology {
 public:
  int64_t period() const override { return 1; }
  explicit Ring(int n) : Topology(n) {}
  std::vector<int> targets(int peer, int64_t, Rng&) const override { return neighbours(peer); }
  std::vector<int> neighbours(int peer) const override {
    if (n_ == 2) return {1 - peer};
    return {(peer + n_ - 1) % n_, (peer + 1) % n_};
  }
};

class Torus final : public Topology {
 public:
  int64_t period() const override { return 1; }
  explicit Torus(int n) : Topology(n) {
    rows_ = static_cast<int>(std::sqrt(static_cast<double>(n)));
    while (n % rows_ != 0) --rows_;
    cols_ = n / rows_;
  }
  std::vector<int> targets(int peer, int64_t, Rng&) const override { return neighbours(peer); }
  std::vector<int> neighbours(int peer) const override {
    const int r = peer / cols_, c = peer % cols_;
    std::vector<int> v{((r + rows_ - 1) % rows_) * cols_ + c, ((r + 1) % rows_) * cols_ + c,
                       r * cols_ + (c + cols_ - 1) % cols_, r * cols_ + (c + 1) % cols_};
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    v.erase(std::remove(v.begin(), v.end(), peer), v.end());
    return v;
  }

 private:
  int rows_, cols_;
};

class Exponential final : public Topology {
 public:
  explicit Exponential(int n) : Topology(n) {
    while ((1 << levels_) < n) ++levels_;
  }
  int64_t period() const override { return levels_; }
  std::vector<int> targets(int peer, int64_t round, Rng&) const override {
    const int hop = 1 << static_cast<int>(round % levels_);
    return {(peer + hop) % n_};
  }
  std::vector<int> neighbours(int peer) const override {
    std::vector<int> v;
    for (int l = 0; l < levels_; ++l) v.push_back((peer + (1 << l)) % n_);
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
  }

 private:
  int levels_ = 0;
};

class Complete final : public Topology {
 public:
  int64_t period() const override { return 1; }
  explicit Complete(int n) : Topology(n) {}
  std::vector<int> targets(int peer, int64_t, Rng&) const override { return all_but(n_, peer); }
  std::vector<int> neighbours(int peer) const override { return all_but(n_, peer); }
};

class Star final : public Topology {
 public:
  int64_t period() const override { return 1; }
  explicit Star(int n) : Topology(n) {}
  std::vector<int> targets(int peer, int64_t, Rng&) const override { return neighbours(peer); }
  std::vector<int> neighbours(int peer) const override { return peer == 0 ? all_but(n_, 0) : std::vector<int>{0}; }
};

class RandomPeer final : public Topology {
 public:
  explicit RandomPeer(int n) : Topology(n) {}
  std::vector<int> targets(int peer, int64_t, Rng& rng) const override { return {random_other(n_, peer, rng)}; }
  std::vector<int> neighbours(int peer) const override { return all_but(n_, peer); }
};

// A random d-regular graph (every peer d neighbours, all of them targets every round, as
// on a ring): the graph of decentralized SGD at scale, where a ring's diameter n/2 would
// leave the average out of reach. Drawn from a seed of (n, d) alone, so every peer of a
// cluster builds the same graph; stubs are paired at random, never a loop or a second
// edge between the same pair, redrawn until the graph is connected.
class RandomRegular final : public Topology {
 public:
  RandomRegular(int n, int degree) : Topology(n), adj_(static_cast<size_t>(n)) {
    if (degree < 1 || degree >= n) {
      throw InputError("topology random_regular: degree must be in [1, " + std::to_string(n - 1) + "], got " + std::to_string(degree));
    }
    if ((static_cast<int64_t>(n) * degree) % 2 != 0) {
      throw InputError("topology random_regular: peers x degree must be even (" + std::to_string(n) + " x " + std::to_string(degree) + ")");
    }
    Rng rng(0x7265677565ULL + static_cast<uint64_t>(n) * 1000 + static_cast<uint64_t>(degree), 11);
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (draw(degree, rng) && connected()) return;
    }
    throw InputError("topology random_regular: no connected " + std::to_string(degree) + "-regular graph found on " +
                     std::to_string(n) + " peers; try another degree");
  }
  std::vector<int> targets(int peer, int64_t, Rng&) const override { return adj_[peer]; }
  int64_t period() const override { return 1; }
  std::vector<int> neighbours(int peer) const override { return adj_[peer]; }

 private:
  bool draw(int degree, Rng& rng) {
    for (auto& a : adj_) a.clear();
    std::vector<int> stubs;
    for (int i = 0; i < n_; ++i) stubs.insert(stubs.end(), static_cast<size_t>(degree), i);
    while (!stubs.empty()) {
      bool paired = false;
      for (int tries = 0; tries < 64 && !paired; ++tries) {
        const size_t a = rng.below(stubs.size()), b = rng.below(stubs.size());
        const int u = stubs[a], v = stubs[b];
        if (a == b || u == v || std::find(adj_[u].begin(), adj_[u].end(), v) != adj_[u].end()) continue;
        adj_[u].push_back(v);
        adj_[v].push_back(u);
        // Remove both stubs (the larger index first, so the smaller stays valid).
        for (size_t k : {std::max(a, b), std::min(a, b)}) {
          stubs[k] = stubs.back();
          stubs.pop_back();
        }
        paired = true;
      }
      if (!paired) return false;  // the stubs left cannot be paired: draw again
    }
    for (auto& a : adj_) std::sort(a.begin(), a.end());
    return true;
  }
  bool connected() const {
    std::vector<char> seen(static_cast<size_t>(n_), 0);
    std::vector<int> todo{0};
    seen[0] = 1;
    int reached = 1;
    while (!todo.empty()) {
      const int u = todo.back();
      todo.pop_back();
      for (int v : adj_[u]) {
        if (!seen[v]) {
          seen[v] = 1;
          ++reached;
          todo.push_back(v);
        }
      }
    }
    return reached == n_;
  }
  std::vector<std::vector<int>> adj_;
};

class Hierarchical final : public Topology {
 public:
  Hierarchical(int n, std::vector<int> site_of, int cross_every)
      : Topology(n), site_of_(std::move(site_of)), cross_every_(std::max(1, cross_every)) {
    if (site_of_.empty()) site_of_.assign(n, 0);
  }
  std::vector<int> targets(int peer, int64_t round, Rng& rng) const override {
    std::vector<int> same, other;
    for (int j = 0; j < n_; ++j) {
      if (j == peer) continue;
      (site_of_[j] == site_of_[peer] ? same : other).push_back(j);
    }
    const bool cross = (round % cross_every_ == cross_every_ - 1) || same.empty();
    const auto& pool = cross && !other.empty() ? other : same;
    return {pool[rng.below(pool.size())]};
  }
  std::vector<int> neighbours(int peer) const override { return all_but(n_, peer); }

 private:
  std::vector<int> site_of_;
  int cross_every_;
};

class BandwidthAware final : public Topology {
 public:
  BandwidthAware(int n, double floor) : Topology(n), floor_(floor), thr_(static_cast<size_t>(n) * n, 0.0) {}
  std::vector<int> targets(int peer, int64_t, Rng& rng) const override {
    const auto p = probabilities(peer);
    double u = rng.uniform(), acc = 0;
    for (int j = 0; j < n_; ++j) {
      acc += p[j];
      if (u < acc && j != peer) return {j};
    }
    return {random_other(n_, peer, rng)};
  }
  std::vector<int> neighbours(int peer) const override { return all_but(n_, peer); }
  void observe_throughput(int peer, int other, double bps) override {
    std::lock_guard<std::mutex> lock(mu_);
    double& t = thr_[static_cast<size_t>(peer) * n_ + other];
    t = t <= 0 ? bps : 0.8 * t + 0.2 * bps;  // smoothed
  }
  // Probability of each peer as the next target: throughput-proportional, floored.
  std::vector<double> probabilities(int peer) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> p(n_, 0.0);
    double sum = 0;
    int known = 0;
    for (int j = 0; j < n_; ++j) {
      if (j == peer) continue;
      const double t = thr_[static_cast<size_t>(peer) * n_ + j];
      if (t > 0) {
        sum += t;
        ++known;
      }
    }
    const double uniform = 1.0 / (n_ - 1);
    const double least = floor_ * uniform;
    // Unmeasured links are tried as if they were average.
    const double mean = known > 0 ? sum / known : 1.0;
    double total = 0;
    for (int j = 0; j < n_; ++j) {
      if (j == peer) continue;
      const double t = thr_[static_cast<size_t>(peer) * n_ + j];
      p[j] = t > 0 ? t : mean;
      total += p[j];
    }
    // Mix with the uniform distribution just enough that no edge falls below the floor.
    double lowest = 1.0;
    for (int j = 0; j < n_; ++j) {
      if (j != peer) lowest = std::min(lowest, p[j] / total);
    }
    const double mix = lowest >= least ? 0.0 : (least - lowest) / (uniform - lowest);
    for (int j = 0; j < n_; ++j) {
      if (j != peer) p[j] = (1 - mix) * p[j] / total + mix * uniform;
    }
    return p;
  }

 private:
  double floor_;
  mutable std::mutex mu_;
  std::vector<double> thr_;  // GUARDED_BY(mu_)
};

template <class T, class... Args>
TopologyFactory builder(Args... args) {
  return [=](const TopologySpec&, int n) { return std::unique_ptr<Topology>(std::make_unique<T>(n, args...)); };
}

}  // namespace

// hearsay's own topologies, there before any lookup (a function's static).
NamedRegistry<TopologyFactory>& topologies() {
  static NamedRegistry<TopologyFactory> all(
      "topology", {{"ring", builder<Ring>()},
                   {"torus", builder<Torus>()},
                   {"exponential", builder<Exponential>()},
                   {"complete", builder<Complete>()},
                   {"star", builder<Star>()},
                   {"random", builder<RandomPeer>()},
                   {"random_regular",
                    [](const TopologySpec& s, int n) { return std::unique_ptr<Topology>(std::make_unique<RandomRegular>(n, s.degree)); }},
                   {"hierarchical",
                    [](const TopologySpec& s, int n) {
                      return std::unique_ptr<Topology>(std::make_unique<Hierarchical>(n, s.site_of, s.cross_every));
                    }},
                   {"bandwidth", [](const TopologySpec& s, int n) {
                      if (!(s.floor > 0 && s.floor <= 1)) throw InputError("topology: bandwidth floor must be in (0, 1]");
                      return std::unique_ptr<Topology>(std::make_unique<BandwidthAware>(n, s.floor));
                    }}});
  return all;
}

std::unique_ptr<Topology> make_topology(const TopologySpec& spec, int n) {
  if (n < 2) throw InputError("topology: a cluster needs at least 2 peers, got " + std::to_string(n));
  if (!spec.site_of.empty() && static_cast<int>(spec.site_of.size()) != n) {
    throw InputError("topology: site_of names " + std::to_string(spec.site_of.size()) + " peers, the cluster has " + std::to_string(n));
  }
  return topologies().get(spec.kind)(spec, n);
}

}  // namespace hearsay
