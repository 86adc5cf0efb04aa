// A peer whose model and training loop belong to another framework: the PyTorch front end
// (python/, docs/PYTORCH.md). The framework computes each step's gradient into a flat
// buffer it shares with the engine and owns the optimizer; the engine does the rest of
// what hearsay-peer does, from the same config: joins the cluster over its transport and
// emulated links, runs the configured algorithm (codecs, mixer, guard) around each step,
// deals this peer's shard of the config's data in the same order, keeps the step count,
// the schedule, the stop criteria, the compute slowdown and the event log.
//
// Threads: one thread (the framework's) calls everything; step() runs the algorithm on
// it and calls back into the framework's optimizer from it. The transport's threads are
// the engine's own.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hearsay/clock.h"
#include "hearsay/data.h"
#include "hearsay/log.h"
#include "hearsay/metrics.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/peer.h"
#include "hearsay/trainable.h"

namespace hearsay {

class GossipEngine;
class StepLedger;
class Transport;

// The framework's model as the engine sees it: flat parameter and gradient buffers that
// the framework owns (host memory for device "cpu", else memory of that CUDA device), cut
// into named views, and its optimizer.
struct ExternalModel {
  float* params = nullptr;
  float* grads = nullptr;
  size_t num_params = 0;
  std::vector<ParamView> views;
  std::string device = "cpu";
  std::string description;  // the start event's "model"
  // The model's running state that is not trained (BatchNorm's running statistics): a
  // flat buffer of `num_buffers` floats beside the parameters, which a synchronous
  // algorithm's peers share after every step (BufferSharing). An asynchronous algorithm
  // has none here: its framework lays the buffers out after the parameters, where they
  // are mixed with the model (docs/PYTORCH.md, "Buffers").
  float* buffers = nullptr;
  size_t num_buffers = 0;
  enum class BufferSharing { kAverage, kBroadcast };
  BufferSharing buffer_sharing = BufferSharing::kBroadcast;
  // Updates the parameters from the gradient buffer with learning rate `lr` (the step's
  // rate as the algorithm scales it). Must not throw through the engine; report failures
  // by throwing std::exception.
  std::function<void(float lr)> optimizer_step;
};

// The stats the framework measured on a step's batch (summed over it), as a native
// forward pass reports them.
struct ExternalStepStats {
  double loss_sum = 0;
  int64_t correct = 0;
  int64_t count = 0;
};

struct ExternalPeerOptions {
  std::string config_path;
  std::vector<std::string> sets;  // --set fragments, merged in order
  std::string name;               // which peer of the cluster; empty: SLURM_PROCID / RANK
  std::string log_path;           // empty: the config's log.path
  bool quiet = false;             // no progress line on stderr
  bool alone = false;             // train alone even when the config lists a cluster
  // Set (a signal's watcher, started before the peer is made): joining ends as soon as it
  // becomes true, and the peer is stopped before its first step. Must outlive the peer.
  const std::atomic<bool>* stop = nullptr;
  // HOST:PORT (port 0 picks one): serve the peer's metrics in Prometheus's text format at
  // http://HOST:PORT/metrics, as hearsay-peer --metrics does (docs/OPERATIONS.md). Up
  // before the join, so that a port in use stops the peer before it joins.
  std::string metrics_address;
};

class ExternalPeer {
 public:
  // Loads and checks the config, joins the cluster (listens, dials, waits for the
  // neighbours) and loads the data. Throws InputError naming the file, field or variable.
  explicit ExternalPeer(const ExternalPeerOptions& options);
  ~ExternalPeer();
  ExternalPeer(const ExternalPeer&) = delete;
  ExternalPeer& operator=(const ExternalPeer&) = delete;

  // Hands the model to the engine and writes the start event; with `join`, an
  // asynchronous peer then asks a neighbour for its model (a late joiner's start), which
  // overwrites the buffer (a peer about to resume from a checkpoint does not). Once only.
  // Throws InputError when the model does not fit (sizes, views, device).
  void attach(ExternalModel model, bool join = true);
  bool attached() const { return model_ != nullptr; }
  // The port its metrics are served at (--metrics); 0 without.
  int metrics_port() const;

