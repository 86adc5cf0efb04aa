// GossipEngine's sending side: segmenting and encoding a message for its link (the adaptive
// codec choice, encode-once), the send functions, holding sends until a step ends, and the
// lies of fault injection.

#include <algorithm>
#include <limits>
#include <cmath>

#include "../util/callback_gate.h"
#include "algorithm.h"
#include "algorithm_registry.h"
#include "hearsay/build_config.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "chunked_copy.h"
#include "mailboxes.h"
#include "segment_frames.h"
#include "update_guard.h"

namespace hearsay {

// Cuts a message into segments, encodes each with the link's codec for its kind, and
// sends them; `done` hears once the last has left. Synchronous exchanges and messages on
// links without a codec travel as raw fp32, referenced rather than copied.

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
  // An update encoded once (send_encoded) carries no floats: its length is its segments'.
  size_t n = data->size();
  uint64_t encoded_bytes = 0;
  if (m.encoded) {
    n = 0;
    for (const auto& s : m.encoded->segments) {
      n = std::max<size_t>(n, s.offset + s.length);
      encoded_bytes += s.payload->size();
    }
  }
  LinkCodecs& lc = *link_codecs_[i];
  std::unique_lock<std::mutex> codec_lock(lc.mu);  // one message per link at a time anyway
  const bool push_sum = m.kind == MessageKind::kPushSum && !m.synchronous;
  HEARSAY_CHECK(!push_sum || owned, "a push-sum share was sent shared; its rounding must go back into it");
  bool update = false;
  LinkEncoder* enc = link_encoder(i, m, n, &update);
  auto segs = enc != nullptr ? enc->codec().segments(n, spec_.segment_elements) : even_segments(n, spec_.segment_elements);
  if (m.encoded) {
    segs.clear();
    for (const auto& s : m.encoded->segments) segs.emplace_back(s.offset, s.length);
  }
  codec_lock.unlock();
  // A large message (not a push-sum share, whose rounding goes back whole) travels as a
  // stream: each segment made as it goes out, a window unacknowledged, resumed after a cut.
  const uint64_t message_bytes = m.encoded ? encoded_bytes : sizeof(float) * n;
  const bool stream = !push_sum && segs.size() > 1 && message_bytes > spec_.stream_window_bytes;
  // Segment s's frame: its payload encoded with the link's codec (or referenced).
  // Made in place: `out` points into its own envelope, so it never moves.
  struct Making {
    Making(const Message& m, const std::string& sender, uint64_t id, std::vector<std::pair<size_t, size_t>> s)
        : offset(m.offset), total(m.total), encoded(m.encoded), segs(std::move(s)), out(m, sender, id, segs.size()) {}
    uint64_t offset, total;
    std::shared_ptr<const Encoded> encoded;
    std::shared_ptr<const std::vector<float>> data;
    std::shared_ptr<std::vector<float>> owned;
    std::vector<std::pair<size_t, size_t>> segs;
    SegmentFrames out;
    std::vector<float> rounding;  // push-sum: what a lossy codec took off the numerator
  };
  const uint64_t id = stream ? stream_id_base_ + next_update_id_++ : next_update_id_++;
  auto mk = std::make_shared<Making>(m, peers_[me_], id, std::move(segs));
  mk->data = data;
  mk->owned = owned;
  if (stream) mk->out.u->set_resumable(true);
  auto make = [this, i, mk, enc, push_sum](uint32_t s) {
    Making& k = *mk;
    const auto [begin, len] = k.segs[s];
    wire::Update& u = k.out.segment(s, k.offset + begin, len);
    if (k.encoded) {
      const auto& seg = k.encoded->segments[s];
      write_codec_params(seg.params, u.mutable_codec());
      k.out.add(seg.payload->data(), seg.payload->size(), seg.payload);
    } else if (enc == nullptr) {
      k.out.add(reinterpret_cast<const uint8_t*>(k.data->data() + begin), len * sizeof(float), k.data);
    } else {
      auto payload = std::make_shared<std::vector<uint8_t>>();
      CodecParams params;
      {
        std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
        enc->encode(k.data->data() + begin, len, k.offset + begin, k.total, *payload, params);
      }
      write_codec_params(params, u.mutable_codec());
      if (push_sum) {
        // The numerator becomes exactly what the receiver will decode, and the rounding
        // goes back to the sender's own x: one push moves mass, it never loses any.
        std::vector<float> sent(len, 0.0f);
        decode_accumulate(params, payload->data(), payload->size(), 1.0f, sent.data(), len);
        k.rounding.resize(k.data->size(), 0.0f);
        for (size_t e = 0; e < len; ++e) {
          float& x = (*k.owned)[begin + e];
          k.rounding[begin + e] = x - sent[e];
          x = sent[e];
        }
      }
      k.out.add(payload->data(), payload->size(), payload);
    }
    OutFrame f = std::move(k.out.frames.back());
    k.out.frames.pop_back();
    return f;
  };
  const auto kind = static_cast<size_t>(m.kind);
  if (stream) {
    const auto count = static_cast<uint32_t>(mk->segs.size());
    const bool shares = mk->encoded != nullptr;
    return start_stream(
        i, id, count, make,
        [this, kind, done = std::move(done)](const SendStatus& st, uint64_t bytes) {
          sent_by_kind_[kind] += bytes;
          done(st);
        },
        shares);
  }
  std::vector<OutFrame> frames;
  size_t bytes = 0;
  for (uint32_t s = 0; s < mk->segs.size(); ++s) {
    frames.push_back(make(s));
    bytes += frames.back().size();
  }
  if (!mk->rounding.empty()) give_back(mk->rounding, m.offset, 0);
  sent_by_kind_[kind] += bytes;
  // A push whose send fails is given back whole: mass is never silently lost.
  send_frames(i, std::move(frames), bytes, std::move(done), push_sum ? owned : nullptr, m.push_sum_weight, m.offset);
}

