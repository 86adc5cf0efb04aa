// The peers a transport keeps a connection to: each connect() adds a target that is dialled
// at once, and again after every failed attempt and every lost connection, waiting the
// back-off of backoff.h between tries, until stop(). The tcp transport and the fabric
// bootstrap share it; what happens on a connected socket is theirs.
//
// A failed attempt is told to the link table as `unreachable` (LinkEvent::kUnreachable),
// once per distinct reason until the peer is admitted again: an operator (and
// hearsay-peer --check) learns why a neighbour does not come up, without a line per retry.
//
// Threads: any thread may call it; dialling and the waits run on the io_context's threads.
// The callback runs without the dialer's lock held, so it may call back into the dialer.
#pragma once

#include <asio.hpp>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "hearsay/transport.h"
#include "link_table.h"

namespace hearsay {

class Dialer {
 public:
  struct Target {
    std::string peer_id, address;
    int attempt = 0;  // GUARDED_BY(Dialer::mu_): tries since the last admitted connection
    std::string last_failure;  // GUARDED_BY(Dialer::mu_): the reason last told to the link table
    asio::steady_timer timer;
  };
  using TargetPtr = std::shared_ptr<Target>;
  // A socket connected to target's address (`remote`: the endpoint actually reached). The
  // transport takes it from here; if its own set-up fails before a connection starts, it
  // calls retry_later(target).
  using Connected = std::function<void(const TargetPtr& target, std::shared_ptr<asio::ip::tcp::socket> sock,
                                       const std::string& remote)>;

  // `options` gives the back-off (reconnect_initial_s, reconnect_max_s); it must outlive
  // the dialer, as must `io` and `links` (where failed attempts are told).
  Dialer(asio::io_context& io, const TransportOptions& options, LinkTable& links, Connected connected);

  // Starts dialling `peer_id` at `address` (already validated). Ignored after stop().
  void add(const std::string& peer_id, const std::string& address);
  // Dials the target again after its back-off; the next wait is twice as long.
  void retry_later(const TargetPtr& target);
  // The connection dialled to `peer_id` is gone: dial it again after the back-off.
  void redial(const std::string& peer_id);
  // `peer_id` was admitted: its next redial starts from the shortest wait again.
  void reset_backoff(const std::string& peer_id);
  // No more attempts; the pending waits are cancelled on the I/O thread. Idempotent.
  void stop();

 private:
  void dial(const TargetPtr& target);
  // A failed attempt: told to the link table when its reason is new, then dialled again.
  void failed(const TargetPtr& target, const std::string& reason);

  asio::io_context& io_;
  const TransportOptions& options_;
  LinkTable& links_;
  Connected connected_;
  std::mutex mu_;
  bool stopped_ = false;             // GUARDED_BY(mu_)
  std::vector<TargetPtr> targets_;   // GUARDED_BY(mu_)
  std::mt19937_64 rng_;              // GUARDED_BY(mu_)
};

}  // namespace hearsay
