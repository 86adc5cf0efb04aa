#include "hearsay/preflight.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "hearsay/clock.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "hearsay/wire.h"
#include "hearsay/wire.pb.h"

namespace hearsay {
namespace {


// Bandwidth probes go in frames of at most this many payload bytes, so a slow link shows
// progress and no frame nears a receiver's limits.
constexpr size_t kProbeChunkBytes = 1 << 20;

}  // namespace

struct PeerCheck::State {
  const config::Config& cfg;
  CheckOptions options;
  int me = -1;
  std::unique_ptr<Transport> responder;  // answers the other checks, at this peer's address
  std::unique_ptr<Transport> prober;     // dials every other peer

  RealClock clock;  // a check runs on real time, before any peer does
  std::mutex mu;
  std::condition_variable changed;
  std::map<std::string, LinkEvent> last_event;       // GUARDED_BY(mu): the prober's, per neighbour
  std::map<uint64_t, double> replies;                // GUARDED_BY(mu): probe seq -> clock.now() when its reply came
  std::map<uint64_t, uint64_t> reply_bytes;          // GUARDED_BY(mu): probe seq -> bytes it carried
  std::set<std::string> answered;                    // GUARDED_BY(mu): peers admitted by the responder
  uint64_t next_seq = 1;                             // GUARDED_BY(mu)

  State(const config::Config& c, CheckOptions o) : cfg(c), options(o) {}

  // Waits for `pred` (under mu) until `deadline` or a stop; true when it held.
  template <class Pred>
  bool wait_until(double deadline, const std::atomic<bool>* stop, Pred pred) {
    std::unique_lock<std::mutex> lock(mu);
    while (!pred()) {
      if ((stop && *stop) || clock.now() >= deadline) return false;
      clock.wait_for(lock, changed, 0.02, pred);
    }
    return true;
  }

  uint64_t send_probe(const std::string& peer, const std::shared_ptr<const std::vector<uint8_t>>& payload, size_t bytes) {
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu);
      seq = next_seq++;
    }
    wire::Envelope e;
    e.mutable_probe()->set_seq(seq);
    prober->send(peer, make_frame(e, payload->data(), bytes, payload), nullptr);
    return seq;
  }

  void measure(LinkCheck& link, const std::atomic<bool>* stop) {
    const double deadline = clock.now() + options.probe_timeout_s;
    auto none = std::make_shared<const std::vector<uint8_t>>();
    std::vector<double> rtts;
    for (int i = 0; i < options.pings; ++i) {
      const double sent = clock.now();
      const uint64_t seq = send_probe(link.peer, none, 0);
      if (!wait_until(deadline, stop, [&] { return replies.count(seq) > 0; })) break;
      std::lock_guard<std::mutex> lock(mu);
      rtts.push_back(replies[seq] - sent);
    }
    if (rtts.empty()) {
      link.failure = "admitted, but no answer to a probe within " + std::to_string(static_cast<int>(options.probe_timeout_s)) +
                     " s (a peer of an older version, or a link that drops frames)";
      return;
    }
    std::sort(rtts.begin(), rtts.end());
    link.rtt_s = rtts[rtts.size() / 2];
    if (options.probe_bytes == 0) {  // asked for the round trip only
      link.ok = true;
      return;
    }

    // Every chunk queued at once: the link, not the round trip, sets the pace. The time
    // until the last reply less one round trip is the time the bytes took to cross.
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(kProbeChunkBytes, std::max<uint64_t>(1, options.probe_bytes)));
    auto payload = std::make_shared<const std::vector<uint8_t>>(chunk, uint8_t{0});
    std::vector<uint64_t> seqs;
    const double start = clock.now();
    for (uint64_t sent = 0; sent < options.probe_bytes; sent += chunk) {
      seqs.push_back(send_probe(link.peer, payload, static_cast<size_t>(std::min<uint64_t>(chunk, options.probe_bytes - sent))));
    }
    const bool all = wait_until(deadline, stop, [&] { return replies.count(seqs.back()) > 0; });
    std::lock_guard<std::mutex> lock(mu);
    uint64_t acked = 0;
    double last = start;
    for (uint64_t s : seqs) {
      if (replies.count(s) == 0) continue;
      acked += reply_bytes[s];
      last = std::max(last, replies[s]);
    }
    const double took = (all ? last : clock.now()) - start;
    const double crossing = took > 2 * link.rtt_s ? took - link.rtt_s : took;
    link.probe_bytes = acked;
    if (acked > 0 && crossing > 0) link.bandwidth_Bps = static_cast<double>(acked) / crossing;
    if (!all) {
      link.failure = std::to_string(acked) + " of " + std::to_string(options.probe_bytes) + " probe bytes answered within " +
                     std::to_string(static_cast<int>(options.probe_timeout_s)) + " s";
      return;
    }
    link.ok = true;
  }
};

