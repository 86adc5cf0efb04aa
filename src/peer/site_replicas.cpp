// Sites as the unit of the WAN (cluster.site_replicas; docs/ALGORITHMS.md, "Site
// replicas"). Every step a site's peers average their gradients around the site's ring
// (site_gradient, under the site codec; nothing crosses the WAN). An algorithm whose
// collectives span every peer (diloco, streaming_diloco, local_sgd) then runs on every
// peer as it always does, on that averaged gradient. Any other runs on the sites' leaders
// only (each site's first peer), over the gossip topology among the sites
// (SiteLeaderTopology): the algorithm sees one peer per site and is not rewritten for it;
// after its step the leader sends its model to the rest of its site, which took the same
// averaged gradient and adopts the model as it is, so the site holds it bit for bit.
//
// A peer of the site that stops answering (a wait for it runs out at sync_timeout_s) ends
// the site's view: its live peers agree on a new one (change_view), the first of them
// leads, the step is given up, and the site goes on (docs/ALGORITHMS.md, "A leader's death").
#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "algorithm.h"
#include "site_replicas.h"
#include "algorithm_registry.h"
#include "hearsay/log.h"
#include "hearsay/topology.h"

namespace hearsay {
namespace {

// Each peer's site index (0 for every peer when the topology names no sites).
std::vector<int> sites_of(const TopologySpec& t, int peers) {
  return t.site_of.empty() ? std::vector<int>(static_cast<size_t>(peers), 0) : t.site_of;
}

int count_sites(const TopologySpec& t, int peers) {
  const auto s = sites_of(t, peers);
  return static_cast<int>(std::set<int>(s.begin(), s.end()).size());
}

// The gossip topology among the sites, each site one node (numbered in order of its
// first peer, as site_of numbers them).
TopologySpec site_level(const TopologySpec& t) {
  TopologySpec s = t;
  s.site_of.clear();
  return s;
}

// The cluster's topology for an algorithm the leaders run: the gossip topology among the
// sites, each site's node played by its leader; a site's other peers gossip with no one.
// A site's leader changes when its view does (set_leader, on the step loop's thread) while
// transport threads read it (observe_throughput): each site's leader is an atomic.
class SiteLeaderTopology final : public Topology {
 public:
  SiteLeaderTopology(const TopologySpec& spec, int n) : Topology(n) {
    const auto site = sites_of(spec, n);
    site_of_ = site;
    std::map<int, int> leader;
    for (int i = 0; i < n; ++i) leader.emplace(site[static_cast<size_t>(i)], i);  // the first peer of each site
    leader_of_ = std::vector<std::atomic<int>>(leader.size());
    for (const auto& [s, i] : leader) leader_of_.at(static_cast<size_t>(s)) = i;
    sites_ = make_topology(site_level(spec), static_cast<int>(leader_of_.size()));
  }
  std::vector<int> targets(int peer, int64_t round, Rng& rng) const override {
    return is_leader(peer) ? leaders(sites_->targets(site_of_[static_cast<size_t>(peer)], round, rng)) : std::vector<int>{};
  }
  std::vector<int> neighbours(int peer) const override {
    return is_leader(peer) ? leaders(sites_->neighbours(site_of_[static_cast<size_t>(peer)])) : std::vector<int>{};
  }
  int64_t period() const override { return sites_->period(); }
  int site_of(int peer) const { return site_of_[static_cast<size_t>(peer)]; }
  int leader(int site) const { return leader_of_.at(static_cast<size_t>(site)).load(); }
  int sites() const { return static_cast<int>(leader_of_.size()); }
  // A site's new leader: its view changed (this peer's own site), or it was heard from.
  void set_leader(int site, int peer) { leader_of_.at(static_cast<size_t>(site)) = peer; }
  void observe_throughput(int peer, int other, double bytes_per_s) override {
    if (is_leader(peer) && is_leader(other)) {
      sites_->observe_throughput(site_of_[static_cast<size_t>(peer)], site_of_[static_cast<size_t>(other)], bytes_per_s);
    }
  }

