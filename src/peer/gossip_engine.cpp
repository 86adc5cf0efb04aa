#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <set>
#include <thread>

#include "hearsay/checkpoint.pb.h"
#include "algorithm.h"
#include "algorithm_registry.h"
#include "hearsay/build_config.h"
#include "hearsay/checkpoint.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "chunked_copy.h"
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

}  // namespace

void check_gossip_spec(const GossipSpec& s, int peers) {
  const AlgorithmEntry& entry = algorithm_entry(s.algorithm);
  if (peers < 2) throw InputError("algorithm '" + s.algorithm + "': needs at least 2 peers");
  if (s.gossip_every < 1) throw InputError("gossip_every must be >= 1");
  if (!(s.sync_timeout_s > 0)) throw InputError("sync_timeout_s must be > 0");
  if (s.segment_elements < 1024) throw InputError("segment_elements must be >= 1024");
  if (s.byzantine != "none" && s.byzantine != "scaled" && s.byzantine != "sign_flip" && s.byzantine != "random" &&
      s.byzantine != "absurd") {
    throw InputError("byzantine '" + s.byzantine + "': use none, scaled, sign_flip, random or absurd");
  }
  if (!(s.guard.max_norm_ratio >= 0) || s.guard.strikes < 0 || !(s.guard.quarantine_s >= 0)) {
    throw InputError("guard: max_norm_ratio and quarantine_s must be >= 0 and strikes >= 0");
  }
  check_codec_spec(s.codec);
  check_site_replicas(s, peers);
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
  if (leaders_run(s)) {
    // The algorithm runs among the sites' leaders: its topology is the one among sites.
    int sites = 0;
    const GossipSpec among = among_sites(s, peers, &sites);
    if (sites >= 2) check_algorithm_topology(among, sites);
    return;
  }
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
      log_(log), mixer_(spec.mixer), topology_(make_engine_topology(spec, static_cast<int>(peers_.size()))),
      rng_(seed, 500 + me), inbox_(std::make_unique<Inbox>(mixer_, gossip_device(model) >= 0, &clock)),
      guard_(std::make_unique<UpdateGuard>(spec.guard, peers_.size())),
      robust_(std::make_unique<RobustMixing>(spec.mixer)) {
  check_gossip_spec(spec_, static_cast<int>(peers_.size()));
  cuda_device_ = gossip_device(model_);
  on_device_ = cuda_device_ >= 0;
  link_bps_.assign(peers_.size(), 0.0);
  seed_ = seed;
  // Made at a link's first use (outgoing_link): a peer of 1,024 keeps state only for the
  // few it talks to.
  outboxes_.resize(peers_.size());
  link_codecs_.resize(peers_.size());
  entry_ = &algorithm_entry(spec_.algorithm);
  algorithm_ = entry_->make(spec_, *parse_algorithm_options(*entry_, spec_.options));
  scratch_ = DeviceBuffer(model_.backend(), sizeof(float) * model_.num_params());
  if (leaders_run(spec_)) site_optimizer_ = site_replay_optimizer(*this, optimizer_);
  transport_.set_receiver([this](const std::string& from, InFrame&& f) { on_frame(from, std::move(f)); });
}

GossipEngine::~GossipEngine() {
  stop();
  stop_copying();
  // Arrivals after this point have nowhere to go.
  transport_.set_receiver(nullptr);
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

// Cuts a message into segments, encodes each with the link's codec for its kind, and
// sends them; `done` hears once the last has left. Synchronous exchanges and messages on
// links without a codec travel as raw fp32, referenced rather than copied.
namespace {

// The frames of one message as it is cut into segments: one Update header each (the
// message's header, its id and count, the segment's place), each with its payload.
struct SegmentFrames {
  SegmentFrames(const GossipEngine::Message& m, const std::string& sender, uint64_t id, size_t count) {
    u = envelope.mutable_update();
    write_header(m, sender, u);
    u->set_update_id(id);
    u->set_segment_count(static_cast<uint32_t>(count));
  }
  // The header of segment `index`, for the caller to add the codec's parameters to.
  wire::Update& segment(uint32_t index, uint64_t offset, uint64_t length) {
    u->set_segment_offset(offset);
    u->set_segment_length(length);
    u->set_segment_index(index);
    return *u;
  }
  void add(const uint8_t* payload, size_t size, std::shared_ptr<const void> owner) {
    frames.push_back(make_frame(envelope, payload, size, std::move(owner)));
    bytes += frames.back().size();
  }

  wire::Envelope envelope;
  wire::Update* u = nullptr;
  std::vector<OutFrame> frames;
  size_t bytes = 0;
};

}  // namespace

// With the link's codec lock held: the encoder a message of this kind travels under on
// link i (the registry's rule, re-chosen first under adaptive compression), or null when
// it travels as fp32; `update` says which of the link's two encoders it is.
LinkEncoder* GossipEngine::link_encoder(int i, const Message& m, size_t n, bool* update) {
  const Compression compression = m.synchronous || n == 0 ? Compression::kNone : entry_->compression_of(m.kind);
  *update = compression == Compression::kUpdate;
  if (compression == Compression::kNone) return nullptr;
  if (spec_.adaptive.enabled) adapt_codec(i, n, *update);
  LinkEncoder* enc = *update ? link_codecs_[i]->update.get() : link_codecs_[i]->model.get();
  return enc->spec().name == "none" && !enc->error_feedback() ? nullptr : enc;
}

void GossipEngine::put_on_wire(int i, Message&& m, std::function<void(const SendStatus&)> done) {
  if (m.device) {
    if (put_device_on_wire(i, m, done)) return;
    m.data = *m.device->host();  // the host encodes it (put_device_on_wire said why)
    m.device.reset();
  }
  // A shared tensor (send_shared) is read only; anything else is the message's own.
  std::shared_ptr<std::vector<float>> owned;
  std::shared_ptr<const std::vector<float>> data;
  if (m.shared) {
    data = std::move(m.shared);
  } else {
    owned = std::make_shared<std::vector<float>>(std::move(m.data));
    data = owned;
  }
  const size_t n = data->size();
  LinkCodecs& lc = *link_codecs_[i];
  std::unique_lock<std::mutex> codec_lock(lc.mu);  // one message per link at a time anyway
  const bool push_sum = m.kind == MessageKind::kPushSum && !m.synchronous;
  HEARSAY_CHECK(!push_sum || owned, "a push-sum share was sent shared; its rounding must go back into it");
  std::vector<float> rounding;  // push-sum: what a lossy codec took off the numerator
  bool update = false;
  LinkEncoder* enc = link_encoder(i, m, n, &update);
  auto segs = enc != nullptr ? enc->codec().segments(n, spec_.segment_elements) : even_segments(n, spec_.segment_elements);
  if (m.encoded) {
    segs.clear();
    for (const auto& s : m.encoded->segments) segs.emplace_back(s.offset, s.length);
  }
  SegmentFrames out(m, peers_[me_], next_update_id_++, segs.size());
  for (uint32_t s = 0; s < segs.size(); ++s) {
    const auto [begin, len] = segs[s];
    wire::Update& u = out.segment(s, m.offset + begin, len);
    if (m.encoded) {
      const auto& seg = m.encoded->segments[s];
      write_codec_params(seg.params, u.mutable_codec());
      out.add(seg.payload->data(), seg.payload->size(), seg.payload);
    } else if (enc == nullptr) {
      out.add(reinterpret_cast<const uint8_t*>(data->data() + begin), len * sizeof(float), data);
    } else {
      auto payload = std::make_shared<std::vector<uint8_t>>();
      CodecParams params;
      enc->encode(data->data() + begin, len, m.offset + begin, m.total, *payload, params);
      write_codec_params(params, u.mutable_codec());
      if (push_sum) {
        // The numerator becomes exactly what the receiver will decode, and the rounding
        // goes back to the sender's own x: one push moves mass, it never loses any.
        std::vector<float> sent(len, 0.0f);
        decode_accumulate(params, payload->data(), payload->size(), 1.0f, sent.data(), len);
        rounding.resize(n, 0.0f);
        for (size_t k = 0; k < len; ++k) {
          float& x = (*owned)[begin + k];
          rounding[begin + k] = x - sent[k];
          x = sent[k];
        }
      }
      out.add(payload->data(), payload->size(), payload);
    }
  }
  codec_lock.unlock();
  if (!rounding.empty()) give_back(rounding, m.offset, 0);
  sent_by_kind_[static_cast<size_t>(m.kind)] += out.bytes;
  // A push whose send fails is given back whole: mass is never silently lost.
  send_frames(i, std::move(out.frames), out.bytes, std::move(done), push_sum ? owned : nullptr, m.push_sum_weight, m.offset);
}

void GossipEngine::send_frames(int i, std::vector<OutFrame> frames, size_t bytes, std::function<void(const SendStatus&)> done,
                               std::shared_ptr<const std::vector<float>> returned, double weight, uint64_t offset) {
  const uint32_t count = static_cast<uint32_t>(frames.size());
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
    if (model_norm < 0 && m.kind != MessageKind::kGradient) model_norm = this->model_norm();
    // Folded gradients and deltas are sums of their parts; a folded model is the newest one.
    const uint64_t parts = m.kind == MessageKind::kModel ? 1 : m.coalesced + 1;
    const std::string why = check_update_norm(spec_.guard, m.kind, norm_of(m), parts, model_norm, own_grad_norm_.load());
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
  const double sq = host_sum_squares(g.data(), g.size());
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

// One answer per neighbour at a time: a neighbour that asks again before it has read the
// last (or asks every step and never reads) would otherwise queue a model per request.
void GossipEngine::serve_join_requests() {
  for (int j : inbox_->take_senders_of(kJoinRound, 0)) {
    if (outgoing_link(j).holds_sync(kJoinRound, 1)) continue;  // the answer on its way serves this request too
    send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = 1}, params_host());
  }
}

void GossipEngine::join(double timeout_s) {
  if (!entry_->joins_from_neighbour) return;  // synchronous ones start together by construction
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
    send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kJoinRound, .phase = 0}, {});
    const double give_up = std::min(deadline, clock_.now() + 1.0);
    std::optional<Message> m;
    while (!m && clock_.now() < give_up && !stopped_) {
      serve_join_requests();  // peers starting together must not wait on each other
      m = inbox_->wait_sync(j, kJoinRound, 1, 0.05, stopped_);
    }
    if (!m) continue;
    if (m->step > 0 && m->data.size() == model_.num_params()) {
      set_params_host(m->data);
      log_.write(log_.event("join").add("from", peers_[j]).add("their_step", static_cast<int64_t>(m->step)));
    }
    break;  // an untrained neighbour's answer too: everyone is starting together
  }
  // Answers to the tries given up on would otherwise be held for good.
  inbox_->forget_sync([](int, uint64_t round, uint32_t phase) { return round == kJoinRound && phase == 1; });
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
  serve_join_requests();
  ++logical_clock_;
  work_s_ = 0;
  work_since_ = now;
  mixed_this_step_.clear();
  // Site replicas: a member takes part in its site's gradient sum and adopts its
  // leader's model; the leader runs the algorithm, then sends its site that model.
  const SiteRole role = site_role(*this);
  if (steps_ == 0 && spec_.site_replicas) log_site(*this, role);
  BatchStats s;
  in_step_ = true;
  try {
    try {
      if (role == SiteRole::kLeader) {
        refresh_site_leaders(*this);
        begin_site_replay(*this);
      }
      s = role == SiteRole::kMember ? site_member_step(*this, batch, lr, steps_) : algorithm_->step(*this, batch, lr, steps_);
      if (role == SiteRole::kLeader) send_site_update(*this, steps_);
    } catch (const SiteViewChanged& changed) {
      end_site_replay(*this);
      // The step is given up: the site holds its decider's model, and a peer that was
      // behind the newest skips to its step.
      s = changed.stats;
      steps_ += changed.skip;
      skipped_steps_ += static_cast<int64_t>(changed.skip);
    }
  } catch (...) {
    end_site_replay(*this);
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

int GossipEngine::batch_rows(int batch_size) const { return site_batch_rows(*this, batch_size); }

void GossipEngine::note_compute(double seconds, int rows) {
  if (rows > 0 && seconds > 0) site_split_.seconds_per_sample = seconds / rows;
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_once(const std::vector<float>& data, uint64_t offset,
                                                                    const std::string& codec) {
  CodecSpec s = spec_.codec;
  if (!codec.empty()) s.name = codec;
  return encode_once(data, s, offset);
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_once(const std::vector<float>& data, const CodecSpec& spec,
                                                                    uint64_t offset) {
  // Kept by every setting a codec is made from (a tuple, not a string made on every call:
  // this is on every hop of every all-reduce).
  std::unique_ptr<Codec>& once_codec =
      once_codecs_[std::make_tuple(spec.name, spec.density, spec.exact_topk, spec.value_bits, spec.levels, spec.block, spec.rank)];
  if (!once_codec) {
    CodecSpec s = spec;
    s.error_feedback = "on";  // picks random-k unscaled (a contraction); no residual is kept here
    once_codec = make_codec(s, model_.param_views(), rng_.next_u64());
  }
  Codec& codec = *once_codec;
  return build_encoded(data.size(), codec.segments(data.size(), spec_.segment_elements),
                       [&](size_t begin, size_t len, std::vector<uint8_t>& payload, CodecParams& params) {
                         codec.encode(data.data() + begin, len, offset + begin, payload, params);
                       });
}

std::shared_ptr<const GossipEngine::Encoded> build_encoded(
    size_t n, const std::vector<std::pair<size_t, size_t>>& segments,
    const std::function<void(size_t offset, size_t length, std::vector<uint8_t>& payload, CodecParams& params)>& encode) {
  auto out = std::make_shared<GossipEngine::Encoded>();
  out->decoded.assign(n, 0.0f);
  for (const auto& [begin, len] : segments) {
    GossipEngine::Encoded::Segment s;
    s.offset = begin;
    s.length = len;
    auto payload = std::make_shared<std::vector<uint8_t>>();
    encode(begin, len, *payload, s.params);
    // Decoded exactly as a receiver's inbox decodes it: into zeros, scale 1.
    const std::string err = decode_accumulate(s.params, payload->data(), payload->size(), 1.0f, out->decoded.data() + begin, len);
    HEARSAY_CHECK(err.empty(), "an update just encoded does not decode: " + err);
    s.payload = std::move(payload);
    out->segments.push_back(std::move(s));
  }
  return out;
}

void GossipEngine::send_encoded(int to, Message m, std::shared_ptr<const Encoded> update) {
  m.encoded = std::move(update);
  send(to, std::move(m), {});
}

void GossipEngine::stamp(Message& m) const {
  m.from = me_;
  m.clock = logical_clock_;
  m.step = steps_;
  m.samples = samples_seen_;
  if (m.total == 0) m.total = model_.num_params();
}

void GossipEngine::send(int to, Message m, std::vector<float> data) {
  stamp(m);
  m.data = std::move(data);
  if (lies_in(m) && !m.data.empty()) lie(m.data);
  offer(to, std::move(m));
}

// "absurd" lies in synchronous exchanges too (their dense parts: what an all-reduce or a
// model average sends), where the update guard, not robust mixing, must stop it.
bool GossipEngine::lies_in(const Message& m) const {
  return spec_.byzantine != "none" && (!m.synchronous || spec_.byzantine == "absurd");
}

void GossipEngine::send_shared(int to, Message m, std::shared_ptr<const std::vector<float>> data) {
  if (lies_in(m)) return send(to, std::move(m), std::vector<float>(*data));  // lies on a copy
  stamp(m);
  m.shared = std::move(data);
  offer(to, std::move(m));
}

void GossipEngine::offer(int to, Message&& m) {
  // Only an external peer's engine (its framework's thread handed back at the step's end)
  // holds its asynchronous sends to the step's end; a native peer's leave at once, as its
  // step's remaining time (emulated compute among it) would otherwise delay every reply.
  const bool hold = in_step_ && !m.synchronous && (owner_ends_steps_ || copy_between_steps_);
  if (!hold) return outgoing_link(to).offer(std::move(m));
  deferred_.push_back([this, to, held = std::move(m)]() mutable { outgoing_link(to).offer(std::move(held)); });
}

void GossipEngine::end_step() {
  if (!in_step_) return;
  flush_deferred();
  if (copy_between_steps_) {
    // The helper copies the parameters while the framework computes the next gradient;
    // the next step finishes what it has not (take_copy).
    cancel_copy();  // a copy of an earlier step's end, not taken (none, in a step loop)
    auto job = std::make_shared<ChunkedCopy>(model_.params(), model_.num_params(), copy_buffer());
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_job_ = std::move(job);
    ++copy_jobs_;
    copy_cv_.notify_all();
  }
}

void GossipEngine::flush_deferred() {
  in_step_ = false;
  std::vector<std::function<void()>> now;
  now.swap(deferred_);
  for (auto& f : now) f();
}

std::shared_ptr<const std::vector<float>> GossipEngine::snapshot_params() {
  return std::make_shared<const std::vector<float>>(model_.get_params());
}

void GossipEngine::copy_between_steps(bool on) {
  if (!on || copy_between_steps_ || !model_.backend().is_host() || clock_.simulated()) return;
  copy_between_steps_ = true;
  copier_ = std::thread([this] {
#ifdef __linux__
    // Throughput work, not latency: as a batch thread it never preempts the framework's
    // thread when it wakes (SCHED_BATCH needs no privilege; where refused, it stays as it is).
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
#endif
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(copy_mu_);
    for (;;) {
      copy_cv_.wait(lock, [&] { return copy_quit_ || copy_jobs_ != seen; });
      if (copy_quit_) return;
      seen = copy_jobs_;
      std::shared_ptr<ChunkedCopy> job = copy_job_;
      lock.unlock();
      if (job) job->help();
      lock.lock();
    }
  });
}

std::shared_ptr<std::vector<float>> GossipEngine::copy_buffer() {
  for (const auto& b : copy_buffers_) {
    if (b.use_count() == 1) return b;  // held by this list alone: no send, no snapshot reads it
  }
  // Three: when the next copy begins, this step's snapshot is still held, and so may be
  // the one before it (an adpsgd request's model, kept until the answer comes).
  if (copy_buffers_.size() >= 3) copy_buffers_.erase(copy_buffers_.begin());
  copy_buffers_.push_back(std::make_shared<std::vector<float>>());
  return copy_buffers_.back();
}

std::shared_ptr<const std::vector<float>> GossipEngine::take_copy() {
  std::shared_ptr<ChunkedCopy> job;
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    job = std::move(copy_job_);
  }
  if (!job) return nullptr;
  // The helper may not have had a core since the step ended (the framework's threads
  // held them all): waiting for it could last a whole step (bench/torch_overhead.py, 2
  // torch peers on 2 cores), so this thread copies every chunk not yet begun.
  return job->finish(copy_sq_);
}

void GossipEngine::cancel_copy() {
  std::shared_ptr<ChunkedCopy> job;
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    job = std::move(copy_job_);
  }
  if (job) job->cancel();
}

std::shared_ptr<const std::vector<float>> GossipEngine::start_snapshot() {
  if (!start_snapshot_) start_snapshot_ = snapshot_params();
  return start_snapshot_;
}

void GossipEngine::stop_copying() {
  if (!copier_.joinable()) return;
  cancel_copy();  // the chunks under way finish first: they read the parameters
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_quit_ = true;
  }
  copy_cv_.notify_all();
  copier_.join();
  copy_between_steps_ = false;
}

