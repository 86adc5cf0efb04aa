// What the averaging algorithms' invariant tests share (adpsgd_test, choco_test, sgp_test,
// dpsgd_test): peers that start apart and take no gradient step, and the measures of where
// their models went.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/peer.h"

namespace hearsay::test {

// Peers that start apart and take (almost) no gradient steps: what the gossip alone does to
// their models. lr 1e-30 moves no fp32 parameter of this size.
// `adjust` changes the spec before the run (a codec, a consensus step).
inline ClusterResult averaging_only(const std::string& algorithm, const std::string& topology, int n = 8,
                             const std::function<void(ClusterSpec&)>& adjust = {}) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(R"(
    name: "avg" seed: 11
    model { kind: MLP hidden: [16] }
    data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 8 num_classes: 4 }
    optim { lr: 1e-30 momentum: 0 }
    train { batch_size: 16 epochs: 16 eval_every_steps: 1000000 }
    log { every_steps: 16 }
  )", "averaging-test"));
  s.peers = n;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = topology;
  s.gossip.mixer.weighting = "polynomial";  // staleness-weighted shares, as by default
  s.distinct_init = true;
  // Steps paced at a fixed 1 ms, not stretched by a slowdown: a slowdown multiplies what a
  // step measured, so a peer descheduled on a loaded machine (CI runs two suites at once)
  // then sleeps 20 times the time it lost, the peers drift apart in pace and too few
  // exchanges happen before they stop (a CI run of adpsgd ended at 0.009 of its spread).
  s.base.train.emulated_step_s = 0.001;
  s.slowdown = std::vector<double>(n, 1.0);
  if (adjust) adjust(s);
  return run_cluster(s);
}

inline std::vector<double> mean_of(const std::vector<std::vector<float>>& models) {
  std::vector<double> m(models[0].size(), 0.0);
  for (const auto& x : models) {
    for (size_t i = 0; i < m.size(); ++i) m[i] += x[i];
  }
  for (auto& v : m) v /= static_cast<double>(models.size());
  return m;
}

inline double distance(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

// Mean distance of the peers' models from their mean.
inline double spread(const std::vector<std::vector<float>>& models) {
  const auto m = mean_of(models);
  double total = 0;
  for (const auto& x : models) total += distance(std::vector<double>(x.begin(), x.end()), m);
  return total / static_cast<double>(models.size());
}

// The averaging invariant: the models meet (spread below 1e-3 of where it started) on the
// mean they started with (moved less than 1e-4 of the starting spread).
inline void check_mean_kept_and_consensus(const ClusterResult& r) {
  const double start_spread = spread(r.initial_params), end_spread = spread(r.final_params);
  const double moved = distance(mean_of(r.initial_params), mean_of(r.final_params));
  MESSAGE("spread " << start_spread << " -> " << end_spread << "; the mean moved " << moved);
  CHECK(end_spread < 1e-3 * start_spread);
  CHECK(moved < 1e-4 * start_spread);
}

}  // namespace hearsay::test
