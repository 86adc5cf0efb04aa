#include "message_stream.h"

#include <algorithm>
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
  for (;;) {
    OutFrame frame;
    uint64_t generation;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || suspended_ || sent_ >= segments_) return;
      // The window: one frame always, more while what is unacknowledged stays under it.
      if (sent_ > acked_ && in_flight_ >= options_.window_bytes) return;
      if (sent_ == made_) {
        kept_.push_back(make_(made_));
        kept_bytes_ += kept_.back().size();
        ++made_;
      }
      frame = kept_[sent_ - acked_];  // a copy: the kept one stays for a resend
      ++sent_;
      in_flight_ += frame.size();
      bytes_sent_ += frame.size();
      generation = generation_;
    }
    send_(std::move(frame), [self = shared_from_this(), generation](const SendStatus& s) { self->on_sent(generation, s); });
  }
}

void MessageStream::on_sent(uint64_t generation, const SendStatus& s) {
  if (s.ok) return;  // the acknowledgements move the window
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_ || generation != generation_ || suspended_) return;
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
    if (held < acked_) {
      failure_ = "the receiver holds " + std::to_string(held) + " of its segments, fewer than the " + std::to_string(acked_) +
                 " it had acknowledged (it restarted?)";
      done = finish_locked();
    } else {
      // Never past what was sent: a receiver cannot acknowledge what it was not sent.
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
    if (!suspended_) {
      if (sent_ == acked_ || now - progress_at_ < options_.stall_s) return;
      suspended_ = true;
      suspended_at_ = now - options_.retry_s;  // goes on at once where the link is up
      failure_ = "no acknowledgement for " + std::to_string(static_cast<int>(now - progress_at_)) + " s";
    }
    const double down = now - suspended_at_;
    if (down > options_.resume_timeout_s) {
      failure_ = "the link was down for " + std::to_string(static_cast<int>(down)) + " s in the middle of the message (" +
                 failure_ + ")";
      done = finish_locked();
      why = failure_;
      bytes = bytes_sent_;
    } else if (connected && down >= options_.retry_s) {
      // From the receiver's last acknowledgement: what it had not acknowledged is resent
      // (segments it holds already are skipped by its inbox).
      suspended_ = false;
      failure_.clear();
      progress_at_ = now;
      ++generation_;
      sent_ = acked_;
      in_flight_ = 0;
    } else {
      return;
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
  return kept_bytes_;
}

}  // namespace hearsay