void GossipEngine::params_written() {
  if (copy_between_steps_) cancel_copy();  // a copy of what the parameters were is not wanted
  params_sq_ = -1;
}

// --- Gossip on the device (gossip_on_device) ------------------------------------------
// Everything below that touches CUDA memory is built only with CUDA; a peer gossips on
// its device only in such a build (gossip_device), so the stubs are never reached.

void GossipEngine::say_once(const std::string& what) {
  std::lock_guard<std::mutex> lock(said_mu_);
  if (std::find(said_.begin(), said_.end(), what) != said_.end()) return;
  said_.push_back(what);
  std::fprintf(stderr, "hearsay: peer %s: %s\n", peers_[me_].c_str(), what.c_str());
}

#if HEARSAY_HAVE_CUDA
namespace {

// A snapshot in memory of the peer's backend. The copy runs on the backend's stream and is
// waited for, because the device codecs read it from other threads on another stream.
class BackendSnapshot final : public GossipEngine::DeviceSnapshot {
 public:
  BackendSnapshot(Backend& backend, int device, const float* src, size_t n)
      : backend_(backend), device_(device), buffer_(backend, sizeof(float) * n), n_(n) {
    backend_.copy(buffer_.data(), src, sizeof(float) * n);
    backend_.synchronize();
  }
  size_t size() const override { return n_; }
  const float* data() const override { return buffer_.f32(); }
  std::shared_ptr<const std::vector<float>> host() const override {
    std::call_once(downloaded_, [this] {
      auto h = std::make_shared<std::vector<float>>(n_);
      use_cuda_device(device_);  // a transport thread's current device may be another
      device_to_host(h->data(), buffer_.data(), sizeof(float) * n_);
      host_ = std::move(h);
    });
    return host_;
  }
  std::shared_ptr<const DeviceSnapshot> combine(float a, const DeviceSnapshot& other, float b) const override {
    auto out = std::make_shared<BackendSnapshot>(backend_, device_, data(), n_);
    if (a != 1.0f) backend_.scale(n_, a, out->buffer_.f32());
    backend_.axpy(n_, b, other.data(), out->buffer_.f32());
    backend_.synchronize();
    return out;
  }

