// Where a config sets an algorithm's options: the extension of GossipConfig whose type is
// that algorithm's options message (config_loader checks it, gossip_spec() reads it).
#pragma once

#include <google/protobuf/descriptor.h>

#include "hearsay/config.pb.h"
#include "../peer/algorithm_registry.h"

namespace hearsay {

// The set extension of `g` that holds `algorithm`'s options, or null when the config
// leaves them at their defaults. Defined in cluster_from_config.cpp.
const google::protobuf::FieldDescriptor* algorithm_options_field(const config::GossipConfig& g,
                                                                 const AlgorithmEntry& algorithm);

}  // namespace hearsay
