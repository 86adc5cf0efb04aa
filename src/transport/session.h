// The protocol of one connection, whatever moves its bytes: the admission handshake,
// heartbeats with round-trip measurement, Bye, and the hand-off of admitted frames.
// Every transport runs one Session per connection. Not thread-safe: the owning
// connection calls it from one thread (or strand) at a time.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "hearsay/wire.pb.h"
#include "hearsay/transport.h"

namespace hearsay {

// What one side of a connection proves it knows the secret over: everything that makes
// this connection this connection (docs/WIRE.md, "Admission").
struct AdmissionTranscript {
  std::string cluster;
  std::string dialler, listener;               // peer names
  std::string dialler_nonce, listener_nonce;   // 32 fresh random bytes each
};
enum class Role { kDialler, kListener };

// HMAC-SHA256(secret, "hearsay-admission-v2" | version | cluster | dialler | listener |
// dialler nonce | listener nonce | prover's role), fields length-prefixed.
std::string admission_proof(const std::string& secret, const AdmissionTranscript& t, Role prover);
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

  // `dial_peer`: the peer this side dialled, or empty when it accepted the connection.
  // It decides the roles in the proofs, and a dialled peer must answer with that name.
  Session(const TransportOptions& options, std::string remote_address, std::string dial_peer, Hooks hooks);

  // Sends our phase-1 Hello.
  void start();
  // Handles one decoded frame.
  void on_frame(InFrame&& frame);
  // Sends a heartbeat when one is due; drops a neighbour silent past the liveness timeout.
  void tick(std::chrono::steady_clock::time_point now);
  // A Bye to send before closing; `displaced` when a newer connection took the remote's name.
  OutFrame bye(const std::string& reason, bool displaced) const;

  bool admitted() const { return admitted_; }
  bool rejected() const { return rejected_; }
  // The remote closed this connection because it admitted another one under our name.
  bool displaced() const { return displaced_; }
  // The admitted remote said Bye: an orderly close on its side (the connection still ends
  // through the reject hook, with the Bye's reason), not a refusal.
  bool said_bye() const { return said_bye_; }
  const std::string& peer_id() const { return remote_id_; }
  const std::string& remote_address() const { return remote_address_; }
  double rtt_s() const { return rtt_s_; }
  std::chrono::steady_clock::time_point started() const { return started_; }
  // Replies (to heartbeats and probes) queued for the remote and not yet sent, and those
  // refused because that many were: a remote that asks and never reads costs this side a
  // bounded queue, never its memory.
  uint32_t replies_queued() const { return replies_queued_->load(); }
  uint64_t replies_refused() const { return replies_refused_; }

  // At most this many replies wait to leave; a request beyond them is not answered.
  static constexpr uint32_t kMaxRepliesQueued = 256;
  // This many requests refused in a row (no reply left in between) close the connection:
  // an honest neighbour sends a heartbeat a second, so it never gets near.
  static constexpr uint64_t kMaxRepliesRefused = 4096;

 private:
  void on_hello(const wire::Hello& h);
  void reject(const std::string& reason);
  // Queues a reply to the remote's request, within kMaxRepliesQueued; closes the
  // connection once kMaxRepliesRefused requests in a row found the queue full.
  void reply(const wire::Envelope& e);
  // Why a phase-1 Hello names a peer this side must not admit; empty when it may.
  std::string refuse_name(const std::string& name) const;
  AdmissionTranscript transcript() const;
  Role role() const { return dial_peer_.empty() ? Role::kListener : Role::kDialler; }

  const TransportOptions& options_;
  std::string remote_address_;
  std::string dial_peer_;
  Hooks hooks_;
  std::string nonce_;          // ours, for the other side to sign
  std::string remote_id_;
  std::string remote_nonce_;
  bool admitted_ = false;
  bool rejected_ = false;
  bool displaced_ = false;
  bool said_bye_ = false;
  double rtt_s_ = -1;
  uint64_t heartbeat_seq_ = 0;
  // Shared with the frames in flight: a reply's frame counts until the transport lets go
  // of it (sent, or dropped when the connection closes), even after this Session is gone.
  std::shared_ptr<std::atomic<uint32_t>> replies_queued_ = std::make_shared<std::atomic<uint32_t>>(0);
  uint64_t replies_refused_ = 0;
  uint64_t refused_in_a_row_ = 0;
  std::chrono::steady_clock::time_point started_, last_heartbeat_, last_heard_;
};

}  // namespace hearsay
