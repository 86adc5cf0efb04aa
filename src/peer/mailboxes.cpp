#include "mailboxes.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "update_guard.h"

namespace hearsay {

// The engine's message kinds and the wire's, both ways: the one mapping.
static wire::PayloadKind wire_kind(MessageKind k) {
  switch (k) {
    case MessageKind::kGradient: return wire::GRADIENT;
    case MessageKind::kModel: return wire::MODEL;
    case MessageKind::kModelDelta: return wire::MODEL_DELTA;
    case MessageKind::kPushSum: return wire::PUSH_SUM_WEIGHT;
  }
  return wire::GRADIENT;
}

static MessageKind message_kind(wire::PayloadKind k) {
  switch (k) {
    case wire::GRADIENT: return MessageKind::kGradient;
    case wire::MODEL: return MessageKind::kModel;
    case wire::MODEL_DELTA: return MessageKind::kModelDelta;
    case wire::PUSH_SUM_WEIGHT: return MessageKind::kPushSum;
  }
  return MessageKind::kGradient;  // proto2 keeps an unknown enum value out of kind()
}

void write_codec_params(const CodecParams& p, wire::CodecParams* w) {
  w->Clear();
  w->set_codec_id(p.codec_id());
  w->set_codec_version(p.codec_version());
  for (double v : p.all_values()) w->add_values(v);
  if (p.seed() != 0) w->set_seed(p.seed());  // 0 is what a receiver reads when it is absent
}

CodecParams read_codec_params(const wire::CodecParams& w) {
  CodecParams p;
  p.set_codec_id(w.codec_id());
  p.set_codec_version(w.codec_version());
  for (double v : w.values()) p.add_values(v);
  p.set_seed(w.seed());
  return p;
}

void write_header(const GossipEngine::Message& m, const std::string& sender, wire::Update* u) {
  u->set_sender(sender);
  u->set_clock(m.clock);
  u->set_step(m.step);
  u->set_samples_seen(m.samples);
  u->set_kind(wire_kind(m.kind));
  u->set_tensor_length(m.total);
  u->set_push_sum_weight(m.push_sum_weight);
  u->set_synchronous(m.synchronous);
  u->set_round(m.round);
  u->set_phase(m.phase);
  u->set_reply_requested(m.reply_requested);
  if (m.mix_share != 0) u->set_mix_share(m.mix_share);
}

GossipEngine::Message read_header(const wire::Update& u, int from) {
  GossipEngine::Message m;
  m.from = from;
  m.kind = message_kind(u.kind());
  m.clock = u.clock();
  m.step = u.step();
  m.samples = u.samples_seen();
  m.push_sum_weight = u.push_sum_weight();
  m.synchronous = u.synchronous();
  m.reply_requested = u.reply_requested();
  m.mix_share = u.mix_share();
  m.round = u.round();
  m.phase = u.phase();
  m.total = u.tensor_length();
  return m;
}

// The same, with a shared snapshot counted only the first time `seen` meets it.
static uint64_t distinct_bytes(const GossipEngine::Message& m, std::unordered_set<const void*>& seen) {
  uint64_t b = message_held_bytes(m);
  if (m.shared && !seen.insert(m.shared.get()).second) b -= m.shared->size() * sizeof(float);
  // An update encoded once for every target is one set of bytes, however many links hold it.
  if (m.encoded && !seen.insert(m.encoded.get()).second) {
    for (const auto& s : m.encoded->segments) b -= s.payload->size();
  }
  return b;
}

// --- Outbox ---------------------------------------------------------------------------

// A synchronous message's (round, phase); none for an asynchronous one.
static std::optional<std::pair<uint64_t, uint32_t>> sync_tag(const GossipEngine::Message& m) {
  if (!m.synchronous) return std::nullopt;
  return std::make_pair(m.round, m.phase);
}

// send_ is always called without mu_ held: a transport may report failure inline (a
// neighbour that is gone), which re-enters on_done.

void Outbox::offer(GossipEngine::Message&& m) {
  std::optional<GossipEngine::Message> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!busy_ && sync_.empty()) {
      busy_ = true;
      in_flight_bytes_ = message_held_bytes(m);
      note_in_flight_shared(m);
      in_flight_step_ = m.step;
      in_flight_sync_ = sync_tag(m);
      now = std::move(m);
    } else if (m.synchronous || (m.encoded && m.kind == MessageKind::kModel)) {
      // In order, never folded: synchronous parts, and whole models encoded once (adpsgd's
      // requests and answers: each an exchange's half; one exchange open per neighbour
      // bounds them). Encoded gradients and deltas fold as the others (absorb).
      sync_.push_back(std::move(m));
    } else {
      auto it = pending_.find(m.fold_slot());
      if (it == pending_.end()) {
        pending_step_[m.fold_slot()] = m.step;
        pending_.emplace(m.fold_slot(), std::move(m));
      } else {
        it->second.absorb(std::move(m));
        mixer_.count_coalesced(1);
      }
    }
  }
  if (now) launch(std::move(*now));
}

