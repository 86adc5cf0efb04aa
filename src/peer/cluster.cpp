#include "hearsay/cluster.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

#include "hearsay/clock.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

// Collects each peer's snapshot per step and computes the consensus distance once all
// peers have reported that step.
class ConsensusMonitor {
 public:
  explicit ConsensusMonitor(int n) : n_(n) {}
  void add(int peer, int64_t step, const std::vector<float>& params) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = pending_[step];
    slot.resize(n_);
    slot[peer] = params;
    int have = 0;
    for (const auto& p : slot) have += !p.empty();
    if (have < n_) return;
    const size_t d = slot[0].size();
    std::vector<double> mean(d, 0.0);
    for (const auto& p : slot) {
      for (size_t i = 0; i < d; ++i) mean[i] += p[i];
    }
    for (auto& m : mean) m /= n_;
    double total = 0;
    for (const auto& p : slot) {
      double s = 0;
      for (size_t i = 0; i < d; ++i) s += (p[i] - mean[i]) * (p[i] - mean[i]);
      total += std::sqrt(s);
    }
    series_.emplace_back(step, total / n_);
    pending_.erase(step);
  }
  std::vector<std::pair<int64_t, double>> series() {
    std::lock_guard<std::mutex> lock(mu_);
    std::sort(series_.begin(), series_.end());
    return series_;
  }

 private:
  int n_;
  std::mutex mu_;
  std::map<int64_t, std::vector<std::vector<float>>> pending_;
  std::vector<std::pair<int64_t, double>> series_;
};

// Holds late peers back until the peers that start at once have each taken a number of
// steps (as their snapshots report them) or finished, whichever comes first.
class StartGate {
 public:
  explicit StartGate(std::vector<bool> early) : early_(std::move(early)), steps_(early_.size(), 0), done_(early_.size(), false) {}
  void reached(int peer, int64_t step) {
    std::lock_guard<std::mutex> lock(mu_);
    steps_[peer] = std::max(steps_[peer], step);
    cv_.notify_all();
  }
  void finished(int peer) {
    std::lock_guard<std::mutex> lock(mu_);
    done_[peer] = true;
    cv_.notify_all();
  }
  void wait_for_early_peers(int64_t steps) {
    std::unique_lock<std::mutex> lock(mu_);
    wall_clock().wait_for(lock, cv_, std::numeric_limits<double>::infinity(), [&] {
      for (size_t i = 0; i < early_.size(); ++i) {
        if (early_[i] && !done_[i] && steps_[i] < steps) return false;
      }
      return true;
    });
  }

 private:
  std::vector<bool> early_;
  std::vector<int64_t> steps_;
  std::vector<bool> done_;
  std::mutex mu_;
  std::condition_variable cv_;
};

// What was still in outboxes or on the wire when the peers stopped is let arrive and taken
// in, so that what the peers hold at the end is all there is (sgp's mass is counted whole).
// Bounded: a few rounds of at most 10 s each.
void settle(const std::vector<Peer*>& peers) {
  for (int round = 0; round < 3; ++round) {
    Clock& wall = wall_clock();
    const double deadline = wall.now() + 10;
    auto all_idle = [&] {
      for (auto& p : peers) {
        if (!p->engine()->idle()) return false;
      }
      return true;
    };
    while (!all_idle() && wall.now() < deadline) wall.sleep_for(0.005);
    wall.sleep_for(0.02);  // the last frames reach their inboxes
    for (auto& p : peers) p->engine()->settle();
  }
}

}  // namespace