 private:
  Backend& backend_;
  int device_;
  DeviceBuffer buffer_;
  size_t n_;
  mutable std::once_flag downloaded_;
  mutable std::shared_ptr<const std::vector<float>> host_;  // set once, under downloaded_
};

bool same_codec(const CodecSpec& a, const CodecSpec& b) {
  return a.name == b.name && a.density == b.density && a.exact_topk == b.exact_topk && a.value_bits == b.value_bits &&
         a.levels == b.levels && a.block == b.block && a.rank == b.rank && a.error_feedback == b.error_feedback;
}

// What a link still owes for one payload kind: its host encoder's residual plus its device
// twin's (a link that fell back to the host for a while holds parts in both).
std::vector<float> owed_residual(const LinkEncoder& enc, const DeviceLinkEncoder& twin) {
  std::vector<float> owed = twin.residual_host();
  const auto& host = enc.residual();
  if (owed.empty()) return host;
  for (size_t k = 0; k < host.size() && k < owed.size(); ++k) owed[k] += host[k];
  return owed;
}

}  // namespace

std::shared_ptr<const GossipEngine::DeviceSnapshot> GossipEngine::snapshot_device(const float* src, size_t n) {
  HEARSAY_CHECK(on_device_, "snapshot_device on a peer that gossips on the host");
  return std::make_shared<BackendSnapshot>(model_.backend(), cuda_device_, src, n);
}