void Outbox::note_in_flight_shared(const GossipEngine::Message& m) {
  in_flight_shared_ = m.shared ? static_cast<const void*>(m.shared.get()) : static_cast<const void*>(m.encoded.get());
  in_flight_shared_bytes_ = m.shared ? m.shared->size() * sizeof(float) : 0;
  if (!m.shared && m.encoded) {
    for (const auto& seg : m.encoded->segments) in_flight_shared_bytes_ += seg.payload->size();
  }
}

void Outbox::launch(GossipEngine::Message&& m) {
  send_(std::move(m), [this](const SendStatus& s) { on_done(s); });
}

void Outbox::on_done(const SendStatus& s) {
  std::optional<GossipEngine::Message> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    busy_ = false;
    in_flight_bytes_ = 0;
    in_flight_shared_ = nullptr;
    in_flight_shared_bytes_ = 0;
    in_flight_sync_.reset();
    if (!s.ok) ++failed_;
    if (!sync_.empty()) {
      next = std::move(sync_.front());
      sync_.pop_front();
    } else if (!pending_.empty()) {
      next = std::move(pending_.begin()->second);
      in_flight_step_ = pending_step_[pending_.begin()->first];
      pending_step_.erase(pending_.begin()->first);
      pending_.erase(pending_.begin());
    }
    if (next) {
      busy_ = true;
      in_flight_sync_ = sync_tag(*next);
      in_flight_bytes_ = message_held_bytes(*next);
      note_in_flight_shared(*next);
      if (next->synchronous) in_flight_step_ = next->step;
    }
  }
  if (next) launch(std::move(*next));
}

size_t Outbox::buffered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = in_flight_bytes_;
  for (const auto& [k, m] : pending_) b += message_held_bytes(m);
  for (const auto& m : sync_) b += message_held_bytes(m);
  return b;
}

uint64_t Outbox::held_memory(std::unordered_set<const void*>& seen) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t b = in_flight_bytes_;  // the message on the wire: its parts belong to the frames now
  // A tensor shared by several links' messages (adpsgd's request to two neighbours) is one
  // buffer: counted by the first outbox that meets it.
  if (in_flight_shared_ != nullptr && !seen.insert(in_flight_shared_).second) b -= in_flight_shared_bytes_;
  for (const auto& [k, m] : pending_) b += distinct_bytes(m, seen);
  for (const auto& m : sync_) b += distinct_bytes(m, seen);
  return b;
}

std::optional<uint64_t> Outbox::oldest_unsent_step() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<uint64_t> oldest;
  auto see = [&](uint64_t step) { oldest = oldest ? std::min(*oldest, step) : step; };
  if (busy_) see(in_flight_step_);
  for (const auto& [slot, step] : pending_step_) see(step);
  for (const auto& m : sync_) see(m.step);
  return oldest;
}

bool Outbox::holds_sync(uint64_t round, uint32_t phase) const {
  const std::pair<uint64_t, uint32_t> tag{round, phase};
  std::lock_guard<std::mutex> lock(mu_);
  if (in_flight_sync_ == tag) return true;
  return std::any_of(sync_.begin(), sync_.end(), [&](const GossipEngine::Message& m) { return sync_tag(m) == tag; });
}

uint64_t Outbox::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

// --- Inbox ----------------------------------------------------------------------------

