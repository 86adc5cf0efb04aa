// The simulator (docs/SIMULATION.md): every peer of a cluster config in one process, on
// SimGrid's virtual clock and network model. The peers are the real ones (Peer, the
// gossip engine, the algorithm, codecs, update guard, model, optimizer, data); only time
// and the wire are simulated (src/sim). Same config and seed, byte-identical logs.
#pragma once

#include <atomic>

#include <cstdint>
#include <string>
#include <vector>

namespace hearsay {

namespace config {
class Config;
}  // namespace config

struct SimulationOptions {
  std::string log_dir;           // per-peer NAME.jsonl and the simulator's cluster.jsonl
  double progress_every_s = 2;   // wall seconds between progress lines on stderr; 0: none
  // Once set (a signal's stop: hearsay/signals.h), every peer stops at its next step and
  // the run ends, stopped_by "signal". Checked each monitor period of virtual time.
  const std::atomic<bool>* stop = nullptr;
};

struct SimulationResult {
  std::string stopped_by;  // target, virtual_time, signal, finished, failed
  double virtual_s = 0;
  double wall_s = 0;
  uint64_t events = 0;     // frames carried, sleeps and waits: the simulation's own steps
  uint64_t peak_rss_bytes = 0;
  int peers = 0;
};

// Runs the config's cluster (experiment.simulate set or not). Throws InputError for a
// config it cannot simulate or a peer's bad input; a peer that fails ends the run with
// its message.
SimulationResult run_simulation(const config::Config& cfg, const SimulationOptions& options);

}  // namespace hearsay
