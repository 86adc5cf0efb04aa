#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <thread>

#include "hearsay/clock.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/peer.h"
#include "hearsay/process.h"

namespace hearsay {

// The trust model (docs/WIRE.md, "Trust"): tcp is encrypted (TLS) unless cluster.tls is
// off; fabric shm stays on one host; fabric over a network is in clear, so it may join
// sites only where the operator says the network between them is trusted.
static void check_transport_trust(const config::ClusterConfig& cl) {
  const std::string& kind = cl.transport();
  if (kind.rfind("fabric", 0) != 0 || cl.trusted_network()) return;
  const std::string provider = kind == "fabric" ? std::string("tcp;ofi_rxm") : kind.substr(kind.find(':') + 1);
  if (provider == "shm") return;
  std::set<std::string> sites;
  for (const auto& p : cl.peers()) sites.insert(p.site());
  if (sites.size() < 2) return;
  throw InputError("cluster.transport '" + kind + "': fabric over a network carries frames unencrypted, and the peers are on " +
                   std::to_string(sites.size()) + " sites; use tcp (TLS), or set cluster.trusted_network: true if the network "
                   "between the sites is trusted");
}

int cluster_peer_index(const config::ClusterConfig& cl, const std::string& name) {
  for (int i = 0; i < cl.peers_size(); ++i) {
    if (cl.peers(i).name() == name) return i;
  }
  throw InputError("peer '" + name + "' is not in cluster.peers");
}

std::unique_ptr<Transport> cluster_transport(const config::Config& base, int me, bool emulate) {
  const auto& cl = base.cluster();
  const int n = cl.peers_size();
  TransportOptions o;
  o.peer_id = cl.peers(me).name();
  o.site = cl.peers(me).site();
  o.cluster_id = cl.id();
  o.secret = load_cluster_secret(cl);
  for (const auto& p : cl.peers()) o.cluster_peers.push_back(p.name());
  o.tls = cl.tls();
  check_transport_trust(cl);
  std::unique_ptr<Transport> transport = create_transport(cl.transport(), o);
  if (!emulate || !emulates_links(cl) || cl.ideal()) return transport;
  std::map<std::string, LinkModel> per_peer;
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    LinkModel m = link_between(cl, me, j);
    const std::string &from = cl.peers(me).site(), &to = cl.peers(j).site();
    if (cl.shared_wan() && from != to) {
      m.pipe = "wan " + from + " > " + to;
      m.pipe_scope = cl.id() + "/" + pipe_scope_of_this_run();
    }
    per_peer[cl.peers(j).name()] = m;
  }
  return create_emulated_transport(std::move(transport), link_model(cl.default_link()), per_peer, base.seed() + me);
}

void listen_as_peer(Transport& transport, const config::ClusterConfig& cl, int me) {
  const bool own_listen = !cl.peers(me).listen().empty();
  const std::string listen_at = own_listen ? cl.peers(me).listen() : cl.peers(me).address();
  try {
    transport.listen(listen_at);
  } catch (const InputError& e) {
    // Which peer, which field, and what an operator should look at: the config gives this
    // peer an address another host has, a name that does not resolve, or a port in use.
    throw InputError("peer " + cl.peers(me).name() + " (cluster.peers[" + std::to_string(me) + "]." +
                     (own_listen ? "listen" : "address") + " '" + listen_at + "'): " + e.what() +
                     "; this peer listens there, so it must be one of this host's addresses with a free port" +
                     (own_listen ? std::string() : std::string(" (behind a port forward or NAT, set listen to this host's "
                                                               "own address and keep address for the others to dial)")));
  }
}

const char* link_event_name(LinkEvent::Kind kind) {
  switch (kind) {
    case LinkEvent::Kind::kUp: return "up";
    case LinkEvent::Kind::kDown: return "down";
    case LinkEvent::Kind::kRejected: return "rejected";
    case LinkEvent::Kind::kUnreachable: return "unreachable";
  }
  return "?";
}

