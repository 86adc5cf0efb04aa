// A message too large to hand to a transport whole (a model of gigabytes) travels as a
// stream of its segments (docs/WIRE.md, "Large messages"): each segment's frame is made
// (encoded) as it goes out, at most `window_bytes` are sent and not yet acknowledged by
// the receiver (its Credit frames say how many segments it holds, in order), and a link
// that drops in the middle does not restart the message: once the link is back, the
// stream goes on from the receiver's last acknowledgement, resending only what it had not
// acknowledged (kept, at most a window). So the bytes in flight on a link are bounded,
// heartbeats and small frames never queue behind gigabytes, and a cut costs a window.
//
// Threads: made and ticked on the peer's step thread; acknowledged() on the transport's
// receiving thread; send completions on the transport's. One lock; frames are handed to
// the transport outside it (a transport may complete a send inline).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "hearsay/clock.h"
#include "hearsay/transport.h"

namespace hearsay {

class MessageStream : public std::enable_shared_from_this<MessageStream> {
 public:
  struct Options {
    uint64_t window_bytes = 64u << 20;  // sent and not yet acknowledged, at most (one frame always)
    double retry_s = 0.5;               // after a failed send, the wait before going on
    double resume_timeout_s = 60;       // a link down this long in the middle of a message fails it
    // No acknowledgement for this long after every segment sent had left: they were lost
    // with a connection that dropped after the transport had taken them (it reports no
    // failure then), so the stream goes on from the last acknowledgement as after a failed
    // send. (A receiver's acknowledgements never queue behind its own data: they are
    // urgent frames, OutFrame::urgent.)
    double stall_s = 10;
    // Its frames reference bytes the message holds already (an update encoded once, which
    // the outbox counts): the frames kept for a resend are then no memory of their own.
    bool frames_share_message = false;
  };
  // Builds segment `index`'s frame; called once per index, in order, under the stream's
  // lock (so never twice at once).
  using MakeFrame = std::function<OutFrame(uint32_t index)>;
  using Send = std::function<void(OutFrame frame, SendCallback done)>;
  // Once: ok when the receiver acknowledged every segment, or why not. `bytes`: every
  // byte handed to the transport for this message, resends included.
  using Done = std::function<void(const SendStatus& status, uint64_t bytes)>;

  MessageStream(uint64_t update_id, uint32_t segments, MakeFrame make, Send send, Done done, Options options,
                const Clock& clock);
  // Sends the first window.
  void start();
  // The receiver holds the first `held` segments of update `update_id` (another update's
  // acknowledgement is ignored, and so is one older than one taken: a connection's before
  // a cut). 0 once some were acknowledged: it lost the message (restarted), which then
  // fails, as nothing before the window is kept to resend.
  void acknowledged(uint64_t update_id, uint32_t held);
  // A stream whose sends failed, whose link is seen down (`connected` false), or whose
  // segments all left without an acknowledgement for stall_s, goes on once `connected`
  // again and retry_s has passed. One with nothing acknowledged for resume_timeout_s
  // fails, whatever the link says.
  void tick(bool connected);

  uint64_t update_id() const { return update_id_; }
  bool finished() const;
  uint64_t bytes_in_flight() const;  // sent and not acknowledged
  uint64_t held_bytes() const;       // frames kept for a resend (their payloads)

 private:
  void pump();
  void on_sent(uint64_t generation, const SendStatus& s);
  // With mu_ held: marks it finished and returns the done callback to run outside it.
  Done finish_locked();

  const uint64_t update_id_;
  const uint32_t segments_;
  MakeFrame make_;
  Send send_;
  Done done_;
  const Options options_;
  const Clock& clock_;

  mutable std::mutex mu_;
  uint32_t made_ = 0, sent_ = 0, acked_ = 0;  // GUARDED_BY(mu_): segment counts
  std::deque<OutFrame> kept_;                 // GUARDED_BY(mu_): segments [acked_, made_)
  uint64_t kept_bytes_ = 0, in_flight_ = 0;   // GUARDED_BY(mu_)
  uint64_t bytes_sent_ = 0;                   // GUARDED_BY(mu_)
  uint64_t generation_ = 0;                   // GUARDED_BY(mu_): bumped at each resume
  bool suspended_ = false, finished_ = false; // GUARDED_BY(mu_)
  bool pumping_ = false, repump_ = false;     // GUARDED_BY(mu_): one thread hands frames over at a time
  uint32_t unsent_ = 0;                       // GUARDED_BY(mu_): handed over, not yet reported sent
  double sent_out_at_ = 0;                    // GUARDED_BY(mu_): when the last handed over had all left
  double suspended_at_ = 0;                   // GUARDED_BY(mu_)
  double progress_at_ = 0;                    // GUARDED_BY(mu_): the last acknowledgement that moved it (or its start)
  std::string failure_;                       // GUARDED_BY(mu_): why it ends, when it fails
};

}  // namespace hearsay
