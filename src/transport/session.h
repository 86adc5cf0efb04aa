// The protocol of one connection, whatever moves its bytes: the admission handshake,
// heartbeats with round-trip measurement, Bye, and the hand-off of admitted frames.
// Every transport runs one Session per connection. Not thread-safe: the owning
// connection calls it from one thread (or strand) at a time.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "hearsay/transport.h"

namespace hearsay {

// HMAC-SHA256(secret, "hearsay-hello-v1" | cluster | peer_id | nonce).
std::string admission_proof(const std::string& secret, const std::string& cluster, const std::string& peer_id,
                            const std::string& nonce);
std::string random_nonce();

class Session {
 public:
  struct Hooks {
    std::function<void(OutFrame)> send;                // queue a control frame
    std::function<void(const std::string& reason)> reject;  // close: bad peer or bad frame
    std::function<void(const std::string& peer_id)> admitted;
    std::function<void(InFrame&&)> deliver;            // an admitted Update or Credit
    std::function<void(const std::string& reason)> drop;  // a bad frame the stream survives
  };

  Session(const TransportOptions& options, std::string remote_address, Hooks hooks);

  // Sends our phase-1 Hello.
  void start();
  // Handles one decoded frame.
  void on_frame(InFrame&& frame);
  // Sends a heartbeat when one is due; drops a neighbour silent past the liveness timeout.
  void tick(std::chrono::steady_clock::time_point now);
  // A Bye to send before closing.
  OutFrame bye(const std::string& reason) const;

  bool admitted() const { return admitted_; }
  bool rejected() const { return rejected_; }
  const std::string& peer_id() const { return remote_id_; }
  const std::string& remote_address() const { return remote_address_; }
  double rtt_s() const { return rtt_s_; }
  std::chrono::steady_clock::time_point started() const { return started_; }

 private:
  void on_hello(const wire::Hello& h);
  void reject(const std::string& reason);

  const TransportOptions& options_;
  std::string remote_address_;
  Hooks hooks_;
  std::string nonce_;          // ours, for the other side to sign
  std::string remote_id_;
  std::string remote_nonce_;
  bool sent_proof_ = false;
  bool admitted_ = false;
  bool rejected_ = false;
  double rtt_s_ = -1;
  uint64_t heartbeat_seq_ = 0;
  std::chrono::steady_clock::time_point started_, last_heartbeat_, last_heard_;
};

}  // namespace hearsay
