// What every connection shares, whatever carries its bytes (a tcp socket, a fabric
// endpoint, an in-process mailbox): the remote address, the peer it dialled, its Session,
// its counters, whether it has closed, the heartbeat tick and how its end is told to the
// link table. The carrying is the derived class's.
//
// Threads: like the Session, used from the connection's one thread (or strand) at a time;
// stats() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

#include "link_table.h"
#include "session.h"

namespace hearsay {

class SessionConnection : public Connection {
 public:
  LinkStats stats() const final { return counters_.snapshot(); }
  const std::string& dial_peer() const { return dial_peer_; }
  void displace(const std::string& reason) final {
    displacing_ = true;
    close(reason);
  }
  // The other end closed this connection for a newer one under our name: another process
  // holds it, so the transport must not redial. Read once the connection has ended.
  bool displaced() const { return session_.displaced(); }

 protected:
  // `hooks` are the derived class's (they run only once the connection has started).
  SessionConnection(const TransportOptions& options, std::string address, std::string dial_peer, Session::Hooks hooks)
      : address_(std::move(address)), dial_peer_(std::move(dial_peer)),
        session_(options, address_, dial_peer_, std::move(hooks)) {}

  // Heartbeats, the round trip and liveness; nothing once closed.
  void tick_session(std::chrono::steady_clock::time_point now) {
    if (closed_) return;
    session_.tick(now);
    counters_.rtt_s = session_.rtt_s();
  }
  // Marks the connection closed; false when it already was (the caller then does nothing).
  bool mark_closed() {
    if (closed_) return false;
    closed_ = true;
    counters_.open = false;
    return true;
  }
  // The Bye to send before closing (displace() may be called from any thread).
  OutFrame bye(const std::string& reason) const { return session_.bye(reason, displacing_.load()); }
  // Tells the link table the connection ended, and first that it was refused when `rejected`.
  // A remote's Bye is its orderly close, not a refusal: only the link's down event tells it
  // (every clean shutdown would otherwise print one), unless it says another process
  // took this peer's name there.
  void report_end(LinkTable& links, const std::string& reason, bool rejected) {
    if (rejected && session_.said_bye() && !session_.displaced()) rejected = false;
    // Refused before the remote named itself: the peer this side dialled, if it dialled.
    if (rejected) links.rejected(session_.peer_id().empty() ? dial_peer_ : session_.peer_id(), address_, reason);
    links.closed(session_.peer_id(), this, address_, reason);
  }

  std::string address_;    // the remote end, for logs and link events
  std::string dial_peer_;  // the peer we dialled; empty when the other side dialled us
  Session session_;
  LinkCounters counters_;
  bool closed_ = false;
  std::atomic<bool> displacing_{false};
};

}  // namespace hearsay
