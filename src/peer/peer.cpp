#include "hearsay/checkpoint.pb.h"
#include "hearsay/peer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "hearsay/checkpoint.h"
#include "hearsay/error.h"
#include "hearsay/process.h"
#include "algorithm.h"
#include "site_replicas.h"
#include "emulated_time.h"
#include "run_plan.h"
#include "memory_use.h"
#include "step_ledger.h"
#include "checkpoint_writer.h"
#include "live_snapshot.h"

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
  StepLedger ledger(t, spec_.log_every_steps, total_steps, log_, progress_, *clock_, metrics_);
  ledger.set_memory_source([this] {
    MemoryUse m = measure_memory(*model_, *optimizer_, false, engine_.get());
    if (checkpoints_) m.host["checkpoint"] = checkpoints_->held_bytes();
    return m;
  });
  ledger.start({.device = backend_->name(),
                .model = spec_.model_description,
                .params = static_cast<int64_t>(model_->num_params()),
                .shard_size = shard,
                .batch_size = batch,
                .seed = spec_.seed});

  const int64_t first_step = resume();
  // The checkpoints' snapshot buffers, made beside the first steps (checkpoint_writer.h).
  // A CPU peer's snapshot is read from the live state and needs them only once a fence
  // has waited for the disk (live_snapshot.h): none are made for it now.
  if (!checkpoint_path().empty()) {
    make_checkpoint_writer();
    if (!snapshots_live()) checkpoints_->prepare(model_->num_params(), optimizer_->state_buffer_names());
  }
  // A resumed peer goes on from its own state; a fresh one may start from a neighbour's.
  if (engine_) engine_->join(first_step == 0 && network_.join, network_.join_quorum, network_.join_timeout_s);
  TrainResult result;
  result.steps = first_step;
  std::vector<int64_t> idx(static_cast<size_t>(batch) * max_site_share(engine_ ? &network_ : nullptr));
  ledger.begin_cadence();
  auto do_eval = [&](int64_t step) {
    const double t0 = log_.elapsed();
    const BatchStats s = evaluate();
    ledger.pad_eval(log_.elapsed() - t0);
    ledger.evaluated(step, sampler_->epochs_done(), s.accuracy(), s.loss(), data_->test.is_text(), log_.elapsed() - t0,
                     engine_.get());
    if (network_.on_eval) network_.on_eval(step, s);
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
    double compute_s = 0;  // the step's own forward, backward and optimizer passes
    if (engine_) {
      // An algorithm may write to the state anywhere in its step (mixing arrivals before
      // its gradient): a live checkpoint's fence before all of it.
      if (checkpoints_) checkpoints_->fence();
      try {
        s = engine_->step(Batch{batch_x_.f32(), batch_y_.i32(), rows}, lr);
        compute_s = engine_->last_compute_s();
        step += engine_->take_skipped_steps();  // the site's view changed with this peer behind
      } catch (const StopRequested&) {
        break;  // stopped mid-round: end the run normally, with its end event
      }
    } else {
      const double c0 = clock_->now();
      s = model_->forward_backward(Batch{batch_x_.f32(), batch_y_.i32(), batch});
      // The forward and backward pass only read the state: a live checkpoint read it
      // beside them, and is fenced only now, before the optimizer writes it.
      if (checkpoints_) checkpoints_->fence();
      optimizer_->step(model_->params(), model_->grads(), lr);
      compute_s = clock_->now() - c0;
    }
    // Stretch the step's work only (computation, codecs, mixing: all a GPU's): waiting
    // on the network is not what a slower GPU slows.
    const double work_s = engine_ ? engine_->last_work_s() : clock_->now() - t0;
    const double factor = network_.step_time_factor ? network_.step_time_factor(step) : 1.0;
    const double padded_from = clock_->now();
    // An emulated step computes its rows: a share of a site's batch takes its share of the time.
    stretch_step(*clock_, work_s, network_.slowdown * factor, t.emulated_step_s * rows / batch, ledger.compute_overruns());
    compute_s = step_compute_s(compute_s, network_.slowdown * factor, t.emulated_step_s * rows / batch);
    if (engine_) engine_->note_compute(work_s + (clock_->now() - padded_from), rows);
    const double step_s = clock_->now() - t0;

    const double loss = s.loss();
    ledger.check_finite(loss, step, lr, engine_.get(), "lower optim.lr (now " + std::to_string(spec_.schedule.base_lr) + ")");
    result.losses.push_back(loss);
    result.steps = step + 1;
    if (result.steps == network_.flip_bit_after_step && engine_) engine_->inject_bit_flip();
    if (metrics_ != nullptr) metrics_->on_step(result.steps, loss, rows);
    if (engine_) result.max_buffered_bytes = std::max(result.max_buffered_bytes, engine_->buffered_bytes());
    ledger.stepped(result.steps, sampler_->epochs_done(), loss, lr, batch, step_s, compute_s, engine_.get(), [&] {
      if (engine_ && network_.on_snapshot) network_.on_snapshot(result.steps, model_->get_params());
    });
    if (ledger.eval_due(result.steps, sampler_->epochs_done())) {
      do_eval(result.steps);
      if (ledger.target_ends_run(engine_.get())) break;
    }
    if (checkpoint_every > 0 && result.steps % checkpoint_every == 0 && result.steps < total_steps) {
      save_checkpoint(result.steps, log_.elapsed());
    }
    if (stopping()) break;
  }
  result.stopped = stopping() && result.steps < total_steps;
  // A peer restarted from a checkpoint at (or past) its last step takes no step: its
  // result is still the model's real accuracy, not an empty one.
  if (result.steps >= total_steps && ledger.evaluated_at() != result.steps && t.evaluates) do_eval(result.steps);
  // On a stop (SIGTERM) and at the end: nothing learnt so far is lost. A stop before this
  // run's first step has nothing new to keep (and leaves an earlier checkpoint as it was).
  if (!(result.stopped && result.steps == first_step)) save_checkpoint(result.steps, log_.elapsed());
  if (checkpoints_) checkpoints_->finish();  // the last one on disk before the end event says so
  const double train_s = ledger.train_s();
  result.steps_per_s = train_s > 0 ? static_cast<double>(result.steps) / train_s : 0;
  result.compute_utilisation = ledger.compute_utilisation();
  result.epochs = sampler_->epochs_done();
  result.wall_s = log_.elapsed();
  result.final_test_acc = ledger.final_test_acc();
  result.final_test_loss = ledger.final_test_loss();
  result.evaluated = ledger.evaluated();
  result.time_to_target_s = ledger.time_to_target_s();
  result.steps_to_target = ledger.steps_to_target();
  result.bytes_to_target = ledger.bytes_to_target();
  if (engine_) result.bytes_sent = engine_->bytes_sent();
  // The links' final counters, where the loop's last gossip event is older: the summary's
  // bytes per link and per site read the last one (a run stopped at its target ends
  // between two log.every_steps).
  if (engine_ && result.steps % spec_.log_every_steps != 0 && result.steps != total_steps) engine_->log_stats(result.steps);
  ledger.finish(result.steps, result.epochs, batch, result.stopped, result.bytes_sent, engine_ != nullptr);
  return result;
}

