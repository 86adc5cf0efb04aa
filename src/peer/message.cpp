// A message's own operations, apart from the queues that hold it (mailboxes.cpp): its
// length, decoding what it kept, folding a newer one into it, the memory it holds.
#include <algorithm>
#include <cmath>

#include "hearsay/codec.h"
#include "hearsay/error.h"
#include "message.h"

namespace hearsay {

size_t GossipEngine::Message::elements() const {
  if (device) return device->size();
  if (shared) return shared->size();
  if (!data.empty()) return data.size();
  // Kept as the payloads it came in, or encoded once to send: its segments' lengths.
  const auto& bytes = payloads ? payloads : encoded;
  size_t n = 0;
  if (bytes) {
    for (const auto& seg : bytes->segments) n += seg.length;
  }
  return n;
}

const float* decode_segment(const GossipEngine::Encoded::Segment& seg, std::vector<float>& scratch) {
  scratch.assign(seg.length, 0.0f);
  const std::string err = decode_accumulate(seg.params, seg.payload->data(), seg.payload->size(), 1.0f, scratch.data(), seg.length);
  HEARSAY_CHECK(err.empty(), "a payload checked when it was made or arrived does not decode now: " + err);
  return scratch.data();
}

void decode_kept(GossipEngine::Message& m) {
  if (!m.kept_only()) return;
  m.data.assign(m.elements(), 0.0f);
  for (const auto& seg : m.payloads->segments) {
    const std::string err = decode_accumulate(seg.params, seg.payload->data(), seg.payload->size(), 1.0f,
                                              m.data.data() + (seg.offset - m.offset), seg.length);
    // The inbox decoded these very bytes when they arrived, and kept them only if they did.
    HEARSAY_CHECK(err.empty(), "a kept payload that decoded on arrival does not decode now: " + err);
  }
  m.payloads.reset();
}

namespace {

// The codec's bytes a message holds in place of floats: what it came as (payloads, on a
// host peer's inbox) or what it will send (encoded once); null when it holds floats.
std::shared_ptr<const GossipEngine::Encoded>* bytes_of(GossipEngine::Message& m) {
  if (m.kept_only()) return &m.payloads;
  if (m.encoded && m.data.empty() && m.shared == nullptr && m.device == nullptr && m.payloads == nullptr) return &m.encoded;
  return nullptr;
}

// Encoded bytes to send that must fold with another message: decoded into data, as a
// receiver decodes them (the link then encodes the fold as it would any floats).
void decode_encoded(GossipEngine::Message& m) {
  if (bytes_of(m) != &m.encoded) return;
  m.data.assign(m.elements(), 0.0f);
  std::vector<float> scratch;
  for (const auto& seg : m.encoded->segments) {
    const float* y = decode_segment(seg, scratch);
    std::copy(y, y + seg.length, m.data.data() + (seg.offset - m.offset));
  }
  m.encoded.reset();
}

// Whether two gradients hold their bytes alike (both kept, or both encoded to send), every
// segment over the same range under the same rounding codec (fp16 or bf16), so that their
// mean can be rounded again in it.
bool fold_stays_rounded(GossipEngine::Message& a, GossipEngine::Message& b) {
  if (a.kind != MessageKind::kGradient || a.offset != b.offset) return false;
  const auto* pa = bytes_of(a);
  const auto* pb = bytes_of(b);
  if (pa == nullptr || pb == nullptr || (pa == &a.payloads) != (pb == &b.payloads)) return false;
  const auto& x = (*pa)->segments;
  const auto& y = (*pb)->segments;
  if (x.size() != y.size()) return false;
  for (size_t k = 0; k < x.size(); ++k) {
    const uint32_t id = x[k].params.codec_id();
    if (x[k].offset != y[k].offset || x[k].length != y[k].length || id != y[k].params.codec_id()) return false;
    if (id != static_cast<uint32_t>(CodecId::kFp16) && id != static_cast<uint32_t>(CodecId::kBf16)) return false;
  }
  return true;
}

// into <- the mean of into (weight a) and newer (weight b), a segment at a time, rounded
// to the codec both hold: one message of that codec's bytes per sender (an inbox) or per
// link (an outbox) however many fold (a dense fold held 4 bytes a value, and 8 while it
// ran), for one more rounding to nearest of the mean (the codec's own error, once more).
// Its sum of squares is the guard's, of the values the step will add.
void fold_rounded(GossipEngine::Message& into, GossipEngine::Message& newer, double a, double b) {
  std::shared_ptr<const GossipEngine::Encoded>& mine = *bytes_of(into);
  const GossipEngine::Encoded& theirs = **bytes_of(newer);
  auto out = std::make_shared<GossipEngine::Encoded>();
  std::vector<float> x, y;
  double sq = 0;
  std::unique_ptr<Codec> codecs[2];  // fp16's, bf16's: made when first needed
  for (size_t k = 0; k < mine->segments.size(); ++k) {
    const auto& sx = mine->segments[k];
    const auto& sy = theirs.segments[k];
    decode_segment(sx, x);
    decode_segment(sy, y);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((a * x[i] + b * y[i]) / (a + b));
    const bool fp16 = sx.params.codec_id() == static_cast<uint32_t>(CodecId::kFp16);
    std::unique_ptr<Codec>& codec = codecs[fp16 ? 0 : 1];
    if (!codec) {
      CodecSpec spec;
      spec.name = fp16 ? "fp16" : "bf16";
      codec = make_codec(spec, {}, 0);
    }
    GossipEngine::Encoded::Segment seg;
    seg.offset = sx.offset;
    seg.length = sx.length;
    auto payload = std::make_shared<std::vector<uint8_t>>();
    codec->encode(x.data(), x.size(), seg.offset, *payload, seg.params);
    seg.payload = std::move(payload);
    const float* rounded = decode_segment(seg, y);
    for (size_t i = 0; i < seg.length; ++i) sq += static_cast<double>(rounded[i]) * rounded[i];
    out->segments.push_back(std::move(seg));
  }
  mine = std::move(out);
  into.sum_squares = sq;
}

}  // namespace

void GossipEngine::Message::absorb(Message&& newer) {
  if (fold_stays_rounded(*this, newer)) {
    // The mean of the parts, each weighted by how many it holds, as the dense fold below.
    fold_rounded(*this, newer, static_cast<double>(coalesced + 1), static_cast<double>(newer.coalesced + 1));
    coalesced += newer.coalesced + 1;
    clock = std::min(clock, newer.clock);
    step = std::max(step, newer.step);
    samples = std::max(samples, newer.samples);
    return;
  }
  if (kind != MessageKind::kModel) {
    decode_encoded(*this);
    decode_encoded(newer);
  }
  // Payloads kept alone are decoded before a fold sums them (a model's newest wins whole).
  if (kind != MessageKind::kModel) {
    decode_kept(*this);
    decode_kept(newer);
  }
  // A shared tensor is read-only: a fold that adds to it works on a copy.
  for (Message* part : {this, &newer}) {
    if (part->shared && part->kind != MessageKind::kModel) {
      part->data = *part->shared;
      part->shared.reset();
    }
  }
  // Two device snapshots fold on the device (DeviceSnapshot::combine); a snapshot meeting a
  // host message (a fallback made that one) folds on the host.
  if ((device == nullptr) != (newer.device == nullptr)) {
    for (Message* part : {this, &newer}) {
      if (part->device == nullptr) continue;
      part->data = *part->device->host();
      part->device.reset();
    }
  }
  const uint64_t folded = coalesced + newer.coalesced + 1;
  if (kind == MessageKind::kModel || elements() != newer.elements() || offset != newer.offset) {
    const bool reply = reply_requested || newer.reply_requested;
    *this = std::move(newer);
    reply_requested = reply;
  } else if (kind == MessageKind::kGradient) {
    // The mean of the parts, each message weighted by how many it holds: a sender whose
    // gradients pile up on a slow link counts, per message taken, for one gradient.
    const double a = static_cast<double>(coalesced + 1), b = static_cast<double>(newer.coalesced + 1);
    if (device != nullptr) {
      device = device->combine(static_cast<float>(a / (a + b)), *newer.device, static_cast<float>(b / (a + b)));
    } else {
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>((a * data[i] + b * newer.data[i]) / (a + b));
    }
    payloads.reset();  // the arrived payloads no longer say what data holds
    sum_squares = -1;
    clock = std::min(clock, newer.clock);
    step = std::max(step, newer.step);
    samples = std::max(samples, newer.samples);
  } else {
    if (device != nullptr) {
      device = device->combine(1.0f, *newer.device, 1.0f);
    } else {
      for (size_t i = 0; i < data.size(); ++i) data[i] += newer.data[i];
    }
    payloads.reset();
    sum_squares = -1;
    push_sum_weight += newer.push_sum_weight;
    // Staleness of a sum is that of its oldest part.
    clock = std::min(clock, newer.clock);
    step = std::max(step, newer.step);
    samples = std::max(samples, newer.samples);
  }
  coalesced = folded;
}

size_t message_held_bytes(const GossipEngine::Message& m) {
  size_t b = m.data.size() * sizeof(float);
  if (m.shared) b += m.shared->size() * sizeof(float);
  if (m.device) b += m.device->size() * sizeof(float);
  for (const auto* bytes : {&m.payloads, &m.encoded}) {
    if (*bytes == nullptr) continue;
    for (const auto& s : (*bytes)->segments) b += s.payload->size();
  }
  return b;
}

}  // namespace hearsay