std::string Inbox::add_segment(int from, const wire::Update& u, const uint8_t* payload, size_t bytes, uint32_t* held) {
  const uint32_t count = std::max<uint32_t>(1, u.segment_count());
  const auto key = std::make_pair(from, u.update_id());
  uint32_t held_here = 0;
  if (held == nullptr) held = &held_here;
  *held = 0;
  // The message being assembled is taken out of the map while its segment is decoded and
  // checked (passes over up to the whole model), so that the step's thread, which takes
  // arrivals from this inbox, never waits for them. A sender's segments come one after
  // another from its link's one reading thread.
  decltype(partial_)::node_type node;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = partial_.find(key);
    if (it == partial_.end() && u.resumable()) {
      // Another thread decodes a segment of it (the old connection's reader): no answer,
      // the next segment's will say.
      if (decoding_.count(key) != 0) {
        *held = kNoAnswer;
        return {};
      }
      // A resent segment of a message completed already, or one whose beginning this
      // inbox does not hold (it restarted, or dropped it): said, not assembled.
      for (const auto& [f, id, segments, length] : completed_) {
        if (f == from && id == u.update_id() && segments == count && length == u.tensor_length()) {
          *held = segments;
          return {};
        }
      }
      if (u.segment_index() != 0) return {};
    }
    if (it == partial_.end()) {
      // A sender has at most a few messages in flight; an old unfinished one is abandoned.
      int mine = 0;
      for (const auto& [k, p] : partial_) mine += k.first == from;
      if (mine >= 8) {
        for (auto p = partial_.begin(); p != partial_.end(); ++p) {
          if (p->first.first == from) {
            partial_.erase(p);
            break;
          }
        }
      }
      Partial p;
      p.count = count;
      p.m = read_header(u, from);
      // Measured as it is decoded, except a synchronous message decoded whole (measured where it is taken).
      p.m.sum_squares = p.m.synchronous && !(lean_ && p.m.kind != MessageKind::kPushSum) ? -1.0 : 0.0;
      it = partial_.emplace(key, std::move(p)).first;
    }
    Partial& p = it->second;
    if (p.count != count || p.m.total != u.tensor_length()) return "segments: its segment count or tensor length differs from the update's first segment";
    if (u.resumable() && u.segment_index() < p.have) {
      *held = p.have;  // resent after a cut: held already
      return {};
    }
    // Segments of one message arrive in order on every transport; each extends the data.
    if (p.have == 0) {
      p.lo = u.segment_offset();
      p.m.offset = p.lo;
    } else if (u.segment_offset() != p.lo + p.filled) {
      if (u.resumable()) {
        // Out of its order (a segment of the connection before a cut, after the resend
        // began): not taken, nor the message dropped; the acknowledgement says where it is.
        *held = p.have;
        return {};
      }
      partial_.erase(it);
      return "segments: segment " + std::to_string(u.segment_index()) + " does not follow the one before it";
    }
    node = partial_.extract(it);
    decoding_.insert(key);
  }
  Partial& p = node.mapped();
  // A host peer keeps an asynchronous arrival as the bytes it came in (Message::payloads):
  // each segment is decoded into a scratch of its own size for the checks, then dropped.
  const bool lean = lean_ && p.m.kind != MessageKind::kPushSum;
  // Its segments follow one another to the tensor's end at most: one allocation, not a
  // vector grown (and copied, and its fresh pages zeroed) segment by segment. The
  // tensor's length was checked against this model before any segment got here.
  if (!lean && p.have == 0 && u.segment_offset() < u.tensor_length()) p.m.data.reserve(u.tensor_length() - u.segment_offset());
  // segment_length was checked against the tensor, and the tensor against this model.
  const size_t n = u.segment_length();
  thread_local std::vector<float> scratch;  // a transport thread's: one segment (segment_elements at most)
  float* values = nullptr;
  if (lean) {
    scratch.assign(n, 0.0f);
    values = scratch.data();
  } else {
    const size_t old = p.m.data.size();
    p.m.data.resize(old + n);
    values = p.m.data.data() + old;
  }
  std::string err = decode_accumulate(read_codec_params(u.codec()), payload, bytes, 1.0f, values, n);
  // Checked as it is decoded (the values are still in cache): nothing non-finite is mixed.
  if (err.empty()) {
    // The finite check measures the sum of squares in its pass, on the transport's
    // thread: the guard's norm check on the step's thread reads it (GossipEngine::screen).
    double sq = 0;
    if (const std::string where = find_non_finite(values, n, &sq); !where.empty()) {
      err = "non-finite: " + where + " of segment " + std::to_string(u.segment_index());
    } else if (!std::isfinite(p.m.push_sum_weight) || p.m.push_sum_weight < 0) {
      err = "non-finite: push-sum weight " + std::to_string(p.m.push_sum_weight);
    } else if (!p.m.synchronous || lean) {
      p.m.sum_squares += sq;
    }
  }
  if (err.empty() && lean) {
    GossipEngine::Encoded::Segment seg;
    seg.offset = u.segment_offset();
    seg.length = n;
    seg.params = read_codec_params(u.codec());
    seg.payload = std::make_shared<const std::vector<uint8_t>>(payload, payload + bytes);
    if (!p.kept) p.kept = std::make_shared<GossipEngine::Encoded>();
    p.kept->segments.push_back(std::move(seg));
  } else if (err.empty() && keep_payloads_ && p.keep && !p.m.synchronous) {
    const CodecParams params = read_codec_params(u.codec());
    const auto id = static_cast<CodecId>(params.codec_id());
    // Only codecs whose decode is the plain value (no scale of their own to multiply in):
    // with those, the weight times each value lands in device memory rounded exactly as
    // the host path's upload and axpy round it.
    if (id == CodecId::kFp16 || id == CodecId::kBf16 || id == CodecId::kTopk) {
      if (!p.kept) p.kept = std::make_shared<GossipEngine::Encoded>();
      GossipEngine::Encoded::Segment seg;
      seg.offset = u.segment_offset();
      seg.length = n;
      seg.params = params;
      seg.payload = std::make_shared<const std::vector<uint8_t>>(payload, payload + bytes);
      p.kept->segments.push_back(std::move(seg));
    } else {
      p.keep = false;
      p.kept.reset();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  decoding_.erase(key);
  if (!err.empty()) {
    if (p.m.synchronous) {
      for (auto r = refused_sync_.begin(); r != refused_sync_.end();) r = std::get<0>(r->first) == from ? refused_sync_.erase(r) : std::next(r);
      refused_sync_[{from, p.m.round, p.m.phase}] = err;
      cv_.notify_all();
    }
    return err;  // the message is dropped with its node
  }
  *held = ++p.have;
  p.filled += n;
  if (p.have == p.count) {
    if (u.resumable()) {
      completed_.emplace_back(from, u.update_id(), p.count, p.m.total);
      if (completed_.size() > kCompleted) completed_.pop_front();
    }
    auto m = std::move(p.m);
    if (p.keep && p.kept) m.payloads = std::move(p.kept);
    return complete(std::move(m));
  }
  // Back for its next segment. Should the key be there again (a replaced connection of the
  // same sender began it anew meanwhile), the one there stays and this one is dropped.
  partial_.insert(std::move(node));
  return {};
}

std::string Inbox::complete(GossipEngine::Message&& m) {
  if (m.synchronous) {
    // Bounded: a sender is never more than a round or two ahead of the slowest wait, so
    // messages for more rounds than kSyncRounds, or more than kSyncMessages in all, are a
    // flood (or a sender far off course) and are refused rather than kept forever.
    std::set<uint64_t> rounds{m.round};
    size_t held = 0;
    for (const auto& [k, v] : sync_) {
      if (std::get<0>(k) != m.from || (std::get<1>(k) == m.round && std::get<2>(k) == m.phase)) continue;
      rounds.insert(std::get<1>(k));
      ++held;
    }
    if (rounds.size() > kSyncRounds || held >= kSyncMessages) {
      return "synchronous: already holding " + std::to_string(held) + " messages over " + std::to_string(rounds.size() - 1) +
             " rounds from this peer (at most " + std::to_string(kSyncMessages) + " over " + std::to_string(kSyncRounds) +
             "); refused round " + std::to_string(m.round) + " phase " + std::to_string(m.phase);
    }
    sync_[{m.from, m.round, m.phase}] = std::move(m);
  } else if (m.kind == MessageKind::kModelDelta) {
    // Model deltas (choco's q) are taken one by one, in the order sent: a public copy stays
    // the sender's equal bit for bit only if it adds exactly the sender's deltas in turn.
    auto& queue = deltas_[m.from];
    if (queue.size() >= kDeltas) {
      return "backlog: already holding " + std::to_string(queue.size()) + " model deltas from this peer (at most " +
             std::to_string(kDeltas) + ")";
    }
    queue.push_back(std::move(m));
  } else {
    const auto key = std::make_pair(m.from, m.fold_slot());
    auto it = async_.find(key);
    if (it == async_.end()) {
      async_.emplace(key, std::move(m));
    } else {
      it->second.absorb(std::move(m));
      mixer_.count_coalesced(1);
      // Every part was finite, but their sum (push-sum mass) can overflow: refused as a
      // non-finite update, with the pending message it went into (the parts are one now).
      const auto& folded = it->second;
      std::string where = find_non_finite(folded.data.data(), folded.data.size());
      if (where.empty() && !std::isfinite(folded.push_sum_weight)) where = "the push-sum weight is infinite";
      if (!where.empty()) {
        async_.erase(it);
        return "non-finite: summed with the update pending from this peer, " + where + " (an overflow)";
      }
    }
  }
  cv_.notify_all();
  return {};
}

std::vector<GossipEngine::Message> Inbox::take_async() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<GossipEngine::Message> out;
  for (auto& [k, m] : async_) out.push_back(std::move(m));
  async_.clear();
  for (auto& [from, queue] : deltas_) {
    for (auto& m : queue) out.push_back(std::move(m));
  }
  deltas_.clear();
  return out;
}

