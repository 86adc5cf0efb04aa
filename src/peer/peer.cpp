#include "hearsay/checkpoint.pb.h"
#include "hearsay/peer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "hearsay/checkpoint.h"
#include "hearsay/error.h"
#include "algorithm.h"
#include "site_replicas.h"
#include "emulated_time.h"
#include "run_plan.h"

namespace hearsay {
namespace {

// How many of the config's batches one step of this peer may take: under site replicas
// with a speed split its share of its site's, at most kMaxSiteShare (4) batches; else 1.
int max_site_share(const PeerNetwork* network) {
  if (network == nullptr || !network->gossip.site_replicas || network->gossip.site_split != "speed") return 1;
  return kMaxSiteShare;
}

}  // namespace


Peer::Peer(PeerSpec spec, EventLog& log, Progress* progress, const PeerNetwork* network)
    : spec_(std::move(spec)), log_(log), progress_(progress) {
  if (spec_.shared_data) {
    data_ = spec_.shared_data.get();  // one copy for every peer of a simulated cluster
  } else {
    owned_data_ = std::move(spec_.data);
    data_ = &owned_data_;
  }
  backend_ = create_backend(spec_.device, spec_.threads);
  const int batch = spec_.train.batch_size;
  // Under site replicas with a speed split a peer may take up to its whole site's batch.
  const int max_batch = std::max(batch * max_site_share(network), spec_.train.eval_batch_size);
  const uint64_t init_seed = network != nullptr && network->init_seed ? *network->init_seed : spec_.seed;
  model_ = create_model(spec_.model, *backend_, max_batch, init_seed);
  optimizer_ = create_optimizer(*backend_, model_->num_params(), spec_.optimizer);

  sampler_ = make_shard_sampler(data_->train, spec_);

  if (network != nullptr) {
    network_ = *network;
    if (network_.clock != nullptr) clock_ = network_.clock;
    if (network_.transport == nullptr) throw InputError("peer: a network needs a transport");
    if (!(network_.slowdown >= 1.0)) throw InputError("peer: slowdown must be >= 1");
    network_.gossip.optimizer = spec_.optimizer;
    engine_ = make_gossip_engine(network_.gossip, network_.peers, network_.me, *network_.transport, *model_,
                                             *optimizer_, *clock_, log_, spec_.seed);
  }
  if (data_->train.is_text() != (model_->batch_kind() == BatchKind::kTokens)) {
    throw InputError("peer " + spec_.name + ": the model reads " +
                     (model_->batch_kind() == BatchKind::kTokens ? "text" : "features") + " but the data is " +
                     (data_->train.is_text() ? "text" : "features"));
  }
  // A sample is dim() floats and one label, or context token ids and as many targets
  // (int32: the same 4 bytes a float takes).
  const bool text = data_->train.is_text();
  const size_t x_per_sample = text ? static_cast<size_t>(data_->train.context) : static_cast<size_t>(data_->train.dim());
  const size_t y_per_sample = text ? static_cast<size_t>(data_->train.context) : 1;
  batch_x_ = DeviceBuffer(*backend_, sizeof(float) * static_cast<size_t>(max_batch) * x_per_sample);
  batch_y_ = DeviceBuffer(*backend_, sizeof(int32_t) * static_cast<size_t>(max_batch) * y_per_sample);
  host_tokens_.resize(text ? static_cast<size_t>(max_batch) * x_per_sample : 0);
  if (!backend_->is_host()) {
    host_x_.resize(text ? 0 : static_cast<size_t>(max_batch) * x_per_sample);
    host_y_.resize(static_cast<size_t>(max_batch) * y_per_sample);
  }
}

// Text windows into the batch buffers (through host staging on a device backend).
void Peer::load_token_batch(const Dataset& set, const int64_t* idx, int n) {
  const size_t count = static_cast<size_t>(n) * set.context;
  if (backend_->is_host()) {
    gather_tokens(set, idx, n, batch_x_.i32(), batch_y_.i32());
    return;
  }
  gather_tokens(set, idx, n, host_tokens_.data(), host_y_.data());
  backend_->upload(batch_x_.data(), host_tokens_.data(), sizeof(int32_t) * count);
  backend_->upload(batch_y_.data(), host_y_.data(), sizeof(int32_t) * count);
}

Peer::~Peer() = default;

void Peer::stop() {
  stop_ = true;
  if (engine_) engine_->stop();
}

void Peer::set_metrics(MetricsBoard* board) {
  metrics_ = board;
  if (engine_) engine_->set_metrics(board);
}

void Peer::next_batch(int batch, int64_t* idx) {
  sampler_->next(batch, idx);
  if (data_->train.is_text()) {
    load_token_batch(data_->train, idx, batch);
  } else if (backend_->is_host()) {
    gather_batch(data_->train, idx, batch, batch_x_.f32(), batch_y_.i32());
  } else {
    gather_batch(data_->train, idx, batch, host_x_.data(), host_y_.data());
    backend_->upload(batch_x_.data(), host_x_.data(), sizeof(float) * batch * data_->train.dim());
    backend_->upload(batch_y_.data(), host_y_.data(), sizeof(int32_t) * batch);
  }
}

namespace {

// The median time of `run` over `times` calls that follow `warmup` untimed ones (to warm
// caches and allocators); `prepare` runs before each call, untimed.
// Measured on `wall`, real time also in a simulation: what is measured is this machine's work.
template <class Prepare, class Run>
double median_seconds(const Clock& wall, int warmup, int times, Prepare prepare, Run run) {
  std::vector<double> took;
  for (int i = 0; i < warmup + times; ++i) {
    prepare();
    const double t0 = wall.now();
    run();
    if (i >= warmup) took.push_back(wall.now() - t0);
  }
  std::sort(took.begin(), took.end());
  return took.empty() ? 0.0 : took[took.size() / 2];
}

}  // namespace

double Peer::measure_step_s(int steps) {
  const int batch = spec_.train.batch_size;
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  return median_seconds(real_clock_, 3, steps, [&] { next_batch(batch, idx.data()); }, [&] {
    model_->forward_backward(Batch{batch_x_.f32(), batch_y_.i32(), batch});
    optimizer_->step(model_->params(), model_->grads(), spec_.schedule.base_lr);
    backend_->synchronize();
  });
}

double Peer::measure_eval_s(int times) {
  return median_seconds(real_clock_, 1, times, [] {}, [&] {
    evaluate();
    backend_->synchronize();
  });
}

BatchStats Peer::evaluate() {
  const Dataset& test = data_->test;
  const int eb = spec_.train.eval_batch_size;
  BatchStats total;
  std::vector<int64_t> idx(eb);
  for (int64_t start = 0; start < test.size; start += eb) {
    const int n = static_cast<int>(std::min<int64_t>(eb, test.size - start));
    if (test.is_text()) {
      for (int i = 0; i < n; ++i) idx[i] = start + i;
      load_token_batch(test, idx.data(), n);
      total += model_->evaluate(Batch{batch_x_.data(), batch_y_.i32(), n});
      continue;
    }
    if (backend_->is_host()) {
      // Test rows are contiguous: hand them to the model without copying.
      const auto* labels = test.labels.data() + start;
      const BatchStats s = model_->evaluate(Batch{test.row(start), labels, n});
      total.loss_sum += s.loss_sum;
      total.correct += s.correct;
      total.count += s.count;
      continue;
    }
    backend_->upload(batch_x_.data(), test.row(start), sizeof(float) * static_cast<size_t>(n) * test.dim());
    backend_->upload(batch_y_.data(), test.labels.data() + start, sizeof(int32_t) * n);
    const BatchStats s = model_->evaluate(Batch{batch_x_.f32(), batch_y_.i32(), n});
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.count += s.count;
  }
  return total;
}

TrainResult Peer::run() {
  const TrainSpec& t = spec_.train;
  const int batch = t.batch_size;
  // In a cluster every peer takes the same number of steps (synchronous algorithms meet
  // every round), sized by the mean shard.
  const int64_t shard = shard_size();
  const int64_t total_steps = planned_steps(t, shard);
  LrSchedule schedule = spec_.schedule;
  schedule.total_steps = total_steps;
  const int64_t log_every = spec_.log_every_steps;

  JsonObject start = log_.event("start");
  start
                 .add("device", backend_->name())
                 .add("model", spec_.model_description)
                 .add("params", static_cast<int64_t>(model_->num_params()))
                 .add("shard_size", shard)
                 .add("batch_size", batch)
                 .add("total_steps", total_steps)
                 .add("target_test_acc", t.target_test_acc)
                 .add("seed", static_cast<int64_t>(spec_.seed))
                 // Wall-clock time (Unix seconds) at this event: places the log's relative
                 // times among other processes' (restarted peers append to one log). A
                 // simulated peer's is the virtual time since the simulation began.
                 .add("unix_time", shared_time_s(*clock_));
  if (clock_->simulated()) start.add("simulated", true).add("evaluates", t.evaluates);
  log_.write(start);

  const int64_t first_step = resume();
  // A resumed peer goes on from its own state; a fresh one may start from a neighbour's.
  if (engine_ && first_step == 0 && network_.join) engine_->join();
  TrainResult result;
  result.steps = first_step;
  std::vector<int64_t> idx(static_cast<size_t>(batch) * max_site_share(engine_ ? &network_ : nullptr));
  double window_loss = 0, window_train_s = 0;
  int64_t window_steps = 0;
  double train_s = 0;
  ProgressState state;
  int64_t last_epoch = 0;

  int64_t compute_overruns = 0;  // steps whose real computation exceeded train.emulated_step_s
  int64_t evaluated_at = -1;  // the step of the last evaluation
  EvalCadence eval_cadence(t.eval_every_s, shared_time_s(*clock_));
  int64_t eval_overruns = 0;  // evaluations whose real scoring exceeded train.emulated_eval_s
  auto do_eval = [&](int64_t step) {
    evaluated_at = step;
    const double t0 = log_.elapsed();
    const BatchStats s = evaluate();
    if (t.emulated_eval_s > 0) pad_to(*clock_, log_.elapsed() - t0, t.emulated_eval_s, eval_overruns);
    const double eval_s = log_.elapsed() - t0;
    result.final_test_acc = s.accuracy();
    result.evaluated = true;
    result.final_test_loss = s.loss();
    state.test_acc = s.accuracy();
    if (metrics_ != nullptr) metrics_->on_eval(s.accuracy(), s.loss());
    JsonObject e = log_.event("eval");
    e.add("step", step).add("epoch", sampler_->epochs_done()).add("test_acc", s.accuracy()).add("test_loss", s.loss());
    if (data_->test.is_text()) e.add("test_bits_per_byte", s.loss() / std::log(2.0));
    log_.write(e.add("eval_s", eval_s));
    if (network_.on_eval) network_.on_eval(step, s);
    if (t.target_test_acc > 0 && !result.time_to_target_s && s.accuracy() >= t.target_test_acc) {
      result.time_to_target_s = log_.elapsed();
      result.steps_to_target = step;
      if (engine_) result.bytes_to_target = engine_->bytes_sent();
    }
  };

  const int64_t checkpoint_every = spec_.checkpoint_every_steps;
  for (int64_t step = first_step; step < total_steps; ++step) {
    if (stopping()) break;  // asked before this step (while loading, joining, checkpointing)
    const double t0 = clock_->now();
    // This step's rows: the config's batch, or this peer's share of its site's.
    const int rows = engine_ ? engine_->batch_rows(batch) : batch;
    next_batch(rows, idx.data());
    const float lr = schedule.at(step);
    BatchStats s;
    if (engine_) {
      try {
        s = engine_->step(Batch{batch_x_.f32(), batch_y_.i32(), rows}, lr);
        step += engine_->take_skipped_steps();  // the site's view changed with this peer behind
      } catch (const StopRequested&) {
        break;  // stopped mid-round: end the run normally, with its end event
      }
    } else {
      s = model_->forward_backward(Batch{batch_x_.f32(), batch_y_.i32(), batch});
      optimizer_->step(model_->params(), model_->grads(), lr);
    }
    // Stretch the step's work only (computation, codecs, mixing: all a GPU's): waiting
    // on the network is not what a slower GPU slows.
    const double work_s = engine_ ? engine_->last_work_s() : clock_->now() - t0;
    const double factor = network_.step_time_factor ? network_.step_time_factor(step) : 1.0;
    const double padded_from = clock_->now();
    // An emulated step computes its rows: a share of a site's batch takes its share of the time.
    stretch_step(*clock_, work_s, network_.slowdown * factor, t.emulated_step_s * rows / batch, compute_overruns);
    if (engine_) engine_->note_compute(work_s + (clock_->now() - padded_from), rows);
    const double step_s = clock_->now() - t0;

    const double loss = s.loss();
    if (!std::isfinite(loss)) {
      log_.write(log_.event("diverged").add("step", step).add("lr", static_cast<double>(lr)).add("after_neighbours", engine_ && !engine_->mixed_this_step().empty()));
      // Say whether the step followed neighbours' updates: a hostile or broken neighbour
      // must not be blamed on this peer's learning rate.
      std::string mixed;
      if (engine_) {
        for (const auto& n : engine_->mixed_this_step()) mixed += (mixed.empty() ? "" : ", ") + n;
      }
      throw InputError("training diverged at step " + std::to_string(step) + " (loss is not finite) " +
                       (mixed.empty() ? "with no neighbour's update mixed in this step; lower optim.lr (now " +
                                            std::to_string(spec_.schedule.base_lr) + ")"
                                      : "after mixing updates from " + mixed +
                                            " in this step; check those peers (their learning rate, their logs) "
                                            "or tighten cluster.gossip.guard"));
    }
    result.losses.push_back(loss);
    result.steps = step + 1;
    if (metrics_ != nullptr) metrics_->on_step(result.steps, loss, rows);
    window_loss += loss;
    window_train_s += step_s;
    train_s += step_s;
    ++window_steps;

    state.step = step + 1;
    state.epoch = sampler_->epochs_done();
    state.loss = loss;
    state.samples_per_s = train_s > 0 ? static_cast<double>(result.steps) * batch / train_s : 0;
    state.eta_s = state.samples_per_s > 0 ? static_cast<double>(total_steps - result.steps) * batch / state.samples_per_s : -1;

    if (engine_) result.max_buffered_bytes = std::max(result.max_buffered_bytes, engine_->buffered_bytes());
    if (result.steps % log_every == 0 || result.steps == total_steps) {
      if (engine_) {
        engine_->log_stats(result.steps);
        if (network_.on_snapshot) network_.on_snapshot(result.steps, model_->get_params());
      }
      log_.write(log_.event("step")
                     .add("step", result.steps)
                     .add("epoch", state.epoch)
                     .add("loss", window_loss / window_steps)
                     .add("lr", static_cast<double>(lr))
                     .add("samples_per_s", window_train_s > 0 ? window_steps * batch / window_train_s : 0.0));
      window_loss = window_train_s = 0;
      window_steps = 0;
    }
    const bool epoch_ended = static_cast<int64_t>(state.epoch) > last_epoch;
    last_epoch = static_cast<int64_t>(state.epoch);
    bool eval_now = t.eval_every_steps > 0 ? result.steps % t.eval_every_steps == 0 : epoch_ended;
    if (t.eval_every_s > 0) {
      eval_now = eval_cadence.due(shared_time_s(*clock_));
    }
    if (!t.evaluates) eval_now = false;
    if (eval_now || (result.steps == total_steps && t.evaluates)) {
      do_eval(result.steps);
      if (progress_) progress_->update(state, true);
      if (result.time_to_target_s && !engine_) break;
    } else if (progress_) {
      progress_->update(state);
    }
    if (checkpoint_every > 0 && result.steps % checkpoint_every == 0 && result.steps < total_steps) {
      save_checkpoint(result.steps, log_.elapsed());
    }
    if (stopping()) break;
  }
  result.stopped = stopping() && result.steps < total_steps;
  // A peer restarted from a checkpoint at (or past) its last step takes no step: its
  // result is still the model's real accuracy, not an empty one.
  if (result.steps >= total_steps && evaluated_at != result.steps && t.evaluates) {
    state.step = result.steps;
    state.epoch = sampler_->epochs_done();
    do_eval(result.steps);
    if (progress_) progress_->update(state, true);
  }
  // On a stop (SIGTERM) and at the end: nothing learnt so far is lost. A stop before this
  // run's first step has nothing new to keep (and leaves an earlier checkpoint as it was).
  if (!(result.stopped && result.steps == first_step)) save_checkpoint(result.steps, log_.elapsed());
  result.steps_per_s = train_s > 0 ? static_cast<double>(result.steps) / train_s : 0;
  result.epochs = sampler_->epochs_done();
  result.wall_s = log_.elapsed();
  if (engine_) result.bytes_sent = engine_->bytes_sent();
  // The links' final counters, where the loop's last gossip event is older: the summary's
  // bytes per link and per site read the last one (a run stopped at its target ends
  // between two log.every_steps).
  if (engine_ && result.steps % log_every != 0 && result.steps != total_steps) engine_->log_stats(result.steps);
  auto end = log_.event("end");
  end.add("steps", result.steps)
      .add("epoch", result.epochs)
      .add("final_test_acc", result.final_test_acc)
      .add("final_test_loss", result.final_test_loss)
      .add("train_s", train_s)
      .add("samples_per_s", train_s > 0 ? result.steps * batch / train_s : 0.0)
      .add("bytes_sent", static_cast<int64_t>(result.bytes_sent));
  if (result.stopped) end.add("stopped", true);
  if (t.emulated_step_s > 0) end.add("emulated_step_s", t.emulated_step_s).add("compute_overruns", compute_overruns);
  if (t.emulated_eval_s > 0) end.add("emulated_eval_s", t.emulated_eval_s).add("eval_overruns", eval_overruns);
  if (result.time_to_target_s) {
    end.add("time_to_target_s", *result.time_to_target_s).add("steps_to_target", *result.steps_to_target);
    if (engine_) end.add("bytes_to_target", static_cast<int64_t>(result.bytes_to_target));
  } else {
    end.add_null("time_to_target_s");
  }
  log_.write(end);
  if (progress_) progress_->finish(state);
  return result;
}

std::vector<float> Peer::params() const { return model_->get_params(); }

std::string Peer::algorithm_state() const { return engine_ ? engine_->algorithm_state() : std::string(); }

std::string Peer::checkpoint_path() const {
  return spec_.checkpoint_dir.empty() ? std::string() : spec_.checkpoint_dir + "/" + spec_.name + ".ckpt";
}

void Peer::save_checkpoint(int64_t step, double wall_s) {
  const std::string path = checkpoint_path();
  if (path.empty()) return;
  const double t0 = log_.elapsed();
  ckpt::Checkpoint c;
  c.set_peer(spec_.name);
  c.set_run(spec_.name);
  c.set_cluster(spec_.cluster_id);
  c.set_training_digest(spec_.training_digest);
  c.set_num_params(model_->num_params());
  c.set_step(step);
  const auto params = model_->get_params();
  c.set_params(floats_to_bytes(params.data(), params.size()));
  save_optimizer_state(optimizer_->save_state(), c);
  save_sampler_state(sampler_->state(), c);
  if (engine_) engine_->save_state(c);
  c.set_wall_s(wall_offset_s_ + wall_s);
  write_checkpoint(path, c);
  log_.write(log_.event("checkpoint").add("step", step).add("path", path).add("write_s", log_.elapsed() - t0));
}

int64_t Peer::shard_size() const { return engine_ ? data_->train.size / spec_.num_shards : sampler_->shard_size(); }

int64_t Peer::resume() {
  const std::string path = checkpoint_path();
  if (path.empty() || !spec_.resume) return 0;
  // The largest a checkpoint of this run can be: the model and up to 15 more model-sized
  // buffers (the optimizer's, the algorithm's), the sampler's order, and room for links.
  const uint64_t n = model_->num_params();
  const uint64_t max_bytes = 64 * n + 16 * static_cast<uint64_t>(data_->train.size) + (16u << 20);
  const auto c = read_checkpoint(path, max_bytes);
  if (!c) return 0;
  const std::string where = "checkpoint " + path;
  const CheckpointExpectation want{spec_.name, spec_.cluster_id, spec_.training_digest, n, planned_steps(spec_.train, shard_size()),
                                   spec_.optimizer.name};
  vet_checkpoint_values(*c, want, where);
  std::vector<float> params(n);
  bytes_to_floats(c->params(), params.data(), params.size(), where + ": params");
  if (const std::string differs = checkpoint_provenance_mismatch(*c, want); !differs.empty()) {
    if (!spec_.weights_from_other_run) {
      throw InputError(where + ": not this run's checkpoint: " + differs +
                       "; move it away, or set checkpoint { weights_from_other_run: true } to start from its parameters");
    }
    // Its parameters only, as initial weights: its optimizer, sampler and algorithm state
    // belong to another run.
    model_->set_params(params);
    log_.write(log_.event("resume").add("step", int64_t{0}).add("path", path).add("their_wall_s", 0.0));
    std::fprintf(stderr, "hearsay-peer: %s: initial weights from %s, a checkpoint of another run (%s)\n", spec_.name.c_str(),
                 path.c_str(), differs.c_str());
    return 0;
  }
  model_->set_params(params);
  optimizer_->load_state(load_optimizer_state(*c, where), where);
  sampler_->restore(load_sampler_state(*c));
  if (engine_) engine_->load_state(*c);
  wall_offset_s_ = c->wall_s();
  log_.write(log_.event("resume").add("step", c->step()).add("path", path).add("their_wall_s", c->wall_s()));
  return c->step();
}

}  // namespace hearsay