PeerCheck::PeerCheck(const config::Config& cfg, const std::string& peer_name, CheckOptions options)
    : state_(std::make_unique<State>(cfg, options)) {
  const auto& cl = cfg.cluster();
  if (cl.peers_size() < 2) throw InputError("--check: the config has no cluster of at least 2 peers to check");
  State& s = *state_;
  s.me = cluster_peer_index(cl, peer_name);
  s.responder = cluster_transport(cfg, s.me, false);
  s.responder->set_link_listener([&s](const LinkEvent& e) {
    if (e.kind != LinkEvent::Kind::kUp) return;
    std::lock_guard<std::mutex> lock(s.mu);
    s.answered.insert(e.peer_id);
  });
  listen_as_peer(*s.responder, cl, s.me);
  s.prober = cluster_transport(cfg, s.me, false);
  s.prober->set_link_listener([&s](const LinkEvent& e) {
    {
      std::lock_guard<std::mutex> lock(s.mu);
      // An up link stays the verdict: a later refusal is of a retry, not of the link. A
      // rejection stays over a later unreachable: the peer was there and refused this
      // secret, and that is what to mend, even if its own check has ended since.
      auto it = s.last_event.find(e.peer_id);
      if (it != s.last_event.end() && it->second.kind == LinkEvent::Kind::kUp && e.kind != LinkEvent::Kind::kDown) return;
      if (it != s.last_event.end() && it->second.kind == LinkEvent::Kind::kRejected &&
          e.kind == LinkEvent::Kind::kUnreachable) {
        return;
      }
      s.last_event[e.peer_id] = e;
    }
    s.changed.notify_all();
  });
  s.prober->set_receiver([&s](const std::string&, InFrame&& f) {
    if (!f.envelope->has_probe() || !f.envelope->probe().is_reply()) return;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      const uint64_t seq = f.envelope->probe().seq();
      if (seq == 0 || seq >= s.next_seq) return;  // answers no probe of ours
      s.replies[seq] = s.clock.now();
      s.reply_bytes[seq] = f.envelope->probe().bytes();
    }
    s.changed.notify_all();
  });
}

PeerCheck::~PeerCheck() {
  if (state_->prober) state_->prober->close();
  if (state_->responder) state_->responder->close();
}