bool GossipEngine::put_device_on_wire(int i, Message& m, const std::function<void(const SendStatus&)>& done) {
  const size_t n = m.device->size();
  LinkCodecs& lc = *link_codecs_[i];
  std::unique_lock<std::mutex> codec_lock(lc.mu);  // one message per link at a time anyway
  const bool push_sum = m.kind == MessageKind::kPushSum && !m.synchronous;
  bool update = false;
  LinkEncoder* enc = link_encoder(i, m, n, &update);
  if (push_sum && enc != nullptr) {
    codec_lock.unlock();
    say_once("push-sum shares under a lossy codec are encoded on the host: the rounding the codec takes off a share is "
             "given back to this peer as a host vector");
    return false;
  }
  DeviceLinkEncoder* twin = nullptr;
  if (enc != nullptr) {
    auto& slot = update ? lc.device_update : lc.device_model;
    try {
      if (!slot) {
        slot = std::make_shared<DeviceLinkEncoder>(cuda_device_, enc->spec(), model_.param_views(), lc.seed);
      } else if (!same_codec(slot->spec(), enc->spec())) {
        slot->set_spec(enc->spec());  // the host encoder's choice (adaptive): the twin follows
      }
    } catch (const InputError& e) {
      slot.reset();
      const std::string name = enc->spec().name;
      codec_lock.unlock();
      say_once("codec '" + name + "' has no device twin (" + e.what() + "): its messages are encoded on the host");
      return false;
    }
    twin = slot.get();
    // What the host encoder still owes (a fallback's sends, a checkpoint's residual) moves
    // to the device once, so the two never both hold what one link owes for long.
    if (twin->error_feedback() && !enc->residual().empty()) {
      twin->add_to_residual(enc->residual(), enc->residual().size());
      enc->residual().clear();
    }
  }
  const auto segs = enc != nullptr ? enc->codec().segments(n, spec_.segment_elements) : even_segments(n, spec_.segment_elements);
  SegmentFrames out(m, peers_[me_], next_update_id_++, segs.size());
  std::shared_ptr<const std::vector<float>> raw;  // the dense values, downloaded once, where no codec applies
  for (uint32_t s = 0; s < segs.size(); ++s) {
    const auto [begin, len] = segs[s];
    wire::Update& u = out.segment(s, m.offset + begin, len);
    if (twin == nullptr) {
      if (!raw) raw = m.device->host();
      out.add(reinterpret_cast<const uint8_t*>(raw->data() + begin), len * sizeof(float), raw);
    } else {
      auto payload = std::make_shared<std::vector<uint8_t>>();
      CodecParams params;
      twin->encode(m.device->data() + begin, len, m.offset + begin, m.total, *payload, params);
      write_codec_params(params, u.mutable_codec());
      out.add(payload->data(), payload->size(), payload);
    }
  }
  codec_lock.unlock();
  // A push (raw here) whose send fails is given back whole, as on the host path.
  sent_by_kind_[static_cast<size_t>(m.kind)] += out.bytes;
  send_frames(i, std::move(out.frames), out.bytes, done, push_sum ? raw : nullptr, m.push_sum_weight, m.offset);
  return true;
}