void GossipEngine::send_frames(int i, std::vector<OutFrame> frames, size_t bytes, std::function<void(const SendStatus&)> done,
                               std::shared_ptr<const std::vector<float>> returned, double weight, uint64_t offset) {
  const uint32_t count = static_cast<uint32_t>(frames.size());
  auto remaining = std::make_shared<std::atomic<uint32_t>>(count);
  auto failed = std::make_shared<std::atomic<bool>>(false);
  const double t0 = clock_.now();
  for (auto& f : frames) {
    transport_.send(peers_[i], std::move(f), [this, gate = send_gate_, i, bytes, t0, remaining, failed, done, returned,
                                              weight, offset](const SendStatus& st) {
      // The transport may finish a send after this engine is gone: then nothing is told.
      const CallbackGate::Pass pass(*gate);
      if (!pass) return;
      if (!st.ok) *failed = true;
      if (--*remaining != 0) return;
      if (*failed && returned) give_back(*returned, offset, weight);
      const double dt = clock_.now() - t0;
      if (!*failed) note_link_throughput(i, bytes, dt);
      done(*failed ? SendStatus{false, "segment lost"} : SendStatus{});
    });
  }
}

void GossipEngine::note_link_throughput(int to, uint64_t bytes, double seconds) {
  if (!(seconds > 0)) return;
  const double bps = static_cast<double>(bytes) / seconds;
  topology_->observe_throughput(me_, to, bps);
  std::lock_guard<std::mutex> lock(link_mu_);
  double& b = link_bps_[to];
  b = b <= 0 ? bps : 0.8 * b + 0.2 * bps;
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


namespace {

// x[0, n), at element `offset` of its tensor, encoded by `codec` over its segments
// (build_encoded: the decoded values written over `decoded_into`, kept, or neither).
std::shared_ptr<const GossipEngine::Encoded> encode_segments(Codec& codec, const float* x, size_t n, uint64_t offset,
                                                            size_t segment_elements, float* decoded_into, bool keep_decoded) {
  return build_encoded(
      n, codec.segments(n, segment_elements),
      [&](size_t begin, size_t len, std::vector<uint8_t>& payload, CodecParams& params) {
        codec.encode(x + begin, len, offset + begin, payload, params);
      },
      decoded_into, keep_decoded);
}

}  // namespace

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_once(const std::vector<float>& data, uint64_t offset,
                                                                    const std::string& codec) {
  CodecSpec s = spec_.codec;
  if (!codec.empty()) s.name = codec;
  return encode_once(data, s, offset);
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_once(const std::vector<float>& data, const CodecSpec& spec,
                                                                    uint64_t offset, bool keep_decoded) {
  Codec& codec = once_codec(spec);
  return encode_segments(codec, data.data(), data.size(), offset, spec_.segment_elements, nullptr, keep_decoded);
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_model() {
  CodecSpec spec;
  spec.name = spec_.model_codec;
  spec.error_feedback = "off";
  Codec& codec = once_codec(spec);
  const size_t n = model_.num_params();
  std::vector<float> host;  // only where the parameters are not host memory
  const float* x = model_.params();
  if (!model_.backend().is_host()) {
    host = params_host();
    x = host.data();
  }
  return encode_segments(codec, x, n, 0, spec_.segment_elements, nullptr, false);
}

bool GossipEngine::models_encode_once() const {
  return !on_device_ && spec_.byzantine == "none" && !spec_.adaptive.enabled && !copy_between_steps_;
}

bool GossipEngine::updates_encode_once() const { return models_encode_once() && !uses_error_feedback(spec_.codec); }

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_update_once(const float* x, size_t n) {
  HEARSAY_CHECK(updates_encode_once(), "encode_update_once where updates are encoded per link");
  // gossip.codec as the links would make it (random-k scaled, unbiased), not once_codec's.
  if (!update_codec_once_) update_codec_once_ = make_codec(spec_.codec, model_.param_views(), rng_.next_u64());
  Codec& codec = *update_codec_once_;
  return encode_segments(codec, x, n, 0, spec_.segment_elements, nullptr, false);
}

void for_each_decoded(const GossipEngine::Encoded& e, std::vector<float>& scratch,
                      const std::function<void(size_t at, const float* y, size_t n)>& fn) {
  for (const auto& seg : e.segments) fn(seg.offset, decode_segment(seg, scratch), seg.length);
}

std::shared_ptr<const GossipEngine::Encoded> GossipEngine::encode_in_place(float* data, size_t n, uint64_t offset,
                                                                        const std::string& codec_name) {
  CodecSpec s = spec_.codec;
  if (!codec_name.empty()) s.name = codec_name;
  Codec& codec = once_codec(s);
  // Each segment is read by its encoding before its decoded values are written over it.
  return encode_segments(codec, data, n, offset, spec_.segment_elements, data, true);
}

Codec& GossipEngine::once_codec(const CodecSpec& spec) {
  // Kept by every setting a codec is made from (a tuple, not a string made on every call:
  // this is on every hop of every all-reduce).
  std::unique_ptr<Codec>& once_codec =
      once_codecs_[std::make_tuple(spec.name, spec.density, spec.exact_topk, spec.value_bits, spec.levels, spec.block, spec.rank)];
  if (!once_codec) {
    CodecSpec s = spec;
    s.error_feedback = "on";  // picks random-k unscaled (a contraction); no residual is kept here
    once_codec = make_codec(s, model_.param_views(), rng_.next_u64());
  }
  return *once_codec;
}

std::shared_ptr<const GossipEngine::Encoded> build_encoded(
    size_t n, const std::vector<std::pair<size_t, size_t>>& segments,
    const std::function<void(size_t offset, size_t length, std::vector<uint8_t>& payload, CodecParams& params)>& encode,
    float* decoded_into, bool keep_decoded) {
  auto out = std::make_shared<GossipEngine::Encoded>();
  if (decoded_into == nullptr && keep_decoded) out->decoded.assign(n, 0.0f);
  std::vector<float> scratch;  // a segment's, when the decoded values are not kept
  float* decoded = decoded_into != nullptr ? decoded_into : out->decoded.data();
  for (const auto& [begin, len] : segments) {
    GossipEngine::Encoded::Segment s;
    s.offset = begin;
    s.length = len;
    auto payload = std::make_shared<std::vector<uint8_t>>();
    encode(begin, len, *payload, s.params);
    // Decoded exactly as a receiver's inbox decodes it: into zeros, scale 1.
    float* into = decoded + begin;
    if (decoded_into == nullptr && !keep_decoded) {
      scratch.assign(len, 0.0f);
      into = scratch.data();
    } else if (decoded_into != nullptr) {
      std::fill(into, into + len, 0.0f);
    }
    const std::string err = decode_accumulate(s.params, payload->data(), payload->size(), 1.0f, into, len);
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

}  // namespace hearsay
