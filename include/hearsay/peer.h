// A peer: one site's training process. It owns its backend, model, optimizer and data
// shard, and runs the step loop. With no neighbours in its config it trains alone (the
// foundation every decentralized algorithm builds on).
#pragma once

#include <memory>
#include <optional>

#include "hearsay/backend.h"
#include "hearsay/config.h"
#include "hearsay/data.h"
#include "hearsay/log.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"

namespace hearsay {

struct TrainResult {
  int64_t steps = 0;
  double epochs = 0;
  double final_test_acc = 0;
  double final_test_loss = 0;
  double wall_s = 0;
  std::optional<double> time_to_target_s;  // set when train.target_test_acc was reached
  std::vector<double> losses;              // training loss of every step (for tests)
};

class Peer {
 public:
  // Loads data, builds the model on the configured device. Throws InputError on bad
  // config or data. `log` must outlive the peer; `progress` may be null.
  Peer(const config::Config& cfg, EventLog& log, Progress* progress);
  ~Peer();

  TrainResult run();
  // Evaluates the current model on the whole test set.
  BatchStats evaluate();

  Model& model() { return *model_; }
  const TrainTest& data() const { return data_; }

 private:
  config::Config cfg_;
  EventLog& log_;
  Progress* progress_;
  TrainTest data_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Sgd> sgd_;
  std::unique_ptr<BatchSampler> sampler_;
  DeviceBuffer batch_x_, batch_y_;
  std::vector<float> host_x_;
  std::vector<int32_t> host_y_;
};

}  // namespace hearsay
