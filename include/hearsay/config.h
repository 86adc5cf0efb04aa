// Loading and checking configs (protobuf text format; schema in proto/hearsay/config.proto),
// and turning config messages into the runtime's own types. Every error names the source
// and the place: "FILE:LINE:COL: field: problem".
#pragma once

#include <string>
#include <vector>

#include "hearsay/config.pb.h"
#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"

namespace hearsay {

// Reads, parses and validates a config file, then merges each override (a text-format
// fragment such as 'train { batch_size: 128 }', as given to --set) over it in order:
// scalar fields are replaced, repeated fields appended to. Throws InputError.
config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides = {});
// The same for config text; `source` names it in errors.
config::Config parse_config(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides = {});

// Loads (or generates) the train and test sets the data config names.
TrainTest load_data(const config::DataConfig& data, uint64_t seed);
// The model spec for the config, shaped by the data (input shape, class count).
ModelSpec model_spec(const config::ModelConfig& model, const Dataset& train);
SgdParams sgd_params(const config::OptimConfig& optim);
LrSchedule lr_schedule(const config::OptimConfig& optim, int64_t total_steps);

}  // namespace hearsay
