// The frames of one message as the engine cuts it into segments (engine_send.cpp's host
// path, engine_device.cpp's device path): one wire header each, with the payload.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "hearsay/transport.h"
#include "hearsay/wire.h"
#include "hearsay/wire.pb.h"
#include "message.h"

namespace hearsay {

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

}  // namespace hearsay
