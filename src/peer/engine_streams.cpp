// GossipEngine's large messages (src/peer/message_stream.h; docs/WIRE.md, "Large
// messages"): one stream per link while one is under way, the receiver's acknowledgements
// of their segments, and the resumption of a stream whose link came back.

#include "../util/callback_gate.h"
#include "algorithm.h"
#include "hearsay/wire.pb.h"
#include "message_stream.h"

#include <algorithm>
#include <cstdint>

namespace hearsay {

void GossipEngine::start_stream(int to, uint64_t update_id, uint32_t segments, std::function<OutFrame(uint32_t)> make,
                                std::function<void(const SendStatus&, uint64_t bytes)> done, bool shares_message) {
  MessageStream::Options o;
  o.frames_share_message = shares_message;
  o.window_bytes = spec_.stream_window_bytes;
  o.resume_timeout_s = spec_.stream_resume_timeout_s;
  const double t0 = clock_.now();
  auto stream = std::make_shared<MessageStream>(
      update_id, segments, std::move(make),
      [this, gate = send_gate_, peer = peers_[to]](OutFrame f, SendCallback sent) {
        // The transport outlives the engine: what a stream sends after the engine is gone
        // is not sent, and a completion after it is not told (the stream reads the
        // engine's clock).
        const CallbackGate::Pass pass(*gate);
        if (!pass) return;
        transport_.send(peer, std::move(f), [gate, sent = std::move(sent)](const SendStatus& s) {
          const CallbackGate::Pass later(*gate);
          if (later) sent(s);
        });
      },
      [this, gate = send_gate_, to, t0, done = std::move(done)](const SendStatus& st, uint64_t bytes) {
        const CallbackGate::Pass pass(*gate);
        if (!pass) return;
        {
          std::lock_guard<std::mutex> lock(streams_mu_);
          if (streams_[to] && streams_[to]->finished()) streams_[to].reset();
        }
        if (st.ok) note_link_throughput(to, bytes, clock_.now() - t0);
        done(st, bytes);
      },
      o, clock_);
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_[to] = stream;  // one message per link at a time (the outbox's rule)
  }
  stream->start();
}

void GossipEngine::on_acknowledgement(int from, uint64_t update_id, uint64_t held) {
  std::shared_ptr<MessageStream> stream;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (static_cast<size_t>(from) < streams_.size()) stream = streams_[from];
  }
  // An acknowledgement of no stream under way (a late one, or made up) changes nothing.
  if (stream) stream->acknowledged(update_id, static_cast<uint32_t>(std::min<uint64_t>(held, UINT32_MAX)));
}

void GossipEngine::acknowledge(int to, uint64_t update_id, uint32_t held) {
  AckLane& lane = *ack_lanes_[to];
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    if (lane.in_flight) {
      // The newest waits; an older one it replaces says less.
      if (!lane.waiting || lane.update_id != update_id || held > lane.held) lane.held = held;
      lane.update_id = update_id;
      lane.waiting = true;
      return;
    }
    lane.in_flight = true;
  }
  send_acknowledgement(to, update_id, held);
}

void GossipEngine::send_acknowledgement(int to, uint64_t update_id, uint32_t held) {
  wire::Envelope e;
  e.mutable_credit()->set_acked_update_id(update_id);
  e.mutable_credit()->set_credits(held);
  transport_.send(peers_[to], make_frame(e), [this, gate = send_gate_, to](const SendStatus&) {
    const CallbackGate::Pass pass(*gate);
    if (!pass) return;
    AckLane& lane = *ack_lanes_[to];
    uint64_t next_id = 0;
    uint32_t next_held = 0;
    {
      std::lock_guard<std::mutex> lock(lane.mu);
      if (!lane.waiting) {
        lane.in_flight = false;
        return;
      }
      lane.waiting = false;
      next_id = lane.update_id;
      next_held = lane.held;
    }
    send_acknowledgement(to, next_id, next_held);
  });
}

void GossipEngine::tick_streams() {
  std::vector<std::pair<int, std::shared_ptr<MessageStream>>> under_way;
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i]) under_way.emplace_back(static_cast<int>(i), streams_[i]);
    }
  }
  for (auto& [i, s] : under_way) s->tick(connected(i));
}

}  // namespace hearsay
