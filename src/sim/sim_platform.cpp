#include "sim_platform.h"

#include <simgrid/kernel/routing/NetPoint.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/kernel/resource/NetworkModelIntf.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"

namespace hearsay::sim {
namespace {

namespace s4u = simgrid::s4u;

// "Unlimited" as SimGrid takes it: a link too fast to ever be the bottleneck (1 Pbit/s).
constexpr double kUnlimitedBytesPerS = 1.25e14;

double bytes_per_s(const LinkModel& m) { return m.bandwidth_bps > 0 ? m.bandwidth_bps / 8.0 : kUnlimitedBytesPerS; }

// SimGrid's time quantum takes events due within it of one another together, so a
// latency under twice the quantum is not resolved. A WAN link's latency is what a
// simulation across sites is for: refused. A LAN hop's may be below it by choice (a
// coarse quantum for a WAN-bound question at scale): said, in the platform's notes.
void check_latency_against_precision(SimPlatform& p, const std::string& link, double latency_s, const config::SimulationConfig& sim,
                                     bool refuse) {
  if (latency_s <= 0 || latency_s >= 2 * sim.time_precision_s()) return;
  const std::string what = "experiment.simulation.time_precision_s: " + std::to_string(sim.time_precision_s()) +
                           " s is more than half the latency of link '" + link + "' (" + std::to_string(latency_s) + " s)";
  if (refuse) throw InputError(what + "; give a smaller time_precision_s");
  p.notes.push_back(what + ": its latency is not resolved (events on it may come up to the quantum early)");
}

// The link model between two sites, from the config's first peers of each (the site
// pair's site_links entry, else the default link).
LinkModel site_pair_model(const config::ClusterConfig& cl, const std::vector<int>& site_of, const std::vector<int>& first_peer,
                          int a, int b) {
  if (a != b) return link_between(cl, first_peer[a], first_peer[b]);
  // Inside a site the pair is a peer with another of its site; a site of one peer has no
  // such pair, and its model is never used.
  for (int j = 0; j < cl.peers_size(); ++j) {
    if (j != first_peer[a] && site_of[j] == a) return link_between(cl, first_peer[a], j);
  }
  return link_model(cl.default_link());
}

// Site s's zone, inside `root`: its peers' hosts and interfaces, its gateway and access
// links. Returns the zone and its gateway (the WAN routes' ends).
std::pair<s4u::NetZone*, simgrid::kernel::routing::NetPoint*> build_site(SimPlatform& p, int s, s4u::NetZone* root,
                                                                        const config::ClusterConfig& cl,
                                                                        const config::SimulationConfig& sim,
                                                                        const LinkModel& lan) {
  const std::string& site = p.sites[s];
  const int n = cl.peers_size();
  p.jitter_s[{s, s}] = lan.jitter_s;
  p.loss[{s, s}] = lan.loss;
  const double half_latency = std::max(0.0, lan.latency_s - lan.jitter_s) / 2;
  check_latency_against_precision(p, site + " LAN (half its latency a hop)", half_latency, sim, false);
  double uplink_bytes_per_s = 0, downlink_bytes_per_s = 0;
  for (const auto& a : sim.sites()) {
    if (a.site() != site) continue;
    uplink_bytes_per_s = a.uplink_mbps() * 1e6 / 8;
    downlink_bytes_per_s = a.downlink_mbps() * 1e6 / 8;
  }
  // A peer's network interface is on its WAN routes too, unless the site's uplink and
  // downlink are no faster than it: then every WAN flow of the peer is bound by those
  // first, and leaving the interface off those routes changes no WAN flow's rate (only
  // a peer whose own LAN and WAN traffic together fill its interface would see it)
  // while it keeps the solver's system small: the max-min solver scans every link that
  // carries a flow, and with 1,024 peers each interface would be one more.
  const bool nic_on_wan = !(uplink_bytes_per_s > 0 && downlink_bytes_per_s > 0 &&
                            uplink_bytes_per_s <= bytes_per_s(lan) && downlink_bytes_per_s <= bytes_per_s(lan));
  // A star zone routes everything through the interfaces; a full zone is given each
  // route: between two peers their interfaces, to and from the gateway only the site's
  // access links (with the LAN's half latencies the interfaces would have added).
  s4u::NetZone* zone = nic_on_wan ? s4u::create_star_zone("site " + site) : s4u::create_full_zone("site " + site);
  zone->set_parent(root);
  // The site's gateway to the WAN: traffic leaving the site goes into it through the
  // uplink, traffic for the site comes out of it through the downlink. (Made before the
  // hosts' routes: a full zone sizes its route table at the first route it is given.)
  auto* gw = zone->create_router("site " + site + " gateway");
  std::vector<int> members;
  std::vector<s4u::Link*> ups, downs;
  for (int i = 0; i < n; ++i) {
    if (p.site_of[i] != s) continue;
    const std::string& name = cl.peers(i).name();
    s4u::Host* h = zone->create_host(name, 1e9);
    // The peer's network interface: its sends leave through `up`, what it receives
    // comes in through `down`; a flow inside the site crosses the sender's up and the
    // receiver's down, so its latency is the LAN's and its rate the LAN's bandwidth.
    s4u::Link* up = zone->create_link(name + " up", bytes_per_s(lan))->set_latency(half_latency)->seal();
    s4u::Link* down = zone->create_link(name + " down", bytes_per_s(lan))->set_latency(half_latency)->seal();
    if (nic_on_wan) {
      zone->add_route(h->get_netpoint(), nullptr, nullptr, nullptr, {s4u::LinkInRoute(up)}, false);
      zone->add_route(nullptr, h->get_netpoint(), nullptr, nullptr, {s4u::LinkInRoute(down)}, false);
    }
    p.hosts[i] = h;
    members.push_back(i);
    ups.push_back(up);
    downs.push_back(down);
  }
  if (!nic_on_wan) {
    for (size_t a = 0; a < members.size(); ++a) {
      for (size_t b = 0; b < members.size(); ++b) {
        if (a == b) continue;
        zone->add_route(p.hosts[members[a]]->get_netpoint(), p.hosts[members[b]]->get_netpoint(), nullptr, nullptr,
                        {s4u::LinkInRoute(ups[a]), s4u::LinkInRoute(downs[b])}, false);
      }
    }
  }
  std::vector<s4u::LinkInRoute> uplink, downlink;
  if (uplink_bytes_per_s > 0) {
    s4u::Link* l = zone->create_link("site " + site + " uplink", uplink_bytes_per_s);
    if (!nic_on_wan) l->set_latency(half_latency);
    uplink.emplace_back(l->seal());
    p.access[site].push_back(l);
  }
  if (downlink_bytes_per_s > 0) {
    s4u::Link* l = zone->create_link("site " + site + " downlink", downlink_bytes_per_s);
    if (!nic_on_wan) l->set_latency(half_latency);
    downlink.emplace_back(l->seal());
    p.access[site].push_back(l);
  }
  if (nic_on_wan) {
    zone->add_route(nullptr, gw, nullptr, nullptr, uplink, false);
    zone->add_route(gw, nullptr, nullptr, nullptr, downlink, false);
  } else {
    for (int i : members) {
      zone->add_route(p.hosts[i]->get_netpoint(), gw, nullptr, nullptr, uplink, false);
      zone->add_route(gw, p.hosts[i]->get_netpoint(), nullptr, nullptr, downlink, false);
    }
  }
  zone->seal();
  return {zone, gw};
}

}  // namespace

std::vector<std::string> simgrid_options(const config::SimulationConfig& sim) {
  char precision[32];
  std::snprintf(precision, sizeof precision, "%.17g", sim.time_precision_s());  // read back as the same double
  std::vector<std::string> o = {"--log=root.thresh:error",  // SimGrid's own log kept to errors
                                "--cfg=network/model:" + sim.network_model(), std::string("--cfg=surf/precision:") + precision,
                                // Actors' stacks are reserved, not touched: 1,024 peers and their links fit.
                                "--cfg=contexts/stack-size:1024"};
  // CM02 is stated as latency + size / bandwidth: no TCP window bound on a flow's rate
  // either (LV08 keeps SimGrid's, the window of a 4 MiB TCP buffer).
  if (sim.network_model() == "CM02") {
    o.push_back("--cfg=network/TCP-gamma:0");
    // Nor the acknowledgement traffic SimGrid adds against each flow (LV08 keeps it): the
    // emulated link carries frames one way only.
    o.push_back("--cfg=network/crosstraffic:0");
  }
  return o;
}

SimPlatform build_platform(const config::ClusterConfig& cl, const config::SimulationConfig& sim) {
  SimPlatform p;
  p.site_of = site_indices(cl);
  const int n = cl.peers_size();
  int sites = 0;
  for (int s : p.site_of) sites = std::max(sites, s + 1);
  std::vector<int> first_peer(sites, -1);
  for (int i = 0; i < n; ++i) {
    if (first_peer[p.site_of[i]] < 0) first_peer[p.site_of[i]] = i;
  }
  for (int s = 0; s < sites; ++s) p.sites.push_back(cl.peers(first_peer[s]).site());

  const bool emulated = emulates_links(cl) && !cl.ideal();
  auto model = [&](int a, int b) { return emulated ? site_pair_model(cl, p.site_of, first_peer, a, b) : LinkModel{}; };

  s4u::NetZone* root = s4u::create_full_zone("cluster");
  // LV08 completes at arrival whatever the default says (asking it for departure is refused at load).
  p.completes_at_departure = sim.network_model() == "CM02" && sim.sender_completion() == "departure";
  if (p.completes_at_departure) {
    // The transfer alone: SimNetwork holds each frame for its route's latency after it.
    root->get_network_model()->set_lat_factor_cb(
        [](double, const s4u::Host*, const s4u::Host*, const std::vector<s4u::Link*>&, const std::unordered_set<s4u::NetZone*>&) {
          return 0.0;
        });
  }
  std::vector<s4u::NetZone*> zones;
  std::vector<simgrid::kernel::routing::NetPoint*> gateways;
  p.hosts.resize(n);
  for (int s = 0; s < sites; ++s) {
    const auto [zone, gw] = build_site(p, s, root, cl, sim, model(s, s));
    zones.push_back(zone);
    gateways.push_back(gw);
  }
  for (int a = 0; a < sites; ++a) {
    for (int b = 0; b < sites; ++b) {
      if (a == b) continue;
      const LinkModel m = model(a, b);
      check_latency_against_precision(p, "wan " + p.sites[a] + " > " + p.sites[b], m.latency_s - m.jitter_s, sim, true);
      s4u::Link* wan = root->create_link("wan " + p.sites[a] + " > " + p.sites[b], bytes_per_s(m))
                           ->set_latency(std::max(0.0, m.latency_s - m.jitter_s));
      // Without a shared WAN every flow gets the link's bandwidth to itself, as every
      // directed pair of peers gets its own emulated link.
      if (!cl.shared_wan()) wan->set_sharing_policy(s4u::Link::SharingPolicy::FATPIPE);
      wan->seal();
      p.wan[{a, b}] = wan;
      p.jitter_s[{a, b}] = m.jitter_s;
      p.loss[{a, b}] = m.loss;
      root->add_route(zones[a]->get_netpoint(), zones[b]->get_netpoint(), gateways[a], gateways[b],
                      {s4u::LinkInRoute(wan)}, false);
    }
  }
  root->seal();
  return p;
}

}  // namespace hearsay::sim
