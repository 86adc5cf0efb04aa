// A peer: one site's training process. It owns its backend, model, optimizer and data
// shard, and runs the step loop. With no neighbours in its config it trains alone (the
// foundation every decentralized algorithm builds on).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>

#include "hearsay/backend.h"
#include "hearsay/clock.h"
#include "hearsay/gossip.h"
#include "hearsay/data.h"
#include "hearsay/log.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"

namespace hearsay {

// How long and how a peer trains (docs/CONFIG.md, TrainConfig).
struct TrainSpec {
  int batch_size = 64;
  double epochs = 5;             // passes over the shard; stops at whichever limit comes first
  int64_t max_steps = 0;         // 0: no limit
  double target_test_acc = 0;    // 0: none
  int64_t eval_every_steps = 0;  // 0: at the end of each epoch
  int eval_batch_size = 1000;
  double eval_every_s = 0;       // > 0: evaluate on the clock instead
  double emulated_step_s = 0;    // > 0: every step's computation takes slowdown x this
  double emulated_eval_s = 0;    // > 0: every evaluation takes this (padded; virtual on the simulator)
  // false: this peer never evaluates its model (a simulated cluster of 1,024 scores a
  // fixed subsample of its peers; its start event says so).
  bool evaluates = true;
};

// What one peer trains and how, in runtime types: src/config fills it from a config
// (peer_spec in config.h), loading the data; a program may fill it itself.
struct PeerSpec {
  std::string name = "run";  // the peer's name in logs and checkpoint files
  uint64_t seed = 1;         // initialisation, sharding, sampling
  std::string device = "cpu";
  int threads = 1;
  TrainTest data;            // the whole data set; the peer trains on its shard
  // Instead of `data`: a data set shared with other peers of this process (the
  // simulator's 1,024 peers read one copy). Left alone by the peer.
  std::shared_ptr<const TrainTest> shared_data;
  int num_shards = 1, shard = 0;
  Partition partition = Partition::kIid;
  double dirichlet_alpha = 0.5;
  ModelSpec model;           // shaped by the data
  std::string model_description;  // how the config named the model (the start event's "model")
  OptimizerSpec optimizer;
  LrSchedule schedule;       // total_steps is filled in by the peer from `train`
  TrainSpec train;
  int64_t log_every_steps = 50;
  std::string checkpoint_dir;  // empty: no checkpoints
  int64_t checkpoint_every_steps = 0;
  bool resume = true;
  bool weights_from_other_run = false;  // checkpoint.weights_from_other_run
  // A checkpoint's provenance: the cluster's id (empty alone) and a digest of the config
  // fields that shape training (training_digest in src/config/from_config.cpp).
  std::string cluster_id;
  std::string training_digest;
};

struct TrainResult {
  int64_t steps = 0;
  double epochs = 0;
  double final_test_acc = 0;
  double final_test_loss = 0;
  bool evaluated = false;  // final_test_acc and final_test_loss are of an evaluation
  double wall_s = 0;
  std::optional<double> time_to_target_s;  // set when train.target_test_acc was reached
  std::optional<int64_t> steps_to_target;  // the step of that evaluation
  std::vector<double> losses;              // training loss of every step (for tests)
  double steps_per_s = 0;                  // over the whole run, waits and slowdown included
  double compute_utilisation = 0;          // the end event's (docs/LOGS.md, "Compute utilisation")
  size_t max_buffered_bytes = 0;           // gossip buffers' high-water mark
  uint64_t bytes_sent = 0;                 // to every neighbour, frames whole
  uint64_t bytes_to_target = 0;            // bytes_sent when the target accuracy was reached
  bool stopped = false;                    // a stop (stop(), stop_when's flag) ended it early
};

// How a peer joins a cluster: who the peers are, which one it is, the transport it
// reaches them over (already listening and connecting), and how it gossips.
struct PeerNetwork {
  GossipSpec gossip;
  std::vector<std::string> peers;
  int me = 0;
  Transport* transport = nullptr;
  // Emulated compute heterogeneity: each step is stretched to `slowdown` times its
  // measured duration (a 4x slower GPU on the same machine), or to slowdown x
  // train.emulated_step_s when that is set.
  double slowdown = 1.0;
  // Called every log.every_steps steps with a consistent host copy of the parameters
  // (in-process clusters use it for the consensus distance). May be empty.
  std::function<void(int64_t step, const std::vector<float>& params)> on_snapshot;
  // Asynchronous algorithms: ask a neighbour for its model before the first step (a late
  // joiner's start). Tests of averaging invariants turn it off: a copied model is not an
  // average.
  bool join = true;
  // Asynchronous algorithms on a real network: how many peers must answer before the
  // first step (cluster.min_neighbours; 0: none), waiting up to join_timeout_s
  // (cluster.connect_timeout_s). A resumed peer waits for them too.
  int join_quorum = 0;
  double join_timeout_s = 30;
  // Fault injection for tests of bit parity: after this step (its count of steps taken),
  // one bit of what parity checks flips (GossipEngine::inject_bit_flip). -1: never.
  int64_t flip_bit_after_step = -1;
  // Initialise the model from this seed instead of the config's (tests whose peers must
  // start apart; real clusters start from one seed).
  std::optional<uint64_t> init_seed;
  // The clock the peer and its engine run on; null: real time. The simulator gives each
  // peer a virtual clock (src/sim). Must outlive the peer.
  Clock* clock = nullptr;
  // Each step's emulated computation (train.emulated_step_s x slowdown) multiplied by
  // this function's value for the step, when set: a simulated GPU's step-time spread.
  std::function<double(int64_t step)> step_time_factor;
  // Called after each evaluation with its step and result (the simulator's stop at
  // target). May be empty; must not block.
  std::function<void(int64_t step, const BatchStats& result)> on_eval;
};

class CheckpointWriter;
struct CheckpointData;

class Peer {
 public:
  // Loads data, builds the model on the configured device. Throws InputError on bad
  // config or data. `log` must outlive the peer; `progress` may be null. Without a
  // network the peer trains alone.
  Peer(PeerSpec spec, EventLog& log, Progress* progress, const PeerNetwork* network = nullptr);
  ~Peer();
  // A host copy of the model's parameters. Not while run() is stepping.
  std::vector<float> params() const;
  // The gossip algorithm's own state, as a checkpoint holds it (empty alone or for an
  // algorithm that keeps none). Not while run() is stepping.
  std::string algorithm_state() const;
  // Asks run() to return after the current step (any thread).
  void stop();
  // run() also returns at the first step boundary where *flag is set (a signal's stop:
  // include/hearsay/signals.h), before its first step when it is set already. Must
  // outlive run().
  void stop_when(const std::atomic<bool>* flag) { stop_when_ = flag; }
  // Where run() publishes its live figures (every step, every evaluation, and the gossip
  // engine's at its log points); null: nowhere. Before run(); must outlive the peer.
  void set_metrics(MetricsBoard* board);