Inbox::Inbox(Mixer& mixer, bool keep_payloads, Clock* clock, bool lean)
    : mixer_(mixer), keep_payloads_(keep_payloads), lean_(lean && !keep_payloads),
      clock_(clock != nullptr ? clock : &wall_clock()) {}

std::optional<GossipEngine::Message> Inbox::wait_sync(int from, uint64_t round, uint32_t phase, double timeout_s,
                                                      const std::atomic<bool>& stop, std::string* refused) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto key = std::make_tuple(from, round, phase);
  clock_->wait_for(lock, cv_, timeout_s, [&] { return stop || sync_.count(key) != 0 || refused_sync_.count(key) != 0; });
  auto it = sync_.find(key);
  if (it == sync_.end()) {
    if (const auto r = refused_sync_.find(key); r != refused_sync_.end() && refused != nullptr) *refused = r->second;
    return std::nullopt;
  }
  auto m = std::move(it->second);
  sync_.erase(it);
  return m;
}

void Inbox::forget_sync(const std::function<bool(int, uint64_t, uint32_t)>& stale) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = sync_.begin(); it != sync_.end();) {
    const auto& [from, round, phase] = it->first;
    it = stale(from, round, phase) ? sync_.erase(it) : std::next(it);
  }
}

std::vector<int> Inbox::take_senders_of(uint64_t round, uint32_t phase) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> from;
  for (auto it = sync_.begin(); it != sync_.end();) {
    if (std::get<1>(it->first) == round && std::get<2>(it->first) == phase) {
      from.push_back(std::get<0>(it->first));
      it = sync_.erase(it);
    } else {
      ++it;
    }
  }
  return from;
}

bool Inbox::holds_sync_from(int from, uint64_t round, uint32_t phase) const {
  std::lock_guard<std::mutex> lock(mu_);
  return sync_.count({from, round, phase}) != 0;
}

void Inbox::wake() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

size_t Inbox::buffered_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t b = 0;
  for (const auto& [k, p] : partial_) {
    b += p.m.data.capacity() * sizeof(float);
    if (p.kept) {
      for (const auto& s : p.kept->segments) b += s.payload->size();
    }
  }
  for (const auto& [k, m] : async_) b += message_held_bytes(m);
  for (const auto& [from, queue] : deltas_) {
    for (const auto& m : queue) b += message_held_bytes(m);
  }
  for (const auto& [k, m] : sync_) b += message_held_bytes(m);
  return b;
}

uint64_t Inbox::held_memory(std::unordered_set<const void*>&) const {
  // What arrives is decoded into buffers of its own: nothing here is shared with another
  // owner, so every byte counts.
  return buffered_bytes();
}

}  // namespace hearsay
