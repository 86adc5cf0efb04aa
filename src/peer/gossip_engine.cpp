// The engine's frame: construction, the join protocol and the step
// (its other parts: engine_send.cpp, engine_arrivals.cpp, engine_replica.cpp,
// engine_device.cpp, engine_between_steps.cpp, engine_state.cpp; made by engine_factory.cpp).

#include <random>
#include <algorithm>
#include <limits>
#include <cmath>

#include "../util/callback_gate.h"
#include "timed_optimizer.h"
#include "algorithm.h"
#include "phases.h"
#include "algorithm_registry.h"
#include "hearsay/build_config.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "mailboxes.h"
#include "update_guard.h"
#include "../mixer/robust.h"

namespace hearsay {

namespace {

// The CUDA device a peer gossips on (GossipEngine::gossip_on_device): its backend's, in a
// build with CUDA; -1 where the peer gossips on the host.
int gossip_device(const Trainable& model) {
#if HEARSAY_HAVE_CUDA
  const std::string name = model.backend().name();
  if (model.backend().is_host() || name.rfind("cuda:", 0) != 0) return -1;
  return std::stoi(name.substr(5));
#else
  (void)model;
  return -1;
#endif
}

// A random base for stream ids, in the upper half of the ids (a message's own count
// stays far below it), from the system's entropy: never the same in two lives of a peer.
uint64_t random_id_base() {
  std::random_device entropy;
  const uint64_t r = (static_cast<uint64_t>(entropy()) << 32) ^ entropy();
  return r | (uint64_t{1} << 63);
}

}  // namespace

GossipEngine::GossipEngine(const GossipSpec& spec, std::vector<std::string> peers, int me, Transport& transport,
                           Trainable& model, Optimizer& optimizer, Clock& clock, EventLog& log, uint64_t seed,
                           std::unique_ptr<Topology> topology, std::unique_ptr<Algorithm> algorithm)
    : stream_id_base_(random_id_base()), spec_(spec), peers_(std::move(peers)), me_(me), transport_(transport), model_(model), optimizer_(optimizer), clock_(clock),
      log_(log), mixer_(spec.mixer), topology_(std::move(topology)),
      rng_(seed, 500 + me), inbox_(std::make_unique<Inbox>(mixer_, gossip_device(model) >= 0, &clock, model.backend().is_host())),
      guard_(std::make_unique<UpdateGuard>(spec.guard, peers_.size())),
      robust_(std::make_unique<RobustMixing>(spec.mixer)) {
  cuda_device_ = gossip_device(model_);
  on_device_ = cuda_device_ >= 0;
  link_bps_.assign(peers_.size(), 0.0);
  seed_ = seed;
  // Made at a link's first use (outgoing_link): a peer of 1,024 keeps state only for the
  // few it talks to.
  outboxes_.resize(peers_.size());
  link_codecs_.resize(peers_.size());
  streams_.resize(peers_.size());
  for (size_t i = 0; i < peers_.size(); ++i) ack_lanes_.push_back(std::make_unique<AckLane>());
  entry_ = &algorithm_entry(spec_.algorithm);
  algorithm_ = std::move(algorithm);
  send_gate_ = std::make_shared<CallbackGate>();
  timed_optimizer_ = std::make_unique<TimedOptimizer>(
      [this]() -> Optimizer& { return optimizer_seen_ ? *optimizer_seen_ : optimizer_; }, clock_, compute_s_);
  algorithm_->attach(*this);
  transport_.set_receiver([this](const std::string& from, InFrame&& f) { on_frame(from, std::move(f)); });
}

GossipEngine::~GossipEngine() {
  stop();
  stop_copying();
  // Arrivals after this point have nowhere to go, and sends that finish tell no one.
  transport_.set_receiver(nullptr);
  send_gate_->close();
}

Outbox& GossipEngine::outgoing_link(int i) {
  if (outboxes_[i]) return *outboxes_[i];
  CodecSpec model_spec;
  model_spec.name = spec_.model_codec;
  model_spec.error_feedback = "off";  // a model's rounding is not owed to anyone
  auto lc = std::make_unique<LinkCodecs>();
  lc->seed = seed_ * 1000 + i;
  lc->update = std::make_unique<LinkEncoder>(spec_.codec, model_.param_views(), seed_ * 1000 + i);
  lc->model = std::make_unique<LinkEncoder>(model_spec, model_.param_views(), seed_ * 1000 + i);
  link_codecs_[i] = std::move(lc);
  outboxes_[i] = std::make_unique<Outbox>(
      [this, i](Message&& m, std::function<void(const SendStatus&)> done) { put_on_wire(i, std::move(m), std::move(done)); },
      mixer_);
  return *outboxes_[i];
}

int GossipEngine::index_of(const std::string& id) const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i] == id) return static_cast<int>(i);
  }
  return -1;
}