 private:
  bool is_leader(int peer) const { return leader_of_[static_cast<size_t>(site_of_[static_cast<size_t>(peer)])] == peer; }
  std::vector<int> leaders(const std::vector<int>& sites) const {
    std::vector<int> out;
    out.reserve(sites.size());
    for (int s : sites) out.push_back(leader_of_[static_cast<size_t>(s)]);
    return out;
  }
  std::vector<int> site_of_;
  std::vector<std::atomic<int>> leader_of_;
  std::unique_ptr<Topology> sites_;
};

// The site's phases are phases.h's: the ring (kSiteRingPhases), the leader's update after
// its step in parts (kSiteModelPhases: fp32, exact, so the site holds its bits), the speeds
// summed every kSplitEvery steps (kSiteSplitPhases), and a view change's messages (round
// kViewRound): each live peer's "alive" with the round it was in (kSiteAlivePhases) and the
// decision of the live peer with the newest model (kSiteDecisionPhases). Every one carries
// its view's epoch (e x kSiteEpochStride), so that what an attempt given up left in flight
// never meets the next attempt's messages.
constexpr uint64_t kViewRound = ~uint64_t{0} - 1;

uint32_t site_phase(const GossipEngine& e, uint32_t base) { return base + e.site_view().epoch * kSiteEpochStride; }
uint32_t epoch_of(uint32_t phase) { return phase / kSiteEpochStride; }
const std::string& name_of(const GossipEngine& e, int peer) { return e.peers()[static_cast<size_t>(peer)]; }

std::vector<std::string> names_of(const GossipEngine& e, const std::vector<int>& peers) {
  std::vector<std::string> out;
  for (int i : peers) out.push_back(name_of(e, i));
  return out;
}

// Adopts a view change's outcome: the view (its first peer leads), its epoch, the step in
// which the newest of the site's peers gave up (each peer's next step is the one after:
// a peer that was behind skips the steps between, so that every peer of the site counts
// the same steps to the run's end), and, where this peer did not decide it, the model of
// the peer that decided. Returns the steps this peer skips.
uint64_t adopt_view(GossipEngine& e, SiteState& state, uint32_t epoch, const std::vector<int>& members, uint64_t gave_up_step, uint64_t step,
                const std::vector<float>* params) {
  auto& v = e.site_view();
  const std::vector<int> before = my_site(e);
  v.members = members;
  v.epoch = epoch;
  if (params != nullptr) e.set_params_host(*params);
  forget_site_replay(e, state);  // the site's next update is whole: model and optimizer state
  state.split.rows.clear();  // equal shares until the new site has measured itself
  if (auto* t = dynamic_cast<SiteLeaderTopology*>(&e.topology())) t->set_leader(t->site_of(e.me()), members.front());
  // What the given-up attempts left: ring hops and models of earlier epochs, and the alive
  // messages of late peers (they are not in the view; their decision wait runs out).
  e.forget_sync([epoch](int, uint64_t round, uint32_t phase) {
    return is_site_phase(phase) && (epoch_of(phase) < epoch || (round == kViewRound && epoch_of(phase) <= epoch));
  });
  std::vector<int> left;
  for (int i : before) {
    if (std::find(members.begin(), members.end(), i) == members.end()) left.push_back(i);
  }
  auto ev = e.log().event("site_view");
  ev.add("step", static_cast<int64_t>(step)).add("epoch", static_cast<int64_t>(epoch)).add("leader", name_of(e, members.front()));
  e.log().write(ev.add("peers", names_of(e, members)).add("left", names_of(e, left)));
  return gave_up_step - step;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The site's view change, started by this peer at `step` when peer `silent` of its site
// did not answer: every live peer tells every other one it is alive (and the step it was
// in); those heard from within sync_timeout_s are the new view, led by its first peer.
// The first of those in the latest step (the newest model: after a whole site's restart
// from checkpoints of different ages, not the oldest) decides: it sends the view, that
// step, and its model to the others, who adopt them. Each peer of the site reaches this
// on its own wait's timeout, within about one sync_timeout_s of the others (they all
// wait, directly or not, on the same lost peer). A peer that hears no decision, or that
// finds itself alone while a peer of its site is still connected, fails saying so.
// Returns the steps this peer skips (adopt_view).
uint64_t change_view(GossipEngine& e, SiteState& state, uint64_t step, int silent) {
  const std::vector<int> view = my_site(e);
  const std::string& me = name_of(e, e.me());
  const uint32_t epoch = e.site_view().epoch + 1;
  if (epoch > kMaxSiteEpoch) {
    throw InputError("peer " + me + ": its site changed its view " + std::to_string(kMaxSiteEpoch) +
                     " times; no more are counted (restart the site)");
  }
  const uint64_t my_round = step;  // a site's exchanges are numbered by the step
  const uint32_t alive_phase = kSiteAlivePhases.first + epoch * kSiteEpochStride;
  const uint32_t decision_phase = kSiteDecisionPhases.first + epoch * kSiteEpochStride;
  const GossipEngine::Message alive{.kind = MessageKind::kModel, .synchronous = true, .round = kViewRound, .phase = alive_phase,
                                    .total = 4};
  for (int j : view) {
    if (j != e.me()) e.send(j, GossipEngine::Message(alive), round_as_floats(my_round));
  }
  const double window = e.spec().sync_timeout_s;
  const double deadline = e.time().now() + window;
  std::vector<int> live{e.me()};
  std::map<int, uint64_t> round_of{{e.me(), my_round}};
  for (int j : view) {
    if (j == e.me()) continue;
    const auto m = e.wait_sync_for(j, kViewRound, alive_phase, std::max(0.0, deadline - e.time().now()));
    if (!m) continue;
    const auto r = round_from_floats(m->data);
    if (!r || m->data.size() != 4) {
      throw InputError("peer " + me + ": peer " + name_of(e, j) + "'s alive message in its site's view change " +
                       std::to_string(epoch) + " is malformed (" + std::to_string(m->data.size()) +
                       " values; a round is 4 floats of 16 bits)");
    }
    live.push_back(j);
    round_of[j] = *r;
  }
  // Alone, while a peer of the view is still connected: that peer is alive and did not
  // answer, so it holds a view without this peer (this one came back after a crash, or
  // answered too late). Going on alone would make the site two replicas.
  for (int j : view) {
    if (live.size() == 1 && j != e.me() && e.connected(j)) {
      throw InputError("peer " + me + ": in its site's view change " + std::to_string(epoch) + " no peer of its site answered, "
                       "yet " + name_of(e, j) + " is connected: the site goes on without this peer (it came back after "
                       "the others changed their view, or answered too late); restart the whole site to bring it back");
    }
  }
  std::sort(live.begin(), live.end());
  uint64_t gave_up = 0;
  for (const auto& [j, r] : round_of) gave_up = std::max(gave_up, r);
  int decider = -1;
  for (const auto& [j, r] : round_of) {
    if (r == gave_up && decider < 0) decider = j;  // the map is in peer order
  }
  // The decision as two messages: the view (a round, a count, the peers), then the model.
  const GossipEngine::Message model{.kind = MessageKind::kModel, .synchronous = true, .round = kViewRound,
                                    .phase = decision_phase + 1};
  if (decider == e.me()) {
    std::vector<float> d = round_as_floats(gave_up);
    d.push_back(static_cast<float>(live.size()));
    for (int i : live) d.push_back(static_cast<float>(i));
    const GossipEngine::Message decision{.kind = MessageKind::kModel, .synchronous = true, .round = kViewRound,
                                         .phase = decision_phase, .total = d.size()};
    const std::vector<float> params = e.params_host();
    for (int j : live) {
      if (j == e.me()) continue;
      e.send(j, GossipEngine::Message(decision), d);
      e.send(j, GossipEngine::Message(model), params);
    }
    return adopt_view(e, state, epoch, live, gave_up, step, nullptr);
  }
  const auto m = e.wait_sync_for(decider, kViewRound, decision_phase, 2 * window);
  const auto params = m ? e.wait_sync_for(decider, kViewRound, decision_phase + 1, window) : std::nullopt;
  const std::string& from = name_of(e, decider);
  if (!m || !params) {
    throw InputError("peer " + me + ": in its site's view change " + std::to_string(epoch) + " (peer " + name_of(e, silent) +
                     " stopped answering), " + from + ", the live peer with the newest model, sent no decision within " +
                     std::to_string(2 * window) + " s: the site's peers disagree on who is alive (restart the site)");
  }
  // Checked before anything is taken: a step no older than this peer's, a count, that many
  // peers of this view in order (the sender among them), then the model.
  const std::vector<float>& d = m->data;
  const auto r = round_from_floats(d);
  const bool counted = d.size() >= 5 && d[4] >= 1 && d[4] <= static_cast<float>(view.size()) && d[4] == std::floor(d[4]);
  const size_t n = counted ? static_cast<size_t>(d[4]) : 0;
  std::vector<int> members;
  for (size_t k = 0; k < n && 5 + k < d.size(); ++k) {
    const float f = d[5 + k];
    const bool index = f == std::floor(f) && f >= 0 && f < static_cast<float>(e.peers().size());
    const int i = index ? static_cast<int>(f) : -1;
    if (i < 0 || std::find(view.begin(), view.end(), i) == view.end() || (!members.empty() && i <= members.back())) break;
    members.push_back(i);
  }
  const bool sender_in = std::find(members.begin(), members.end(), decider) != members.end();
  if (!r || *r < my_round || n == 0 || members.size() != n || d.size() != 5 + n || !sender_in ||
      params->data.size() != e.model().num_params()) {
    throw InputError("peer " + me + ": the decision of its site's view change " + std::to_string(epoch) + " from " + from +
                     " is malformed (" + std::to_string(d.size()) + " values and a model of " +
                     std::to_string(params->data.size()) + "; a step no older than this peer's, a count, the view's "
                     "peers in order with the sender, then the model's " + std::to_string(e.model().num_params()) + ")");
  }
  if (std::find(members.begin(), members.end(), e.me()) == members.end()) {
    throw InputError("peer " + me + ": its site's view change " + std::to_string(epoch) + " left it out (" + from +
                     " heard from " + joined(names_of(e, members)) + " within sync_timeout_s, " + std::to_string(window) +
                     " s, and not from this peer); the site goes on without it (restart the whole site to bring it back)");
  }
  return adopt_view(e, state, epoch, members, *r, step, &params->data);
}

// Runs one of the site's synchronous exchanges. When a peer of the site does not answer,
// under an algorithm that can take a new leader the site changes its view and the step is
// given up (SiteViewChanged); else the timeout stands, saying why.
template <class F>
auto site_exchange(GossipEngine& e, SiteState& state, uint64_t step, const BatchStats& s, F&& exchange) -> decltype(exchange()) {
  try {
    return exchange();
  } catch (const PeerTimeout& t) {
    if (!elects_new_leader(e.spec())) {
      if (!leaders_run(e.spec())) throw;
      throw PeerTimeout(std::string(t.what()) + "; a site elects a new leader only under adpsgd, gossip_grad and sgp", t.peer);
    }
    throw SiteViewChanged{s, change_view(e, state, step, t.peer)};
  }
}
constexpr uint64_t kSplitEvery = 10;
// A new split is taken when some peer's share would move by more than this (relative).
constexpr double kSplitHysteresis = 0.1;

// Every kSplitEvery steps: the site's seconds per sample, one slot a peer, summed (fp32,
// exact: each slot has one writer); when every peer has measured, the split that the
// speeds give, taken if it moves a share by more than kSplitHysteresis. Every peer of
// the site computes the same split from the same sums.
void update_split(GossipEngine& e, SiteState& state, const std::vector<int>& site, uint64_t step, const BatchStats& s) {
  auto& split = state.split;
  const int k = static_cast<int>(std::find(site.begin(), site.end(), e.me()) - site.begin());
  std::vector<float> slots(site.size(), 0.0f);
  slots[static_cast<size_t>(k)] = static_cast<float>(split.seconds_per_sample);
  slots = site_exchange(e, state, step, s, [&] {
    return allreduce_sum(e, MessageKind::kGradient, std::move(slots), step, site_phase(e, kSiteSplitPhases.first),
                         false, ReduceScope::kSite);
  });
  std::vector<double> seconds(slots.begin(), slots.end());
  if (std::any_of(seconds.begin(), seconds.end(), [](double v) { return !(v > 0); })) return;
  int total = 0;
  for (int r : split.rows) total += r;
  const std::vector<int> next = split_rows(seconds, total, kMaxSiteShare * total / static_cast<int>(site.size()));
  bool moves = false;
  for (size_t j = 0; j < next.size(); ++j) {
    moves = moves || std::abs(next[j] - split.rows[j]) > kSplitHysteresis * split.rows[j];
  }
  if (!moves) return;
  split.rows = next;
  std::vector<std::string> names;
  for (int i : site) names.push_back(e.peers()[static_cast<size_t>(i)]);
  auto ev = e.log().event("split");
  ev.add("step", static_cast<int64_t>(step)).add("peers", names).add("rows", std::vector<int64_t>(next.begin(), next.end()));
  ev.add("seconds_per_sample", seconds);
  e.log().write(ev);
}

}  // namespace

std::vector<int> split_rows(const std::vector<double>& seconds_per_sample, int total, int cap) {
  const size_t n = seconds_per_sample.size();
  // Water-filling: peers whose share would pass the cap take the cap, and the rest of the
  // rows go to the others by their speeds, until no share passes it.
  std::vector<bool> capped(n, false);
  std::vector<double> want(n, 0.0);
  for (bool again = true; again;) {
    again = false;
    double speed_sum = 0;
    int left = total;
    for (size_t j = 0; j < n; ++j) {
      if (capped[j]) {
        left -= cap;
      } else {
        speed_sum += 1.0 / seconds_per_sample[j];
      }
    }
    for (size_t j = 0; j < n; ++j) {
      want[j] = capped[j] ? cap : left * (1.0 / seconds_per_sample[j]) / speed_sum;
      if (!capped[j] && want[j] > cap) capped[j] = again = true;
    }
  }
  // Largest remainder: each peer its whole rows (at least 1), then the rows left over to
  // the largest fractions, ties to the earlier peer.
  std::vector<int> rows(n);
  std::vector<std::pair<double, size_t>> fraction(n);
  int given = 0;
  for (size_t j = 0; j < n; ++j) {
    rows[j] = std::max(1, static_cast<int>(std::floor(want[j])));
    fraction[j] = {capped[j] ? -1.0 : want[j] - std::floor(want[j]), j};
    given += rows[j];
  }
  std::stable_sort(fraction.begin(), fraction.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total; i = (i + 1) % n, ++given) ++rows[fraction[i].second];
  // More than total only where the minimum of 1 row a peer gave some away: take back from the largest.
  while (given > total) {
    --*std::max_element(rows.begin(), rows.end());
    --given;
  }
  return rows;
}

bool leaders_run(const GossipSpec& s) { return s.site_replicas && !algorithm_entry(s.algorithm).collective; }

// A new leader runs the algorithm with a fresh peer's state: only where the algorithm says
// it keeps nothing a neighbour relies on (AlgorithmEntry::new_site_leader; each says why in
// its own file).
bool elects_new_leader(const GossipSpec& s) { return leaders_run(s) && algorithm_entry(s.algorithm).new_site_leader; }

void refresh_site_leaders(GossipEngine& e) {
  if (!elects_new_leader(e.spec())) return;
  auto* t = dynamic_cast<SiteLeaderTopology*>(&e.topology());
  if (t == nullptr) return;
  const int mine = t->site_of(e.me());
  const int n = static_cast<int>(e.peers().size());
  for (int site = 0; site < t->sites(); ++site) {
    const int was = t->leader(site);
    if (site == mine || e.connected(was)) continue;
    // A site's view is led by its first live peer: the first of its peers still connected.
    int now = -1;
    for (int i = 0; i < n && now < 0; ++i) {
      if (t->site_of(i) == site && e.connected(i)) now = i;
    }
    if (now < 0) continue;  // none reachable: keep the last known
    t->set_leader(site, now);
    auto ev = e.log().event("site_leader");
    ev.add("site", static_cast<int64_t>(site)).add("leader", name_of(e, now));
    e.log().write(ev.add("was", name_of(e, was)));
  }
}

void check_site_replicas(const GossipSpec& s, int peers) {
  if (!s.site_replicas) return;
  if (algorithm_entry(s.algorithm).sums_sites_first) {
    throw InputError(s.algorithm + " already sums each site's gradients first and crosses the WAN only between the sites' "
                     "leaders (hierarchical); site_replicas adds nothing to it: leave it off");
  }
  if (s.site_split != "speed" && s.site_split != "equal") throw OptionError("site_split", "'" + s.site_split + "': use speed or equal");
  const std::string codec = s.site_codec.empty() ? s.codec.name : s.site_codec;
  if (!s.site_codec.empty() && !summable_codec(codec)) {
    throw OptionError("site_codec", "'" + codec + "': use none, fp16, bf16, int8 or int4 (summed on the way)");
  }
  if (!summable_codec(codec)) {
    throw InputError("the site's gradient sum travels under gossip.codec unless cluster.site_codec is set, and '" + codec +
                     "' cannot be summed on the way: set cluster.site_codec to none, fp16, bf16, int8 or int4");
  }
  if (!leaders_run(s)) return;
  const int sites = count_sites(s.topology, peers);
  if (sites < 2) {
    throw InputError(s.algorithm + " under site_replicas runs between the sites, and the cluster has one site: its peers "
                     "are one replica with no one to gossip with (one site trains data-parallel: use allreduce)");
  }
  if (s.topology.kind == "hierarchical") {
    throw InputError("topology 'hierarchical' picks peers inside a site, and under site_replicas " + s.algorithm +
                     " gossips between sites, each one peer: use ring, torus, exponential, complete, random, "
                     "random_regular, bandwidth or star");
  }
  try {
    make_topology(site_level(s.topology), sites);
  } catch (const InputError& e) {
    throw InputError(std::string("the topology among the ") + std::to_string(sites) + " sites: " + e.what());
  }
}

std::unique_ptr<Topology> make_engine_topology(const GossipSpec& s, int peers) {
  if (leaders_run(s)) return std::make_unique<SiteLeaderTopology>(s.topology, peers);
  return make_topology(s.topology, peers);
}

GossipSpec among_sites(const GossipSpec& s, int peers, int* sites) {
  GossipSpec among = s;
  among.topology = site_level(s.topology);
  among.site_replicas = false;
  *sites = count_sites(s.topology, peers);
  return among;
}

SiteRole site_role(const GossipEngine& e) {
  if (!leaders_run(e.spec())) return SiteRole::kNone;
  const auto site = my_site(e);
  if (site.front() == e.me()) return site.size() > 1 ? SiteRole::kLeader : SiteRole::kNone;
  return SiteRole::kMember;
}

void log_site(GossipEngine& e, SiteRole role) {
  const auto site = my_site(e);
  const auto& site_of = e.spec().topology.site_of;
  const char* name = role == SiteRole::kMember ? "member" : leaders_run(e.spec()) ? "leader" : "replica";
  auto ev = e.log().event("site");
  ev.add("site", site_of.empty() ? 0 : site_of[static_cast<size_t>(e.me())]).add("role", name);
  e.log().write(ev.add("leader", e.peers()[static_cast<size_t>(site.front())]).add("peers", static_cast<int64_t>(site.size())));
}

BatchStats site_gradient(GossipEngine& e, SiteState& state, const Batch& batch, uint64_t step) {
  const BatchStats s = e.forward_backward(batch);
  if (!e.spec().site_replicas) return s;
  const std::vector<int> site = my_site(e);
  const size_t site_peers = site.size();
  if (site_peers < 2) return s;
  auto& split = state.split;
  if (split.rows.size() != site_peers) split.rows.assign(site_peers, batch.rows);  // equal, until measured
  const bool equal = std::all_of(split.rows.begin(), split.rows.end(), [&](int r) { return r == split.rows.front(); });
  Backend& b = e.model().backend();
  std::vector<float> g = download_floats(b, e.model().grads(), e.model().num_params());
  // The mean over the site's samples: each peer's mean gradient weighted by its rows.
  // Equal rows: summed, then divided by the peers (the same bits as before splits were).
  if (!equal) {
    int total = 0;
    for (int r : split.rows) total += r;
    const float w = static_cast<float>(batch.rows) / static_cast<float>(total);
    for (auto& v : g) v *= w;
  }
  g = site_exchange(e, state, step, s, [&] {
    return allreduce_sum(e, MessageKind::kGradient, std::move(g), step, site_phase(e, kSiteRingPhases.first), true,
                         ReduceScope::kSite, e.spec().site_codec);
  });
  if (equal) {
    const float inv = 1.0f / static_cast<float>(site_peers);
    for (auto& v : g) v *= inv;
  }
  b.upload(e.model().grads(), g.data(), sizeof(float) * g.size());
  note_site_gradient(e, state, std::move(g));
  if (e.spec().site_split == "speed" && step % kSplitEvery == kSplitEvery - 1) update_split(e, state, site, step, s);
  return s;
}

int site_batch_rows(const GossipEngine& e, const SiteState& state, int batch_size) {
  if (!e.spec().site_replicas || e.spec().site_split != "speed") return batch_size;
  const auto& rows = state.split.rows;
  if (rows.empty()) return batch_size;
  const auto site = my_site(e);
  const size_t k = static_cast<size_t>(std::find(site.begin(), site.end(), e.me()) - site.begin());
  return k < rows.size() ? rows[k] : batch_size;
}

BatchStats site_member_step(GossipEngine& e, SiteState& state, const Batch& batch, float lr, uint64_t step) {
  const BatchStats s = site_gradient(e, state, batch, step);
  const int leader = my_site(e).front();
  follow_site_leader(e, state, step, leader, lr, [&](uint32_t part) {
    return site_exchange(e, state, step, s, [&] { return e.wait_sync(leader, step, site_phase(e, kSiteModelPhases.first) + part).data; });
  });
  return s;
}

void send_site_update(GossipEngine& e, SiteState& state, uint64_t step) {
  const auto site = my_site(e);
  if (site.size() < 2) return end_site_replay(e, state);
  for (auto& [part, values] : site_update_parts(e, state, step)) {
    const GossipEngine::Message header{.kind = MessageKind::kModel, .synchronous = true, .round = step,
                                       .phase = site_phase(e, kSiteModelPhases.first) + part, .offset = 0, .total = values.size()};
    for (size_t k = 1; k < site.size(); ++k) e.send(site[k], GossipEngine::Message(header), values);
  }
}

std::vector<float> round_as_floats(uint64_t r) {
  std::vector<float> out(4);
  for (int k = 0; k < 4; ++k) out[static_cast<size_t>(k)] = static_cast<float>((r >> (16 * k)) & 0xffffu);
  return out;
}
std::optional<uint64_t> round_from_floats(const std::vector<float>& v) {
  if (v.size() < 4) return std::nullopt;
  uint64_t r = 0;
  for (int k = 0; k < 4; ++k) {
    const float f = v[static_cast<size_t>(k)];
    if (!(f >= 0 && f <= 65535.0f) || f != std::floor(f)) return std::nullopt;
    r |= static_cast<uint64_t>(f) << (16 * k);
  }
  return r;
}

}  // namespace hearsay
