#include "dialer.h"

#include <chrono>

#include "asio_helpers.h"
#include "backoff.h"

namespace hearsay {

Dialer::Dialer(asio::io_context& io, const TransportOptions& options, LinkTable& links, Connected connected)
    : io_(io), options_(options), links_(links), connected_(std::move(connected)), rng_(std::random_device{}()) {}

void Dialer::add(const std::string& peer_id, const std::string& address) {
  auto target = std::make_shared<Target>(Target{peer_id, address, 0, {}, asio::steady_timer(io_)});
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    targets_.push_back(target);
  }
  asio::post(io_, [this, target] { dial(target); });
}

void Dialer::dial(const TargetPtr& target) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
  }
  async_dial(io_, target->address,
             [this, target](std::shared_ptr<asio::ip::tcp::socket> sock, const std::string& remote, const std::string& error) {
               if (!sock) return failed(target, error);
               connected_(target, std::move(sock), remote);
             });
}

void Dialer::failed(const TargetPtr& target, const std::string& reason) {
  bool tell = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    tell = target->last_failure != reason;
    target->last_failure = reason;
  }
  if (tell) links_.unreachable(target->peer_id, target->address, reason);
  retry_later(target);
}

void Dialer::retry_later(const TargetPtr& target) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  const double delay = backoff_delay(options_, target->attempt++, rng_);
  target->timer.expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(std::chrono::duration<double>(delay)));
  target->timer.async_wait([this, target](asio::error_code ec) {
    if (!ec) dial(target);
  });
}

void Dialer::redial(const std::string& peer_id) {
  TargetPtr target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    // connect() twice to one peer keeps two targets; the newest one redials.
    for (auto& t : targets_) {
      if (t->peer_id == peer_id) target = t;
    }
  }
  if (target) retry_later(target);
}

void Dialer::reset_backoff(const std::string& peer_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : targets_) {
    if (t->peer_id != peer_id) continue;
    t->attempt = 0;
    t->last_failure.clear();
  }
}

void Dialer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  // The timers belong to the I/O thread; once stopped_ is set no one arms them again.
  asio::post(io_, [this] {
    for (auto& t : targets_) t->timer.cancel();
  });
}

}  // namespace hearsay
