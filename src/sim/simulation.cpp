// run_simulation: the cluster of a config on virtual time (docs/SIMULATION.md). One
// SimGrid actor per peer runs Peer::run, the same step loop a peer process runs; a
// monitor actor evaluates the mean model and stops the run at its target or time limit;
// a fault actor crashes peers and takes links down on schedule.
#include "hearsay/simulation.h"

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <exception>
#include <memory>
#include <optional>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/peer.h"
#include "sim_network.h"
#include "sim_platform.h"

namespace hearsay {
namespace {

namespace s4u = simgrid::s4u;
using sim::SimClock;
using sim::SimNetwork;
using sim::SimTransport;

uint64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

// Which peers score their model: the first of each site, then the second of each, ...
std::vector<bool> evaluating_peers(const std::vector<int>& site_of, int count) {
  const int n = static_cast<int>(site_of.size());
  std::vector<bool> on(n, count <= 0 || count >= n);
  if (count <= 0 || count >= n) return on;
  int sites = 0;
  for (int s : site_of) sites = std::max(sites, s + 1);
  std::vector<std::vector<int>> by_site(sites);
  for (int i = 0; i < n; ++i) by_site[site_of[i]].push_back(i);
  int chosen = 0;
  for (size_t rank = 0; chosen < count; ++rank) {
    for (const auto& peers : by_site) {
      if (rank < peers.size() && chosen < count) {
        on[peers[rank]] = true;
        ++chosen;
      }
    }
  }
  return on;
}

struct ScheduledFault {
  double at = 0, until = 0;
  std::string kind;  // crash, churn, site_down, outage
  int peer = -1;
  std::vector<s4u::Link*> links;
  std::string target;
};

class Simulation {
 public:
  Simulation(const config::Config& cfg, const SimulationOptions& opt) : cfg_(cfg), opt_(opt) {}

  SimulationResult run();

 private:
  struct PeerSlot {
    PeerSpec spec;
    PeerNetwork network;
    std::unique_ptr<SimClock> clock;
    std::unique_ptr<EventLog> log;
    std::unique_ptr<SimTransport> transport;
    std::unique_ptr<Peer> peer;
    bool running = false, finished = false;
    double restart_at = -1;
    std::string crash_kind;  // crash or churn: what took it down last
    int incarnation = 0;
    std::optional<double> last_acc;
  };

  void start_engine();
  void make_peers();
  void build_incarnation(int i);
  void peer_body(int i);
  void monitor_body();
  void fault_body(std::vector<ScheduledFault> faults);
  std::vector<ScheduledFault> schedule_faults();
  void stop_all(const std::string& why);
  void evaluate_mean_model();
  void progress(bool force);
  void write_fault(const ScheduledFault& f, bool begin);

