#pragma once
// A simulated run's peers all live in one process: what they hold at least (each peer's
// model-sized buffers, batch, shard and view of the cluster, and the data set, held once)
// against the memory there is, so that a run too large is refused at load, not after
// minutes in std::bad_alloc (100,000 peers once ran 89 s into it).
#include <string>

namespace hearsay {
namespace config {
class Config;
}

// "" when a simulation of `c` fits this machine's memory (or its cgroup's limit, or the
// limit is unknown); else why not, with the figures, for the error at cluster.peers.
std::string simulation_memory_problem(const config::Config& c);

// The same for real peers: what one peer holds at least (the model's parameters and
// gradient, the optimizer's state, the algorithm's own model-sized buffers and one model or
// update arriving), times the peers of the cluster that run on this machine (those at a
// loopback address: hearsay-run starts them all here), against the memory there is. ""
// when it fits or the limit is unknown; else why not, with the figures. `*several` tells
// whether more than one peer was counted (the error then belongs at cluster.peers, else at
// model).
std::string peer_memory_problem(const config::Config& c, bool* several);

}  // namespace hearsay