std::vector<float> Peer::params() const { return model_->get_params(); }

std::string Peer::algorithm_state() const { return engine_ ? engine_->algorithm_state() : std::string(); }

std::string Peer::checkpoint_path() const {
  return spec_.checkpoint_dir.empty() ? std::string() : spec_.checkpoint_dir + "/" + spec_.name + ".ckpt";
}

void Peer::make_checkpoint_writer() {
  // In the background on real time; a simulated peer writes in its own step (its clock is
  // virtual, and the simulated disk costs nothing).
  checkpoints_ = std::make_unique<CheckpointWriter>(!clock_->simulated(), [this](const CheckpointWriter::Written& w) {
    log_.write(log_.event("checkpoint")
                   .add("step", w.step)
                   .add("path", w.path)
                   .add("bytes", static_cast<int64_t>(w.file_bytes))
                   .add("snapshot_s", w.snapshot_s)
                   .add("waited_s", w.waited_s)
                   .add("copied_bytes", static_cast<int64_t>(w.copied_bytes))
                   .add("fence_waited_bytes", static_cast<int64_t>(w.fence_waited_bytes))
                   .add("fence_s", w.fence_s)
                   .add("write_s", w.write_s));
  });
}

void Peer::save_checkpoint(int64_t step, double wall_s) {
  const std::string path = checkpoint_path();
  if (path.empty()) return;
  if (!checkpoints_) make_checkpoint_writer();
  // The snapshot: the step loop's whole share of a checkpoint (copies of the parameters
  // and the optimizer's state, the engine's and the sampler's small state).
  const double t0 = clock_->now();
  // The one before is written first: one snapshot held at a time, taken into its buffers.
  const double waited_s = checkpoints_->finish();
  CheckpointData d = checkpoints_->take_spare();
  d.message = std::make_shared<ckpt::Checkpoint>();
  ckpt::Checkpoint& c = *d.message;
  c.set_peer(spec_.name);
  c.set_run(spec_.name);
  c.set_cluster(spec_.cluster_id);
  c.set_training_digest(spec_.training_digest);
  c.set_num_params(model_->num_params());
  c.set_step(step);
  save_sampler_state(sampler_->state(), c);
  if (engine_) engine_->save_state(c);
  c.set_wall_s(wall_offset_s_ + wall_s);
  if (!take_live_snapshot(d)) {
    download_floats_into(model_->backend(), model_->params(), model_->num_params(), d.params);
    optimizer_->save_state_into(d.optimizer);
  }
  checkpoints_->submit(path, step, std::move(d), clock_->now() - t0 - waited_s, waited_s);
}

