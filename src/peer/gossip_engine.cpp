#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include "hearsay/checkpoint.pb.h"
#include "algorithm.h"
#include "algorithm_registry.h"
#include "hearsay/checkpoint.h"
#include "hearsay/error.h"
#include "mailboxes.h"
#include "update_guard.h"
#include "../mixer/robust.h"

namespace hearsay {

void check_gossip_spec(const GossipSpec& s, int peers) {
  const AlgorithmEntry& entry = algorithm_entry(s.algorithm);
  if (peers < 2) throw InputError("algorithm '" + s.algorithm + "': needs at least 2 peers");
  if (s.gossip_every < 1) throw InputError("gossip_every must be >= 1");
  if (!(s.sync_timeout_s > 0)) throw InputError("sync_timeout_s must be > 0");
  if (s.segment_elements < 1024) throw InputError("segment_elements must be >= 1024");
  if (s.byzantine != "none" && s.byzantine != "scaled" && s.byzantine != "sign_flip" && s.byzantine != "random") {
    throw InputError("byzantine '" + s.byzantine + "': use none, scaled, sign_flip or random");
  }
  if (!(s.guard.max_norm_ratio >= 0) || s.guard.strikes < 0 || !(s.guard.quarantine_s >= 0)) {
    throw InputError("guard: max_norm_ratio and quarantine_s must be >= 0 and strikes >= 0");
  }
  check_codec_spec(s.codec);
  if (s.model_codec != "none" && s.model_codec != "fp16" && s.model_codec != "bf16" && s.model_codec != "int8") {
    throw InputError("codec.model_codec '" + s.model_codec + "': use none, fp16, bf16 or int8 (whole models are not sparsified)");
  }
  const AdaptiveSpec& a = s.adaptive;
  if (!(a.step_fraction > 0) || !(a.min_density > 0 && a.min_density <= a.max_density && a.max_density <= 1)) {
    throw InputError("codec: adaptive needs step_fraction > 0 and 0 < min_density <= max_density <= 1");
  }
  check_algorithm_topology(s, peers);
  if (entry.check) {
    const auto options = parse_algorithm_options(entry, s.options);
    try {
      entry.check(*options, s, peers);
    } catch (const OptionError& e) {
      throw InputError(s.algorithm + " options: " + e.what());
    }
  }
}

void check_algorithm_topology(const GossipSpec& s, int peers) {
  const AlgorithmEntry* entry = find_algorithm(s.algorithm);
  if (entry == nullptr || !entry->undirected_topology || peers < 2) return;
  const auto t = make_topology(s.topology, peers);
  for (int i = 0; i < peers; ++i) {
    for (int j : t->neighbours(i)) {
      const auto back = t->neighbours(j);
      if (std::find(back.begin(), back.end(), i) != back.end()) continue;
      throw InputError(s.algorithm + " needs an undirected topology, and '" + s.topology.kind + "' on " + std::to_string(peers) +
                       " peers is directed (peer " + std::to_string(i) + " sends to peer " + std::to_string(j) +
                       ", which never sends back): its Metropolis-Hastings weights would not be doubly stochastic and "
                       "each round would wait for messages that never come; use ring, torus, complete, random, "
                       "hierarchical, bandwidth or star");
    }
  }
}

GossipEngine::GossipEngine(const GossipSpec& spec, std::vector<std::string> peers, int me, Transport& transport,
                           Trainable& model, Optimizer& optimizer, Clock& clock, EventLog& log, uint64_t seed)
    : spec_(spec), peers_(std::move(peers)), me_(me), transport_(transport), model_(model), optimizer_(optimizer), clock_(clock),
      log_(log), mixer_(spec.mixer), topology_(make_topology(spec.topology, static_cast<int>(peers_.size()))),
      rng_(seed, 500 + me), inbox_(std::make_unique<Inbox>(mixer_)),
      guard_(std::make_unique<UpdateGuard>(spec.guard, peers_.size())),
      robust_(std::make_unique<RobustMixing>(spec.mixer)) {
  check_gossip_spec(spec_, static_cast<int>(peers_.size()));
  link_bps_.assign(peers_.size(), 0.0);
  for (size_t i = 0; i < peers_.size(); ++i) {
    outboxes_.push_back(std::make_unique<Outbox>(
        [this, i](Message&& m, std::function<void(const SendStatus&)> done) {
          put_on_wire(static_cast<int>(i), std::move(m), std::move(done));
        },
        mixer_));
    CodecSpec model_spec;
    model_spec.name = spec_.model_codec;
    model_spec.error_feedback = "off";  // a model's rounding is not owed to anyone
    auto lc = std::make_unique<LinkCodecs>();
    lc->update = std::make_unique<LinkEncoder>(spec_.codec, model_.param_views(), seed * 1000 + i);
    lc->model = std::make_unique<LinkEncoder>(model_spec, model_.param_views(), seed * 1000 + i);
    link_codecs_.push_back(std::move(lc));
  }
  entry_ = &algorithm_entry(spec_.algorithm);
  algorithm_ = entry_->make(spec_, *parse_algorithm_options(*entry_, spec_.options));
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

// Cuts a message into segments, encodes each with the link's codec for its kind, and
// sends them; `done` hears once the last has left. Synchronous exchanges and messages on
// links without a codec travel as raw fp32, referenced rather than copied.
void GossipEngine::put_on_wire(int i, Message&& m, std::function<void(const SendStatus&)> done) {
  auto data = std::make_shared<std::vector<float>>(std::move(m.data));
  const size_t n = data->size();
  LinkCodecs& lc = *link_codecs_[i];
  std::unique_lock<std::mutex> codec_lock(lc.mu);  // one message per link at a time anyway
  LinkEncoder* enc = nullptr;
  const bool push_sum = m.kind == MessageKind::kPushSum && !m.synchronous;
  std::vector<float> rounding;  // push-sum: what a lossy codec took off the numerator
  const Compression compression = m.synchronous || n == 0 ? Compression::kNone : entry_->compression_of(m.kind);
  if (compression != Compression::kNone) {
    const bool update = compression == Compression::kUpdate;
    if (spec_.adaptive.enabled) adapt_codec(i, n, update);
    enc = update ? lc.update.get() : lc.model.get();
    if (enc->spec().name == "none" && !enc->error_feedback()) enc = nullptr;
  }
  auto segs = enc != nullptr ? enc->codec().segments(n, spec_.segment_elements) : even_segments(n, spec_.segment_elements);
  if (m.encoded) {
    segs.clear();
    for (const auto& s : m.encoded->segments) segs.emplace_back(s.offset, s.length);
  }
  const uint32_t count = static_cast<uint32_t>(segs.size());
  const uint64_t id = next_update_id_++;
  wire::Envelope e;
  auto* u = e.mutable_update();
  write_header(m, peers_[me_], u);
  u->set_update_id(id);
  u->set_segment_count(count);
  std::vector<OutFrame> frames;
  size_t bytes = 0;
  for (uint32_t s = 0; s < count; ++s) {
    const auto [begin, len] = segs[s];
    u->set_segment_offset(m.offset + begin);
    u->set_segment_length(len);
    u->set_segment_index(s);
    if (m.encoded) {
      const auto& seg = m.encoded->segments[s];
      write_codec_params(seg.params, u->mutable_codec());
      frames.push_back(make_frame(e, seg.payload->data(), seg.payload->size(), seg.payload));
    } else if (enc == nullptr) {
      frames.push_back(make_frame(e, reinterpret_cast<const uint8_t*>(data->data() + begin), len * sizeof(float), data));
    } else {
      auto payload = std::make_shared<std::vector<uint8_t>>();
      CodecParams params;
      enc->encode(data->data() + begin, len, m.offset + begin, m.total, *payload, params);
      write_codec_params(params, u->mutable_codec());
      if (push_sum) {
        // The numerator becomes exactly what the receiver will decode, and the rounding
        // goes back to the sender's own x: one push moves mass, it never loses any.
        std::vector<float> sent(len, 0.0f);
        decode_accumulate(params, payload->data(), payload->size(), 1.0f, sent.data(), len);
        rounding.resize(n, 0.0f);
        for (size_t k = 0; k < len; ++k) {
          float& x = (*data)[begin + k];
          rounding[begin + k] = x - sent[k];
          x = sent[k];
        }
      }
      frames.push_back(make_frame(e, payload->data(), payload->size(), payload));
    }
    bytes += frames.back().size();
  }
  codec_lock.unlock();
  if (!rounding.empty()) give_back(rounding, m.offset, 0);
  // A push whose send fails is given back whole: mass is never silently lost.
  auto returned = push_sum ? data : nullptr;
  const double weight = m.push_sum_weight;
  const uint64_t offset = m.offset;
  auto remaining = std::make_shared<std::atomic<uint32_t>>(count);
  auto failed = std::make_shared<std::atomic<bool>>(false);
  const double t0 = clock_.now();
  for (auto& f : frames) {
    transport_.send(peers_[i], std::move(f), [this, i, bytes, t0, remaining, failed, done, returned, weight,
                                              offset](const SendStatus& st) {
      if (!st.ok) *failed = true;
      if (--*remaining != 0) return;
      if (*failed && returned) give_back(*returned, offset, weight);
      const double dt = clock_.now() - t0;
      if (!*failed && dt > 0) {
        const double bps = static_cast<double>(bytes) / dt;
        topology_->observe_throughput(me_, i, bps);
        std::lock_guard<std::mutex> lock(link_mu_);
        double& b = link_bps_[i];
        b = b <= 0 ? bps : 0.8 * b + 0.2 * bps;
      }
      done(*failed ? SendStatus{false, "segment lost"} : SendStatus{});
    });
  }
}

// With lc.mu held. Re-chooses link i's codec for updates (gradients, deltas) or for whole
// models from its throughput and the step time; logs a "codec" event when the choice
// moves (another codec, or density by over a quarter).
void GossipEngine::adapt_codec(int i, size_t n, bool update) {
  double bps;
  {
    std::lock_guard<std::mutex> lock(link_mu_);
    bps = link_bps_[i];
  }
  LinkEncoder& enc = update ? *link_codecs_[i]->update : *link_codecs_[i]->model;
  CodecChoice c = choose_codec(spec_.adaptive, enc.spec(), n, bps, step_s_.load(), !update);
  // An update's residual carries across codec changes, so nothing already owed is lost;
  // a model's rounding is owed to no one.
  c.spec.error_feedback = update ? (spec_.codec.error_feedback == "off" ? "off" : "on") : "off";
  const CodecSpec& now = enc.spec();
  auto same = [&](const CodecSpec& a) {
    return a.name == now.name && (a.name != "topk" || std::fabs(a.density / now.density - 1) <= 0.25);
  };
  // Hysteresis: the current codec stays while it is the choice for a budget anywhere
  // between 80% and 100% of this one, so a link near a boundary does not flap.
  AdaptiveSpec tighter = spec_.adaptive;
  tighter.step_fraction *= 0.8;
  if (same(c.spec) || same(choose_codec(tighter, enc.spec(), n, bps, step_s_.load(), !update).spec)) return;
  enc.set_spec(c.spec);
  auto e = log_.event("codec");
  e.add("link", peers_[i]).add("payload", update ? "update" : "model").add("codec", c.spec.name);
  e.add("bandwidth_Bps", bps).add("step_s", step_s_.load());
  e.add("budget_bytes", c.budget_bytes).add("expected_bytes", c.expected_bytes).add("reason", c.reason);
  if (c.spec.name == "topk") e.add("density", c.spec.density);
  log_.write(e);
}

void GossipEngine::on_frame(const std::string& from, InFrame&& frame) {
  if (!frame.envelope->has_update()) return;
  const int idx = index_of(from);
  const auto& u = frame.envelope->update();
  // An asynchronous update is always the whole model's size; a synchronous one may be a
  // smaller vector of a collective (PowerSGD's factors), never a larger one.
  const bool fits = u.synchronous() ? u.tensor_length() <= model_.num_params() : u.tensor_length() == model_.num_params();
  if (idx < 0 || !fits) {
    std::fprintf(stderr, "hearsay: peer %s: dropped an update from '%s': %s\n", peers_[me_].c_str(), from.c_str(),
                 idx < 0 ? "not a member of this cluster" : "its tensor does not match this model");
    return;
  }
  // A quarantined neighbour's updates are not even decoded.
  if (!guard_->admits(idx, clock_.now())) {
    ++rejected_;
    return;
  }
  // Lamport: our clock is at least every clock we have heard.
  uint64_t c = logical_clock_.load();
  while (u.clock() > c && !logical_clock_.compare_exchange_weak(c, u.clock())) {
  }
  const std::string err = inbox_->add_segment(idx, u, frame.payload.data(), frame.payload.size());
  if (!err.empty()) refuse(idx, err);
}

void GossipEngine::refuse(int from, const std::string& why) {
  ++rejected_;
  std::fprintf(stderr, "hearsay: peer %s: refused an update from '%s': %s\n", peers_[me_].c_str(), peers_[from].c_str(),
               why.c_str());
  if (guard_->refuse(from, clock_.now(), why)) {
    std::fprintf(stderr, "hearsay: peer %s: neighbour '%s' quarantined for %g s after %d refused updates in a row (last: %s)\n",
                 peers_[me_].c_str(), peers_[from].c_str(), spec_.guard.quarantine_s, spec_.guard.strikes, why.c_str());
  }
}

std::vector<GossipEngine::Message> GossipEngine::screen(std::vector<Message> arrivals) {
  std::vector<Message> out;
  double model_norm = -1;  // measured once, and only when something arrived
  for (auto& m : arrivals) {
    if (!guard_->admits(m.from, clock_.now())) {
      ++rejected_;
      continue;
    }
    double sq = 0;
    for (float v : m.data) sq += static_cast<double>(v) * v;
    if (model_norm < 0 && m.kind != MessageKind::kGradient) {
      double x2 = 0;
      for (float v : params_host()) x2 += static_cast<double>(v) * v;
      model_norm = std::sqrt(x2);
    }
    // Folded gradients and deltas are sums of their parts; a folded model is the newest one.
    const uint64_t parts = m.kind == MessageKind::kModel ? 1 : m.coalesced + 1;
    const std::string why = check_update_norm(spec_.guard, m.kind, std::sqrt(sq), parts, model_norm, own_grad_norm_.load());
    if (!why.empty()) {
      refuse(m.from, why);
      continue;
    }
    guard_->pass(m.from);
    mixed_this_step_.push_back(peers_[m.from]);
    out.push_back(std::move(m));
  }
  return out;
}

void GossipEngine::note_own_gradient(const std::vector<float>& g) {
  double sq = 0;
  for (float v : g) sq += static_cast<double>(v) * v;
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
constexpr uint64_t kJoinRound = ~uint64_t{0};
}  // namespace

bool GossipEngine::connected(int peer) const { return transport_.link_stats(peers_[peer]).connected; }

void GossipEngine::serve_join_requests() {
  for (int j : inbox_->take_senders_of(kJoinRound, 0)) send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = 1}, params_host());
}

