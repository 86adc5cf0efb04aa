// Who talks to whom. A topology names, for a peer and a gossip round, the neighbours it
// sends to. Peers are indices 0..n-1 (the cluster's order); sites group them.
//
//   ring           i-1 and i+1
//   torus          2-D wrap-around grid (rows x cols = n, as square as possible): 4 neighbours
//   exponential    one peer per round: i + 2^(round mod log2 n) (SGP's one-peer exponential graph)
//   complete       everyone else
//   star           peer 0 and every other peer (a hub site and spokes; the one topology
//                  whose peers have unequal degrees)
//   random         one uniformly random other peer per round (AD-PSGD)
//   random_regular a random d-regular graph (d = degree), every neighbour every round
//   hierarchical   one random peer of the same site per round, and every `cross_every`-th
//                  round one random peer of another site (geo-distributed)
//   bandwidth      one peer per round, chosen with probability proportional to the measured
//                  throughput of the link to it, never below `floor` (so every edge stays
//                  in use and the graph stays connected)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hearsay/registry.h"
#include "hearsay/rng.h"

namespace hearsay {

struct TopologySpec {
  std::string kind = "ring";
  std::vector<int> site_of;  // site index of each peer (hierarchical); empty: one site
  int cross_every = 4;       // hierarchical
  double floor = 0.05;       // bandwidth: least probability of any neighbour, times 1/(n-1)
  int degree = 4;            // random_regular: neighbours of each peer
};

class Topology {
 public:
  virtual ~Topology() = default;
  int size() const { return n_; }
  // The peers `peer` sends to in `round` (never itself).
  virtual std::vector<int> targets(int peer, int64_t round, Rng& rng) const = 0;
  // Every peer `peer` may ever send to (for heartbeats and failure detection).
  virtual std::vector<int> neighbours(int peer) const = 0;
  // Rounds after which targets(peer, round) repeat whatever the rng draws: 1 where they do
  // not depend on the round, 0 where they are drawn at random (so which peers send to a
  // given one in a round cannot be known; sgp's delay bound needs it).
  virtual int64_t period() const { return 0; }
  // Bandwidth-aware topologies learn link speeds; others ignore this.
  virtual void observe_throughput(int peer, int other, double bytes_per_s) {}

 protected:
  explicit Topology(int n) : n_(n) {}
  int n_;
};

// Throws InputError for an unknown kind (listing the registered ones) or an impossible size.
std::unique_ptr<Topology> make_topology(const TopologySpec& spec, int n);

// The one list of topologies, by name (hearsay/registry.h): hearsay's own (above) and any
// a program adds with topologies().add(name, factory). A factory throws InputError for a
// spec it cannot build (it is given n >= 2 and a site_of of n entries or none).
using TopologyFactory = std::function<std::unique_ptr<Topology>(const TopologySpec& spec, int n)>;
NamedRegistry<TopologyFactory>& topologies();

}  // namespace hearsay
