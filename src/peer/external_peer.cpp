#include "hearsay/external_peer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/gossip.h"
#include "hearsay/peer_metrics.h"
#include "hearsay/process.h"
#include "../log/event_schema.h"
#include "phases.h"
#include "../model/external.h"
#include "../optim/callback_optimizer.h"
#include "algorithm.h"
#include "algorithm_registry.h"
#include "emulated_time.h"
#include "run_plan.h"
#include "memory_use.h"
#include "step_ledger.h"

namespace hearsay {

namespace {

// The synchronous phases of a step's round that share the buffers (share_buffers): their own
// range (phases.h), apart from the algorithm's and the site's.
constexpr uint32_t kBufferPhase = kBufferPhases.first;

}  // namespace

ExternalPeer::ExternalPeer(const ExternalPeerOptions& o) {
  const config::Config cfg = load_config_file(o.config_path, o.sets);
  const bool cluster = cfg.cluster().peers_size() >= 2 && !o.alone;
  std::string name = cfg.name();
  if (cluster) name = resolve_peer_name(cfg, o.name);
  const std::string log_path = o.log_path.empty() ? cfg.log().path() : o.log_path;
  log_ = std::make_unique<EventLog>(log_path, name);
  if (!o.quiet) progress_ = std::make_unique<Progress>(stderr, name);
  if (!o.metrics_address.empty()) {
    // Up before the join, as hearsay-peer's.
    PeerMetrics m = serve_peer_metrics(cfg, cluster, name, o.metrics_address, "torch", program_name());
    metrics_board_ = std::move(m.board);
    metrics_server_ = std::move(m.server);
  }
  if (cluster) {
    // Before joining: no neighbour need be up to be told this.
    const std::string& algorithm = cfg.cluster().gossip().algorithm();
    if (algorithm_entry(algorithm).steps_without_optimizer) {
      throw InputError("peer " + name + ": algorithm '" + algorithm + "' takes its step itself, without the optimizer, and a " +
                       "torch peer steps with its framework's optimizer; run it with native peers (hearsay-peer), or choose " +
                       "another algorithm");
    }
    ClusterMembership m = join_cluster(cfg, name, *log_, o.stop != nullptr ? o.stop : &stop_);
    transport_ = std::move(m.transport);
    network_ = m.network;
    in_cluster_ = true;
    peers_ = network_.peers;
    me_ = network_.me;
    check_algorithm_topology(network_.gossip, static_cast<int>(peers_.size()));
    const config::Config mine = cluster_peer_config(cfg, name);
    spec_ = peer_spec(mine);
    device_from_config_ = mine.has_device();
    final_consensus_mode_ = static_cast<int>(cfg.cluster().final_consensus());
    finish_timeout_s_ = cfg.cluster().finish_timeout_s();
  } else {
    spec_ = peer_spec(cfg);
    device_from_config_ = cfg.has_device();
    peers_ = {name};
  }
  // The native peer's sampler: a torch peer sees its shard in the same order.
  sampler_ = make_shard_sampler(spec_.data.train, spec_);

  const TrainSpec& t = spec_.train;
  // As the native peer: in a cluster every peer takes the steps of the mean shard.
  shard_size_ = in_cluster_ ? spec_.data.train.size / spec_.num_shards : sampler_->shard_size();
  total_steps_ = planned_steps(t, shard_size_);
  schedule_ = spec_.schedule;
  schedule_.total_steps = total_steps_;
  ledger_ = std::make_unique<StepLedger>(spec_.train, spec_.log_every_steps, total_steps_, *log_, progress_.get(), clock_,
                                         metrics_board_.get());
  ledger_->begin_cadence();
  if (o.stop != nullptr && *o.stop) stop_ = true;  // stopped while it joined: no step is taken
}

ExternalPeer::~ExternalPeer() {
  close();
  engine_.reset();  // before the transport it listens on
}

int ExternalPeer::metrics_port() const { return metrics_server_ ? metrics_server_->port() : 0; }

void ExternalPeer::attach(ExternalModel m, bool join) {
  if (model_) throw InputError("peer " + spec_.name + ": a model is attached already (one model per peer)");
  if (!m.optimizer_step) throw InputError("peer " + spec_.name + ": the model has no optimizer step");
  // The framework's model decides where the engine computes; a config that names another
  // kind of device was meant for another run (or the script forgot its .to()): said, not
  // trained on silently. Which GPU is the script's (its LOCAL_RANK), so only the kind counts.
  const auto kind = [](const std::string& d) { return d.rfind("cuda", 0) == 0 ? std::string("cuda") : d; };
  if (device_from_config_ && kind(spec_.device) != kind(m.device)) {
    throw InputError("peer " + spec_.name + ": the config's device is '" + spec_.device + "' but the model's parameters are on " +
                     m.device + "; move the model there before wrapping it (model.to(\"" + spec_.device +
                     "\")), or set device: \"" + m.device + "\" (or leave device out: the model's device is used)");
  }
  backend_ = create_backend(m.device, spec_.threads);
  if (backend_->is_host() != (m.device == "cpu")) {
    throw InputError("peer " + spec_.name + ": device '" + m.device + "' is not where the backend computes");
  }
  const std::string description = m.description.empty() ? std::string("external") : m.description;
  model_ = std::make_unique<ExternalTrainable>(*backend_, m.params, m.grads, m.num_params, std::move(m.views), description);
  optimizer_step_ = std::move(m.optimizer_step);
  if (m.num_buffers > 0) {
    if (m.buffers == nullptr) throw InputError("peer " + spec_.name + ": " + std::to_string(m.num_buffers) + " buffers at a null address");
    if (in_cluster_ && !is_synchronous(network_.gossip.algorithm)) {
      throw InputError("peer " + spec_.name + ": " + network_.gossip.algorithm + " is asynchronous: its buffers travel with the "
                       "model (after the parameters), not beside it");
    }
    buffers_ = m.buffers;
    num_buffers_ = m.num_buffers;
    buffer_sharing_ = m.buffer_sharing;
  }
  // The framework's optimizer, wrapped for optim.grad_clip_norm as a native one would be.
  optimizer_ = make_callback_optimizer(*backend_, m.params, m.grads, m.num_params,
                                       [this](float lr) { optimizer_step_(lr); });
  if (spec_.optimizer.grad_clip_norm > 0) {
    optimizer_ = clip_gradient_norm(std::move(optimizer_), *backend_, m.num_params, spec_.optimizer.grad_clip_norm);
  }
  if (in_cluster_) {
    network_.gossip.optimizer = spec_.optimizer;
    engine_ = make_gossip_engine(network_.gossip, network_.peers, network_.me, *network_.transport, *model_,
                                             *optimizer_, clock_, *log_, spec_.seed);
    // The framework computes each gradient between two steps without writing the
    // parameters: the engine copies them meanwhile, not on the step's time.
    engine_->copy_between_steps(true);
    engine_->owner_ends_steps(true);
    engine_->set_metrics(metrics_board_.get());
  }
  ledger_->set_memory_source([this] { return measure_memory(*model_, *optimizer_, true, engine_.get()); });
  ledger_->start({.device = backend_->name(),
                  .model = description,
                  .params = static_cast<int64_t>(m.num_params),
                  .shard_size = shard_size_,
                  .batch_size = spec_.train.batch_size,
                  .seed = spec_.seed});
  // A peer stopped while it joined takes no model either; a resumed one (join false)
  // still waits for its quorum to answer.
  if (engine_ && !stop_) engine_->join(join, network_.join_quorum, network_.join_timeout_s);
  synchronize();
  last_return_ = clock_.now();
}

void ExternalPeer::synchronize() {
  if (backend_) backend_->synchronize();
}

void ExternalPeer::check_attached(const char* what) const {
  if (!model_) throw InputError(std::string("peer ") + spec_.name + ": " + what + " before a model was attached");
}

double ExternalPeer::framework_compute_s() const {
  return clock_.now() - last_return_;
}

void ExternalPeer::step(const ExternalStepStats& stats, float lr) {
  check_attached("a step");
  if (finished_) throw InputError("peer " + spec_.name + ": a step after finish()");
  if (broken_) {
    throw InputError("peer " + spec_.name + ": an earlier step failed part-way (step " + std::to_string(steps_) +
                     "); the algorithm's state is not consistent, so this peer takes no more steps");
  }
  if (stats.count < 1 || stats.count > (int64_t{1} << 30)) {
    throw InputError("peer " + spec_.name + ": a step over " + std::to_string(stats.count) + " samples (count must be >= 1)");
  }
  try {
    run_step(stats, lr);
  } catch (const StopRequested&) {
    throw;
  } catch (...) {
    broken_ = true;
    throw;
  }
}

void ExternalPeer::run_step(const ExternalStepStats& stats, float lr) {
  // The engine's step ends here, last, however run_step returns (its held sends leave and
  // its helper starts copying the parameters as the thread goes back to the framework).
  struct EndStep {
    GossipEngine* engine;
    ~EndStep() {
      if (engine) engine->end_step();
    }
  } end_step{engine_.get()};
  const double framework_s = framework_compute_s();
  const int64_t round = steps_;  // the step's round, as every peer of a synchronous algorithm counts it
  const double t0 = clock_.now();
  auto* model = static_cast<ExternalTrainable*>(model_.get());
  model->arm({stats.loss_sum, stats.correct, stats.count});
  BatchStats s;
  double optimizer_s = 0;  // the framework's optimizer step, timed
  if (engine_) {
    try {
      s = engine_->step(Batch{nullptr, nullptr, static_cast<int>(stats.count)}, lr);
      optimizer_s = engine_->last_compute_s();
    } catch (const StopRequested&) {
      stop_ = true;  // stopped mid-round: the loop ends and finish() writes the end event
      eval_due_ = false;
      synchronize();
      last_return_ = clock_.now();
      return;
    }
  } else {
    s = model->forward_backward(Batch{});
    const double o0 = clock_.now();
    optimizer_->step(model->params(), model->grads(), lr);
    optimizer_s = clock_.now() - o0;
  }
  // Stretch the work only (the framework's and the engine's), as a native peer does.
  const double work_s = framework_s + (engine_ ? engine_->last_work_s() : 0.0);
  const double slowdown = in_cluster_ ? network_.slowdown : 1.0;
  stretch_step(clock_, work_s, slowdown, spec_.train.emulated_step_s, ledger_->compute_overruns());
  // The framework's forward and backward passes ran before this call, between steps.
  const double compute_s = step_compute_s(framework_s + optimizer_s, slowdown, spec_.train.emulated_step_s);
  const double step_s = framework_s + (clock_.now() - t0);

  const double loss = s.loss();
  ledger_->check_finite(loss, steps_, lr, engine_.get(), "lower the script's learning rate");
  if (engine_ && num_buffers_ > 0) {
    try {
      share_buffers(static_cast<uint64_t>(round));
    } catch (const StopRequested&) {
      stop_ = true;  // the step itself was taken: it is counted below
    }
  }
  ++steps_;
  data_batches_fed_at_step_ = data_batches_fed_;
  if (engine_) steps_ += engine_->take_skipped_steps();  // a site's view changed with this peer behind
  if (metrics_board_) metrics_board_->on_step(steps_, loss, static_cast<int64_t>(stats.count));
  ledger_->stepped(steps_, epochs_done(), loss, lr, static_cast<int>(stats.count), step_s, compute_s, engine_.get());
  eval_due_ = ledger_->eval_due(steps_, epochs_done());
  synchronize();
  last_return_ = clock_.now();
}

bool ExternalPeer::running() const {
  if (stop_ || finished_) return false;
  if (steps_ >= total_steps_ && steps_ == resumed_at_) {
    throw InputError("peer " + spec_.name + ": its checkpoint" +
                     (spec_.checkpoint_dir.empty() ? std::string() : " in " + spec_.checkpoint_dir) + " is at step " +
                     std::to_string(steps_) + ", and the run has " + std::to_string(total_steps_) +
                     " steps: it is finished. To start afresh, give another checkpoint.dir or checkpoint { resume: false }; "
                     "to go on, raise train.max_steps or train.epochs");
  }
  if (steps_ >= total_steps_) return false;
  return !ledger_->target_ends_run(engine_.get());
}

void ExternalPeer::record_eval(double test_acc, double test_loss) {
  check_attached("an evaluation");
  if (!(test_acc >= 0 && test_acc <= 1)) {
    throw InputError("peer " + spec_.name + ": test accuracy " + std::to_string(test_acc) + " is not a fraction in [0, 1]");
  }
  // Timed from the last step's return: the framework evaluated meanwhile.
  double eval_s = framework_compute_s();
  ledger_->pad_eval(eval_s);
  eval_s = std::max(eval_s, spec_.train.emulated_eval_s);
  ledger_->evaluated(steps_, epochs_done(), test_acc, test_loss, spec_.data.test.is_text(), eval_s, engine_.get());
  // The evaluation is not the next step's computation: a slowdown must not stretch it.
  last_return_ = clock_.now();
}

void ExternalPeer::finish() {
  if (finished_ || !model_) return;
  finished_ = true;
  ledger_->finish(steps_, epochs_done(), spec_.train.batch_size, stop_ && steps_ < total_steps_, bytes_sent(), engine_ != nullptr,
                  [this](JsonObject& end) {
                    if (consensus_outcome_.empty()) return;
                    end.add("final_consensus", consensus_outcome_).add("consensus_s", consensus_s_);
                    if (consensus_distance_) {
                      end.add("consensus_distance", *consensus_distance_);
                    } else {
                      end.add_null("consensus_distance");
                    }
                  });
  close();
}

void ExternalPeer::close() {
  leave_without_consensus();
  // As hearsay-peer ends: the engine stops waiting, then the transport closes its links
  // and ends its threads, while the framework's buffers still exist.
  if (engine_) {
    engine_->stop();
    engine_->stop_copying();  // its helper reads the framework's parameters between steps
  }
  if (transport_) transport_->close();
}

void ExternalPeer::stop() {
  stop_ = true;
  if (engine_) engine_->stop();
}

void ExternalPeer::params_written() {
  if (engine_) engine_->params_written();
}

void ExternalPeer::next_batch(int batch, float* x_features, int32_t* x_tokens, int32_t* y) {
  if (batch < 1) throw InputError("peer " + spec_.name + ": a batch of " + std::to_string(batch) + " samples");
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  sampler_->next(batch, idx.data());
  if (spec_.data.train.is_text()) {
    gather_tokens(spec_.data.train, idx.data(), batch, x_tokens, y);
  } else {
    gather_batch(spec_.data.train, idx.data(), batch, x_features, y);
  }
}

float ExternalPeer::scheduled_lr() const { return schedule_.at(steps_); }

double ExternalPeer::epochs_done() const {
  if (data_batches_per_epoch_ > 0) return static_cast<double>(data_batches_fed_) / static_cast<double>(data_batches_per_epoch_);
  return sampler_->epochs_done();
}

void ExternalPeer::follow_data(int64_t batches_per_epoch, int64_t batches_per_step) {
  const std::string where = "peer " + spec_.name + ": the script's data";
  if (steps_ > 0 && steps_ != resumed_at_) {
    throw InputError(where + " was given after step " + std::to_string(steps_) + "; give it before the first step (the "
                     "learning-rate schedule and the stop follow it)");
  }
  if (batches_per_epoch < 1 || batches_per_step < 1) {
    throw InputError(where + ": " + std::to_string(batches_per_epoch) + " batches per epoch, " + std::to_string(batches_per_step) +
                     " per step (both must be >= 1)");
  }
  if (resumed_at_ >= 0) check_resumed_epoch(batches_per_epoch, resumed_batches_per_epoch_, resumed_at_);
  const TrainSpec& t = spec_.train;
  const double epoch_steps = std::ceil(t.epochs * static_cast<double>(batches_per_epoch) / static_cast<double>(batches_per_step));
  if (!(epoch_steps >= 0 && epoch_steps < 1e15)) {
    throw InputError(where + ": train.epochs " + std::to_string(t.epochs) + " of " + std::to_string(batches_per_epoch) +
                     " batches is too many steps");
  }
  // Whichever of train.epochs (over the script's data now) and train.max_steps ends first.
  const auto steps = static_cast<int64_t>(epoch_steps);
  total_steps_ = t.max_steps > 0 ? (t.epochs > 0 ? std::min(steps, t.max_steps) : t.max_steps) : steps;
  schedule_.total_steps = total_steps_;
  ledger_->set_total_steps(total_steps_);
  data_batches_per_epoch_ = batches_per_epoch;
  if (resumed_at_ < 0) data_batches_fed_ = 0;  // a resumed peer goes on from its checkpoint's place
  if (model_) {
    // The start event went out with the config's plan: this one replaces it.
    log_->write(log_->event("plan")
                    .add("total_steps", total_steps_)
                    .add("batches_per_epoch", batches_per_epoch)
                    .add("batches_per_step", batches_per_step));
  }
}

void ExternalPeer::check_resumed_epoch(int64_t given, int64_t resumed, int64_t resumed_step) const {
  // The resumed place in the data (epoch, batch) means the same samples only over epochs
  // of the same length: another batch size, shard or dataset would silently shift it.
  if (resumed == 0 || given == resumed) return;
  throw InputError("peer " + spec_.name + ": the script's data has " + std::to_string(given) +
                   " batches an epoch, but the checkpoint it resumes from (step " + std::to_string(resumed_step) + ") counted " +
                   std::to_string(resumed) +
                   "; its place in the data would not be the same samples. Give the loader it had (batch size, "
                   "sampler, dataset), or start afresh (checkpoint { resume: false })");
}

void ExternalPeer::fed_batch() {
  if (data_batches_per_epoch_ == 0) {
    throw InputError("peer " + spec_.name + ": a batch of the script's data was counted before follow_data() said how many "
                     "make an epoch");
  }
  ++data_batches_fed_;
}

void ExternalPeer::share_buffers(uint64_t round) {
  std::vector<float> v(num_buffers_);
  backend_->download(v.data(), buffers_, sizeof(float) * v.size());
  const bool broadcast = buffer_sharing_ == ExternalModel::BufferSharing::kBroadcast;
  // A broadcast is the sum of peer 0's buffers and everyone else's zeros: exact in fp32.
  if (broadcast && me_ != 0) std::fill(v.begin(), v.end(), 0.0f);
  v = allreduce_sum(*engine_, MessageKind::kModel, std::move(v), round, kBufferPhase, false);
  if (!broadcast) {
    const float inv = 1.0f / static_cast<float>(peers_.size());
    for (float& x : v) x *= inv;
  }
  backend_->upload(buffers_, v.data(), sizeof(float) * v.size());
}

std::string ExternalPeer::algorithm() const { return in_cluster_ ? network_.gossip.algorithm : std::string("alone"); }

uint64_t ExternalPeer::bytes_sent() const { return engine_ ? engine_->bytes_sent() : 0; }

std::string ExternalPeer::save_state() const {
  check_attached("state_dict()");
  ckpt::Checkpoint c;
  c.set_peer(spec_.name);
  c.set_run(spec_.name);
  c.set_num_params(model_->num_params());
  c.set_step(steps_);
  // The optimizer's state is the framework's (torch's state_dict), not in this one.
  save_sampler_state(sampler_->state(), c);
  // The batches the steps taken have consumed: a state saved once the next batch is
  // drawn (a checkpoint at the next step's start) resumes with that batch.
  c.set_script_batches_fed(data_batches_fed_at_step_);
  c.set_script_batches_per_epoch(data_batches_per_epoch_);
  if (engine_) engine_->save_state(c);
  c.set_wall_s(ledger_->train_s());
  std::string out;
  c.SerializeToString(&out);
  return out;
}

void ExternalPeer::load_state(const std::string& bytes) {
  check_attached("load_state_dict()");
  const std::string where = "peer " + spec_.name + ": state_dict";
  ckpt::Checkpoint c;
  if (!c.ParseFromString(bytes)) throw InputError(where + ": not a hearsay peer state (it does not parse)");
  if (c.num_params() != model_->num_params()) {
    throw InputError(where + ": holds the state of a model of " + std::to_string(c.num_params()) + " parameters, this one has " +
                     std::to_string(model_->num_params()));
  }
  if (c.step() < 0) throw InputError(where + ": a negative step count");
  if (c.script_batches_fed() < 0 || c.script_batches_per_epoch() < 0) {
    throw InputError(where + ": a negative count of the script's batches");
  }
  // The data given first (peer.batches() before the optimizer) must be the checkpoint's.
  if (data_batches_per_epoch_ > 0) check_resumed_epoch(data_batches_per_epoch_, c.script_batches_per_epoch(), c.step());
  // The engine's part first: what is most likely not to fit throws before anything changed.
  if (engine_) engine_->load_state(c);
  sampler_->restore(load_sampler_state(c));
  steps_ = c.step();
  resumed_at_ = c.step();
  resumed_batches_per_epoch_ = c.script_batches_per_epoch();
  data_batches_fed_ = data_batches_fed_at_step_ = c.script_batches_fed();
  synchronize();
  log_->write(log_->event("resume").add("step", steps_).add("path", std::string("state_dict")).add("their_wall_s", c.wall_s()));
}

void ExternalPeer::write_event(const JsonObject& event) {
  const std::string problem = log_schema::problem(event);
  if (!problem.empty()) throw InputError("peer " + spec_.name + ": event not written: " + problem);
  log_->write(event);
}

std::vector<float> ExternalPeer::engine_params() const {
  check_attached("engine_params()");
  return model_->get_params();
}

std::vector<float> ExternalPeer::engine_grads() const {
  check_attached("engine_grads()");
  std::vector<float> g(model_->num_params());
  backend_->download(g.data(), model_->grads(), sizeof(float) * g.size());
  return g;
}

void ExternalPeer::engine_write_params(const std::vector<float>& params) {
  check_attached("engine_write_params()");
  if (params.size() != model_->num_params()) {
    throw InputError("engine_write_params: " + std::to_string(params.size()) + " values for " +
                     std::to_string(model_->num_params()) + " parameters");
  }
  params_written();
  model_->set_params(params);
  synchronize();
}

const float* ExternalPeer::engine_params_address() const {
  check_attached("engine_params_address");
  return model_->params();
}

}  // namespace hearsay
