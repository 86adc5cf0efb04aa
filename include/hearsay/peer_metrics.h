// A peer's Prometheus endpoint (--metrics HOST:PORT), as hearsay-peer and a torch peer
// (hearsay.torch's metrics=) both serve it: the board its loop reports to, and the server
// that renders it, up before the peer joins its cluster (a port in use stops it then, and an
// operator sees it while it waits for its neighbours).
#pragma once

#include <memory>
#include <string>

#include "hearsay/metrics.h"

namespace hearsay {

namespace config {
class Config;
}

struct PeerMetrics {
  std::unique_ptr<MetricsBoard> board;  // declared first: the server renders it
  std::unique_ptr<MetricsServer> server;
};

// Serves peer `name`'s metrics at `address` (port 0 picks one), with hearsay_info's labels
// from the config (peer, cluster, algorithm and transport, "alone" and "none" unless
// `clustered`, device) and `framework` when not empty ("torch"); says on stderr, as
// `program`, where. Throws InputError naming the peer and --metrics when it cannot listen.
PeerMetrics serve_peer_metrics(const config::Config& cfg, bool clustered, const std::string& name, const std::string& address,
                               const std::string& framework, const std::string& program);

}  // namespace hearsay