void GossipEngine::join(double timeout_s) {
  if (!entry_->joins_from_neighbour) return;  // synchronous ones start together by construction
  std::vector<int> live;
  for (int j : topology_->neighbours(me_)) {
    if (connected(j)) live.push_back(j);
  }
  if (live.empty()) return;
  const int j = live[rng_.below(live.size())];
  send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = 0}, {});
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

BatchStats GossipEngine::step(const Batch& batch, float lr) {
  const double now = clock_.now();
  if (last_step_at_ > 0) {
    const double dt = now - last_step_at_, old = step_s_.load();
    step_s_ = old <= 0 ? dt : 0.9 * old + 0.1 * dt;
  }
  last_step_at_ = now;
  serve_join_requests();
  ++logical_clock_;
  compute_s_ = 0;
  mixed_this_step_.clear();
  const BatchStats s = algorithm_->step(*this, batch, lr, steps_);
  ++steps_;
  samples_seen_ += static_cast<uint64_t>(batch.rows);
  return s;
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_once(const std::vector<float>& data, uint64_t offset) {
  if (!once_codec_) {
    CodecSpec s = spec_.codec;
    s.error_feedback = "on";  // picks random-k unscaled (a contraction); no residual is kept here
    once_codec_ = make_codec(s, model_.param_views(), rng_.next_u64());
  }
  auto out = std::make_shared<Encoded>();
  out->decoded.assign(data.size(), 0.0f);
  for (const auto& [begin, len] : once_codec_->segments(data.size(), spec_.segment_elements)) {
    Encoded::Segment s;
    s.offset = begin;
    s.length = len;
    auto payload = std::make_shared<std::vector<uint8_t>>();
    once_codec_->encode(data.data() + begin, len, offset + begin, *payload, s.params);
    // Decoded exactly as a receiver's inbox decodes it: into zeros, scale 1.
    const std::string err = decode_accumulate(s.params, payload->data(), payload->size(), 1.0f, out->decoded.data() + begin, len);
    HEARSAY_CHECK(err.empty(), "encode_once: the payload just encoded does not decode: " + err);
    s.payload = std::move(payload);
    out->segments.push_back(std::move(s));
  }
  return out;
}

void GossipEngine::send_encoded(int to, Message m, std::shared_ptr<const Encoded> update) {
  m.encoded = std::move(update);
  send(to, std::move(m), {});
}

void GossipEngine::send(int to, Message m, std::vector<float> data) {
  m.from = me_;
  m.clock = logical_clock_;
  m.step = steps_;
  m.samples = samples_seen_;
  if (m.total == 0) m.total = model_.num_params();
  m.data = std::move(data);
  if (spec_.byzantine != "none" && !m.synchronous && !m.data.empty()) lie(m.data);
  outboxes_[to]->offer(std::move(m));
}

// Fault injection (spec.byzantine): what a Byzantine peer sends instead of the truth,
// each chosen to pass the norm check (at its default ratio) so that only robust mixing
// can stop it.
void GossipEngine::lie(std::vector<float>& v) {
  if (spec_.byzantine == "scaled") {
    for (float& x : v) x *= 5.0f;
  } else if (spec_.byzantine == "sign_flip") {
    for (float& x : v) x = -x;
  } else if (spec_.byzantine == "random") {
    double sq = 0;
    for (float x : v) sq += double(x) * x;
    const double sigma = std::sqrt(sq / static_cast<double>(v.size()));
    for (float& x : v) x = static_cast<float>(sigma * rng_.normal());
  }
}

std::vector<GossipEngine::Message> GossipEngine::take_async() { return screen(inbox_->take_async()); }

void GossipEngine::give_back(const std::vector<float>& x, uint64_t offset, double w) {
  std::lock_guard<std::mutex> lock(returned_mu_);
  if (returned_x_.empty()) returned_x_.assign(model_.num_params(), 0.0f);
  for (size_t k = 0; k < x.size() && offset + k < returned_x_.size(); ++k) returned_x_[offset + k] += x[k];
  returned_w_ += w;
}

GossipEngine::Message GossipEngine::take_returned() {
  Message m;
  m.from = me_;
  m.kind = MessageKind::kPushSum;
  std::lock_guard<std::mutex> lock(returned_mu_);
  m.data = std::move(returned_x_);
  m.push_sum_weight = returned_w_;
  returned_x_.clear();
  returned_w_ = 0;
  return m;
}

bool GossipEngine::unsent_since(uint64_t step) const {
  for (const auto& o : outboxes_) {
    const auto oldest = o->oldest_unsent_step();
    if (oldest && *oldest <= step) return true;
  }
  return false;
}

void GossipEngine::wait_sent(uint64_t step) {
  while (unsent_since(step)) {
    if (stopped_) throw StopRequested();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

bool GossipEngine::idle() const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    if (outboxes_[i]->buffered_bytes() > 0 || transport_.link_stats(peers_[i]).queue_depth > 0) return false;
  }
  return true;
}

void GossipEngine::settle() { algorithm_->settle(*this); }

GossipEngine::Message GossipEngine::wait_sync(int from, uint64_t round, uint32_t phase) {
  std::string refused;
  auto m = inbox_->wait_sync(from, round, phase, spec_.sync_timeout_s, stopped_, &refused);
  if (!m) {
    if (stopped_) throw StopRequested();
    if (!refused.empty()) {
      throw InputError("peer " + peers_[me_] + ": " + spec_.algorithm + " refused peer " + peers_[from] + "'s update for round " +
                       std::to_string(round) + " (" + refused + "); a synchronous algorithm cannot go on without it");
    }
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

void GossipEngine::mix_neighbour_model(int from, const std::vector<float>& y, double w) {
  if (spec_.mixer.robust == MixerSpec::Robust::kNone) return mix_params(y, w);
  mix_params(robust_->target(from, params_host(), y), w);
}

void GossipEngine::move_toward_neighbour(int from, const std::vector<float>& base, const std::vector<float>& y, double w) {
  std::vector<float> diff = spec_.mixer.robust == MixerSpec::Robust::kNone ? y : robust_->target(from, base, y);
  for (size_t i = 0; i < diff.size(); ++i) diff[i] -= base[i];
  axpy_params(w, diff);
}

void GossipEngine::axpy_host(double a, const std::vector<float>& y, float* device_dst) {
  Backend& b = model_.backend();
  b.upload(scratch_.data(), y.data(), sizeof(float) * y.size());
  b.axpy(y.size(), static_cast<float>(a), scratch_.f32(), device_dst);
}

void GossipEngine::axpy_params(double a, const std::vector<float>& y) { axpy_host(a, y, model_.params()); }
void GossipEngine::axpy_grads(double a, const std::vector<float>& y) { axpy_host(a, y, model_.grads()); }

void GossipEngine::note_model_distance(const std::string& peer, const std::vector<float>& y) {
  // The log reports one distance per neighbour and window: measuring every arrival would
  // copy the whole model off the device each time for numbers nobody reads.
  if (distances_.count(peer) != 0) return;
  const auto x = params_host();
  double d = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  distances_[peer] = std::sqrt(d);
}

uint64_t GossipEngine::bytes_sent() const {
  uint64_t b = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) != me_) b += transport_.link_stats(peers_[i]).bytes_sent;
  }
  return b;
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

void GossipEngine::save_state(ckpt::Checkpoint& c) const {
  c.set_logical_clock(logical_clock_.load());
  c.set_samples_seen(samples_seen_);
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    for (const auto& [kind, enc] : {std::pair{"update", link_codecs_[i]->update.get()}, std::pair{"model", link_codecs_[i]->model.get()}}) {
      auto* l = c.add_links();
      l->set_peer(peers_[i]);
      l->set_kind(kind);
      l->set_codec(enc->spec().name);
      l->set_density(enc->spec().density);
      l->set_residual(floats_to_bytes(enc->residual().data(), enc->residual().size()));
    }
  }
  c.set_algorithm_state(algorithm_->save());
}