  // One step: the gradient of the batch is in the gradient buffer. Runs the algorithm
  // (sends, waits for a synchronous round, mixes arrivals, calls the optimizer), shares
  // the buffers (a synchronous algorithm's: the mean over every peer, or peer 0's), then
  // the bookkeeping of hearsay-peer's loop. Throws InputError when the loss diverged.
  void step(const ExternalStepStats& stats, float lr);
  // The framework feeds its own data (a DataLoader) instead of next_batch(): the run's
  // steps are train.epochs passes over `batches_per_epoch` batches, `batches_per_step`
  // of them per step (gradient accumulation), or train.max_steps if that comes first;
  // epochs count the batches fed (fed_batch). Before the first step only (of this life: a
  // resumed peer goes on counting from its checkpoint's); a `plan` event when the start
  // event has gone out already. Throws InputError on a bad count, or one that is not the
  // resumed checkpoint's.
  void follow_data(int64_t batches_per_epoch, int64_t batches_per_step);
  // One batch of the framework's data was fed: epochs_done() moves by 1 / batches_per_epoch.
  void fed_batch();
  // Whether the run goes on: steps left, not stopped, target not reached (alone). Throws
  // InputError when a resumed peer's checkpoint is at the run's end already: a rerun of a
  // finished run trains nothing, and says so.
  bool running() const;
  // Whether the step just taken is one the config evaluates after (train.eval_every_*,
  // the epoch's end, the last step).
  bool eval_due() const { return eval_due_; }
  // The framework's evaluation of the current model on the test set: an eval event.
  void record_eval(double test_acc, double test_loss);
  // Ends the run on one model, as cluster.final_consensus says: waits (up to
  // cluster.finish_timeout_s) until every peer has finished its training, then each
  // takes the exact mean of all peers' parameters (AVERAGE) or only measures its distance
  // from it (MEASURE); OFF does nothing. A peer stopped by a signal tells the others it
  // leaves without it. What happened goes into the end event; a consensus that failed
  // (a peer stopped, timed out, or refused) leaves the parameters as they were and says
  // why on stderr. Once, before finish(); alone, nothing.
  void final_consensus();
  // The script's own collectives over every peer of the cluster (external_collectives.cpp),
  // called by every peer in the same order, as torch.distributed's are: `values` (n host
  // floats, at most kMaxCollectiveFloats) become their sum, mean, max or min over the
  // peers, combined in peer order, so every peer holds the same bits; barrier() returns
  // once every peer has called it. Each waits up to gossip.sync_timeout_s for the others.
  enum class ReduceOp { kSum, kMean, kMax, kMin };
  static constexpr size_t kMaxCollectiveFloats = size_t{1} << 24;
  void all_reduce(float* values, size_t n, ReduceOp op);
  void barrier();
  // Writes the end event (once) and closes the peer; run it when the loop ends.
  void finish();
  // Stops the engine and closes the transport (its links and threads); idempotent. After
  // it no thread of the engine touches the framework's buffers.
  void close();
  // Waits for what the engine queued on the model's device (a CUDA backend runs on its own
  // stream, which the framework's does not wait for). Every call that hands the buffers
  // back to the framework ends with it.
  void synchronize();
  // Asks the loop to end after the current step (any thread; a signal handler's).
  void stop();
  // Between steps the engine copies the parameters (for the next step's sends) while the
  // framework computes: the framework calls this before it writes them then (a checkpoint
  // loaded, a constraint applied in place), and the copy is taken again when needed.
  void params_written();

  // The next minibatch of this peer's shard in the native peer's order: x [batch, dim]
  // floats (features) or [batch, context] token ids, y [batch] or [batch, context].
  void next_batch(int batch, float* x_features, int32_t* x_tokens, int32_t* y);
  const TrainTest& data() const { return spec_.data; }
  // The learning rate of the config's schedule at the next step.
  float scheduled_lr() const;

  // The engine's part of a checkpoint (step count, sampler, the algorithm's state, every
  // link's error-feedback residual and codec; the parameters are the framework's), as
  // bytes, and restoring it. load throws InputError when the bytes do not fit.
  std::string save_state() const;
  void load_state(const std::string& bytes);

