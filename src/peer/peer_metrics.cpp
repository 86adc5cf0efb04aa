#include "hearsay/peer_metrics.h"

#include <cstdio>
#include <map>

#include "hearsay/config.pb.h"

namespace hearsay {

PeerMetrics serve_peer_metrics(const config::Config& cfg, bool clustered, const std::string& name, const std::string& address,
                               const std::string& framework, const std::string& program) {
  std::map<std::string, std::string> labels{
      {"peer", name},
      {"cluster", cfg.cluster().id()},
      {"algorithm", clustered ? cfg.cluster().gossip().algorithm() : "alone"},
      {"transport", clustered ? cfg.cluster().transport() : "none"},
      {"device", cfg.device()}};
  if (!framework.empty()) labels["framework"] = framework;
  PeerMetrics m;
  m.board = std::make_unique<MetricsBoard>(std::move(labels));
  m.server = std::make_unique<MetricsServer>(address, [b = m.board.get()] { return b->render(); }, "peer " + name + ": --metrics");
  std::fprintf(stderr, "%s: %s serves metrics at %s (port %d)\n", program.c_str(), name.c_str(), address.c_str(),
               m.server->port());
  return m;
}

}  // namespace hearsay