  TrainResult run();
  // Evaluates the current model on the whole test set.
  BatchStats evaluate();
  // The median time of one training step's computation (forward, backward, optimizer) on
  // this peer's data, alone, over `steps` steps: what train.emulated_step_s is chosen
  // from. Trains the model as it measures; call it on a peer that will not run().
  double measure_step_s(int steps);
  // The median time of one whole evaluation (evaluate()) alone, over `times` of them:
  // what train.emulated_eval_s is chosen from.
  double measure_eval_s(int times);

  Trainable& model() { return *model_; }
  // The gossip engine; null for a peer that trains alone.
  GossipEngine* engine() { return engine_.get(); }
  const TrainTest& data() const { return *data_; }

 private:
  // The next minibatch of this peer's shard into batch_x_ / batch_y_ (on the device).
  void next_batch(int batch, int64_t* idx);
  // Text windows idx[0..n) of `set` into batch_x_ (tokens) and batch_y_ (next tokens).
  void load_token_batch(const Dataset& set, const int64_t* idx, int n);
  // checkpoint.dir/NAME.ckpt, or "" without checkpoints.
  std::string checkpoint_path() const;
  // Snapshots the state and hands it to the checkpoint writer, which writes it while the
  // next steps run (src/peer/checkpoint_writer.h).
  void save_checkpoint(int64_t step, double wall_s);
  void make_checkpoint_writer();
  // Points the snapshot at the live state instead of copying it, where it can; false: the
  // caller copies (CheckpointData::live).
  bool take_live_snapshot(CheckpointData& d);
  // Whether this peer's snapshots are read from its live state (no copy made up front).
  bool snapshots_live() const;
  // What run() sizes its steps by: in a cluster the mean shard (every peer takes the same
  // number of steps: synchronous algorithms meet every round), alone this peer's.
  int64_t shard_size() const;
  // Restores the last checkpoint when there is one (and resume is on); returns its step.
  int64_t resume();

  PeerSpec spec_;
  EventLog& log_;
  Progress* progress_;
  TrainTest owned_data_;
  const TrainTest* data_ = &owned_data_;  // owned_data_ or spec.shared_data
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Trainable> model_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<BatchSampler> sampler_;
  RealClock real_clock_;
  Clock* clock_ = &real_clock_;  // network.clock when given
  std::unique_ptr<GossipEngine> engine_;
  std::unique_ptr<CheckpointWriter> checkpoints_;  // null without checkpoint.dir
  PeerNetwork network_;
  std::atomic<bool> stop_{false};
  const std::atomic<bool>* stop_when_ = nullptr;
  bool stopping() const { return stop_ || (stop_when_ != nullptr && *stop_when_); }
  MetricsBoard* metrics_ = nullptr;
  double wall_offset_s_ = 0;  // seconds of earlier lives (a resumed peer)
  DeviceBuffer batch_x_, batch_y_;
  std::vector<float> host_x_;
  std::vector<int32_t> host_y_;
  std::vector<int32_t> host_tokens_;  // text: a batch's token ids, gathered on the host
};

}  // namespace hearsay