void GossipEngine::note_own_gradient(const float* g, size_t count) {
  const double sq = host_sum_squares(g, count);
  const double n = std::sqrt(sq), old = own_grad_norm_.load();
  own_grad_norm_ = old <= 0 ? n : 0.9 * old + 0.1 * n;
}

std::vector<std::string> GossipEngine::mixed_this_step() const { return mixed_this_step_; }

std::vector<std::string> GossipEngine::quarantined() const {
  std::vector<std::string> out;
  for (int i : guard_->quarantined()) out.push_back(peers_[i]);
  return out;
}

namespace {
// The join's messages: round kJoinRound, phase 0 a request for the model and 1 its answer;
// phase 2 a hello and 3 its answer, which make a neighbour count toward the quorum.
constexpr uint64_t kJoinRound = ~uint64_t{0};
constexpr uint32_t kModelRequestPhase = 0, kModelAnswerPhase = 1, kHelloPhase = 2, kHelloAnswerPhase = 3;
}  // namespace

// A neighbour that has finished its training (its final consensus's first word is held)
// keeps its links open while it waits for the others, but takes no more part: an
// algorithm that waited for it, or gave it push-sum mass, would wait or lose it.
bool GossipEngine::connected(int peer) const {
  return link_up(peer) && !inbox_->holds_sync_from(peer, kFinalRound, kFinishedPhase);
}

bool GossipEngine::link_up(int peer) const { return transport_.link_stats(peers_[peer]).connected; }

// One answer per neighbour at a time: a neighbour that asks again before it has read the
// last (or asks every step and never reads) would otherwise queue a model per request.
void GossipEngine::serve_join_requests() {
  for (int j : inbox_->take_senders_of(kJoinRound, kModelRequestPhase)) {
    if (outgoing_link(j).holds_sync(kJoinRound, kModelAnswerPhase)) continue;  // the answer on its way serves this request too
    send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = kModelAnswerPhase}, params_host());
  }
  for (int j : inbox_->take_senders_of(kJoinRound, kHelloPhase)) {
    if (outgoing_link(j).holds_sync(kJoinRound, kHelloAnswerPhase)) continue;
    send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = kHelloAnswerPhase}, {});
  }
}

void GossipEngine::join(bool adopt_model, int quorum, double quorum_timeout_s) {
  if (!entry_->joins_from_neighbour) return;  // synchronous ones start together by construction
  if (quorum > 0) wait_for_quorum(quorum, quorum_timeout_s);
  if (adopt_model) adopt_neighbour_model(5.0);
  // Answers to the tries given up on would otherwise be held for good.
  inbox_->forget_sync([](int, uint64_t round, uint32_t phase) {
    return round == kJoinRound && (phase == kModelAnswerPhase || phase == kHelloAnswerPhase);
  });
}

void GossipEngine::wait_for_quorum(int quorum, double timeout_s) {
  // A link is up as soon as the neighbour's process has admitted it, which may be long
  // before that neighbour trains (it is in its own join, or its script is still building
  // the model): only an engine answers a hello, so only a neighbour that answered counts.
  const int n = static_cast<int>(peers_.size());
  const double start = clock_.now(), deadline = start + timeout_s;
  std::vector<bool> answered(peers_.size(), false);
  std::vector<double> asked_at(peers_.size(), -1.0);
  int count = 0;
  while (count < quorum) {
    if (stopped_) return;  // the run ends as stopped, before its first step
    const double now = clock_.now();
    if (now >= deadline) {
      std::string silent, absent;
      for (int j = 0; j < n; ++j) {
        if (j == me_ || answered[j]) continue;
        std::string& list = link_up(j) ? silent : absent;
        list += (list.empty() ? "" : ", ") + peers_[j];
      }
      char waited[32];
      std::snprintf(waited, sizeof waited, "%g", timeout_s);
      throw InputError("peer " + peers_[me_] + ": " + std::to_string(count) + " of the " + std::to_string(quorum) +
                       " neighbours it needs (cluster.min_neighbours) answered within cluster.connect_timeout_s (" + waited +
                       " s)" + (silent.empty() ? "" : "; connected but not answering: " + silent +
                                                          " (still in its own join, or its program has not started "
                                                          "training: a neighbour counts once its engine answers)") +
                       (absent.empty() ? "" : "; not connected: " + absent) +
                       "; start them, or set min_neighbours: 0 to train alone until they come");
    }
    for (int j = 0; j < n; ++j) {
      // A neighbour that has finished and waits for the others to (its final consensus)
      // answers and counts: this peer's training is what it waits for.
      if (j == me_ || answered[j] || !link_up(j) || (asked_at[j] >= 0 && now - asked_at[j] < 0.5)) continue;
      send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = kHelloPhase}, {});
      asked_at[j] = now;  // asked again after a while: a hello sent before its engine was up is lost
    }
    serve_join_requests();  // peers starting together must not wait on each other
    for (int j : inbox_->take_senders_of(kJoinRound, kHelloAnswerPhase)) {
      if (j != me_ && !answered[j]) {
        answered[j] = true;
        ++count;
      }
    }
    if (count < quorum) clock_.sleep_for(0.02);
  }
  log_.write(log_.event("quorum").add("answered", static_cast<int64_t>(count)).add("wait_s", clock_.now() - start));
}