bool GossipEngine::decode_on_device(const Message& m, double a, float* device_dst) {
  if (!on_device_ || !m.payloads) return false;
  // The backend's stream is not ordered with the codecs' (the default stream): what it
  // has queued on the destination finishes first; the decode waits for itself.
  model_.backend().synchronize();
  use_cuda_device(cuda_device_);
  for (const auto& s : m.payloads->segments) {
    const std::string err = device_decode_accumulate(s.params, s.payload->data(), s.payload->size(), static_cast<float>(a),
                                                     device_dst + s.offset, s.length);
    // The inbox decoded these very bytes on the host and checked them before keeping them.
    HEARSAY_CHECK(err.empty(), "an update that decoded on the host does not decode on the device: " + err);
  }
  return true;
}

void GossipEngine::note_own_gradient(const DeviceSnapshot& g) {
  use_cuda_device(cuda_device_);
  const double n = std::sqrt(device_sum_squares(g.data(), g.size())), old = own_grad_norm_.load();
  own_grad_norm_ = old <= 0 ? n : 0.9 * old + 0.1 * n;
}

#else  // no CUDA: no peer gossips on a device (gossip_device is -1), so none of this is reached

std::shared_ptr<const GossipEngine::DeviceSnapshot> GossipEngine::snapshot_device(const float*, size_t) {
  HEARSAY_CHECK(false, "snapshot_device in a build without CUDA");
  return nullptr;
}
bool GossipEngine::put_device_on_wire(int, Message&, const std::function<void(const SendStatus&)>&) { return false; }
bool GossipEngine::decode_on_device(const Message&, double, float*) { return false; }
void GossipEngine::note_own_gradient(const DeviceSnapshot&) {
  HEARSAY_CHECK(false, "note_own_gradient(DeviceSnapshot) in a build without CUDA");
}

