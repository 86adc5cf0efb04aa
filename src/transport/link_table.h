// What every transport keeps about its links: the admitted connection(s) of each peer,
// per-link statistics, rejection counters, and the receiver and listener callbacks.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hearsay/transport.h"
#include "../util/callback_gate.h"

namespace hearsay {

// A connection's live counters, written by its transport's threads and read by anyone.
struct LinkCounters {
  std::atomic<bool> admitted{false}, open{true};
  std::atomic<uint64_t> bytes_sent{0}, bytes_received{0}, frames_sent{0}, frames_received{0};
  std::atomic<uint64_t> queue_depth{0}, queue_bytes{0};
  std::atomic<double> rtt_s{-1};

  LinkStats snapshot() const {
    LinkStats s;
    s.connected = admitted && open;
    s.bytes_sent = bytes_sent;
    s.bytes_received = bytes_received;
    s.frames_sent = frames_sent;
    s.frames_received = frames_received;
    s.queue_depth = queue_depth;
    s.queue_bytes = queue_bytes;
    s.rtt_s = rtt_s;
    return s;
  }
};

// One connection of a transport, whatever carries it.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual void send(OutFrame frame, SendCallback done) = 0;
  virtual void close(const std::string& reason) = 0;
  // Closes it because a newer connection was admitted under the same name: the Bye tells
  // the other end not to redial.
  virtual void displace(const std::string& reason) = 0;
  virtual LinkStats stats() const = 0;
};

class LinkTable {
 public:
  explicit LinkTable(std::string transport_name) : name_(std::move(transport_name)) {}

  void set_receiver(Transport::Receiver r);
  void set_listener(Transport::LinkListener l);

  void admitted(const std::string& peer, const std::shared_ptr<Connection>& c, const std::string& address);
  void closed(const std::string& peer, const Connection* c, const std::string& address, const std::string& reason);
  // A connection refused (admission, a broken stream): counted, logged, reported (on
  // stderr once per host, peer and reason, then with its count at 10, 100... times).
  void rejected(const std::string& peer, const std::string& address, const std::string& reason);
  // A dial to `peer` that reached no one (unresolvable, refused, unreachable): reported,
  // not counted (no stranger's doing).
  void unreachable(const std::string& peer, const std::string& address, const std::string& reason);
  // A single frame dropped while the link stays up.
  void dropped(const std::string& peer, const std::string& address, const std::string& reason);
  // To the receiver; held (at most 1024 frames and 64 MiB, oldest dropped) while none is set.
  void deliver(const std::string& peer, InFrame&& frame);

  std::shared_ptr<Connection> find(const std::string& peer) const;
  std::vector<std::string> peers() const;
  // The peer's current connection, with byte and frame totals over every connection it
  // has had (reconnects included).
  LinkStats stats(const std::string& peer) const;
  TransportCounters counters() const;
  // Removes and returns every connection (for close()).
  std::vector<std::shared_ptr<Connection>> take_all();

 private:
  void count(const std::string& reason);

  std::string name_;
  mutable std::mutex mu_;
  std::vector<std::pair<std::string, std::shared_ptr<Connection>>> links_;  // GUARDED_BY(mu_), newest last
  TransportCounters counters_;                                              // GUARDED_BY(mu_)
  std::map<std::string, LinkStats> retired_;  // GUARDED_BY(mu_): totals of closed connections
  static constexpr size_t kMaxSaid = 256;
  std::map<std::string, uint64_t> said_;  // GUARDED_BY(mu_): rejections said, by host, peer and reason
  static constexpr size_t kMaxEarlyFrames = 1024;
  static constexpr size_t kMaxEarlyBytes = 64u << 20;
  size_t early_bytes_ = 0;                                     // GUARDED_BY(mu_)
  Transport::Receiver receiver_;                               // GUARDED_BY(mu_)
  // The gate the receiver's calls pass through: set_receiver closes the replaced one's,
  // waiting for its calls, so an engine that unsets its receiver and is destroyed is never
  // called after. Replaced with the receiver.
  std::shared_ptr<CallbackGate> gate_ = std::make_shared<CallbackGate>();  // GUARDED_BY(mu_)
  std::vector<std::pair<std::string, InFrame>> early_;         // GUARDED_BY(mu_)
  Transport::LinkListener listener_;
};

// The part of every transport that only consults its LinkTable.
class LinkTableTransport : public Transport {
 public:
  void set_receiver(Receiver r) override { links_.set_receiver(std::move(r)); }
  void set_link_listener(LinkListener l) override { links_.set_listener(std::move(l)); }
  void send(const std::string& peer_id, OutFrame frame, SendCallback done) override {
    if (omits_crc()) {
      omit_crc(frame);
    } else {
      seal_crc(frame);
    }
    if (auto c = links_.find(peer_id)) return c->send(std::move(frame), std::move(done));
    if (done) done({false, kind() + ": not connected to peer '" + peer_id + "'"});
  }
  LinkStats link_stats(const std::string& peer_id) const override { return links_.stats(peer_id); }
  std::vector<std::string> connected_peers() const override { return links_.peers(); }
  TransportCounters counters() const override { return links_.counters(); }
  LinkTable& links() { return links_; }
  // Whether this transport's medium cannot corrupt a payload (same-host shared memory),
  // so frames go without a CRC32C and arrive unchecked.
  virtual bool omits_crc() const { return false; }

 protected:
  explicit LinkTableTransport(std::string name) : links_(std::move(name)) {}
  LinkTable links_;
};

}  // namespace hearsay
