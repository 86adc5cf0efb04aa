// The wire format (docs/WIRE.md). A frame is
//
//   fixed header (24 bytes, little-endian) | protobuf Envelope | raw payload
//   magic u32 "HRSY" | version u16 | flags u16 | header_len u32 | payload_len u64 | payload CRC32C u32
//
// Tensor payloads travel outside protobuf: no extra copy, no 2 GiB limit. The decoder
// checks every length against configured limits before it allocates anything.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hearsay {

// The protobuf messages of the frame header (proto/hearsay/wire.proto). Code that builds
// or reads them includes the header protoc generates for wire.proto; this header and the
// transports' interface only pass them along.
namespace wire {
class Envelope;
class Update;
}  // namespace wire

inline constexpr uint32_t kFrameMagic = 0x59535248;  // "HRSY" in memory order
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kFixedHeaderSize = 24;
// Fixed-header flag: the payload carries no CRC32C (the field is 0). Only transports whose
// medium cannot corrupt data unnoticed (same-host shared memory; TLS, whose records are
// authenticated) send such frames, and only their decoders accept them
// (FrameDecoder::accept_unchecked_payloads).
inline constexpr uint16_t kFrameFlagNoCrc = 1;

// A peer's name, in a config and in a Hello: 1 to 64 bytes of letters, digits, '.', '_'
// and '-', not starting with '.'. It names the peer's log file and its links in every
// message, so it can hold no path, no space and nothing a terminal would interpret.
inline constexpr size_t kMaxPeerNameBytes = 64;
bool is_peer_name(const std::string& name);

struct WireLimits {
  uint32_t max_header_bytes = 64 * 1024;
  uint64_t max_payload_bytes = uint64_t{1} << 30;
};

// Limits for a connection that has not been admitted yet: Hello frames are small.
inline constexpr WireLimits kHandshakeLimits{4096, 4096};

// CRC32C (Castagnoli), hardware-accelerated with SSE4.2 where the CPU has it.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// A frame ready to send: `head` holds the fixed header and the encoded Envelope; the
// payload is referenced, not copied, and kept alive by `payload_owner` until sent. Its
// CRC32C is filled in by the transport that sends it (seal_crc), which knows whether its
// medium needs one (omit_crc otherwise), so no payload is checksummed for nothing.
struct OutFrame {
  std::string head;
  const uint8_t* payload = nullptr;
  size_t payload_size = 0;
  std::shared_ptr<const void> payload_owner;
  bool sealed = false;  // the CRC field (or the no-CRC flag) is final
  // A small control frame (Heartbeat, Credit, Probe) that a transport with a queue of its
  // own sends before the data frames waiting there: a heartbeat never waits behind a
  // window of gigabyte-message segments. Set by make_frame.
  bool urgent = false;

  size_t size() const { return head.size() + payload_size; }
};
// Computes the payload's CRC32C into the head (once).
void seal_crc(OutFrame& frame);
// Marks the frame as carrying no CRC (kFrameFlagNoCrc) instead.
void omit_crc(OutFrame& frame);

// Builds a frame. With an owner, the payload is referenced; without one it is copied.
OutFrame make_frame(const wire::Envelope& envelope, const uint8_t* payload = nullptr, size_t payload_size = 0,
                    std::shared_ptr<const void> payload_owner = nullptr);
// The whole frame as one byte string, CRC included (tests, fuzzing, datagram transports).
std::string flatten(const OutFrame& frame);

// Allocates without value-initialising: a received payload is written by the socket
// before it is read, so zero-filling it first would be a wasted pass over every byte.
template <class T>
struct UninitializedAllocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <class U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: left as it is for bytes
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using PayloadBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// A received, checked frame. The envelope is held by pointer so that this header needs
// no protobuf; a decoded frame always has one.
struct InFrame {
  std::shared_ptr<wire::Envelope> envelope;
  PayloadBytes payload;
};

// Why a frame was rejected. Every reason but kNone is counted; all of them except
// kBadUpdate leave the byte stream impossible to resynchronise, so the connection closes.
enum class FrameError {
  kNone,
  kBadMagic,
  kBadVersion,
  kHeaderTooLarge,
  kPayloadTooLarge,
  kBadCrc,
  kBadProtobuf,
  kBadUpdate,
};
const char* frame_error_name(FrameError e);

// Incremental decoder for one byte stream. Feed it bytes as they arrive; it emits each
// complete frame. After an error it refuses further input. A payload's memory is
// reserved once its length has passed the limit check; connections use a small limit
// (kHandshakeLimits) until the peer is admitted.
class FrameDecoder {
 public:
  explicit FrameDecoder(WireLimits limits = {}) : limits_(limits) {}
  // Consumes all of data; calls on_frame for each complete frame. Returns kNone, or the
  // error that stopped decoding (detail() says more).
  FrameError feed(const uint8_t* data, size_t n, const std::function<void(InFrame&&)>& on_frame);
  const std::string& detail() const { return detail_; }
  // Applies to frames whose fixed header has not been read yet.
  void set_limits(WireLimits limits);
  // Whether frames flagged kFrameFlagNoCrc are accepted (default: refused as kBadCrc).
  void accept_unchecked_payloads(bool accept) { accept_unchecked_ = accept; }
  // While a payload of at least `min_bytes` more is expected: where the caller may write
  // its next bytes directly (a socket read), saving a copy. {nullptr, 0} otherwise.
  // After writing n bytes there, call commit_payload(n).
  std::pair<uint8_t*, size_t> payload_space(size_t min_bytes);
  FrameError commit_payload(size_t n, const std::function<void(InFrame&&)>& on_frame);
  // Bytes buffered towards the next frame.
  size_t pending() const;
  // Payload bytes the current frame still expects (0 unless its header has been read).
  uint64_t payload_remaining() const { return state_ == State::kPayload ? payload_len_ - have_ : 0; }

 private:
  FrameError fail(FrameError e, std::string detail);
  void grow(size_t at_least);
  FrameError finish_payload(const std::function<void(InFrame&&)>& on_frame);
  static constexpr uint64_t kGrowAhead = 4u << 20;

  WireLimits limits_;
  enum class State { kFixed, kHeader, kPayload, kFailed } state_ = State::kFixed;
  uint8_t fixed_[kFixedHeaderSize];
  size_t fixed_have_ = 0;
  uint32_t header_len_ = 0;
  uint64_t payload_len_ = 0;
  uint64_t have_ = 0;  // payload bytes received
  bool accept_unchecked_ = false;
  bool unchecked_ = false;    // this frame carries no CRC
  uint32_t crc_ = 0;          // the payload's CRC32C, as the header states it
  uint32_t running_crc_ = 0;  // of the payload bytes received so far
  std::string header_;
  InFrame frame_;
  std::string detail_;
};

// Checks an Update's segment against its payload and (if known, > 0) the receiver's
// tensor length: offset + length within the tensor, segment index below the count,
// payload size consistent with an uncompressed (codec 0) fp32 segment. Returns an empty
// string when valid, else the reason.
std::string check_update(const wire::Update& u, size_t payload_size, uint64_t expected_tensor_length = 0);

}  // namespace hearsay
