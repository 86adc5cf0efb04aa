#include <algorithm>
#include <cmath>
#include <set>

#include "algorithm.h"
#include "hearsay/error.h"
#include "mailboxes.h"

namespace hearsay {

std::vector<std::string> gossip_algorithms() {
  return {"adpsgd", "gossip_grad", "sgp", "choco", "allreduce", "dpsgd", "local_sgd", "diloco"};
}

bool is_synchronous(const std::string& a) {
  return a == "allreduce" || a == "dpsgd" || a == "local_sgd" || a == "diloco";
}

void check_gossip_spec(const GossipSpec& s, int peers) {
  const auto all = gossip_algorithms();
  if (std::find(all.begin(), all.end(), s.algorithm) == all.end()) {
    throw InputError("algorithm '" + s.algorithm + "': unknown; use adpsgd, gossip_grad, sgp, choco, allreduce, dpsgd, local_sgd or diloco");
  }
  if (peers < 2) throw InputError("algorithm '" + s.algorithm + "': needs at least 2 peers");
  if (s.gossip_every < 1) throw InputError("gossip_every must be >= 1");
  if (s.average_every < 0) throw InputError("average_every must be >= 0");
  if (s.local_steps < 1) throw InputError("local_steps must be >= 1");
  if (!(s.outer_lr > 0) || !(s.outer_momentum >= 0 && s.outer_momentum < 1)) {
    throw InputError("diloco: outer_lr must be > 0 and outer_momentum in [0, 1)");
  }
  if (s.segment_elements < 1024) throw InputError("segment_elements must be >= 1024");
  if (!(s.consensus_step > 0 && s.consensus_step <= 1)) throw InputError("choco: consensus_step must be in (0, 1]");
}

GossipEngine::GossipEngine(const GossipSpec& spec, std::vector<std::string> peers, int me, Transport& transport,
                           Model& model, Sgd& sgd, Clock& clock, EventLog& log, uint64_t seed)
    : spec_(spec), peers_(std::move(peers)), me_(me), transport_(transport), model_(model), sgd_(sgd), clock_(clock),
      log_(log), mixer_(spec.mixer), topology_(make_topology(spec.topology, static_cast<int>(peers_.size()))),
      rng_(seed, 500 + me), inbox_(std::make_unique<Inbox>(mixer_)) {
  check_gossip_spec(spec_, static_cast<int>(peers_.size()));
  link_bps_.assign(peers_.size(), 0.0);
  for (size_t i = 0; i < peers_.size(); ++i) {
    outboxes_.push_back(std::make_unique<Outbox>(
        [this, i](Message&& m, std::function<void(const SendStatus&)> done) {
          // Segments of one message; the outbox hears back once the last has left.
          auto data = std::make_shared<std::vector<float>>(std::move(m.data));
          const size_t n = data->size();
          const size_t seg = spec_.segment_elements;
          const uint32_t count = static_cast<uint32_t>(std::max<size_t>(1, (n + seg - 1) / seg));
          const uint64_t id = next_update_id_++;
          auto remaining = std::make_shared<std::atomic<uint32_t>>(count);
          auto failed = std::make_shared<std::atomic<bool>>(false);
          const double t0 = clock_.now();
          for (uint32_t s = 0; s < count; ++s) {
            const size_t begin = s * seg, len = std::min(seg, n - std::min(n, begin));
            wire::Envelope e;
            auto* u = e.mutable_update();
            u->set_sender(peers_[me_]);
            u->set_clock(m.clock);
            u->set_step(m.step);
            u->set_samples_seen(m.samples);
            u->set_kind(m.kind);
            u->set_tensor_length(m.total);
            u->set_segment_offset(m.offset + begin);
            u->set_segment_length(len);
            u->set_update_id(id);
            u->set_segment_index(s);
            u->set_segment_count(count);
            u->set_push_sum_weight(m.push_sum_weight);
            u->set_synchronous(m.synchronous);
            u->set_round(m.round);
            u->set_phase(m.phase);
            u->set_reply_requested(m.reply_requested);
            OutFrame f = make_frame(e, reinterpret_cast<const uint8_t*>(data->data() + begin), len * sizeof(float), data);
            transport_.send(peers_[i], std::move(f), [this, i, n, t0, remaining, failed, done](const SendStatus& st) {
              if (!st.ok) *failed = true;
              if (--*remaining == 0) {
                const double dt = clock_.now() - t0;
                if (!*failed && dt > 0) {
                  const double bps = n * sizeof(float) / dt;
                  topology_->observe_throughput(me_, static_cast<int>(i), bps);
                  std::lock_guard<std::mutex> lock(link_mu_);
                  double& b = link_bps_[i];
                  b = b <= 0 ? bps : 0.8 * b + 0.2 * bps;
                }
                done(*failed ? SendStatus{false, "segment lost"} : SendStatus{});
              }
            });
          }
        },
        mixer_));
  }
  const std::string& a = spec_.algorithm;
  if (a == "adpsgd") algorithm_ = make_adpsgd();
  if (a == "gossip_grad") algorithm_ = make_gossip_grad();
  if (a == "sgp") algorithm_ = make_sgp();
  if (a == "choco") algorithm_ = make_choco();
  if (a == "allreduce") algorithm_ = make_allreduce();
  if (a == "dpsgd") algorithm_ = make_dpsgd();
  if (a == "local_sgd") algorithm_ = make_local_sgd(false);
  if (a == "diloco") algorithm_ = make_local_sgd(true);
  scratch_ = DeviceBuffer(model_.backend(), sizeof(float) * model_.num_params());
  transport_.set_receiver([this](const std::string& from, InFrame&& f) { on_frame(from, std::move(f)); });
}

GossipEngine::~GossipEngine() {
  stop();
  // Arrivals after this point have nowhere to go.
  transport_.set_receiver(nullptr);
}

int GossipEngine::index_of(const std::string& id) const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i] == id) return static_cast<int>(i);
  }
  return -1;
}