#endif

void GossipEngine::send_device(int to, Message m, std::shared_ptr<const DeviceSnapshot> data) {
  if (spec_.byzantine != "none" && !m.synchronous) {
    say_once("fault injection (byzantine '" + spec_.byzantine + "') lies on the host: this peer's sends are encoded there");
    return send(to, std::move(m), std::vector<float>(*data->host()));
  }
  stamp(m);
  m.device = std::move(data);
  offer(to, std::move(m));
}

void GossipEngine::axpy_params(double a, const Message& m) {
  if (!decode_on_device(m, a, model_.params())) axpy_params(a, m.data);
}

void GossipEngine::axpy_grads(double a, const Message& m) {
  if (!decode_on_device(m, a, model_.grads())) axpy_grads(a, m.data);
}

void GossipEngine::mix_neighbour_model(int from, const Message& m, double w) {
  // A robust rule needs the host values (its target is computed there).
  if (!on_device_ || !m.payloads || spec_.mixer.robust != MixerSpec::Robust::kNone) return mix_neighbour_model(from, m.data, w);
  // x <- (1 - w) x + w y, as mix_params does it: scale, then add w y.
  model_.backend().scale(m.data.size(), static_cast<float>(1.0 - w), model_.params());
  decode_on_device(m, w, model_.params());
}

// Fault injection (spec.byzantine): what a Byzantine peer sends instead of the truth,
// each chosen to pass the norm check (at its default ratio) so that only robust mixing
// can stop it; but "absurd", which only the update guard can.
void GossipEngine::lie(std::vector<float>& v) {
  if (spec_.byzantine == "scaled") {
    for (float& x : v) x *= 5.0f;
  } else if (spec_.byzantine == "absurd") {
    for (float& x : v) x *= 1e30f;  // finite, for a value under 3e8: only a norm check stops it
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
    if (!o) continue;
    const auto oldest = o->oldest_unsent_step();
    if (oldest && *oldest <= step) return true;
  }
  return false;
}

// A wait on neighbours inside a step: its time is not the step's work (last_work_s).
class GossipEngine::WaitSpan {
 public:
  explicit WaitSpan(GossipEngine& e) : e_(e) { e_.work_s_ += e_.clock_.now() - e_.work_since_; }
  ~WaitSpan() { e_.work_since_ = e_.clock_.now(); }
  WaitSpan(const WaitSpan&) = delete;
  WaitSpan& operator=(const WaitSpan&) = delete;

 private:
  GossipEngine& e_;
};

void GossipEngine::wait_sent(uint64_t step) { wait_until([&] { return !unsent_since(step); }, std::numeric_limits<double>::infinity()); }

bool GossipEngine::wait_until(const std::function<bool()>& ready, double timeout_s) {
  const WaitSpan waiting(*this);
  const double deadline = clock_.now() + timeout_s;
  while (!ready()) {
    if (stopped_) throw StopRequested();
    if (clock_.now() >= deadline) return false;
    clock_.sleep_for(200e-6);
  }
  return true;
}

bool GossipEngine::idle() const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    if ((outboxes_[i] && outboxes_[i]->buffered_bytes() > 0) || transport_.link_stats(peers_[i]).queue_depth > 0) return false;
  }
  return true;
}

void GossipEngine::settle() {
  // A site that trains as one replica holds the leader's model as of its last step; what
  // the leader would take in now could not reach its site any more.
  if (site_role(*this) != SiteRole::kNone) return;
  algorithm_->settle(*this);
}

void GossipEngine::refuse_sync(int from, uint64_t round, const std::string& why) {
  refuse(from, why);
  log_.write(log_.event("refused").add("neighbour", peers_[from]).add("round", static_cast<int64_t>(round)).add("reason", why));
  throw InputError("peer " + peers_[me_] + ": " + spec_.algorithm + " refused peer " + peers_[from] + "'s update for round " +
                   std::to_string(round) + " (" + why + "); a synchronous algorithm cannot go on without it");
}

double GossipEngine::norm_of(const Message& m) {
  // The inbox measured it as it decoded the message, on the transport's thread.
  return std::sqrt(m.sum_squares >= 0 ? m.sum_squares : host_sum_squares(m.data.data(), m.data.size()));
}

double GossipEngine::model_norm() {
  if (params_sq_ >= 0 && steps_ - params_sq_step_ <= kNormAgeSteps) return std::sqrt(params_sq_);  // the last mix's
#if HEARSAY_HAVE_CUDA
  if (on_device_) {
    // Measured where the model lives, not downloaded for one number.
    model_.backend().synchronize();
    use_cuda_device(cuda_device_);
    return std::sqrt(device_sum_squares(model_.params(), model_.num_params()));
  }
#endif
  return std::sqrt(model_.backend().sum_squares(model_.params(), model_.num_params()));
}

double GossipEngine::sync_reference_norm(const std::vector<float>& own) {
  return std::max(std::sqrt(host_sum_squares(own.data(), own.size())), model_norm());
}