void GossipEngine::adopt_neighbour_model(double timeout_s) {
  std::vector<int> live;
  for (int j : topology_->neighbours(me_)) {
    if (connected(j)) live.push_back(j);
  }
  if (live.empty()) return;
  // From a random neighbour on, each given at most a second: one that is connected but not
  // yet stepping (still starting, or itself waiting to join) answers nothing, and the
  // next may be training. One draw, as when only one was asked: the seed's random stream
  // after the join is what it was.
  const size_t first = rng_.below(live.size());
  const double deadline = clock_.now() + timeout_s;
  for (size_t t = 0; t < live.size(); ++t) {
    const int j = live[(first + t) % live.size()];
    if (clock_.now() >= deadline || stopped_) break;
    send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = kModelRequestPhase}, {});
    const double give_up = std::min(deadline, clock_.now() + 1.0);
    std::optional<Message> m;
    while (!m && clock_.now() < give_up && !stopped_) {
      serve_join_requests();  // peers starting together must not wait on each other
      m = inbox_->wait_sync(j, kJoinRound, kModelAnswerPhase, 0.05, stopped_);
      if (m) decode_kept(*m);
    }
    if (!m) continue;
    if (m->step > 0 && m->data.size() == model_.num_params()) {
      set_params_host(m->data);
      log_.write(log_.event("join").add("from", peers_[j]).add("their_step", static_cast<int64_t>(m->step)));
    }
    break;  // an untrained neighbour's answer too: everyone is starting together
  }
}

std::vector<int> GossipEngine::live_targets(int64_t round) {
  std::vector<int> out;
  for (int t : topology_->targets(me_, round, rng_)) {
    if (connected(t)) {
      out.push_back(t);
      continue;
    }
    std::vector<int> spare;
    for (int j : topology_->neighbours(me_)) {
      if (connected(j) && std::find(out.begin(), out.end(), j) == out.end()) spare.push_back(j);
    }
    if (!spare.empty()) out.push_back(spare[rng_.below(spare.size())]);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

BatchStats GossipEngine::step(const Batch& batch, float lr) {
  check_parity();  // before anything of this step reads the model the last one left
  // The helper's copy of the parameters as the last step left them (copy_between_steps).
  start_snapshot_ = copy_between_steps_ ? take_copy() : nullptr;
  if (start_snapshot_) {
    params_sq_ = copy_sq_;  // the model now, measured by the helper as it copied it
    params_sq_step_ = steps_;
  }
  const double now = clock_.now();
  if (last_step_at_ > 0) {
    const double dt = now - last_step_at_, old = step_s_.load();
    step_s_ = old <= 0 ? dt : 0.9 * old + 0.1 * dt;
  }
  last_step_at_ = now;
  tick_streams();
  serve_join_requests();
  // Hello answers that came after this peer's join had counted its quorum: dropped, so
  // they do not hold a round's place in the inbox for good.
  inbox_->take_senders_of(kJoinRound, kHelloAnswerPhase);
  ++logical_clock_;
  work_s_ = 0;
  compute_s_ = 0;
  work_since_ = now;
  mixed_this_step_.clear();
  BatchStats s;
  in_step_ = true;
  try {
    s = algorithm_->step(*this, batch, lr, steps_);
  } catch (...) {
    start_snapshot_.reset();
    if (!owner_ends_steps_) end_step();  // what the step sent before it stopped still goes
    throw;
  }
  start_snapshot_.reset();
  work_s_ += clock_.now() - work_since_;
  ++steps_;
  samples_seen_ += static_cast<uint64_t>(batch.rows);
  if (!owner_ends_steps_) end_step();
  return s;
}

BatchStats GossipEngine::gradient(const Batch& batch, uint64_t step) { return algorithm_->gradient(*this, batch, step); }

BatchStats GossipEngine::forward_backward(const Batch& batch) {
  const double t0 = clock_.now();
  const BatchStats s = model_.forward_backward(batch);
  compute_s_ += clock_.now() - t0;
  return s;
}

int GossipEngine::batch_rows(int batch_size) const { return algorithm_->batch_rows(*this, batch_size); }

void GossipEngine::note_compute(double seconds, int rows) { algorithm_->note_compute(seconds, rows); }

uint64_t GossipEngine::bytes_sent() const {
  uint64_t b = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) != me_) b += transport_.link_stats(peers_[i]).bytes_sent;
  }
  return b;
}

size_t GossipEngine::buffered_bytes() const {
  size_t b = inbox_->buffered_bytes();
  for (const auto& o : outboxes_) b += o ? o->buffered_bytes() : 0;
  return b;
}

void GossipEngine::stop() {
  stopped_ = true;
  inbox_->wake();
}

}  // namespace hearsay
