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

}  // namespace hearsay