ClusterResult run_cluster(const ClusterSpec& spec) {
  const int n = spec.peers;
  check_gossip_spec(spec.gossip, n);
  if (!spec.slowdown.empty() && static_cast<int>(spec.slowdown.size()) != n) {
    throw InputError("cluster: slowdown lists " + std::to_string(spec.slowdown.size()) + " peers, the cluster has " + std::to_string(n));
  }
  if (!spec.crash_after_steps.empty() && static_cast<int>(spec.crash_after_steps.size()) != n) {
    throw InputError("cluster: crash_after_steps lists " + std::to_string(spec.crash_after_steps.size()) +
                     " peers, the cluster has " + std::to_string(n));
  }
  const auto crashes = [&](int i) { return !spec.crash_after_steps.empty() && spec.crash_after_steps[i] > 0; };
  if (!spec.start_after_steps.empty() && static_cast<int>(spec.start_after_steps.size()) != n) {
    throw InputError("cluster: start_after_steps lists " + std::to_string(spec.start_after_steps.size()) +
                     " peers, the cluster has " + std::to_string(n));
  }
  const auto late = [&](int i) { return !spec.start_after_steps.empty() && spec.start_after_steps[i] > 0; };
  std::vector<bool> early(n);
  for (int i = 0; i < n; ++i) early[i] = !late(i);
  if (std::find(early.begin(), early.end(), true) == early.end()) {
    throw InputError("cluster: start_after_steps holds every peer back, none would ever start");
  }
  StartGate gate(early);
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i) ids.push_back("peer" + std::to_string(i));

  // Transports: everyone listens, then dials every peer with a higher index, so each
  // pair has one connection.
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::string> addresses;
  for (int i = 0; i < n; ++i) {
    TransportOptions o;
    o.peer_id = ids[i];
    o.cluster_id = "cluster-" + spec.base.name;
    o.secret = "in-process-cluster";
    o.cluster_peers = ids;
    o.heartbeat_interval_s = 0.5;
    auto t = create_transport(spec.transport, o);
    std::map<std::string, LinkModel> per_peer;
    for (const auto& [edge, m] : spec.links) {
      if (edge.first == i) per_peer[ids[edge.second]] = m;
    }
    const bool emulate = spec.link.latency_s > 0 || spec.link.bandwidth_bps > 0 || spec.link.loss > 0 ||
                         !spec.link.outages.empty() || !per_peer.empty();
    if (emulate) t = create_emulated_transport(std::move(t), spec.link, per_peer, spec.base.seed + i);
    addresses.push_back(t->listen(spec.transport == "inproc" ? "" : "127.0.0.1:0"));
    transports.push_back(std::move(t));
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) transports[i]->connect(ids[j], addresses[j]);
  }
  Clock& wall = wall_clock();
  const double deadline = wall.now() + 20;
  for (int i = 0; i < n; ++i) {
    while (static_cast<int>(transports[i]->connected_peers().size()) < n - 1) {
      if (wall.now() > deadline) throw InputError("cluster: peers did not all connect within 20 s");
      wall.sleep_for(0.005);
    }
  }

  ConsensusMonitor monitor(n);
  std::vector<std::unique_ptr<EventLog>> logs;
  std::vector<std::unique_ptr<Peer>> peers;
  for (int i = 0; i < n; ++i) {
    PeerSpec c = spec.base;
    if (crashes(i)) c.train.max_steps = spec.crash_after_steps[i];  // its schedule as for a run of that length
    c.name = ids[i];
    c.num_shards = n;
    c.shard = i;
    logs.push_back(std::make_unique<EventLog>(spec.log_dir.empty() ? "" : spec.log_dir + "/" + ids[i] + ".jsonl", ids[i]));
    PeerNetwork net;
    net.gossip = spec.gossip;
    if (!spec.byzantine.empty()) net.gossip.byzantine = spec.byzantine.at(i);
    net.peers = ids;
    net.me = i;
    net.transport = transports[i].get();
    net.slowdown = spec.slowdown.empty() ? 1.0 : spec.slowdown[i];
    if (!spec.flip_bit_after_step.empty()) net.flip_bit_after_step = spec.flip_bit_after_step.at(i);
    net.on_snapshot = [&monitor, &gate, i](int64_t step, const std::vector<float>& p) {
      monitor.add(i, step, p);
      gate.reached(i, step);
    };
    if (spec.distinct_init) {
      net.join = false;
      net.init_seed = spec.base.seed + 1000 + static_cast<uint64_t>(i);
    }
    peers.push_back(std::make_unique<Peer>(std::move(c), *logs.back(), nullptr, &net));
  }

  ClusterResult result;
  result.peers.resize(n);
  for (auto& p : peers) result.initial_params.push_back(p->params());
  std::mutex error_mu;
  std::exception_ptr first_error;  // the root cause, not the stops it triggered
  const double t0 = wall.now();
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        if (late(i)) gate.wait_for_early_peers(spec.start_after_steps[i]);
        result.peers[i] = peers[i]->run();
        gate.finished(i);
        if (crashes(i)) transports[i]->close();  // dead: the others hear nothing more from it
      } catch (...) {
        gate.finished(i);  // a late peer must not wait for one that failed
        {
          std::lock_guard<std::mutex> lock(error_mu);
          if (!first_error) first_error = std::current_exception();
        }
        for (auto& p : peers) p->stop();  // the others must not wait for this one
      }
    });
  }
  for (auto& t : threads) t.join();
  result.wall_s = wall.now() - t0;
  result.consensus = monitor.series();
  if (!spec.log_dir.empty()) {
    EventLog cluster_log(spec.log_dir + "/cluster.jsonl", "cluster");
    for (const auto& [step, d] : result.consensus) {
      cluster_log.write(cluster_log.event("consensus").add("step", step).add("distance", d));
    }
  }
  if (!first_error) {
    std::vector<Peer*> live;
    for (int i = 0; i < n; ++i) {
      if (!crashes(i)) live.push_back(peers[i].get());
    }
    settle(live);
  }
  // Transports stop delivering before the engines they deliver to go away.
  for (auto& t : transports) t->close();
  for (auto& p : peers) {
    result.final_params.push_back(p->params());
    result.algorithm_state.push_back(p->algorithm_state());
  }
  peers.clear();
  if (first_error) std::rethrow_exception(first_error);
  return result;
}

}  // namespace hearsay
