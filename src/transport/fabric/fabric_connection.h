// One peer reached over the fabric: its Session and FrameDecoder, the frames it sends (a
// FrameInFlight each, posted by the progress thread), and its stream of direct payloads.
// Its bootstrap socket is its liveness signal: the socket's close means the peer is gone.
//
// Threads: send() and close() from any thread; everything else on the progress thread.
#pragma once

#include <rdma/fabric.h>

#include <asio.hpp>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "../session_connection.h"
#include "fabric_endpoint.h"
#include "hearsay/wire.h"

namespace hearsay::fabric {

class FabricTransport;
class FabricProgress;

// A frame on its way out: its head goes as one message, its payload in chunks (or as one
// direct message); each posted message holds the frame until it completes.
struct FrameInFlight {
  OutFrame frame;
  SendCallback done;
  std::shared_ptr<FabricConnection> conn;
  size_t posted = 0;       // bytes of head + payload posted so far
  size_t outstanding = 0;  // posted messages not yet completed
  bool failed = false;
  bool finished = false;  // its callback has run (the provider may still hold its memory)
  std::string error;
  size_t total() const { return frame.size(); }
};

class FabricConnection final : public SessionConnection, public std::enable_shared_from_this<FabricConnection> {
 public:
  // `dial_peer`: the peer we dialled, or empty when the other side dialled us.
  // `direct_from`: the smallest payload sent and received direct on this link (0: none);
  // `my_stream`/`their_stream`: the tag prefixes of the direct payloads each side receives.
  FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<asio::ip::tcp::socket> bootstrap, std::string address,
                   std::string dial_peer, uint64_t direct_from, uint32_t my_stream, uint32_t their_stream);
  void start();  // progress thread
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  void close_now(const std::string& reason);  // progress thread
  void on_bytes(const uint8_t* data, size_t n);  // an untagged message; progress thread
  void on_direct_payload(bool ok, fi_addr_t src, size_t n, const std::string& error);  // progress thread
  void fail(const std::string& reason, bool rejected);  // progress thread
  void tick(Clock::time_point now) { tick_session(now); }  // progress thread
  void sent(size_t bytes) {
    counters_.bytes_sent += bytes;
    ++counters_.frames_sent;
  }
  void dequeued(size_t bytes) {
    --counters_.queue_depth;
    counters_.queue_bytes -= bytes;
  }
  fi_addr_t addr() const { return addr_; }
  // Whether a payload of this size goes direct; the tag for the next one that does, and
  // the count moved on once it is posted.
  bool sends_direct(size_t payload) const { return direct_from_ > 0 && payload >= direct_from_; }
  uint64_t send_tag() const { return direct_tag(their_stream_, send_seq_); }
  void sent_direct() { ++send_seq_; }
  bool closed() const { return closed_; }
  std::shared_ptr<asio::ip::tcp::socket> bootstrap() const { return bootstrap_; }

 private:
  // Counts a frame for the queue and hands it to the progress thread.
  void enqueue(OutFrame frame, SendCallback done);
  void decode(const uint8_t* data, size_t n);
  void on_frame(InFrame&& f);      // a decoded frame, to the session
  bool decoded(FrameError error);  // false (and the link closed) on an error
  void receive_direct();

  FabricTransport& t_;
  FabricProgress& progress_;
  fi_addr_t addr_;
  std::shared_ptr<asio::ip::tcp::socket> bootstrap_;
  // Direct payloads (both sides offered them): the sender tags each with the receiver's
  // stream and its own count; the receiver posts a tagged receive into the frame as soon
  // as the frame's header has arrived, and holds later untagged messages until it is in.
  uint64_t direct_from_;
  uint32_t my_stream_, their_stream_;
  uint32_t send_seq_ = 0, recv_seq_ = 0;
  Op* direct_op_ = nullptr;  // the posted tagged receive, if any
  uint64_t direct_bytes_ = 0;
  std::deque<std::vector<uint8_t>> held_;
  size_t held_bytes_ = 0;
  FrameDecoder decoder_;
};

}  // namespace hearsay::fabric
