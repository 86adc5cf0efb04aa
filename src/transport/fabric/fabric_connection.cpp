#include "fabric_connection.h"

#include "fabric_progress.h"
#include "fabric_transport_impl.h"
#include "hearsay/error.h"

namespace hearsay::fabric {
namespace {

// Untagged messages held while a direct payload is on its way (they belong after it).
constexpr size_t kMaxHeldBytes = 16u << 20;

}  // namespace

FabricConnection::FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<asio::ip::tcp::socket> bootstrap,
                                   std::string address, std::string dial_peer, uint64_t direct_from, uint32_t my_stream,
                                   uint32_t their_stream)
    : SessionConnection(t.options(), std::move(address), std::move(dial_peer),
                        Session::Hooks{
                            [this](OutFrame f) { enqueue(std::move(f), nullptr); },
                            [this](const std::string& reason) { fail(reason, true); },
                            [this](const std::string& peer) {
                              counters_.admitted = true;
                              t_.connection_admitted(peer);
                              decoder_.set_limits(t_.options().limits);
                              decoder_.accept_unchecked_payloads(t_.omits_crc());
                              t_.links().admitted(peer, shared_from_this(), address_);
                            },
                            [this](InFrame&& f) { t_.links().deliver(session_.peer_id(), std::move(f)); },
                            [this](const std::string& reason) { t_.links().dropped(session_.peer_id(), address_, reason); },
                        }),
      t_(t), progress_(t.progress()), addr_(addr), bootstrap_(std::move(bootstrap)), direct_from_(direct_from),
      my_stream_(my_stream), their_stream_(their_stream), decoder_(kHandshakeLimits) {}

void FabricConnection::start() { session_.start(); }

void FabricConnection::enqueue(OutFrame frame, SendCallback done) {
  ++counters_.queue_depth;
  counters_.queue_bytes += frame.size();
  auto fl = std::make_shared<FrameInFlight>();
  fl->frame = std::move(frame);
  fl->done = std::move(done);
  fl->conn = shared_from_this();
  progress_.enqueue(std::move(fl));
}

void FabricConnection::send(OutFrame frame, SendCallback done) { enqueue(std::move(frame), std::move(done)); }

void FabricConnection::close(const std::string& reason) {
  auto self = shared_from_this();
  progress_.run([this, self, reason] { close_now(reason); });
}

void FabricConnection::close_now(const std::string& reason) {
  if (closed_) return;
  if (session_.admitted()) {
    // Close once the Bye has left.
    auto self = shared_from_this();
    return enqueue(bye(reason), [this, self, reason](const SendStatus&) { fail(reason, false); });
  }
  fail(reason, false);
}

void FabricConnection::on_bytes(const uint8_t* data, size_t n) {
  if (closed_) return;
  if (direct_op_ != nullptr) {  // sent after the payload on its way: wait for it
    if (held_bytes_ + n > kMaxHeldBytes) {
      return fail("protocol: " + std::to_string(held_bytes_ + n) + " bytes of messages arrived while waiting for a direct payload of " +
                      std::to_string(direct_bytes_) + " bytes",
                  true);
    }
    held_.emplace_back(data, data + n);
    held_bytes_ += n;
    return;
  }
  decode(data, n);
}

void FabricConnection::on_frame(InFrame&& f) {
  ++counters_.frames_received;
  if (!closed_) session_.on_frame(std::move(f));
}

bool FabricConnection::decoded(FrameError err) {
  if (err == FrameError::kNone) return true;
  fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
  return false;
}

void FabricConnection::decode(const uint8_t* data, size_t n) {
  counters_.bytes_received += n;
  if (decoded(decoder_.feed(data, n, [this](InFrame&& f) { on_frame(std::move(f)); })) && !closed_) receive_direct();
}

// A frame whose header just arrived and whose payload is large enough: its payload comes
// as the next tagged message, straight into the frame.
void FabricConnection::receive_direct() {
  const uint64_t rest = decoder_.payload_remaining();
  if (direct_from_ == 0 || rest < direct_from_ || !session_.admitted()) return;
  const auto [dst, room] = decoder_.payload_space(static_cast<size_t>(rest));
  HEARSAY_CHECK(dst != nullptr && room == rest, "fabric: the decoder gave no room for a direct payload");
  std::string error;
  direct_op_ = progress_.post_direct_recv(shared_from_this(), dst, static_cast<size_t>(rest), direct_tag(my_stream_, recv_seq_++), &error);
  if (direct_op_ == nullptr) return fail("direct payload: " + error, false);
  direct_bytes_ = rest;
}

void FabricConnection::on_direct_payload(bool ok, fi_addr_t src, size_t n, const std::string& error) {
  direct_op_ = nullptr;
  if (closed_) return;
  if (!ok) return fail("direct payload: " + error, true);
  // The receive took any sender's message with this tag; only the admitted peer's counts.
  if (src != addr_) return fail("bad_frame: a direct payload from an endpoint other than the peer's", true);
  if (n != direct_bytes_) {
    return fail("bad_frame: direct payload of " + std::to_string(n) + " bytes, the header said " + std::to_string(direct_bytes_), true);
  }
  counters_.bytes_received += n;
  if (!decoded(decoder_.commit_payload(n, [this](InFrame&& f) { on_frame(std::move(f)); }))) return;
  while (!held_.empty() && direct_op_ == nullptr && !closed_) {
    const std::vector<uint8_t> m = std::move(held_.front());
    held_.pop_front();
    held_bytes_ -= m.size();
    decode(m.data(), m.size());
  }
}

void FabricConnection::fail(const std::string& reason, bool rejected) {
  if (!mark_closed()) return;
  if (direct_op_ != nullptr) progress_.cancel(direct_op_);
  if (direct_from_ > 0) progress_.discard_stream(my_stream_);
  progress_.abandon_sends(this, reason);
  held_.clear();
  held_bytes_ = 0;
  report_end(t_.links(), reason, rejected);
  t_.connection_closed(shared_from_this());
}

}  // namespace hearsay::fabric
