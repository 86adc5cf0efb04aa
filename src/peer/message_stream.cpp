#include "message_stream.h"

#include <algorithm>
#include <exception>
#include <utility>

namespace hearsay {

MessageStream::MessageStream(uint64_t update_id, uint32_t segments, MakeFrame make, Send send, Done done, Options options,
                             const Clock& clock)
    : update_id_(update_id), segments_(segments), make_(std::move(make)), send_(std::move(send)), done_(std::move(done)),
      options_(options), clock_(clock) {}

void MessageStream::start() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    progress_at_ = clock_.now();
  }
  pump();
}

void MessageStream::pump() {
  {
    // One thread hands frames over at a time, so they reach the transport in their
    // order; another that would pump meanwhile leaves it to this one (repump_).
    std::lock_guard<std::mutex> lock(mu_);
    if (pumping_) {
      repump_ = true;
      return;
    }
    pumping_ = true;
  }
  for (;;) {
    OutFrame frame;
    uint64_t generation = 0;
    Done failed;
    std::string why;
    uint64_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const bool can_send = !finished_ && !suspended_ && sent_ < segments_ &&
                            // The window: one frame always, more while what is unacknowledged stays under it.
                            (sent_ == acked_ || in_flight_ < options_.window_bytes);
      if (!can_send) {
        if (!std::exchange(repump_, false)) {
          pumping_ = false;
          return;
        }
        continue;  // something moved while the frame before was handed over: look again
      }
      if (sent_ == made_) {
        try {
          kept_.push_back(make_(made_));
        } catch (const std::exception& e) {
          // The segment cannot be made (memory): the message fails, the outbox goes on.
          failure_ = std::string("its segment ") + std::to_string(made_) + " could not be made: " + e.what();
          failed = finish_locked();
          why = failure_;
          bytes = bytes_sent_;
          pumping_ = false;
        }
        if (!failed) {
          kept_bytes_ += kept_.back().size();
          ++made_;
        }
      }
      if (!failed) {
        frame = kept_[sent_ - acked_];  // a copy: the kept one stays for a resend
        ++sent_;
        ++unsent_;
        in_flight_ += frame.size();
        bytes_sent_ += frame.size();
        generation = generation_;
      }
    }
    if (failed) return failed({false, why}, bytes);
    send_(std::move(frame), [self = shared_from_this(), generation](const SendStatus& s) { self->on_sent(generation, s); });
  }
}

void MessageStream::on_sent(uint64_t generation, const SendStatus& s) {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || generation != generation_) return;
  if (unsent_ > 0) --unsent_;
  if (s.ok) {
    if (unsent_ == 0) sent_out_at_ = clock_.now();  // the acknowledgements move the window
    return;
  }
  if (suspended_) return;
  suspended_ = true;
  suspended_at_ = clock_.now();
  failure_ = s.error;
}

void MessageStream::acknowledged(uint64_t update_id, uint32_t held) {
  if (update_id != update_id_) return;
  Done done;
  SendStatus status;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    if (held == 0 && acked_ > 0) {
      // The receiver says it does not know the update: it restarted, or dropped it.
      failure_ = "the receiver no longer holds the message (it had acknowledged " + std::to_string(acked_) + " of " +
                 std::to_string(segments_) + " segments; restarted?)";
      done = finish_locked();
    } else {
      // An acknowledgement older than one already taken (from a connection before a cut)
      // says nothing new; one past what was sent is held to what was.
      held = std::min(held, sent_);
      if (held > acked_) progress_at_ = clock_.now();
      while (acked_ < held) {
        in_flight_ -= std::min(in_flight_, static_cast<uint64_t>(kept_.front().size()));
        kept_bytes_ -= kept_.front().size();
        kept_.pop_front();
        ++acked_;
      }
      if (acked_ == segments_) done = finish_locked();
    }
    if (acked_ != segments_ && !failure_.empty()) status = {false, failure_};
    bytes = bytes_sent_;
  }
  if (done) return done(status, bytes);
  pump();
}

void MessageStream::tick(bool connected) {
  Done done;
  std::string why;
  uint64_t bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    const double now = clock_.now();
    if (now - progress_at_ > options_.resume_timeout_s) {
      // Nothing acknowledged for this long, whatever the link said: the message fails and
      // the outbox goes on (a receiver that never answers cannot hold a link forever).
      failure_ = "no segment acknowledged for " + std::to_string(static_cast<int>(now - progress_at_)) +
                 " s in the middle of the message" + (failure_.empty() ? "" : " (" + failure_ + ")");
      done = finish_locked();
      why = failure_;
      bytes = bytes_sent_;
    } else {
      if (!suspended_) {
        if (!connected && sent_ > acked_) {
          // The connection dropped under the segments in flight: what the transport had
          // taken before is lost with it, whether or not it said so.
          suspended_ = true;
          suspended_at_ = now;
          failure_ = "the link went down";
        } else if (sent_ > acked_ && unsent_ == 0 && now - std::max(progress_at_, sent_out_at_) >= options_.stall_s) {
          // Every segment sent has left, and none was acknowledged since for stall_s: they
          // were lost with a connection that dropped after the transport had taken them.
          suspended_ = true;
          suspended_at_ = now - options_.retry_s;  // goes on at once where the link is up
          failure_ = "no acknowledgement for " + std::to_string(static_cast<int>(now - progress_at_)) + " s";
        } else {
          return;
        }
      }
      if (!connected || now - suspended_at_ < options_.retry_s) return;
      // From the receiver's last acknowledgement: what it had not acknowledged is resent
      // (segments it holds already are skipped by its inbox).
      suspended_ = false;
      failure_.clear();
      ++generation_;
      sent_ = acked_;
      unsent_ = 0;
      in_flight_ = 0;
    }
  }
  if (done) return done({false, why}, bytes);
  pump();
}

MessageStream::Done MessageStream::finish_locked() {
  finished_ = true;
  kept_.clear();
  kept_bytes_ = in_flight_ = 0;
  make_ = nullptr;  // the message's data goes with it
  return std::exchange(done_, nullptr);
}

bool MessageStream::finished() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_;
}

uint64_t MessageStream::bytes_in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

uint64_t MessageStream::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return options_.frames_share_message ? 0 : kept_bytes_;
}

}  // namespace hearsay
