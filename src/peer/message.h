// A logical gossip message as the engine sees it: a slice of a flat tensor with the
// sender's clock and what it is. It may travel as several wire segments.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hearsay/wire.pb.h"
#include "hearsay/gossip.h"

namespace hearsay {

struct GossipEngine::Message {
  int from = -1;
  MessageKind kind = MessageKind::kModel;
  uint64_t clock = 0, step = 0, samples = 0;
  double push_sum_weight = 0;
  bool synchronous = false, reply_requested = false;
  double mix_share = 0;  // adpsgd replies: the share the replier used
  uint64_t round = 0;
  uint32_t phase = 0;
  uint64_t offset = 0;  // of data within the whole tensor, in elements
  uint64_t total = 0;   // the whole tensor's length
  std::vector<float> data;
  // Set by send_shared: the tensor to send, which its sender keeps too (adpsgd's request:
  // the model it sent is the base of the exchange); data is empty. Never written.
  std::shared_ptr<const std::vector<float>> shared;
  // Set by the inbox as it decodes an arrival: the sum of squares of data (the guard's
  // norm check then needs no pass of its own); negative when not measured (a fold).
  double sum_squares = -1;
  uint64_t coalesced = 0;  // how many messages were folded into this one
  // Set by send_encoded: the payloads to send as they are (data is empty). A whole model so
  // is never folded with another (a link sends them in order); a gradient or a delta
  // waiting behind a busy link folds with the next (absorb): two fp16 or bf16 gradients
  // into their mean in that codec, anything else as decoded floats.
  std::shared_ptr<const Encoded> encoded;
  // Set by send_device on a peer that gossips on its device: the tensor in
  // device memory (data is empty until a fallback downloads it).
  std::shared_ptr<const DeviceSnapshot> device;
  // On such a peer, an asynchronous arrival whose every segment's codec decodes to plain
  // values (fp16, bf16, topk): the payloads as they arrived, beside the host-decoded data
  // (which the guard checks), so the engine can decode them with a weight straight into
  // device memory. Dropped when the message is folded with another (they no longer say
  // what data holds).
  // On a host peer, an asynchronous arrival (push-sum shares excepted) keeps only these,
  // data empty (kept_only()): the codec's bytes, not a decoded fp32 copy, per message held
  // (an fp16 model is half the memory, a top-k gradient a fraction). The engine decodes
  // them a segment at a time where it applies the message (GossipEngine::for_each_part),
  // or whole where a rule needs the whole vector (decode_kept).
  std::shared_ptr<const Encoded> payloads;

  bool kept_only() const { return data.empty() && payloads != nullptr && device == nullptr && shared == nullptr; }

  // The tensor's length, wherever it lives.
  size_t elements() const;

  // Folds a newer message of the same kind into this one: models, newest wins; gradients
  // become the mean of their parts (so a slow link's sender does not step m times as far);
  // push-sum mass adds up (nothing is lost, memory stays one message). The clock is the
  // oldest part's.
  void absorb(Message&& newer);
  // Which pending message a newer one may fold into: by kind, and a request for a model
  // in return (adpsgd) never folds with a reply or a plain model.
  int fold_slot() const { return 2 * static_cast<int>(kind) + (reply_requested ? 1 : 0); }
};

// An update encoded once (encode_once), to go as the same bytes to every neighbour.
struct GossipEngine::Encoded {
  struct Segment {
    uint64_t offset = 0, length = 0;  // in elements, within the whole tensor
    CodecParams params;
    std::shared_ptr<const std::vector<uint8_t>> payload;
  };
  std::vector<Segment> segments;
  // What a receiver decodes from the segments, bit for bit (the same decoder, into zeros).
  std::vector<float> decoded;
};

// A message that kept only its payloads (kept_only()): decoded into data (into zeros, at
// scale 1: the values the inbox checked) and the payloads dropped. Nothing otherwise.
void decode_kept(GossipEngine::Message& m);
// Memory a message holds: its host data, shared tensor, device snapshot, kept payloads.
size_t message_held_bytes(const GossipEngine::Message& m);

// An Encoded of a tensor of n elements cut into `segments` ((offset, length) pairs):
// encode(offset, length, payload, params) writes each segment's payload; what a receiver
// decodes from them is filled in (the inbox's decoder, into zeros, scale 1) and checked.
// The one place encode_once, demo and CompressedSum build the bytes they send to many.
std::shared_ptr<const GossipEngine::Encoded> build_encoded(
    size_t n, const std::vector<std::pair<size_t, size_t>>& segments,
    const std::function<void(size_t offset, size_t length, std::vector<uint8_t>& payload, CodecParams& params)>& encode,
    float* decoded_into = nullptr,  // where the decoded values go instead of `decoded` (written over; n floats)
    bool keep_decoded = true);      // false: `decoded` left empty (each segment still checked to decode)

// One segment's values, decoded (into zeros, scale 1) into `scratch`; returns its data.
// Throws if it does not decode (it was checked when it was made or when it arrived).
const float* decode_segment(const GossipEngine::Encoded::Segment& seg, std::vector<float>& scratch);
// The values an Encoded's segments decode to, a segment at a time, in order: fn(offset
// within the tensor, values, count), decoded (into zeros, scale 1) into `scratch`, which
// each call reuses. Throws if a segment does not decode (it was checked when it was made
// or when it arrived).
void for_each_decoded(const GossipEngine::Encoded& e, std::vector<float>& scratch,
                      const std::function<void(size_t at, const float* y, size_t n)>& fn);

// A tensor snapshot in device memory (GossipEngine::snapshot_device), complete: no device
// work is pending on it when it is handed over, so any thread may read it.
struct GossipEngine::DeviceSnapshot {
  virtual ~DeviceSnapshot() = default;
  virtual size_t size() const = 0;
  virtual const float* data() const = 0;  // device memory
  // The values on the host, downloaded at the first call and kept, so every link that
  // needs them dense (raw fp32, a fallback) shares one download. Any thread.
  virtual std::shared_ptr<const std::vector<float>> host() const = 0;
  // a * this + b * other (of the same length) as a new snapshot: an outbox folding two
  // messages. Step-loop thread (it runs on the peer's backend).
  virtual std::shared_ptr<const DeviceSnapshot> combine(float a, const DeviceSnapshot& other, float b) const = 0;
};

// The Update fields that describe a message (all but the segment's place and codec), and
// the message a first segment describes. The one mapping both ways.
void write_header(const GossipEngine::Message& m, const std::string& sender, wire::Update* u);
// A codec's parameters onto the wire and back (the codecs use the runtime type).
void write_codec_params(const CodecParams& p, wire::CodecParams* w);
CodecParams read_codec_params(const wire::CodecParams& w);
GossipEngine::Message read_header(const wire::Update& u, int from);

}  // namespace hearsay
