// A whole cluster in one process: every peer on its own thread, over the inproc (or
// tcp) transport, optionally under link emulation. Tests use it; it reports what a
// cluster's run needs for checking the theory: each peer's result and step rate, the
// consensus distance over time, and the gossip buffers' high-water mark.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/emulated.h"
#include "hearsay/gossip.h"
#include "hearsay/peer.h"

namespace hearsay {

struct ClusterSpec {
  PeerSpec base;  // model, data, optimizer, training: shared (peer_spec() of a config); each peer gets its shard
  int peers = 4;
  GossipSpec gossip;
  std::string transport = "inproc";
  std::vector<double> slowdown;                  // per peer; empty: all 1
  // Per peer: joins late, once every peer that starts at once has taken this many steps
  // (or finished); 0 or empty: starts at once. Counted in steps, not seconds, so a
  // sanitizer or a loaded machine cannot make "late" mean "before anyone trained".
  std::vector<int64_t> start_after_steps;
  std::vector<std::string> byzantine;            // per peer (GossipSpec::byzantine); empty: none
  LinkModel link;                                // every directed link
  std::map<std::pair<int, int>, LinkModel> links;  // (from, to) overrides
  std::string log_dir;                           // per-peer JSON Lines logs; empty: none
  // Per peer: after this many steps the peer dies as a killed process would (its
  // transport closed, nothing more sent or answered); 0 or empty: never. Its result is
  // the state it died with; the run fails only if a live peer does.
  std::vector<int64_t> crash_after_steps;
  // Tests of averaging invariants: every peer initialises its model from its own seed
  // (base seed + index), and none copies a neighbour's model at start (no join).
  bool distinct_init = false;
  // Per peer: after this many steps one bit of its model flips (PeerNetwork::
  // flip_bit_after_step); -1 or empty: never.
  std::vector<int64_t> flip_bit_after_step;
};

struct ClusterResult {
  std::vector<TrainResult> peers;
  // (step, mean over peers of ||x_i - mean x||) at every log.every_steps steps.
  std::vector<std::pair<int64_t, double>> consensus;
  // Each peer's parameters before its first step and after its last, once the messages
  // still on the wire when the peers stopped have been taken in (GossipEngine::settle).
  std::vector<std::vector<float>> initial_params, final_params;
  // Each peer's algorithm state after its last step, as its checkpoint would hold it
  // (Algorithm::save; choco: its public copies). Tests of an algorithm's invariants read it.
  std::vector<std::string> algorithm_state;
  double wall_s = 0;
};

// Runs every peer to the end of training. Throws InputError for bad specs; a peer that
// fails makes the whole run fail with its message.
ClusterResult run_cluster(const ClusterSpec& spec);

}  // namespace hearsay
