// The one list of gossip algorithms. Each algorithm registers itself from its own source
// file (src/peer/algorithms/NAME.cpp, or any file linked into a program: a test's own
// algorithm): its name, whether it is synchronous, its options message (a protobuf
// extension of GossipConfig declared beside it), where those options are checked, and
// under which codec each kind of message it sends travels. The engine and the config
// loader read this registry; no other list of algorithm names exists.
// docs/ARCHITECTURE.md, "Adding an algorithm".
#pragma once

#include <google/protobuf/message.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hearsay/error.h"
#include "hearsay/gossip.h"

namespace hearsay {

class Algorithm;

// How a message an algorithm sends asynchronously travels. Synchronous exchanges always
// travel as fp32 (a collective compresses its own hops).
enum class Compression {
  kUpdate,  // gossip.codec, with its per-link error feedback (gradients, model deltas)
  kModel,   // gossip.codec.model_codec, no error feedback (a model's rounding is owed to no one)
  kNone,    // fp32 as it is
};

struct SendRule {
  MessageKind kind;
  Compression compression;
};

// Thrown by an algorithm's options check: `field` names the field of its options
// message, so the config loader can point at the line that set it.
struct OptionError : InputError {
  OptionError(std::string field_name, const std::string& problem)
      : InputError(field_name + ": " + problem), field(std::move(field_name)), why(problem) {}
  std::string field, why;
};

struct AlgorithmEntry {
  std::string name;
  bool synchronous = false;
  // Its synchronous exchanges are collectives over every peer (all-reduces): under
  // cluster.site_replicas every peer runs it on its site's averaged gradient. Otherwise
  // only the sites' leaders run it, between them.
  bool collective = false;
  // Its mixing weights need every neighbour relation both ways (Metropolis-Hastings).
  bool undirected_topology = false;
  // A peer that starts late or restarts first copies a neighbour's trained model
  // (GossipEngine::join): for asynchronous algorithms, whose peers never start together.
  bool joins_from_neighbour = false;
  // It keeps its own momentum and applies its own update without the optimizer (demo):
  // optim must be plain sgd with no momentum, Nesterov, weight decay or clipping set (they
  // would not apply), which the config loader checks; its options carry its own.
  bool owns_update = false;
  // It applies its step itself and never calls the peer's optimizer (dgc, demo): a peer
  // whose framework owns the optimizer (a torch peer) cannot run it.
  bool steps_without_optimizer = false;
  // Under cluster.site_replicas, a site whose leader dies may go on under a new one that
  // runs it with a fresh peer's state: it keeps nothing a neighbour relies on.
  bool new_site_leader = false;
  // Its collectives already sum each site's gradients first and cross the WAN only between
  // the sites' leaders (hierarchical): cluster.site_replicas adds nothing to it.
  bool sums_sites_first = false;
  // Its steps leave every peer with the same whole model at known points, which it marks
  // (GossipEngine::copies_equal): gossip.parity_check can compare their digests.
  bool equal_copies = false;
  // Model-sized buffers its own state keeps, as its paper states it (diloco: the outer
  // model and its momentum): the least a peer holds, which a config is checked against
  // before it runs (src/config/simulation_memory.cpp); its memory events count them.
  int model_buffers = 0;
  // The options message's default instance (its type is what the config's extension
  // holds); never null.
  const google::protobuf::Message* options = nullptr;
  // Throws OptionError for a bad field, InputError for a bad combination with the rest of
  // the gossip settings. May be empty.
  std::function<void(const google::protobuf::Message& options, const GossipSpec& spec, int peers)> check;
  std::function<std::unique_ptr<Algorithm>(const GossipSpec& spec, const google::protobuf::Message& options)> make;
  // Every kind of message the algorithm sends asynchronously, and how it travels.
  std::vector<SendRule> sends;

  // How a message of `kind` travels; throws std::logic_error for a kind the algorithm did
  // not declare (a bug in the algorithm, not bad input).
  Compression compression_of(MessageKind kind) const;
};

// The typed form an algorithm's source fills in: Options is its generated options message.
template <class Options>
struct AlgorithmDefinition {
  std::string name;
  bool synchronous = false;
  bool collective = false;
  bool undirected_topology = false;
  bool joins_from_neighbour = false;
  bool owns_update = false;
  bool steps_without_optimizer = false;
  bool new_site_leader = false;
  bool sums_sites_first = false;
  int model_buffers = 0;
  bool equal_copies = false;
  std::vector<SendRule> sends;
  std::function<void(const Options&, const GossipSpec&, int peers)> check;
  std::function<std::unique_ptr<Algorithm>(const GossipSpec&, const Options&)> make;
};

// Adds an entry; throws std::logic_error when the name is taken. Returns true, so that
// a source file can register from a namespace-scope initializer.
bool register_algorithm(AlgorithmEntry entry);

template <class Options>
bool register_algorithm(AlgorithmDefinition<Options> d) {
  AlgorithmEntry e;
  e.name = std::move(d.name);
  e.synchronous = d.synchronous;
  e.collective = d.collective;
  e.undirected_topology = d.undirected_topology;
  e.joins_from_neighbour = d.joins_from_neighbour;
  e.owns_update = d.owns_update;
  e.steps_without_optimizer = d.steps_without_optimizer;
  e.new_site_leader = d.new_site_leader;
  e.sums_sites_first = d.sums_sites_first;
  e.model_buffers = d.model_buffers;
  e.equal_copies = d.equal_copies;
  e.options = &Options::default_instance();
  e.sends = std::move(d.sends);
  if (d.check) {
    e.check = [check = std::move(d.check)](const google::protobuf::Message& o, const GossipSpec& s, int peers) {
      check(static_cast<const Options&>(o), s, peers);
    };
  }
  e.make = [make = std::move(d.make)](const GossipSpec& s, const google::protobuf::Message& o) {
    return make(s, static_cast<const Options&>(o));
  };
  return register_algorithm(std::move(e));
}

// The entry named `name`, or null.
const AlgorithmEntry* find_algorithm(const std::string& name);
// The entry named `name`; throws InputError listing the registered names.
const AlgorithmEntry& algorithm_entry(const std::string& name);
// GossipSpec::options (text format) parsed into a new message of the entry's options
// type; throws InputError naming the algorithm and the problem.
std::unique_ptr<google::protobuf::Message> parse_algorithm_options(const AlgorithmEntry& entry, const std::string& text);

}  // namespace hearsay
