// What a peer's run records around its steps, written once for both peer loops: the
// native loop (Peer::run pulls each batch and steps its own model) and the external peer
// (a framework such as PyTorch owns the loop and the thread, and pushes each step in).
// The start event, the divergence check, the step windows and their events, the progress
// line, when an evaluation is due, the eval events and the target, and the end event are
// all here; the two loops differ only in where a step's gradient and an evaluation come
// from. Why not one loop with the framework as a step source: the framework's loop runs
// on its own thread (Python's, holding its GIL, with its CUDA stream), and its optimizer
// must be called from there; hearsay cannot take that loop over, so the loop's
// bookkeeping is what is shared.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "hearsay/clock.h"
#include "hearsay/log.h"
#include "hearsay/metrics.h"
#include "hearsay/peer.h"

namespace hearsay {

class GossipEngine;

// The start event's facts.
struct RunStart {
  std::string device, model;
  int64_t params = 0, shard_size = 0, batch_size = 0;
  uint64_t seed = 0;
};

class StepLedger {
 public:
  // `progress` and `metrics` may be null. All must outlive the ledger.
  StepLedger(const TrainSpec& train, int64_t log_every_steps, int64_t total_steps, EventLog& log, Progress* progress,
             Clock& clock, MetricsBoard* metrics);

  // Where the memory events come from (measure_memory, memory_use.h); none: no memory
  // events. Called on the step-loop thread at the start and at the log points.
  void set_memory_source(std::function<MemoryUse()> source) { memory_source_ = std::move(source); }

  // A plan that changed before the first step (the framework's own data).
  void set_total_steps(int64_t total_steps) { total_steps_ = total_steps; }
  int64_t total_steps() const { return total_steps_; }

  // The start event, and the first memory event.
  void start(const RunStart& s);
  // train.eval_every_s counts from now.
  void begin_cadence();

  // A loss that is not finite ends the run: a diverged event, then InputError saying
  // whether neighbours' updates were mixed in this step (a hostile or broken neighbour must
  // not be blamed on this peer's learning rate). `lower_lr` is the advice when none was.
  void check_finite(double loss, int64_t step, float lr, const GossipEngine* engine, const std::string& lower_lr);

  // After a step, `steps` now done: the windows, the progress figures, and at the log
  // points the engine's stats, `at_log_point` (may be empty) and the step event.
  // `batch` is the samples a step counts for rates; `step_s` the step's time, `compute_s`
  // its own computation's (step_compute_s, emulated_time.h).
  void stepped(int64_t steps, double epoch, double loss, float lr, int batch, double step_s, double compute_s,
               GossipEngine* engine,
               const std::function<void()>& at_log_point = {});
  // A memory event after `step` steps when an owner's bytes moved by more than 1% (and
  // 1 MiB) since the last one, or when `force`; the metrics board gets it too.
  void note_memory(int64_t step, bool force = false);
  // Whether an evaluation follows this step (train.eval_every_*, an epoch's end, the last
  // step; never when train.evaluates is off). Call once after each stepped(); without an
  // evaluation it updates the progress line.
  bool eval_due(int64_t steps, double epoch);
  // Pads an evaluation that took `measured_s` to train.emulated_eval_s.
  void pad_eval(double measured_s);
  // An evaluation of the model after `step` steps, which took `eval_s`: the eval event, the
  // metrics, the target (bytes from `engine` when there is one).
  void evaluated(int64_t step, double epoch, double test_acc, double test_loss, bool text, double eval_s,
                 const GossipEngine* engine);
  // Alone, reaching the target ends the run; a cluster's launcher stops its peers.
  bool target_ends_run(const GossipEngine* engine) const { return time_to_target_s_ && engine == nullptr; }

  // The end event. `batch` as for stepped(); `bytes_sent` to every neighbour.
  void finish(int64_t steps, double epoch, int batch, bool stopped, uint64_t bytes_sent, bool in_cluster,
              const std::function<void(JsonObject&)>& more = {});

  int64_t& compute_overruns() { return compute_overruns_; }
  double train_s() const { return train_s_; }
  double compute_s() const { return compute_s_; }
  // compute_s over train_s (docs/LOGS.md, "Compute utilisation"), as the end event gives it.
  double compute_utilisation() const;
  int64_t evaluated_at() const { return evaluated_at_; }
  bool evaluated() const { return evaluated_at_ >= 0; }
  double final_test_acc() const { return final_acc_; }
  double final_test_loss() const { return final_loss_; }
  const std::optional<double>& time_to_target_s() const { return time_to_target_s_; }
  const std::optional<int64_t>& steps_to_target() const { return steps_to_target_; }
  uint64_t bytes_to_target() const { return bytes_to_target_; }

 private:
  const TrainSpec& train_;
  int64_t log_every_;
  int64_t total_steps_;
  EventLog& log_;
  Progress* progress_;
  Clock& clock_;
  MetricsBoard* metrics_;
  std::function<MemoryUse()> memory_source_;
  MemoryUse last_memory_;
  int64_t params_ = 0;
  EvalCadence cadence_{0, 0};
  ProgressState state_;
  int64_t last_epoch_ = 0;
  double window_loss_ = 0, window_s_ = 0, train_s_ = 0;
  double window_compute_s_ = 0, compute_s_ = 0;
  int64_t window_steps_ = 0, compute_overruns_ = 0, eval_overruns_ = 0;
  int64_t evaluated_at_ = -1;
  double final_acc_ = 0, final_loss_ = 0;
  std::optional<double> time_to_target_s_;
  std::optional<int64_t> steps_to_target_;
  uint64_t bytes_to_target_ = 0;
};

}  // namespace hearsay