void GossipEngine::on_frame(const std::string& from, InFrame&& frame) {
  if (!frame.envelope.has_update()) return;
  const int idx = index_of(from);
  const auto& u = frame.envelope.update();
  if (idx < 0 || u.tensor_length() != model_.num_params()) {
    std::fprintf(stderr, "hearsay: peer %s: dropped an update from '%s': %s\n", peers_[me_].c_str(), from.c_str(),
                 idx < 0 ? "not a member of this cluster" : "its tensor does not match this model");
    return;
  }
  // Lamport: our clock is at least every clock we have heard.
  uint64_t c = logical_clock_.load();
  while (u.clock() > c && !logical_clock_.compare_exchange_weak(c, u.clock())) {
  }
  inbox_->add_segment(idx, u, frame.payload);
}

namespace {
constexpr uint64_t kJoinRound = ~uint64_t{0};
}  // namespace

bool GossipEngine::connected(int peer) const { return transport_.link_stats(peers_[peer]).connected; }

void GossipEngine::serve_join_requests() {
  for (int j : inbox_->take_senders_of(kJoinRound, 0)) send(j, wire::MODEL, params_host(), 0, true, kJoinRound, 1);
}

void GossipEngine::join(double timeout_s) {
  if (is_synchronous(spec_.algorithm)) return;  // they start together by construction
  std::vector<int> live;
  for (int j : topology_->neighbours(me_)) {
    if (connected(j)) live.push_back(j);
  }
  if (live.empty()) return;
  const int j = live[rng_.below(live.size())];
  send(j, wire::MODEL, {}, 0, true, kJoinRound, 0);
  const double deadline = clock_.now() + timeout_s;
  while (clock_.now() < deadline && !stopped_) {
    serve_join_requests();  // peers starting together must not wait on each other
    auto m = inbox_->wait_sync(j, kJoinRound, 1, 0.05, stopped_);
    if (!m) continue;
    if (m->step > 0 && m->data.size() == model_.num_params()) {
      set_params_host(m->data);
      log_.write(log_.event("join").add("from", peers_[j]).add("their_step", static_cast<int64_t>(m->step)));
    }
    return;
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

BatchStats GossipEngine::step(const float* x, const int32_t* labels, int batch, float lr) {
  serve_join_requests();
  ++logical_clock_;
  compute_s_ = 0;
  const BatchStats s = algorithm_->step(*this, x, labels, batch, lr, steps_);
  ++steps_;
  samples_seen_ += static_cast<uint64_t>(batch);
  return s;
}

void GossipEngine::send(int to, wire::PayloadKind kind, const std::vector<float>& data, double push_sum_weight,
                        bool synchronous, uint64_t round, uint32_t phase, bool reply_requested, uint64_t offset,
                        uint64_t total) {
  Message m;
  m.from = me_;
  m.kind = kind;
  m.clock = logical_clock_;
  m.step = steps_;
  m.samples = samples_seen_;
  m.push_sum_weight = push_sum_weight;
  m.synchronous = synchronous;
  m.round = round;
  m.phase = phase;
  m.reply_requested = reply_requested;
  m.offset = offset;
  m.total = total == 0 ? model_.num_params() : total;
  m.data = data;
  outboxes_[to]->offer(std::move(m));
}

std::vector<GossipEngine::Message> GossipEngine::take_async() { return inbox_->take_async(); }

GossipEngine::Message GossipEngine::wait_sync(int from, uint64_t round, uint32_t phase) {
  auto m = inbox_->wait_sync(from, round, phase, spec_.sync_timeout_s, stopped_);
  if (!m) {
    if (stopped_) throw StopRequested();
    throw InputError("peer " + peers_[me_] + ": " + spec_.algorithm + " waited " + std::to_string(spec_.sync_timeout_s) +
                     " s for peer " + peers_[from] + " (round " + std::to_string(round) +
                     "); synchronous algorithms do not tolerate a missing peer");
  }
  return std::move(*m);
}

std::vector<float> GossipEngine::params_host() { return model_.get_params(); }
void GossipEngine::set_params_host(const std::vector<float>& p) { model_.set_params(p); }

void GossipEngine::mix_params(const std::vector<float>& y, double w) {
  Backend& b = model_.backend();
  b.upload(scratch_.data(), y.data(), sizeof(float) * y.size());
  b.scale(y.size(), static_cast<float>(1.0 - w), model_.params());
  b.axpy(y.size(), static_cast<float>(w), scratch_.f32(), model_.params());
}

void GossipEngine::axpy_params(double a, const std::vector<float>& y) {
  Backend& b = model_.backend();
  b.upload(scratch_.data(), y.data(), sizeof(float) * y.size());
  b.axpy(y.size(), static_cast<float>(a), scratch_.f32(), model_.params());
}

void GossipEngine::note_model_distance(const std::string& peer, const std::vector<float>& y) {
  // The log reports one distance per neighbour and window: measuring every arrival would
  // copy the whole model off the device each time for numbers nobody reads.
  if (distances_.count(peer) != 0) return;
  const auto x = params_host();
  double d = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  distances_[peer] = std::sqrt(d);
}

size_t GossipEngine::buffered_bytes() const {
  size_t b = inbox_->buffered_bytes();
  for (const auto& o : outboxes_) b += o->buffered_bytes();
  return b;
}

void GossipEngine::stop() {
  stopped_ = true;
  inbox_->wake();
}

void GossipEngine::log_stats(int64_t step) {
  const Mixer::Stats m = mixer_.take_stats();
  JsonObject links;
  uint64_t sent = 0, received = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    const LinkStats s = transport_.link_stats(peers_[i]);
    sent += s.bytes_sent;
    received += s.bytes_received;
    JsonObject l;
    l.add("connected", s.connected).add("bytes_sent", static_cast<int64_t>(s.bytes_sent));
    l.add("bytes_received", static_cast<int64_t>(s.bytes_received)).add("queue", static_cast<int64_t>(s.queue_depth));
    if (s.rtt_s >= 0) l.add("rtt_s", s.rtt_s);
    {
      std::lock_guard<std::mutex> lock(link_mu_);
      if (link_bps_[i] > 0) l.add("throughput_Bps", link_bps_[i]);
    }
    links.add_raw(peers_[i], l.str());
  }
  auto e = log_.event("gossip");
  e.add("step", step)
      .add("clock", static_cast<int64_t>(logical_clock_.load()))
      .add("bytes_sent", static_cast<int64_t>(sent))
      .add("bytes_received", static_cast<int64_t>(received))
      .add("applied", static_cast<int64_t>(m.applied))
      .add("dropped", static_cast<int64_t>(m.dropped))
      .add("coalesced", static_cast<int64_t>(m.coalesced))
      .add("tau_p50", m.tau_p50)
      .add("tau_p90", m.tau_p90)
      .add("tau_p99", m.tau_p99)
      .add("tau_max", m.tau_max)
      .add("weight_mean", m.weight_mean)
      .add("buffered_bytes", static_cast<int64_t>(buffered_bytes()))
      .add_raw("links", links.str());
  if (!distances_.empty()) {
    JsonObject d;
    for (const auto& [peer, dist] : distances_) d.add(peer, dist);
    e.add_raw("model_distance", d.str());
    distances_.clear();
  }
  log_.write(e);
}

}  // namespace hearsay