ClusterMembership join_cluster(const config::Config& base, const std::string& name, EventLog& log,
                               const std::atomic<bool>* stop) {
  const auto& cl = base.cluster();
  const int n = cl.peers_size();
  const int me = cluster_peer_index(cl, name);
  // Gossip settings (algorithm, codec...) fail here, before anything listens or dials.
  try {
    check_gossip_spec(gossip_spec(cl), n);
  } catch (const InputError& e) {
    throw InputError(std::string("cluster.gossip: ") + e.what());
  }

  std::unique_ptr<Transport> transport = cluster_transport(base, me, true);
  transport->set_link_listener([&log](const LinkEvent& e) {
    log.write(log.event("link").add("state", link_event_name(e.kind)).add("neighbour", e.peer_id).add("address", e.remote_address).add("reason", e.reason));
  });
  listen_as_peer(*transport, cl, me);
  // Each pair connects once: the peer later in the list dials the earlier one.
  for (int j = 0; j < me; ++j) transport->connect(cl.peers(j).name(), cl.peers(j).address());

  Clock& wall = wall_clock();  // a real peer joins on real time
  const double deadline = wall.now() + cl.connect_timeout_s();
  // An asynchronous peer trains once its quorum is up and the grace window for the rest
  // has passed (at once with min_neighbours 0); a synchronous one needs every neighbour,
  // and a site replica waits for everyone up to the timeout too (its site's ring sums
  // every member's gradient each step), as before.
  const bool waits_for_all = is_synchronous(cl.gossip().algorithm()) || cl.site_replicas();
  double quorum_at = -1;
  for (;;) {
    const int up_now = static_cast<int>(transport->connected_peers().size());
    if (up_now >= n - 1 || wall.now() >= deadline || (stop && *stop)) break;
    if (!waits_for_all && up_now >= cl.min_neighbours()) {
      if (quorum_at < 0) quorum_at = wall.now();
      if (cl.min_neighbours() == 0 || wall.now() - quorum_at >= cl.join_grace_s()) break;
    }
    wall.sleep_for(0.02);
  }
  const std::vector<std::string> up = transport->connected_peers();
  const int connected = static_cast<int>(up.size());
  // Stopped while it waited: the peer ends before its first step, as stopped, not as a
  // join that failed.
  const bool stopped = stop != nullptr && *stop;
  if (connected < n - 1 && !stopped) {
    // Who is missing, and where this peer looked for them: the first 8 by name, then how
    // many more (a cluster of 100,000 would otherwise say it in one line of megabytes).
    std::string missing;
    int named = 0, more = 0;
    for (int j = 0; j < n; ++j) {
      const std::string& other = cl.peers(j).name();
      if (j == me || std::find(up.begin(), up.end(), other) != up.end()) continue;
      if (named == 8) {
        ++more;
        continue;
      }
      missing += (missing.empty() ? "" : ", ") + other + " at " + cl.peers(j).address();
      ++named;
    }
    if (more > 0) missing += " and " + std::to_string(more) + " more";
    char timeout[32];
    std::snprintf(timeout, sizeof timeout, "%g", cl.connect_timeout_s());
    // Connections refused meanwhile, by kind: "admission" many times is a secret that differs.
    std::string refused;
    for (const auto& [kind, times] : transport->counters().rejected) {
      refused += (refused.empty() ? "; connections refused meanwhile: " : ", ") + kind + " " + std::to_string(times) + " times";
    }
    if (transport->counters().rejected.count("admission") != 0) refused += " (a cluster secret that differs?)";
    const std::string counted = "peer " + name + ": " + std::to_string(connected) + " of " + std::to_string(n - 1) +
                                " neighbours connected within cluster.connect_timeout_s (" +
                                timeout + " s); not connected: " + missing + refused;
    if (is_synchronous(cl.gossip().algorithm())) {
      throw InputError(counted + "; " + cl.gossip().algorithm() + " needs all");
    }
    // At most n - 1 (checked when the config was read; the default 1 with n >= 2 peers).
    if (connected < cl.min_neighbours()) {
      throw InputError(counted + "; cluster.min_neighbours is " + std::to_string(cl.min_neighbours()) +
                       " (start those peers, check their addresses and the cluster secret, or set min_neighbours: 0 "
                       "to train alone until they join)");
    }
    std::fprintf(stderr, "%s: %s: %d of %d neighbours connected; starting anyway (asynchronous, min_neighbours %d)\n",
                 program_name().c_str(), name.c_str(), connected, n - 1, cl.min_neighbours());
  }

  ClusterMembership m;
  m.network = cluster_peer_network(base, me);
  // Connected is not yet answering: the engine waits for its quorum's answers too.
  m.network.join_quorum = waits_for_all ? 0 : cl.min_neighbours();
  m.network.join_timeout_s = cl.connect_timeout_s();
  m.network.transport = transport.get();
  m.transport = std::move(transport);
  return m;
}

PeerNetwork cluster_peer_network(const config::Config& cfg, int me) {
  const auto& cl = cfg.cluster();
  PeerNetwork n;
  n.gossip = gossip_spec(cl);
  n.gossip.byzantine = cl.peers(me).byzantine();
  for (const auto& p : cl.peers()) n.peers.push_back(p.name());
  n.me = me;
  n.slowdown = cl.ideal() ? 1.0 : cl.peers(me).slowdown();
  return n;
}

config::Config cluster_peer_config(const config::Config& base, const std::string& name) {
  const auto& cl = base.cluster();
  config::Config cfg = base;
  for (int i = 0; i < cl.peers_size(); ++i) {
    if (cl.peers(i).name() != name) continue;
    cfg.set_name(name);
    cfg.mutable_data()->set_num_shards(cl.peers_size());
    cfg.mutable_data()->set_shard(i);
    if (!cl.peers(i).device().empty()) cfg.set_device(cl.peers(i).device());
    return cfg;
  }
  throw InputError("peer '" + name + "' is not in cluster.peers");
}

TrainResult run_cluster_peer(const config::Config& base, const std::string& name, EventLog& log, Progress* progress,
                             const std::atomic<bool>* stop, MetricsBoard* metrics) {
  ClusterMembership cluster = join_cluster(base, name, log, stop);
  auto& transport = cluster.transport;
  const PeerNetwork& net = cluster.network;
  TrainResult result;
  {
    Peer peer(peer_spec(cluster_peer_config(base, name)), log, progress, &net);
    peer.set_metrics(metrics);
    peer.stop_when(stop);  // at step boundaries; the watcher below also ends a wait inside a step
    std::atomic<bool> done{false};
    std::thread watcher([&] {
      while (!done) {
        if (stop && *stop) peer.stop();
        wall_clock().sleep_for(0.05);
      }
    });
    try {
      result = peer.run();
    } catch (...) {
      done = true;
      watcher.join();
      transport->close();
      throw;
    }
    done = true;
    watcher.join();
    transport->close();
  }
  return result;
}

}  // namespace hearsay
