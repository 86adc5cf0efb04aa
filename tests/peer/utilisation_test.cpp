// Compute utilisation (docs/LOGS.md): the share of a peer's training time in its own
// forward, backward and optimizer passes. A synchronous algorithm's fast peer waits for its
// slow neighbour every step; an asynchronous one's never does.
#include <doctest/doctest.h>

#include "hearsay/cluster.h"
#include "hearsay/config.h"

using namespace hearsay;

namespace {

// Emulated steps of 4 ms (the real ones take microseconds), the second peer 4x slower.
const char* kConfig = R"(
  name: "u"
  seed: 4
  model { kind: LOGREG }
  data { format: SYNTHETIC synthetic_train: 1024 synthetic_test: 64 synthetic_dim: 8 num_classes: 2 }
  optim { lr: 0.05 }
  train { batch_size: 16 max_steps: 60 eval_every_steps: 1000000 emulated_step_s: 0.004 }
  log { every_steps: 20 }
)";

ClusterResult run(const std::string& algorithm) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kConfig, "utilisation-test", {}));
  s.peers = 2;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = "ring";
  s.slowdown = {1.0, 4.0};
  return run_cluster(s);
}

}  // namespace

TEST_CASE("utilisation: allreduce's fast peer waits for its 4x slower neighbour (about a quarter), adpsgd's peers never wait") {
  const ClusterResult sync = run("allreduce");
  const ClusterResult async = run("adpsgd");
  REQUIRE(sync.peers.size() == 2);
  REQUIRE(async.peers.size() == 2);
  MESSAGE("allreduce: " << sync.peers[0].compute_utilisation << " / " << sync.peers[1].compute_utilisation
                        << ", adpsgd: " << async.peers[0].compute_utilisation << " / " << async.peers[1].compute_utilisation);
  // The fast peer computes 4 ms of every 16 the slow one's step takes.
  CHECK(sync.peers[0].compute_utilisation > 0.15);
  CHECK(sync.peers[0].compute_utilisation < 0.4);
  CHECK(sync.peers[1].compute_utilisation > 0.8);
  for (const auto& p : async.peers) CHECK(p.compute_utilisation > 0.8);
}