  const config::Config& cfg_;
  SimulationOptions opt_;
  std::unique_ptr<s4u::Engine> engine_;
  sim::SimPlatform platform_;
  std::unique_ptr<SimNetwork> net_;
  std::shared_ptr<const TrainTest> data_;
  std::vector<PeerSlot> slots_;
  std::vector<std::string> names_;
  std::unique_ptr<SimClock> cluster_clock_;
  std::unique_ptr<EventLog> cluster_log_;
  std::unique_ptr<Peer> evaluator_;  // a peer alone: scores the mean model
  std::string stopped_by_;
  int peers_done_ = 0;
  std::exception_ptr first_error_;
  double max_virtual_s_ = 0, eval_every_s_ = 0, target_ = 0;
  bool stop_at_target_ = true;
  std::chrono::steady_clock::time_point wall_start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_progress_ = wall_start_;
};

void Simulation::start_engine() {
  const auto& s = cfg_.experiment().simulation();
  // SimGrid reads its settings as command-line options.
  static std::vector<std::string> args;
  args = {"hearsay-sim"};
  for (auto& o : sim::simgrid_options(s)) args.push_back(std::move(o));
  // More of SimGrid's own settings, for whoever studies the model itself
  // (docs/SIMULATION.md): HEARSAY_SIMGRID_ARGS="--cfg=network/optim:Full".
  if (const char* more = std::getenv("HEARSAY_SIMGRID_ARGS")) {
    std::istringstream words(more);
    for (std::string w; words >> w;) args.push_back(w);
  }
  static std::vector<char*> argv;
  argv.clear();
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  engine_ = std::make_unique<s4u::Engine>(&argc, argv.data());
}

void Simulation::make_peers() {
  const auto& cl = cfg_.cluster();
  const int n = cl.peers_size();
  PeerSpec base = peer_spec(cluster_peer_config(cfg_, names_[0]));
  data_ = std::make_shared<const TrainTest>(std::move(base.data));
  base.data = TrainTest{};
  const auto evaluates = evaluating_peers(platform_.site_of, cfg_.experiment().simulation().eval_peers());
  slots_.resize(n);
  for (int i = 0; i < n; ++i) {
    PeerSlot& slot = slots_[i];
    slot.spec = base;
    slot.spec.name = names_[i];
    slot.spec.shared_data = data_;
    slot.spec.num_shards = n;
    slot.spec.shard = i;
    if (!cl.peers(i).device().empty()) slot.spec.device = cl.peers(i).device();
    slot.spec.train.evaluates = evaluates[i];
    // A peer that never evaluates needs no buffers for an evaluation batch.
    if (!evaluates[i]) slot.spec.train.eval_batch_size = slot.spec.train.batch_size;
    slot.clock = std::make_unique<SimClock>(*net_, i);
    slot.log = std::make_unique<EventLog>(opt_.log_dir.empty() ? "" : opt_.log_dir + "/" + names_[i] + ".jsonl", names_[i],
                                          slot.clock.get());
    slot.network = cluster_peer_network(cfg_, i);
    slot.network.clock = slot.clock.get();
    slot.network.on_eval = [this, i](int64_t, const BatchStats& s) { slots_[i].last_acc = s.accuracy(); };
  }
  // The mean model is scored on the same test set by a peer of its own, alone.
  PeerSpec eval = base;
  eval.name = "mean";
  eval.shared_data = data_;
  eval.checkpoint_dir.clear();
  evaluator_ = std::make_unique<Peer>(std::move(eval), *cluster_log_, nullptr);
}

void Simulation::build_incarnation(int i) {
  PeerSlot& slot = slots_[i];
  slot.transport = std::make_unique<SimTransport>(*net_, i);
  slot.network.transport = slot.transport.get();
  const double jitter = cfg_.experiment().simulation().step_jitter();
  if (jitter > 0) {
    auto rng = std::make_shared<Rng>(cfg_.seed() * 1000003 + static_cast<uint64_t>(i), 600 + static_cast<uint64_t>(slot.incarnation));
    slot.network.step_time_factor = [rng, jitter](int64_t) { return 1.0 + jitter * (2.0 * rng->uniform() - 1.0); };
  }
  net_->peer_up(i, slot.transport.get(), slot.clock.get());
  slot.peer = std::make_unique<Peer>(slot.spec, *slot.log, nullptr, &slot.network);
  ++slot.incarnation;
}

void Simulation::peer_body(int i) {
  PeerSlot& slot = slots_[i];
  // The last peer to end closes the wire: what is still on it no longer matters.
  struct LastOut {
    Simulation& s;
    ~LastOut() {
      if (++s.peers_done_ == static_cast<int>(s.slots_.size())) s.net_->close();
    }
  } last_out{*this};
  for (;;) {
    try {
      if (!slot.peer) build_incarnation(i);  // the first one is built before time starts
      slot.running = true;
      slot.peer->run();
      slot.running = false;
      slot.finished = true;
      return;
    } catch (const sim::SimulatedCrash&) {
      slot.running = false;
      // Everything of the crashed incarnation goes; what it learnt since its last
      // checkpoint is lost. The log stays, and the next incarnation appends to it.
      slot.peer.reset();
      slot.transport.reset();
      slot.clock->revive();
      if (!stopped_by_.empty()) return;
      s4u::this_actor::sleep_until(slot.restart_at);
      if (!stopped_by_.empty()) return;
      write_fault({slot.restart_at, slot.restart_at, slot.crash_kind, i, {}, names_[i]}, false);
    } catch (...) {
      slot.running = false;
      if (!first_error_) first_error_ = std::current_exception();
      stop_all("failed");
      return;
    }
  }
}

void Simulation::stop_all(const std::string& why) {
  if (stopped_by_.empty()) stopped_by_ = why;
  for (auto& slot : slots_) {
    if (slot.peer) slot.peer->stop();
    slot.clock->wake();
  }
}

void Simulation::evaluate_mean_model() {
  std::vector<double> sum;
  int count = 0;
  for (auto& slot : slots_) {
    if (!slot.peer || !net_->up(&slot - slots_.data())) continue;
    const std::vector<float> p = slot.peer->params();
    if (sum.empty()) sum.assign(p.size(), 0.0);
    for (size_t k = 0; k < p.size(); ++k) sum[k] += p[k];
    ++count;
  }
  if (count == 0) return;
  std::vector<float> mean(sum.size());
  for (size_t k = 0; k < sum.size(); ++k) mean[k] = static_cast<float>(sum[k] / count);
  evaluator_->model().set_params(mean);
  const BatchStats s = evaluator_->evaluate();
  cluster_log_->write(cluster_log_->event("mean_eval").add("peers", count).add("test_acc", s.accuracy()).add("test_loss", s.loss()));
}

void Simulation::progress(bool force) {
  if (opt_.progress_every_s <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && std::chrono::duration<double>(now - last_progress_).count() < opt_.progress_every_s) return;
  last_progress_ = now;
  const double wall = std::chrono::duration<double>(now - wall_start_).count();
  const double virt = s4u::Engine::get_clock();
  const auto& c = net_->counters();
  const uint64_t events = c.frames + c.sleeps + c.waits;
  int up = 0, done = 0;
  double acc = 0;
  int scored = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    up += net_->up(static_cast<int>(i));
    done += slots_[i].finished;
    if (slots_[i].last_acc) {
      acc += *slots_[i].last_acc;
      ++scored;
    }
  }
  std::fprintf(stderr, "hearsay-sim: virtual %.1f s (%.1fx wall), %zu peers (%d up, %d done), %.0f events/s", virt,
               wall > 0 ? virt / wall : 0.0, slots_.size(), up, done, wall > 0 ? events / wall : 0.0);
  if (scored > 0) std::fprintf(stderr, ", mean test accuracy %.2f%% (%d peers)", 100.0 * acc / scored, scored);
  std::fprintf(stderr, "\n");
}

void Simulation::monitor_body() {
  // Halfway between the peers' evaluations (every eval_every_s on the virtual clock), so
  // that each check sees the latest round of them.
  const double period = eval_every_s_ > 0 ? eval_every_s_ : 1.0;
  s4u::this_actor::sleep_for(period / 2);
  for (;;) {
    if (eval_every_s_ > 0) evaluate_mean_model();
    bool all_scored = true, any = false;
    double acc = 0;
    int scored = 0;
    for (const auto& slot : slots_) {
      if (!slot.spec.train.evaluates) continue;
      // A crashed peer not yet back is not part of the cluster's accuracy (as the logs'
      // time to target, hearsay_logs.py): one that never comes back (a site's dead leader)
      // must not hold the run from its target.
      if (!slot.running && !slot.finished && !slot.crash_kind.empty()) continue;
      any = true;
      if (!slot.last_acc) {
        all_scored = false;
        continue;
      }
      acc += *slot.last_acc;
      ++scored;
    }
    if (stop_at_target_ && target_ > 0 && any && all_scored && acc / scored >= target_) stop_all("target");
    if (max_virtual_s_ > 0 && s4u::Engine::get_clock() >= max_virtual_s_) stop_all("virtual_time");
    if (opt_.stop != nullptr && *opt_.stop) stop_all("signal");
    if (!stopped_by_.empty()) return;
    double next = period;
    if (max_virtual_s_ > 0) next = std::min(next, std::max(1e-6, max_virtual_s_ - s4u::Engine::get_clock()));
    s4u::this_actor::sleep_for(next);
  }
}

std::vector<ScheduledFault> Simulation::schedule_faults() {
  const auto& cl = cfg_.cluster();
  const auto& s = cfg_.experiment().simulation();
  std::vector<ScheduledFault> out;
  Rng rng(cfg_.seed() * 31 + 7, 700);
  for (const auto& f : s.faults()) {
    if (f.kind() == config::FaultConfig::SITE_DOWN) {
      ScheduledFault x{f.at_s(), f.at_s() + f.for_s(), "site_down", -1, {}, f.site()};
      const auto it = platform_.access.find(f.site());
      if (it != platform_.access.end()) {
        x.links = it->second;
      } else {
        // No access links: the site's WAN links, both ways, are what goes down.
        const int site = static_cast<int>(std::find(platform_.sites.begin(), platform_.sites.end(), f.site()) - platform_.sites.begin());
        for (const auto& [pair, link] : platform_.wan) {
          if (pair.first == site || pair.second == site) x.links.push_back(link);
        }
      }
      out.push_back(x);
      continue;
    }
    if (!f.peer().empty()) {
      out.push_back({f.at_s(), f.at_s() + f.for_s(), "crash", static_cast<int>(net_->index_of(f.peer())), {}, f.peer()});
      continue;
    }
    // A fraction of the peers, chosen by the seed, each at its own time in the spread.
    std::vector<int> order(names_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    const int count = static_cast<int>(std::lround(f.fraction() * static_cast<double>(names_.size())));
    for (int k = 0; k < count; ++k) {
      const double at = f.at_s() + f.spread_s() * rng.uniform();
      out.push_back({at, at + f.for_s(), "crash", order[k], {}, names_[order[k]]});
    }
  }
  // Outages written on the links between two sites.
  const auto site_of = platform_.site_of;
  for (const auto& [pair, link] : platform_.wan) {
    int a = -1, b = -1;
    for (size_t i = 0; i < site_of.size(); ++i) {
      if (site_of[i] == pair.first && a < 0) a = static_cast<int>(i);
      if (site_of[i] == pair.second && b < 0) b = static_cast<int>(i);
    }
    for (const auto& [start, end] : link_between(cl, a, b).outages) {
      out.push_back({start, end, "outage", -1, {link}, platform_.sites[pair.first] + " > " + platform_.sites[pair.second]});
    }
  }
  // Churn: each peer leaves at the rate given, for churn_downtime_s each time.
  if (s.churn_per_peer_hour() > 0) {
    const double rate = s.churn_per_peer_hour() / 3600.0;
    for (size_t i = 0; i < names_.size(); ++i) {
      Rng r(cfg_.seed() * 1000033 + i, 800);
      for (double t = -std::log(1.0 - r.uniform()) / rate; t < max_virtual_s_; t += s.churn_downtime_s() - std::log(1.0 - r.uniform()) / rate) {
        out.push_back({t, t + s.churn_downtime_s(), "churn", static_cast<int>(i), {}, names_[i]});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const ScheduledFault& x, const ScheduledFault& y) { return x.at < y.at; });
  return out;
}

void Simulation::write_fault(const ScheduledFault& f, bool begin) {
  // In the simulator's log, and in the struck peer's.
  auto write = [&](EventLog& log) {
    auto e = log.event("fault");
    e.add("kind", f.kind).add("state", begin ? "begin" : "end").add("target", f.target);
    if (begin) e.add("until_s", f.until);
    log.write(e);
  };
  write(*cluster_log_);
  if (f.peer >= 0) write(*slots_[f.peer].log);
}

void Simulation::fault_body(std::vector<ScheduledFault> faults) {
  // Begins and ends in time order.
  struct Edge {
    double at;
    size_t fault;
    bool begin;
  };
  std::vector<Edge> edges;
  for (size_t k = 0; k < faults.size(); ++k) {
    edges.push_back({faults[k].at, k, true});
    if (!faults[k].links.empty()) edges.push_back({faults[k].until, k, false});  // a crash ends when the peer is back
  }
  std::stable_sort(edges.begin(), edges.end(), [](const Edge& x, const Edge& y) { return x.at < y.at; });
  for (const Edge& e : edges) {
    if (e.at > s4u::Engine::get_clock()) s4u::this_actor::sleep_until(e.at);
    if (!stopped_by_.empty()) return;
    ScheduledFault& f = faults[e.fault];
    if (f.peer >= 0) {
      PeerSlot& slot = slots_[f.peer];
      if (!slot.running) continue;  // already down, or done
      write_fault(f, true);
      slot.restart_at = f.until;
      slot.crash_kind = f.kind;
      net_->peer_down(f.peer);
      slot.clock->crash();
      slot.clock->wake();
      continue;
    }
    write_fault(f, e.begin);
    for (s4u::Link* l : f.links) e.begin ? l->turn_off() : l->turn_on();
    if (!e.begin) net_->routes_changed();
  }
}

SimulationResult Simulation::run() {
  const auto& cl = cfg_.cluster();
  if (cl.peers_size() < 2) throw InputError("simulation: cluster.peers lists " + std::to_string(cl.peers_size()) + " peer(s); the simulator runs clusters");
  const auto& s = cfg_.experiment().simulation();
  max_virtual_s_ = s.max_virtual_s() > 0 ? s.max_virtual_s() : cfg_.experiment().max_wall_s();
  eval_every_s_ = cfg_.train().eval_every_s();
  target_ = cfg_.train().target_test_acc();
  stop_at_target_ = cfg_.experiment().stop_at_target();
  if (s.churn_per_peer_hour() > 0 && max_virtual_s_ <= 0) {
    throw InputError("experiment.simulation.churn_per_peer_hour: churn needs a time limit (simulation.max_virtual_s or experiment.max_wall_s)");
  }

  start_engine();
  platform_ = sim::build_platform(cl, s);
  // One line, not one a site: what the note says is the same of each.
  if (!platform_.notes.empty()) {
    std::fprintf(stderr, "hearsay-sim: note: %s", platform_.notes.front().c_str());
    if (platform_.notes.size() > 1) std::fprintf(stderr, " (and so of %zu more links)", platform_.notes.size() - 1);
    std::fprintf(stderr, "\n");
  }
  for (const auto& p : cl.peers()) names_.push_back(p.name());
  net_ = std::make_unique<SimNetwork>(platform_, names_, cfg_.seed());
  // The simulator's own log counts virtual time too (t = 0 as the engine starts).
  cluster_clock_ = std::make_unique<SimClock>(*net_, -1);
  cluster_log_ = std::make_unique<EventLog>(opt_.log_dir.empty() ? "" : opt_.log_dir + "/cluster.jsonl", "cluster",
                                            cluster_clock_.get());
  make_peers();
  // Every peer is up before any of them runs: an actor that ran first would otherwise
  // send its first frames to peers not yet up, and they would be dropped as frames to a
  // crashed peer are (an all-reduce's first round then waits for them forever). Real
  // peers dial until the other side listens; at t = 0 the whole cluster is there.
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) build_incarnation(i);

  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    s4u::Actor::create(names_[i], platform_.hosts[i], [this, i] { peer_body(i); });
  }
  s4u::Actor::create("monitor", platform_.hosts[0], [this] { monitor_body(); })->daemonize();
  auto faults = schedule_faults();
  if (!faults.empty()) s4u::Actor::create("faults", platform_.hosts[0], [this, faults] { fault_body(faults); })->daemonize();
  s4u::Engine::on_time_advance_cb([this](double) { progress(false); });
  engine_->run();
  progress(true);

  SimulationResult r;
  r.stopped_by = first_error_ ? "failed" : stopped_by_.empty() ? "finished" : stopped_by_;
  r.virtual_s = s4u::Engine::get_clock();
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start_).count();
  const auto& c = net_->counters();
  r.events = c.frames + c.sleeps + c.waits;
  r.peak_rss_bytes = peak_rss_bytes();
  r.peers = static_cast<int>(slots_.size());
  cluster_log_->write(cluster_log_->event("sim_end")
                          .add("stopped_by", r.stopped_by)
                          .add("virtual_s", r.virtual_s)
                          .add("peers", r.peers)
                          .add("events", static_cast<int64_t>(r.events))
                          .add("frames", static_cast<int64_t>(c.frames))
                          .add("frames_lost", static_cast<int64_t>(c.frames_lost))
                          .add("frames_dropped", static_cast<int64_t>(c.frames_dropped))
                          .add("retries", static_cast<int64_t>(c.retries))
                          .add("link_actors", static_cast<int64_t>(c.link_actors)));
  // The engines go before the transports they were given, and both before the network.
  for (auto& slot : slots_) slot.peer.reset();
  for (auto& slot : slots_) slot.transport.reset();
  if (first_error_) std::rethrow_exception(first_error_);
  return r;
}

}  // namespace

SimulationResult run_simulation(const config::Config& cfg, const SimulationOptions& options) {
  Simulation s(cfg, options);
  return s.run();
}

}  // namespace hearsay
