// The SimGrid platform a cluster config describes (docs/SIMULATION.md, "The network"):
// one host per peer; each site a star zone whose hosts reach each other over their own
// network interface links (the site's LAN: half its latency each way, its bandwidth),
// and the WAN through the site's gateway, behind the site's uplink and downlink when the
// simulation gives them (a full zone that leaves the interfaces off WAN routes where
// those access links are no faster than the interfaces); between two sites one link per direction with the site pair's
// latency and bandwidth, shared by every flow from the one site to the other (the
// shared WAN pipe), or a fat pipe per flow where cluster.shared_wan is false.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace simgrid::s4u {
class Host;
class Link;
}  // namespace simgrid::s4u

namespace hearsay {
namespace config {
class ClusterConfig;
class SimulationConfig;
}  // namespace config

namespace sim {

struct SimPlatform {
  std::vector<simgrid::s4u::Host*> hosts;   // by peer index
  std::vector<int> site_of;                 // by peer index: index into sites
  std::vector<std::string> sites;           // in order of first appearance
  // Each site's access links (uplink, downlink), where the simulation gives them.
  std::map<std::string, std::vector<simgrid::s4u::Link*>> access;
  // The WAN link from site a to site b (a != b), by (a, b) site indices.
  std::map<std::pair<int, int>, simgrid::s4u::Link*> wan;
  // Extra delay per directed pair of sites: each frame's arrival is put off by a draw in
  // [0, 2 x jitter] on top of the route's latency, which is the link's latency less the
  // jitter (so arrivals spread over latency +- jitter, as the emulated link's do).
  std::map<std::pair<int, int>, double> jitter_s;
  std::map<std::pair<int, int>, double> loss;
  // What the platform does not resolve (a LAN hop's latency under the time quantum), for
  // the simulator to say at start.
  std::vector<std::string> notes;
  // simulation.sender_completion "departure": SimGrid's communications carry no latency
  // (the bandwidth phase alone); the network adds each route's latency after it.
  bool completes_at_departure = false;
};

// SimGrid's settings for this simulation, as its command-line options: the network model
// and its terms, the time quantum, and the actors' stacks. The simulator and the tests of
// its network model start their engines with the same ones.
std::vector<std::string> simgrid_options(const config::SimulationConfig& sim);

// Builds the platform into the running SimGrid engine (before it runs). Throws InputError
// for what SimGrid cannot take.
SimPlatform build_platform(const config::ClusterConfig& cluster, const config::SimulationConfig& sim);

}  // namespace sim
}  // namespace hearsay