CheckReport PeerCheck::run(const std::atomic<bool>* stop) {
  State& s = *state_;
  const auto& cl = s.cfg.cluster();
  CheckReport report;
  report.peer = cl.peers(s.me).name();
  report.cluster = cl.id();
  report.transport = cl.transport() + (cl.transport() == "tcp" ? (cl.tls() ? " (TLS)" : " (no TLS)") : "");
  report.emulation_skipped = emulates_links(cl) && !cl.ideal();
  std::vector<std::string> others;
  for (int j = 0; j < cl.peers_size(); ++j) {
    if (j == s.me) continue;
    others.push_back(cl.peers(j).name());
    s.prober->connect(cl.peers(j).name(), cl.peers(j).address());
  }
  const double deadline = s.clock.now() + s.options.connect_s;
  s.wait_until(deadline, stop, [&] {
    for (const auto& o : others) {
      auto it = s.last_event.find(o);
      if (it == s.last_event.end() || it->second.kind != LinkEvent::Kind::kUp) return false;
    }
    return true;
  });
  for (int j = 0; j < cl.peers_size(); ++j) {
    if (j == s.me) continue;
    LinkCheck link;
    link.peer = cl.peers(j).name();
    link.address = cl.peers(j).address();
    LinkEvent last{LinkEvent::Kind::kDown, link.peer, "", ""};
    bool heard = false;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (auto it = s.last_event.find(link.peer); it != s.last_event.end()) {
        last = it->second;
        heard = true;
      }
    }
    if (heard && last.kind == LinkEvent::Kind::kUp) {
      link.reached = last.remote_address;
      s.measure(link, stop);
    } else if (!heard) {
      char waited[96];
      std::snprintf(waited, sizeof waited, "no answer within %g s", s.options.connect_s);
      link.failure = std::string(waited) + " (still connecting: a firewall that drops packets, or a host that is down?)";
    } else {
      link.failure = std::string(link_event_name(last.kind)) + ": " + last.reason;
    }
    report.links.push_back(std::move(link));
  }
  return report;
}

void PeerCheck::linger(double seconds, const std::atomic<bool>* stop) {
  State& s = *state_;
  std::set<std::string> reached;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (const auto& [peer, e] : s.last_event) {
      if (e.kind == LinkEvent::Kind::kUp) reached.insert(peer);
    }
  }
  s.prober->close();  // our probes are done; the others see this peer's prober go
  // A neighbour this check reached is checking back while it is connected to our
  // responder, or has yet to come; one never reached will not come in time.
  const double deadline = s.clock.now() + seconds;
  while (s.clock.now() < deadline && !(stop && *stop)) {
    const auto connected = s.responder->connected_peers();
    bool waiting = false;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      for (const auto& p : reached) {
        const bool here = std::find(connected.begin(), connected.end(), p) != connected.end();
        if (here || s.answered.count(p) == 0) waiting = true;
      }
    }
    if (!waiting) return;
    s.clock.sleep_for(0.05);
  }
}

bool CheckReport::ok() const {
  return std::all_of(links.begin(), links.end(), [](const LinkCheck& l) { return l.ok; });
}

std::string CheckReport::text() const {
  std::string out = "hearsay-peer --check: peer " + peer + " of cluster " + cluster + " over " + transport + ", " +
                    std::to_string(links.size()) + " neighbours\n";
  if (emulation_skipped) out += "  (the config emulates its links; these are the real network's figures, without it)\n";
  size_t failed = 0;
  char line[512];
  for (const auto& l : links) {
    if (l.ok) {
      std::snprintf(line, sizeof line, "  ok      %-16s %s (reached %s): secret proven, rtt %.2f ms", l.peer.c_str(),
                    l.address.c_str(), l.reached.c_str(), l.rtt_s * 1e3);
      out += line;
      if (l.bandwidth_Bps > 0) {
        std::snprintf(line, sizeof line, ", %.1f Mbit/s (%.1f MiB)", l.bandwidth_Bps * 8e-6,
                      static_cast<double>(l.probe_bytes) / (1 << 20));
        out += line;
      }
      out += "\n";
      continue;
    }
    ++failed;
    std::snprintf(line, sizeof line, "  FAILED  %-16s %s: ", l.peer.c_str(), l.address.c_str());
    out += line + l.failure + "\n";
  }
  out += failed == 0 ? "all " + std::to_string(links.size()) + " links ok\n"
                     : std::to_string(failed) + " of " + std::to_string(links.size()) + " links failed\n";
  return out;
}

}  // namespace hearsay