std::string GossipEngine::algorithm_state() const { return algorithm_->save(); }

void GossipEngine::load_state(const ckpt::Checkpoint& c) {
  logical_clock_ = c.logical_clock();
  steps_ = static_cast<uint64_t>(c.step());
  samples_seen_ = c.samples_seen();
  for (const auto& l : c.links()) {
    const int i = index_of(l.peer());
    if (i < 0 || i == me_) throw InputError("checkpoint: link state for '" + l.peer() + "', not a neighbour in this cluster");
    if (l.kind() != "update" && l.kind() != "model") throw InputError("checkpoint: link state of unknown kind '" + l.kind() + "'");
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    LinkEncoder& enc = l.kind() == "update" ? *link_codecs_[i]->update : *link_codecs_[i]->model;
    if (spec_.adaptive.enabled && l.codec() != enc.spec().name) {
      CodecSpec chosen = enc.spec();
      chosen.name = l.codec();
      chosen.density = l.density();
      check_codec_spec(chosen);
      enc.set_spec(chosen);  // where adaptation had got to
    }
    if (!l.residual().empty()) {
      if (!enc.error_feedback()) continue;  // error feedback is off now: nothing is owed
      enc.residual().resize(model_.num_params());
      bytes_to_floats(l.residual(), enc.residual().data(), model_.num_params(), "checkpoint: residual of link " + l.peer());
    }
  }
  algorithm_->load(c.algorithm_state(), *this);
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
      std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
      const CodecSpec& c = link_codecs_[i]->update->spec();
      l.add("codec", c.name).add("model_codec", link_codecs_[i]->model->spec().name);
      if (c.name == "topk" || c.name == "randomk") l.add("density", c.density);
    }
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
      .add("rejected", static_cast<int64_t>(rejected_.load()))
      .add("tau_p50", m.tau_p50)
      .add("tau_p90", m.tau_p90)
      .add("tau_p99", m.tau_p99)
      .add("tau_max", m.tau_max)
      .add("weight_mean", m.weight_mean)
      .add("buffered_bytes", static_cast<int64_t>(buffered_bytes()))
      .add_raw("links", links.str());
  {
    JsonObject refused;
    for (const auto& [why, n] : guard_->refused()) refused.add(why, static_cast<int64_t>(n));
    e.add_raw("refused", refused.str());
    std::string q = "[";
    for (const auto& name : quarantined()) q += (q.size() > 1 ? ",\"" : "\"") + json_escape(name) + "\"";
    e.add_raw("quarantined", q + "]");
  }
  for (const auto& ev : guard_->take_events()) {
    auto qe = log_.event("quarantine");
    qe.add("step", step).add("neighbour", peers_[ev.peer]).add("state", ev.quarantined ? "on" : "off").add("reason", ev.reason);
    if (ev.quarantined) qe.add("for_s", spec_.guard.quarantine_s);
    log_.write(qe);
  }
  if (!distances_.empty()) {
    JsonObject d;
    for (const auto& [peer, dist] : distances_) d.add(peer, dist);
    e.add_raw("model_distance", d.str());
    distances_.clear();
  }
  log_.write(e);
}

}  // namespace hearsay
