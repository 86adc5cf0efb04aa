#include <cstring>

#include "hearsay/wire.pb.h"
#include "hearsay/error.h"
#include "hearsay/wire.h"

namespace hearsay {
namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace

bool is_peer_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxPeerNameBytes || name.front() == '.') return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

OutFrame make_frame(const wire::Envelope& envelope, const uint8_t* payload, size_t payload_size,
                    std::shared_ptr<const void> payload_owner) {
  OutFrame f;
  const size_t header_len = envelope.ByteSizeLong();
  f.head.reserve(kFixedHeaderSize + header_len);
  put_le(f.head, kFrameMagic, 4);
  put_le(f.head, kWireVersion, 2);
  put_le(f.head, 0, 2);  // flags
  put_le(f.head, header_len, 4);
  put_le(f.head, payload_size, 8);
  put_le(f.head, 0, 4);  // the CRC: filled in by the sending transport (seal_crc)
  HEARSAY_CHECK(envelope.AppendToString(&f.head), "envelope serialisation failed");
  if (payload_size > 0 && payload_owner == nullptr) {
    auto copy = std::make_shared<std::vector<uint8_t>>(payload, payload + payload_size);
    f.payload = copy->data();
    f.payload_owner = std::move(copy);
  } else {
    f.payload = payload;
    f.payload_owner = std::move(payload_owner);
  }
  f.payload_size = payload_size;
  f.sealed = payload_size == 0;  // an empty payload's CRC32C is 0
  f.urgent = envelope.has_heartbeat() || envelope.has_credit() || envelope.has_probe();
  return f;
}

namespace {
constexpr size_t kFlagsAt = 6, kCrcAt = 20;
void put_at(std::string& head, size_t at, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) head[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
}  // namespace

void seal_crc(OutFrame& f) {
  if (f.sealed) return;
  put_at(f.head, kCrcAt, crc32c(f.payload, f.payload_size), 4);
  f.sealed = true;
}

void omit_crc(OutFrame& f) {
  if (f.payload_size == 0) return f.sealed = true, void();  // nothing to check anyway
  const uint16_t flags = static_cast<uint8_t>(f.head[kFlagsAt]) | (static_cast<uint8_t>(f.head[kFlagsAt + 1]) << 8);
  put_at(f.head, kFlagsAt, flags | kFrameFlagNoCrc, 2);
  put_at(f.head, kCrcAt, 0, 4);
  f.sealed = true;
}

std::string flatten(const OutFrame& frame) {
  OutFrame sealed = frame;
  seal_crc(sealed);
  std::string s = sealed.head;
  s.append(reinterpret_cast<const char*>(frame.payload), frame.payload_size);
  return s;
}

const char* frame_error_name(FrameError e) {
  switch (e) {
    case FrameError::kNone: return "none";
    case FrameError::kBadMagic: return "bad_magic";
    case FrameError::kBadVersion: return "bad_version";
    case FrameError::kHeaderTooLarge: return "header_too_large";
    case FrameError::kPayloadTooLarge: return "payload_too_large";
    case FrameError::kBadCrc: return "bad_crc";
    case FrameError::kBadProtobuf: return "bad_protobuf";
    case FrameError::kBadUpdate: return "bad_update";
  }
  return "unknown";
}

std::string check_update(const wire::Update& u, size_t payload_size, uint64_t expected_tensor_length) {
  const uint64_t total = u.tensor_length();
  if (expected_tensor_length > 0 && total != expected_tensor_length) {
    return "tensor_length " + std::to_string(total) + " differs from the receiver's " + std::to_string(expected_tensor_length);
  }
  if (u.segment_length() > total || u.segment_offset() > total - u.segment_length()) {
    return "segment [" + std::to_string(u.segment_offset()) + ", +" + std::to_string(u.segment_length()) +
           ") lies outside the tensor of " + std::to_string(total) + " elements";
  }
  if (u.segment_count() > 0 && u.segment_index() >= u.segment_count()) {
    return "segment_index " + std::to_string(u.segment_index()) + " >= segment_count " + std::to_string(u.segment_count());
  }
  if (u.codec().codec_id() == 0 && payload_size != u.segment_length() * sizeof(float)) {
    return "uncompressed segment of " + std::to_string(u.segment_length()) + " elements needs " +
           std::to_string(u.segment_length() * sizeof(float)) + " payload bytes, got " + std::to_string(payload_size);
  }
  return {};
}

}  // namespace hearsay