void GossipEngine::check_sync_part(const Message& m, uint64_t round, double reference, double parts) {
  const double ratio = spec_.guard.max_norm_ratio;
  if (ratio <= 0 || !(reference > 0)) return;
  const double norm = norm_of(m);
  if (norm <= ratio * parts * reference) return;
  char buf[200];
  std::snprintf(buf, sizeof buf, "norm: %.3g is %.3g times this peer's own part (%.3g); the bound is %g times", norm,
                norm / reference, reference, ratio * parts);
  refuse_sync(m.from, round, buf);
}

GossipEngine::Message GossipEngine::wait_sync(int from, uint64_t round, uint32_t phase) {
  auto m = wait_sync_for(from, round, phase, spec_.sync_timeout_s);
  if (!m) {
    throw PeerTimeout("peer " + peers_[me_] + ": " + spec_.algorithm + " waited " + std::to_string(spec_.sync_timeout_s) +
                          " s for peer " + peers_[from] + " (round " + std::to_string(round) +
                          "); synchronous algorithms do not tolerate a missing peer",
                      from);
  }
  return std::move(*m);
}

std::optional<GossipEngine::Message> GossipEngine::wait_sync_for(int from, uint64_t round, uint32_t phase, double timeout_s) {
  std::string refused;
  std::optional<Message> m;
  {
    const WaitSpan waiting(*this);
    m = inbox_->wait_sync(from, round, phase, timeout_s, stopped_, &refused);
  }
  if (!m && stopped_) throw StopRequested();
  if (!m && !refused.empty()) refuse_sync(from, round, refused);
  return m;
}

void GossipEngine::forget_sync(const std::function<bool(int from, uint64_t round, uint32_t phase)>& stale) {
  inbox_->forget_sync(stale);
}

std::optional<GossipEngine::Message> GossipEngine::poll_sync(int from, uint64_t round, uint32_t phase) {
  std::string refused;
  auto m = inbox_->wait_sync(from, round, phase, 0.0, stopped_, &refused);
  if (!m && !refused.empty()) refuse_sync(from, round, refused);
  if (!m && stopped_) throw StopRequested();
  return m;
}

std::vector<float> GossipEngine::params_host() { return model_.get_params(); }
void GossipEngine::set_params_host(const std::vector<float>& p) {
  params_written();
  model_.set_params(p);
}

void GossipEngine::measured_params(const double (&lanes)[8], bool whole) {
  if (!whole) return;
  double total = 0;
  for (double l : lanes) total += l;
  params_sq_ = total;
  params_sq_step_ = steps_;
}

void GossipEngine::mix_params(const std::vector<float>& y, double w) {
  Backend& b = model_.backend();
  if (b.is_host()) {
    // One pass over the model (scale, then add w y, as the backend's two calls round it).
    float* x = model_.params();
    const float keep = static_cast<float>(1.0 - w), share = static_cast<float>(w);
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    size_t i = 0;
    for (; i + 8 <= y.size(); i += 8) {
      for (int j = 0; j < 8; ++j) {
        x[i + j] = keep * x[i + j] + share * y[i + j];
        lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
      }
    }
    for (; i < y.size(); ++i) {
      x[i] = keep * x[i] + share * y[i];
      lanes[0] += static_cast<double>(x[i]) * x[i];
    }
    measured_params(lanes, y.size() == model_.num_params());
    return;
  }
  b.scale(y.size(), static_cast<float>(1.0 - w), model_.params());
  b.axpy(y.size(), static_cast<float>(w), on_backend(y), model_.params());
}

const float* GossipEngine::on_backend(const std::vector<float>& y) {
  // A host backend reads host memory as it is: a copy would cost a pass over the model.
  Backend& b = model_.backend();
  if (b.is_host()) return y.data();
  b.upload(scratch_.data(), y.data(), sizeof(float) * y.size());
  return scratch_.f32();
}

void GossipEngine::mix_neighbour_model(int from, const std::vector<float>& y, double w) {
  if (spec_.mixer.robust == MixerSpec::Robust::kNone) return mix_params(y, w);
  mix_params(robust_->target(from, params_host(), y), w);
}

void GossipEngine::move_toward_neighbour(int from, const std::vector<float>& base, const std::vector<float>& y, double w) {
  if (spec_.mixer.robust == MixerSpec::Robust::kNone && model_.backend().is_host()) {
    // One pass over the model, with no difference held (it is y - base, rounded as before).
    float* x = model_.params();
    const float a = static_cast<float>(w);
    const size_t n = std::min(y.size(), base.size());
    double lanes[8] = {};  // the new model's sum of squares, in the same pass (params_sq_)
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int j = 0; j < 8; ++j) {
        x[i + j] += a * (y[i + j] - base[i + j]);
        lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
      }
    }
    for (; i < n; ++i) {
      x[i] += a * (y[i] - base[i]);
      lanes[0] += static_cast<double>(x[i]) * x[i];
    }
    measured_params(lanes, n == model_.num_params());
    return;
  }
  std::vector<float> diff;
  if (spec_.mixer.robust == MixerSpec::Robust::kNone) {
    diff.resize(y.size());
    for (size_t i = 0; i < diff.size(); ++i) diff[i] = y[i] - base[i];
  } else {
    diff = robust_->target(from, base, y);
    for (size_t i = 0; i < diff.size(); ++i) diff[i] -= base[i];
  }
  axpy_params(w, diff);
}

void GossipEngine::axpy_host(double a, const std::vector<float>& y, float* device_dst) {
  model_.backend().axpy(y.size(), static_cast<float>(a), on_backend(y), device_dst);
}

void GossipEngine::axpy_params(double a, const std::vector<float>& y) { axpy_host(a, y, model_.params()); }
void GossipEngine::axpy_grads(double a, const std::vector<float>& y) { axpy_host(a, y, model_.grads()); }

