#include "step_ledger.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "hearsay/error.h"
#include "hearsay/gossip.h"
#include "emulated_time.h"

namespace hearsay {
namespace {

// A step's own computation over its wall time (docs/LOGS.md): at most 1, 0 with no time.
double utilisation(double compute_s, double wall_s) { return wall_s > 0 ? std::min(1.0, compute_s / wall_s) : 0.0; }

}  // namespace

StepLedger::StepLedger(const TrainSpec& train, int64_t log_every_steps, int64_t total_steps, EventLog& log,
                       Progress* progress, Clock& clock, MetricsBoard* metrics)
    : train_(train), log_every_(log_every_steps), total_steps_(total_steps), log_(log), progress_(progress), clock_(clock),
      metrics_(metrics) {}

void StepLedger::start(const RunStart& s) {
  JsonObject e = log_.event("start");
  e.add("device", s.device)
      .add("model", s.model)
      .add("params", s.params)
      .add("shard_size", s.shard_size)
      .add("batch_size", s.batch_size)
      .add("total_steps", total_steps_)
      .add("target_test_acc", train_.target_test_acc)
      .add("seed", static_cast<int64_t>(s.seed))
      // Wall-clock time (Unix seconds) at this event: places the log's relative times
      // among other processes' (restarted peers append to one log). A simulated peer's is
      // the virtual time since the simulation began.
      .add("unix_time", shared_time_s(clock_));
  if (clock_.simulated()) e.add("simulated", true).add("evaluates", train_.evaluates);
  log_.write(e);
  params_ = s.params;
  note_memory(0, true);
}

namespace {

// Whether any owner's bytes moved by more than 1% and 1 MiB (an owner that came or went
// counts from zero).
bool memory_moved(const MemoryUse& was, const MemoryUse& now) {
  for (const auto& [a, b] : {std::pair{&was.host, &now.host}, std::pair{&was.device, &now.device}}) {
    std::map<std::string, std::pair<uint64_t, uint64_t>> both;
    for (const auto& [k, v] : *a) both[k].first = v;
    for (const auto& [k, v] : *b) both[k].second = v;
    for (const auto& [k, v] : both) {
      const double d = std::abs(static_cast<double>(v.second) - static_cast<double>(v.first));
      if (d > (1u << 20) && d > 0.01 * static_cast<double>(std::max(v.first, v.second))) return true;
    }
  }
  return false;
}

JsonObject owners(const std::map<std::string, uint64_t>& side) {
  JsonObject o;
  for (const auto& [k, v] : side) o.add(k, static_cast<int64_t>(v));
  return o;
}

}  // namespace

void StepLedger::note_memory(int64_t step, bool force) {
  if (!memory_source_) return;
  const MemoryUse m = memory_source_();
  if (!force && !memory_moved(last_memory_, m)) return;
  last_memory_ = m;
  const uint64_t total = m.total();
  JsonObject e = log_.event("memory");
  e.add("step", step).add_raw("host", owners(m.host).str()).add_raw("device", owners(m.device).str());
  e.add("total_bytes", static_cast<int64_t>(total));
  if (params_ > 0) e.add("bytes_per_param", static_cast<double>(total) / static_cast<double>(params_));
  // Resident memory is this machine's figure, not the run's: a simulation's logs stay
  // byte-identical without it (and its peers share one process).
  if (!clock_.simulated()) e.add("resident_bytes", static_cast<int64_t>(resident_memory_bytes()));
  log_.write(e);
  if (metrics_ != nullptr) metrics_->offer_memory(m);
}

void StepLedger::begin_cadence() { cadence_ = EvalCadence(train_.eval_every_s, shared_time_s(clock_)); }

void StepLedger::check_finite(double loss, int64_t step, float lr, const GossipEngine* engine, const std::string& lower_lr) {
  if (std::isfinite(loss)) return;
  std::string mixed;
  if (engine != nullptr) {
    for (const auto& n : engine->mixed_this_step()) mixed += (mixed.empty() ? "" : ", ") + n;
  }
  log_.write(log_.event("diverged").add("step", step).add("lr", static_cast<double>(lr)).add("after_neighbours", !mixed.empty()));
  throw InputError("training diverged at step " + std::to_string(step) + " (loss is not finite) " +
                   (mixed.empty() ? "with no neighbour's update mixed in this step; " + lower_lr
                                  : "after mixing updates from " + mixed +
                                        " in this step; check those peers (their learning rate, their logs) "
                                        "or tighten cluster.gossip.guard"));
}

void StepLedger::stepped(int64_t steps, double epoch, double loss, float lr, int batch, double step_s, double compute_s,
                         GossipEngine* engine, const std::function<void()>& at_log_point) {
  window_loss_ += loss;
  window_s_ += step_s;
  train_s_ += step_s;
  window_compute_s_ += compute_s;
  compute_s_ += compute_s;
  ++window_steps_;
  state_.step = steps;
  state_.epoch = epoch;
  state_.loss = loss;
  state_.samples_per_s = train_s_ > 0 ? static_cast<double>(steps) * batch / train_s_ : 0;
  state_.eta_s = state_.samples_per_s > 0 ? static_cast<double>(total_steps_ - steps) * batch / state_.samples_per_s : -1;
  if (steps % log_every_ != 0 && steps != total_steps_) return;
  if (engine != nullptr) engine->log_stats(steps);
  if (at_log_point) at_log_point();
  log_.write(log_.event("step")
                 .add("step", steps)
                 .add("epoch", epoch)
                 .add("loss", window_loss_ / window_steps_)
                 .add("lr", static_cast<double>(lr))
                 .add("samples_per_s", window_s_ > 0 ? window_steps_ * batch / window_s_ : 0.0)
                 .add("compute_utilisation", utilisation(window_compute_s_, window_s_)));
  if (metrics_ != nullptr) metrics_->on_compute(compute_utilisation());
  window_loss_ = window_s_ = window_compute_s_ = 0;
  window_steps_ = 0;
  note_memory(steps);
}

bool StepLedger::eval_due(int64_t steps, double epoch) {
  const bool epoch_ended = static_cast<int64_t>(epoch) > last_epoch_;
  last_epoch_ = static_cast<int64_t>(epoch);
  bool due = train_.eval_every_steps > 0 ? steps % train_.eval_every_steps == 0 : epoch_ended;
  if (train_.eval_every_s > 0) due = cadence_.due(shared_time_s(clock_));
  due = train_.evaluates && (due || steps == total_steps_);
  if (!due && progress_ != nullptr) progress_->update(state_);
  return due;
}

void StepLedger::pad_eval(double measured_s) {
  if (train_.emulated_eval_s > 0) pad_to(clock_, measured_s, train_.emulated_eval_s, eval_overruns_);
}

void StepLedger::evaluated(int64_t step, double epoch, double test_acc, double test_loss, bool text, double eval_s,
                           const GossipEngine* engine) {
  evaluated_at_ = step;
  final_acc_ = test_acc;
  final_loss_ = test_loss;
  state_.step = step;
  state_.epoch = epoch;
  state_.test_acc = test_acc;
  if (metrics_ != nullptr) metrics_->on_eval(test_acc, test_loss);
  JsonObject e = log_.event("eval");
  e.add("step", step).add("epoch", epoch).add("test_acc", test_acc).add("test_loss", test_loss);
  if (text) e.add("test_bits_per_byte", test_loss / std::log(2.0));
  log_.write(e.add("eval_s", eval_s));
  if (train_.target_test_acc > 0 && !time_to_target_s_ && test_acc >= train_.target_test_acc) {
    time_to_target_s_ = log_.elapsed();
    steps_to_target_ = step;
    if (engine != nullptr) bytes_to_target_ = engine->bytes_sent();
  }
  if (progress_ != nullptr) progress_->update(state_, true);
}

double StepLedger::compute_utilisation() const { return utilisation(compute_s_, train_s_); }

void StepLedger::finish(int64_t steps, double epoch, int batch, bool stopped, uint64_t bytes_sent, bool in_cluster,
                        const std::function<void(JsonObject&)>& more) {
  auto end = log_.event("end");
  end.add("steps", steps).add("epoch", epoch);
  // A run that evaluated nothing (stopped before its first evaluation) has no accuracy,
  // not an accuracy of 0.
  if (evaluated()) {
    end.add("final_test_acc", final_acc_).add("final_test_loss", final_loss_);
  } else {
    end.add_null("final_test_acc").add_null("final_test_loss");
  }
  end.add("train_s", train_s_)
      .add("samples_per_s", train_s_ > 0 ? steps * batch / train_s_ : 0.0)
      .add("bytes_sent", static_cast<int64_t>(bytes_sent))
      .add("compute_s", compute_s_)
      .add("compute_utilisation", compute_utilisation());
  if (stopped) end.add("stopped", true);
  if (train_.emulated_step_s > 0) end.add("emulated_step_s", train_.emulated_step_s).add("compute_overruns", compute_overruns_);
  if (train_.emulated_eval_s > 0) end.add("emulated_eval_s", train_.emulated_eval_s).add("eval_overruns", eval_overruns_);
  if (time_to_target_s_) {
    end.add("time_to_target_s", *time_to_target_s_).add("steps_to_target", *steps_to_target_);
    if (in_cluster) end.add("bytes_to_target", static_cast<int64_t>(bytes_to_target_));
  } else {
    end.add_null("time_to_target_s");
  }
  if (more) more(end);
  log_.write(end);
  if (progress_ != nullptr) {
    state_.step = steps;
    state_.epoch = epoch;
    progress_->finish(state_);
  }
}

}  // namespace hearsay
