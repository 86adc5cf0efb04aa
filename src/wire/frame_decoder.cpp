#include <algorithm>
#include <cstring>

#include "hearsay/wire.pb.h"
#include "hearsay/wire.h"

namespace hearsay {
namespace {

uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}


}  // namespace

FrameError FrameDecoder::fail(FrameError e, std::string detail) {
  state_ = State::kFailed;
  detail_ = std::move(detail);
  return e;
}

void FrameDecoder::set_limits(WireLimits limits) { limits_ = limits; }

// The payload vector's size is how much of it is ready to be written (never ahead of the
// bytes that arrived by more than kGrowAhead; growing it writes nothing); have_ is how
// much holds data. The CRC is taken as bytes arrive, while they are still in cache.
void FrameDecoder::grow(size_t at_least) {
  auto& p = frame_.payload;
  const uint64_t want = std::min<uint64_t>(payload_len_, have_ + std::max<uint64_t>(at_least, kGrowAhead));
  if (p.size() < want) p.resize(static_cast<size_t>(want));
}

FrameError FrameDecoder::finish_payload(const std::function<void(InFrame&&)>& on_frame) {
  if (have_ < payload_len_) return FrameError::kNone;
  frame_.payload.resize(have_);
  if (!unchecked_ && running_crc_ != crc_) return fail(FrameError::kBadCrc, "payload CRC32C mismatch");
  state_ = State::kFixed;
  fixed_have_ = 0;
  have_ = 0;
  on_frame(std::move(frame_));
  frame_ = InFrame{};
  return FrameError::kNone;
}

std::pair<uint8_t*, size_t> FrameDecoder::payload_space(size_t min_bytes) {
  if (state_ != State::kPayload || payload_len_ - have_ < min_bytes) return {nullptr, 0};
  grow(min_bytes);
  return {frame_.payload.data() + have_, frame_.payload.size() - have_};
}

FrameError FrameDecoder::commit_payload(size_t n, const std::function<void(InFrame&&)>& on_frame) {
  if (!unchecked_) running_crc_ = crc32c(frame_.payload.data() + have_, n, running_crc_);
  have_ += n;
  return finish_payload(on_frame);
}

size_t FrameDecoder::pending() const {
  switch (state_) {
    case State::kFixed: return fixed_have_;
    case State::kHeader: return kFixedHeaderSize + header_.size();
    case State::kPayload: return kFixedHeaderSize + header_len_ + have_;
    case State::kFailed: return 0;
  }
  return 0;
}

FrameError FrameDecoder::feed(const uint8_t* data, size_t n, const std::function<void(InFrame&&)>& on_frame) {
  if (state_ == State::kFailed) return FrameError::kBadMagic;
  while (n > 0 || state_ == State::kPayload) {
    if (state_ == State::kFixed) {
      const size_t take = std::min(n, kFixedHeaderSize - fixed_have_);
      std::memcpy(fixed_ + fixed_have_, data, take);
      fixed_have_ += take;
      data += take;
      n -= take;
      if (fixed_have_ < kFixedHeaderSize) return FrameError::kNone;
      const uint32_t magic = static_cast<uint32_t>(get_le(fixed_, 4));
      if (magic != kFrameMagic) return fail(FrameError::kBadMagic, "wrong magic (not a hearsay frame)");
      const uint16_t version = static_cast<uint16_t>(get_le(fixed_ + 4, 2));
      if (version != kWireVersion) {
        return fail(FrameError::kBadVersion, "frame version " + std::to_string(version) + ", this peer speaks " +
                                                 std::to_string(kWireVersion));
      }
      header_len_ = static_cast<uint32_t>(get_le(fixed_ + 8, 4));
      payload_len_ = get_le(fixed_ + 12, 8);
      crc_ = static_cast<uint32_t>(get_le(fixed_ + 20, 4));
      unchecked_ = (get_le(fixed_ + 6, 2) & kFrameFlagNoCrc) != 0;
      if (unchecked_ && !accept_unchecked_) {
        return fail(FrameError::kBadCrc, "frame without a payload CRC32C, which this transport requires");
      }
      if (header_len_ > limits_.max_header_bytes) {
        return fail(FrameError::kHeaderTooLarge, "header of " + std::to_string(header_len_) + " bytes exceeds the limit of " +
                                                     std::to_string(limits_.max_header_bytes));
      }
      if (payload_len_ > limits_.max_payload_bytes) {
        return fail(FrameError::kPayloadTooLarge, "payload of " + std::to_string(payload_len_) +
                                                      " bytes exceeds the limit of " + std::to_string(limits_.max_payload_bytes));
      }
      header_.clear();
      frame_ = InFrame{};
      // The length passed the limit check: reserve it once, so large payloads are not
      // copied as they grow. (Connections keep the limit small until admission.)
      frame_.payload.reserve(static_cast<size_t>(payload_len_));
      have_ = 0;
      running_crc_ = 0;
      state_ = State::kHeader;
    }
    if (state_ == State::kHeader) {
      const size_t take = std::min<size_t>(n, header_len_ - header_.size());
      header_.append(reinterpret_cast<const char*>(data), take);
      data += take;
      n -= take;
      if (header_.size() < header_len_) return FrameError::kNone;
      frame_.envelope = std::make_shared<wire::Envelope>();
      if (!frame_.envelope->ParseFromString(header_)) return fail(FrameError::kBadProtobuf, "envelope does not parse");
      state_ = State::kPayload;
    }
    if (state_ == State::kPayload) {
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, payload_len_ - have_));
      if (take > 0) {
        grow(take);
        std::memcpy(frame_.payload.data() + have_, data, take);
        if (!unchecked_) running_crc_ = crc32c(data, take, running_crc_);
        have_ += take;
      }
      data += take;
      n -= take;
      const FrameError e = finish_payload(on_frame);
      if (e != FrameError::kNone || state_ == State::kPayload) return e;
    }
  }
  return FrameError::kNone;
}

}  // namespace hearsay
