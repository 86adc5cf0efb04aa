// Loading and checking configs (protobuf text format; schema in proto/hearsay/config.proto),
// and turning config messages into the runtime's own types: the one module that knows
// the config schema (the peer, the engine and everything below take runtime types). Every
// error names the source and the place: "FILE:LINE:COL: field: problem". Code that reads
// a config's fields includes the header protoc generates for config.proto.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/peer.h"

namespace hearsay {

class MetricsBoard;

namespace config {
class Config;
class DataConfig;
class ModelConfig;
class OptimConfig;
class ClusterConfig;
class LinkConfig;
}  // namespace config

// Reads, parses and validates a config file, then merges each override (a text-format
// fragment such as 'train { batch_size: 128 }', as given to --set) over it in order:
// scalar fields are replaced, repeated fields appended to. Throws InputError.
config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides = {});
// The same for config text; `source` names it in errors.
config::Config parse_config(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides = {});

// A sweep field (dotted path into Config, e.g. "cluster.gossip.algorithm") set to a
// value written as in text format, as a fragment for --set. Throws InputError naming the
// path when a name is not a field.
std::string field_fragment(const std::string& path, const std::string& value);
// One run of an experiment: the swept values (name, value), the repeat, and the
// fragments that make it from the config.
struct SweepPoint {
  int index = 0;
  int repeat = 0;
  std::vector<std::pair<std::string, std::string>> values;
  std::vector<std::string> sets;
};
// Every grid point of experiment.sweep times experiment.repeats (repeat r adds
// seed: seed + r).
std::vector<SweepPoint> sweep_points(const config::Config& c);

// Loads (or generates) the train and test sets the data config names; `context` is the
// window length text is cut into (the GPT's model.gpt.context).
TrainTest load_data(const config::DataConfig& data, uint64_t seed, int context);
// The model spec for the config, shaped by the data (input shape, class count).
ModelSpec model_spec(const config::ModelConfig& model, const Dataset& train);
// The optimizer's registry name: optim.optimizer, or, where only the deprecated optim.kind
// is given, the name it stands for. Throws InputError when both are given and disagree.
std::string optimizer_name(const config::OptimConfig& optim);
// The optimizer the config names, with its hyper-parameters (create_optimizer() makes it).
OptimizerSpec optimizer_spec(const config::OptimConfig& optim);
LrSchedule lr_schedule(const config::OptimConfig& optim, int64_t total_steps);
// Everything one peer of the config trains with, its data loaded: the config's name,
// seed, device, data shard, model, optimizer, schedule, training, logging and checkpoints.
// Throws InputError naming the data file or the field.
PeerSpec peer_spec(const config::Config& c);

}  // namespace hearsay

#include "hearsay/emulated.h"
#include "hearsay/gossip.h"

namespace hearsay {

// The gossip settings of a cluster config; site_of gives each peer's site index.
GossipSpec gossip_spec(const config::ClusterConfig& cluster);
LinkModel link_model(const config::LinkConfig& link);
// Index of each peer's site (sites numbered in order of first appearance).
std::vector<int> site_indices(const config::ClusterConfig& cluster);
// The emulated link from peer `from` to peer `to`: the site pair's, else the default.
LinkModel link_between(const config::ClusterConfig& cluster, int from, int to);
bool emulates_links(const config::ClusterConfig& cluster);
// Reads the cluster secret from cluster.secret_file or cluster.secret_env; throws
// InputError naming the file or variable when it is missing, empty or shorter than
// kMinSecretBytes.
inline constexpr size_t kMinSecretBytes = 16;
std::string load_cluster_secret(const config::ClusterConfig& cluster);

}  // namespace hearsay

namespace hearsay {

// Which peer of the config's cluster this process is: `requested` if given, else the one
// its launcher's rank names (include/hearsay/launcher.h: torchrun, a Slurm job array, a
// Slurm step, RANK; the launcher's count checked against the peers). Throws InputError if
// it names no peer. Defined in src/config/launcher.cpp.
std::string resolve_peer_name(const config::Config& cfg, const std::string& requested);

// A peer's place in its cluster with its transport open: listening at its address, its
// neighbours dialled and waited for (cluster.connect_timeout_s; a synchronous algorithm
// needs them all), under link emulation where the config has links. `network` points at
// `transport`. What run_cluster_peer and the Python front end's peer train over.
struct ClusterMembership {
  std::unique_ptr<Transport> transport;
  PeerNetwork network;
};
// The gossip side of peer `me`'s PeerNetwork in the config's cluster: the gossip spec
// with the peer's fault injection, every peer's name, its index, its slowdown (1 in the
// ideal twin). The transport, clock and callbacks are the caller's.
PeerNetwork cluster_peer_network(const config::Config& cfg, int me);
// The index of the peer named `name` in cluster.peers; throws InputError if none is.
int cluster_peer_index(const config::ClusterConfig& cluster, const std::string& name);
// The transport peer `me` speaks in the config's cluster (its kind, the secret, TLS, the
// cluster's names), under the config's link emulation when `emulate`; it neither listens
// nor dials yet.
std::unique_ptr<Transport> cluster_transport(const config::Config& cfg, int me, bool emulate);
// Listens at peer `me`'s listen address (else its address); the error names the peer,
// the field and what to look at.
void listen_as_peer(Transport& transport, const config::ClusterConfig& cluster, int me);
// "up", "down", "rejected", "unreachable": the link event's `state` in the log.
const char* link_event_name(LinkEvent::Kind kind);
// `log` (link events) must outlive the transport; `stop` (may be null) ends the wait.
ClusterMembership join_cluster(const config::Config& cfg, const std::string& peer_name, EventLog& log,
                               const std::atomic<bool>* stop);
// The config as the named peer of its cluster trains it: its name, its shard of the data,
// its device.
config::Config cluster_peer_config(const config::Config& cfg, const std::string& peer_name);

// Runs one named peer of a cluster config as a real process (src/peer/cluster_peer.cpp):
// opens the configured transport (under link emulation if the config has links), listens
// at its address, dials its neighbours (retrying as they come up), waits for them, then
// trains. `stop`, when set from another thread (a signal), ends training after the
// current step. `metrics`, when given, gets the peer's live figures (Peer::set_metrics).
TrainResult run_cluster_peer(const config::Config& cfg, const std::string& peer_name, EventLog& log,
                             Progress* progress, const std::atomic<bool>* stop, MetricsBoard* metrics = nullptr);

}  // namespace hearsay