  const std::string& name() const { return spec_.name; }
  const PeerSpec& spec() const { return spec_; }
  int64_t steps() const { return steps_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t shard_size() const { return shard_size_; }
  double epochs_done() const;
  // The script's batches fed over every life of the peer (follow_data, fed_batch).
  int64_t data_batches_fed() const { return data_batches_fed_; }
  // The cluster's peer names (just this one alone), this peer's index, its algorithm.
  const std::vector<std::string>& peers() const { return peers_; }
  int rank() const { return me_; }
  std::string algorithm() const;
  uint64_t bytes_sent() const;
  std::string checkpoint_dir() const { return spec_.checkpoint_dir; }
  // Writes an event the framework built, after checking it against the schema; throws
  // InputError saying which field is wrong.
  void write_event(const JsonObject& event);
  EventLog& log() { return *log_; }
  // Host copies of what the engine reads at the model's addresses, and a write of the
  // parameters there (tests of the shared buffers); the address it reads.
  std::vector<float> engine_params() const;
  std::vector<float> engine_grads() const;
  void engine_write_params(const std::vector<float>& params);
  const float* engine_params_address() const;

 private:
  // step() after its checks; a failure part-way marks the peer broken.
  void run_step(const ExternalStepStats& stats, float lr);
  // A synchronous peer's buffers after round `round`: summed over every peer (peer 0's
  // alone when broadcast), averaged, written back.
  void share_buffers(uint64_t round);
  // Seconds since the last step returned (or attach): the framework's compute.
  double framework_compute_s() const;
  void check_attached(const char* what) const;
  // Throws InputError when the script's epoch of `given` batches is not the `resumed`
  // checkpoint's (0: it had none).
  void check_resumed_epoch(int64_t given, int64_t resumed, int64_t resumed_step) const;
  // The final consensus's words (external_collectives.cpp): `word` at (kFinalRound,
  // phase) to every other peer (or those whose link is up); a wait for one peer's message (its values) that answers joiners and
  // calls `repeat` each second meanwhile (nullopt at the timeout); and, from close(), the
  // words of a peer that leaves before its finish().
  void say_to_all(uint32_t phase, float word, bool only_linked = false);
  std::optional<std::vector<float>> await_word(int from, uint64_t round, uint32_t phase, double timeout_s,
                                               const std::function<void()>& repeat);
  void leave_without_consensus();

  PeerSpec spec_;
  std::string model_kind_;  // the config's model, in text
  // With --metrics: what the ledger and the engine report, and its endpoint. Declared
  // before them so that both outlive the ledger and the engine that point at them.
  std::unique_ptr<MetricsBoard> metrics_board_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<EventLog> log_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<Transport> transport_;
  PeerNetwork network_;
  bool in_cluster_ = false;
  bool device_from_config_ = false;  // the config (or its peer entry) names a device
  std::vector<std::string> peers_;
  int me_ = 0;
  std::unique_ptr<BatchSampler> sampler_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Trainable> model_;
  std::unique_ptr<Optimizer> optimizer_;
  RealClock clock_;
  std::unique_ptr<GossipEngine> engine_;
  std::function<void(float)> optimizer_step_;

  LrSchedule schedule_;
  int64_t shard_size_ = 0;  // the samples a step count is planned over (the mean shard in a cluster)
  int64_t total_steps_ = 0;
  int64_t steps_ = 0;
  std::atomic<bool> stop_{false};
  bool eval_due_ = false;
  bool finished_ = false;
  bool broken_ = false;  // a step failed part-way: the algorithm's state is not to be trusted
  // The start, step, eval and end events, as the native loop writes them.
  std::unique_ptr<StepLedger> ledger_;
  // The framework's own data (follow_data): batches per epoch and fed so far.
  int64_t data_batches_per_epoch_ = 0, data_batches_fed_ = 0;
  int64_t data_batches_fed_at_step_ = 0;  // data_batches_fed_ when the last step was taken
  // The step load_state() resumed at (-1: none), and the script's epoch then, which the
  // data given after it (follow_data) must match.
  int64_t resumed_at_ = -1, resumed_batches_per_epoch_ = 0;
  // cluster.final_consensus (0 AVERAGE, 1 MEASURE, 2 OFF), finish_timeout_s, and what
  // final_consensus() did, for the end event: its outcome, this peer's distance from the
  // mean before it (L2, when measured), its seconds.
  int final_consensus_mode_ = 2;
  double finish_timeout_s_ = 600;
  std::string consensus_outcome_;
  std::optional<double> consensus_distance_;
  double consensus_s_ = 0;
  uint64_t collectives_ = 0;  // the script's collectives so far: each its own round
  float* buffers_ = nullptr;
  size_t num_buffers_ = 0;
  ExternalModel::BufferSharing buffer_sharing_ = ExternalModel::BufferSharing::kBroadcast;
  double last_return_ = 0;  // clock_.now() when the last step returned to the framework
};

}  // namespace hearsay
