// hearsay-peer --check: before any training, one peer of a cluster config dials every
// other peer at its configured address, proves the cluster secret (the admission
// handshake, under TLS where the config has it), and measures each link it reaches:
// round-trip time and bandwidth, with Probe frames (docs/WIRE.md) that the other side
// answers inside its transport, so the other side may be a training peer or another
// check. What failed is named per neighbour: a name that does not resolve, a refused
// connection, a wrong secret, a peer that answers under another name.
//
// The check dials over a transport of its own and answers the others' checks on a
// second one, listening at the peer's address: run at once on every site, the checks
// measure each other, and no pair ends up with two connections under one name.
// Link emulation in the config is not applied: the figures are the real network's.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hearsay {

namespace config {
class Config;
}
class Transport;

struct LinkCheck {
  std::string peer;     // the neighbour
  std::string address;  // where the config says it is
  std::string reached;  // the endpoint the connection reached (the resolved address)
  bool ok = false;      // admitted both ways and measured
  std::string failure;  // why not: "unreachable: ...", "rejected: ...", "no answer to a probe"
  double rtt_s = -1;    // median round trip of empty probes
  double bandwidth_Bps = -1;  // probe payload bytes over the time until the last reply
  uint64_t probe_bytes = 0;   // payload bytes sent to measure it
};

struct CheckOptions {
  double connect_s = 5.0;          // how long every neighbour has to be admitted
  uint64_t probe_bytes = 4 << 20;  // per link, for the bandwidth
  int pings = 5;                   // empty probes, for the round trip
  double probe_timeout_s = 10.0;   // per link, for every reply
};

struct CheckReport {
  std::string peer, cluster, transport;
  bool emulation_skipped = false;  // the config emulates links; these figures are without it
  std::vector<LinkCheck> links;
  bool ok() const;
  // One line per link and a verdict, for a terminal.
  std::string text() const;
};

class PeerCheck {
 public:
  // Listens at the peer's address for the other peers' checks (throws InputError, naming
  // the peer and field, where it cannot).
  PeerCheck(const config::Config& cfg, const std::string& peer_name, CheckOptions options);
  ~PeerCheck();
  PeerCheck(const PeerCheck&) = delete;
  PeerCheck& operator=(const PeerCheck&) = delete;

  // Dials every other peer, waits up to connect_s for each, then measures each admitted
  // link in turn. `stop` (may be null) cuts the waits short.
  CheckReport run(const std::atomic<bool>* stop);
  // Keeps answering the other peers' checks until none of those this check reached is
  // still connected to it, at most `seconds`.
  void linger(double seconds, const std::atomic<bool>* stop);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace hearsay