void GossipEngine::note_model_distance(const std::string& peer, const std::vector<float>& y) {
  // The log reports one distance per neighbour and window: measuring every arrival would
  // copy the whole model off the device each time for numbers nobody reads.
  if (distances_.count(peer) != 0) return;
  std::vector<float> copied;
  const float* x = model_.params();
  if (!model_.backend().is_host()) {
    copied = params_host();
    x = copied.data();
  }
  const size_t n = std::min(model_.num_params(), y.size());
  double d = 0;
  for (size_t i = 0; i < n; ++i) d += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
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
  for (const auto& o : outboxes_) b += o ? o->buffered_bytes() : 0;
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
    if (static_cast<int>(i) == me_ || !link_codecs_[i]) continue;  // never used: nothing owed
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    for (const auto& [kind, enc] : {std::pair{"update", link_codecs_[i]->update.get()}, std::pair{"model", link_codecs_[i]->model.get()}}) {
      auto* l = c.add_links();
      l->set_peer(peers_[i]);
      l->set_kind(kind);
      l->set_codec(enc->spec().name);
      l->set_density(enc->spec().density);
#if HEARSAY_HAVE_CUDA
      const auto& twin = std::string(kind) == "update" ? link_codecs_[i]->device_update : link_codecs_[i]->device_model;
      if (twin) {
        const std::vector<float> owed = owed_residual(*enc, *twin);
        l->set_residual(floats_to_bytes(owed.data(), owed.size()));
        continue;
      }
#endif
      l->set_residual(floats_to_bytes(enc->residual().data(), enc->residual().size()));
    }
  }
  c.set_algorithm_state(algorithm_->save());
}

std::string GossipEngine::algorithm_state() const { return algorithm_->save(); }

void GossipEngine::load_state(const ckpt::Checkpoint& c) {
  params_written();
  logical_clock_ = c.logical_clock();
  steps_ = static_cast<uint64_t>(c.step());
  samples_seen_ = c.samples_seen();
  for (const auto& l : c.links()) {
    const int i = index_of(l.peer());
    if (i < 0 || i == me_) throw InputError("checkpoint: link state for '" + l.peer() + "', not a neighbour in this cluster");
    if (l.kind() != "update" && l.kind() != "model") throw InputError("checkpoint: link state of unknown kind '" + l.kind() + "'");
    outgoing_link(i);
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    LinkEncoder& enc = l.kind() == "update" ? *link_codecs_[i]->update : *link_codecs_[i]->model;
    // A device twin starts again from the host encoder, which now holds the checkpoint's
    // residual (it moves to the device at the twin's first send).
    (l.kind() == "update" ? link_codecs_[i]->device_update : link_codecs_[i]->device_model).reset();
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
  applied_total_ += m.applied;
  dropped_total_ += m.dropped;
  coalesced_total_ += m.coalesced;
  MetricsBoard::Gossip board;
  JsonObject links;
  uint64_t sent = 0, received = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    const LinkStats s = transport_.link_stats(peers_[i]);
    sent += s.bytes_sent;
    received += s.bytes_received;
    // Links this peer has used (sent on, or heard from): a peer of 1,024 talks to few.
    if (!link_codecs_[i] && s.bytes_received == 0) continue;
    if (metrics_ != nullptr) {
      board.links.push_back({.neighbour = peers_[i], .connected = s.connected, .bytes_sent = s.bytes_sent,
                             .bytes_received = s.bytes_received, .queue_frames = s.queue_depth,
                             .queue_bytes = s.queue_bytes, .rtt_s = s.rtt_s});
    }
    JsonObject l;
    l.add("connected", s.connected).add("bytes_sent", static_cast<int64_t>(s.bytes_sent));
    l.add("bytes_received", static_cast<int64_t>(s.bytes_received)).add("queue", static_cast<int64_t>(s.queue_depth));
    if (s.rtt_s >= 0) l.add("rtt_s", s.rtt_s);
    if (link_codecs_[i]) {
      std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
      const CodecSpec& c = link_codecs_[i]->update->spec();
      l.add("codec", c.name).add("model_codec", link_codecs_[i]->model->spec().name);
      if (c.name == "topk" || c.name == "randomk") l.add("density", c.density);
    } else {
      l.add("codec", spec_.codec.name).add("model_codec", spec_.model_codec);  // nothing sent on it yet
    }
    {
      std::lock_guard<std::mutex> lock(link_mu_);
      if (link_bps_[i] > 0) l.add("throughput_Bps", link_bps_[i]);
    }
    links.add_raw(peers_[i], l.str());
  }
  const std::vector<std::string> quarantined_now = quarantined();  // the log's and the board's
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
    for (const auto& name : quarantined_now) q += (q.size() > 1 ? ",\"" : "\"") + json_escape(name) + "\"";
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
  if (metrics_ != nullptr) {
    for (auto kind : {MessageKind::kGradient, MessageKind::kModel, MessageKind::kModelDelta, MessageKind::kPushSum}) {
      board.bytes_sent_by_kind[message_kind_name(kind)] = sent_by_kind_[static_cast<size_t>(kind)].load();
    }
    board.applied = applied_total_;
    board.dropped = dropped_total_;
    board.coalesced = coalesced_total_;
    board.rejected = rejected_.load();
    board.refused = guard_->refused();
    board.quarantined = quarantined_now.size();
    board.buffered_bytes = buffered_bytes();
    board.staleness = mixer_.staleness();
    metrics_->offer_gossip(std::move(board));
  }
}

}  // namespace hearsay