bool Peer::snapshots_live() const {
  // A host peer writing in the background, whose optimizer lends its state: the state is
  // read where it lies until the step loop's next write to it (live_snapshot.h). A GPU
  // peer's state is downloaded instead, and a simulated peer writes in its step.
  OptimizerState probe;
  return backend_->is_host() && !clock_->simulated() && optimizer_->save_state_live(probe).has_value();
}

bool Peer::take_live_snapshot(CheckpointData& d) {
  if (!snapshots_live()) return false;
  const size_t n = model_->num_params();
  OptimizerState header;
  const auto views = optimizer_->save_state_live(header);
  // The spare's buffers, where the writer keeps them (a fence once waited for the disk):
  // the fence copies into them what the writer has not reached. Else none are held.
  bool copies = d.params.size() == n;
  for (const auto& [name, at] : *views) copies = copies && d.optimizer.buffers.count(name) != 0 && d.optimizer.buffers.at(name).size() == n;
  if (copies) {
    // Only the buffers this optimizer keeps now: a spare made for others is not written.
    for (auto it = d.optimizer.buffers.begin(); it != d.optimizer.buffers.end();) {
      it = views->count(it->first) != 0 ? std::next(it) : d.optimizer.buffers.erase(it);
    }
  } else {
    d.params = {};
    d.optimizer.buffers.clear();
  }
  d.optimizer.optimizer = header.optimizer;
  d.optimizer.steps = header.steps;
  d.live = std::make_shared<LiveSnapshot>();
  d.live->add("params", model_->params(), n, copies ? &d.params : nullptr);
  for (const auto& [name, at] : *views) d.live->add(name, at, n, copies ? &d.optimizer.buffers.at(name) : nullptr);
  return true;
}

int64_t Peer::shard_size() const { return engine_ ? data_->train.size / spec_.num_shards : sampler_->shard_size(); }

int64_t Peer::resume() {
  const std::string path = checkpoint_path();
  if (path.empty() || !spec_.resume) return 0;
  // The largest a checkpoint of this run can be: the model and up to 15 more model-sized
  // buffers (the optimizer's, the algorithm's), the sampler's order, and room for links.
  const uint64_t n = model_->num_params();
  const uint64_t max_bytes = 64 * n + 16 * static_cast<uint64_t>(data_->train.size) + (16u << 20);
  // Every chunk is checked as it opens: a damaged file loads nothing.
  const auto file = CheckpointReader::open(path, max_bytes);
  if (!file) return 0;
  const std::string where = "checkpoint " + path;
  const CheckpointExpectation want{spec_.name, spec_.cluster_id, spec_.training_digest, n, planned_steps(spec_.train, shard_size()),
                                   spec_.optimizer.name};
  // The parameters straight into one buffer (not a byte copy beside it: at 1B parameters
  // that is 4 GB), then the rest.
  std::vector<float> params(n);
  file->read_blob("params", params.data(), 4 * n);
  const auto c = std::make_optional(file->read_all({"params"}));
  vet_checkpoint_values(*c, want, where, params.data());
  if (const std::string differs = checkpoint_provenance_mismatch(*c, want); !differs.empty()) {
    if (!spec_.weights_from_other_run) {
      throw InputError(where + ": not this run's checkpoint: " + differs +
                       "; move it away, or set checkpoint { weights_from_other_run: true } to start from its parameters");
    }
    // Its parameters only, as initial weights: its optimizer, sampler and algorithm state
    // belong to another run.
    model_->set_params(params);
    log_.write(log_.event("resume").add("step", int64_t{0}).add("path", path).add("their_wall_s", 0.0));
    std::fprintf(stderr, "%s: %s: initial weights from %s, a checkpoint of another run (%s)\n", program_name().c_str(), spec_.name.c_str(),
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
