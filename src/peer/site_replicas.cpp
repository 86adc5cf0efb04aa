// Sites as the unit of the WAN (cluster.site_replicas; docs/ALGORITHMS.md, "Site
// replicas"). Every step a site's peers average their gradients around the site's ring
// (site_gradient, under the site codec; nothing crosses the WAN). An algorithm whose
// collectives span every peer (diloco, streaming_diloco, local_sgd) then runs on every
// peer as it always does, on that averaged gradient. Any other runs on the sites' leaders
// only (each site's first peer), over the gossip topology among the sites
// (SiteLeaderTopology): the algorithm sees one peer per site and is not rewritten for it;
// after its step the leader sends its model to the rest of its site, which took the same
// averaged gradient and adopts the model as it is, so the site holds it bit for bit.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "algorithm.h"
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
class SiteLeaderTopology final : public Topology {
 public:
  SiteLeaderTopology(const TopologySpec& spec, int n) : Topology(n) {
    const auto site = sites_of(spec, n);
    site_of_ = site;
    std::map<int, int> leader;
    for (int i = 0; i < n; ++i) leader.emplace(site[static_cast<size_t>(i)], i);  // the first peer of each site
    leader_of_.assign(leader.size(), -1);
    for (const auto& [s, i] : leader) leader_of_.at(static_cast<size_t>(s)) = i;
    sites_ = make_topology(site_level(spec), static_cast<int>(leader_of_.size()));
  }
  std::vector<int> targets(int peer, int64_t round, Rng& rng) const override {
    return is_leader(peer) ? leaders(sites_->targets(site_of_[static_cast<size_t>(peer)], round, rng)) : std::vector<int>{};
  }
  std::vector<int> neighbours(int peer) const override {
    return is_leader(peer) ? leaders(sites_->neighbours(site_of_[static_cast<size_t>(peer)])) : std::vector<int>{};
  }
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
  std::vector<int> site_of_, leader_of_;
  std::unique_ptr<Topology> sites_;
};

// The leader's model to its site, after its step: as fp32, exact, so the site holds its bits.
constexpr uint32_t kSiteModelPhase = kSiteStepPhase + (1u << 19);
// The site's speeds, summed every kSplitEvery steps (fp32, one float a peer).
constexpr uint32_t kSiteSplitPhase = kSiteStepPhase + (1u << 18);
constexpr uint64_t kSplitEvery = 10;
// A new split is taken when some peer's share would move by more than this (relative).
constexpr double kSplitHysteresis = 0.1;

// Every kSplitEvery steps: the site's seconds per sample, one slot a peer, summed (fp32,
// exact: each slot has one writer); when every peer has measured, the split that the
// speeds give, taken if it moves a share by more than kSplitHysteresis. Every peer of
// the site computes the same split from the same sums.
void update_split(GossipEngine& e, const std::vector<int>& site, uint64_t step) {
  auto& split = e.site_split();
  const int k = static_cast<int>(std::find(site.begin(), site.end(), e.me()) - site.begin());
  std::vector<float> slots(site.size(), 0.0f);
  slots[static_cast<size_t>(k)] = static_cast<float>(split.seconds_per_sample);
  slots = allreduce_sum(e, MessageKind::kGradient, std::move(slots), step, kSiteSplitPhase, false, ReduceScope::kSite);
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

void check_site_replicas(const GossipSpec& s, int peers) {
  if (!s.site_replicas) return;
  if (s.algorithm == "allreduce") {
    throw InputError("allreduce already sums each site's gradients first and crosses the WAN only between the sites' "
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

BatchStats site_gradient(GossipEngine& e, const Batch& batch, uint64_t step) {
  const BatchStats s = e.model().forward_backward(batch);
  if (!e.spec().site_replicas) return s;
  const std::vector<int> site = my_site(e);
  const size_t site_peers = site.size();
  if (site_peers < 2) return s;
  auto& split = e.site_split();
  if (split.rows.size() != site_peers) split.rows.assign(site_peers, batch.rows);  // equal, until measured
  const bool equal = std::all_of(split.rows.begin(), split.rows.end(), [&](int r) { return r == split.rows.front(); });
  Backend& b = e.model().backend();
  std::vector<float> g(e.model().num_params());
  b.download(g.data(), e.model().grads(), sizeof(float) * g.size());
  // The mean over the site's samples: each peer's mean gradient weighted by its rows.
  // Equal rows: summed, then divided by the peers (the same bits as before splits were).
  if (!equal) {
    int total = 0;
    for (int r : split.rows) total += r;
    const float w = static_cast<float>(batch.rows) / static_cast<float>(total);
    for (auto& v : g) v *= w;
  }
  g = allreduce_sum(e, MessageKind::kGradient, std::move(g), step, kSiteStepPhase, true, ReduceScope::kSite, e.spec().site_codec);
  if (equal) {
    const float inv = 1.0f / static_cast<float>(site_peers);
    for (auto& v : g) v *= inv;
  }
  b.upload(e.model().grads(), g.data(), sizeof(float) * g.size());
  if (e.spec().site_split == "speed" && step % kSplitEvery == kSplitEvery - 1) update_split(e, site, step);
  return s;
}

int site_batch_rows(const GossipEngine& e, int batch_size) {
  if (!e.spec().site_replicas || e.spec().site_split != "speed") return batch_size;
  const auto& rows = e.site_split().rows;
  if (rows.empty()) return batch_size;
  const auto site = my_site(e);
  const size_t k = static_cast<size_t>(std::find(site.begin(), site.end(), e.me()) - site.begin());
  return k < rows.size() ? rows[k] : batch_size;
}

BatchStats site_member_step(GossipEngine& e, const Batch& batch, uint64_t step) {
  const BatchStats s = site_gradient(e, batch, step);
  const int leader = my_site(e).front();
  const auto m = e.wait_sync(leader, step, kSiteModelPhase);
  e.set_params_host(m.data);
  return s;
}

void send_site_model(GossipEngine& e, uint64_t step) {
  const auto site = my_site(e);
  if (site.size() < 2) return;
  const std::vector<float> params = e.params_host();
  const GossipEngine::Message header{.kind = MessageKind::kModel, .synchronous = true, .round = step, .phase = kSiteModelPhase,
                                     .offset = 0, .total = params.size()};
  for (size_t k = 1; k < site.size(); ++k) e.send(site[k], header, params);
}

}  // namespace hearsay
