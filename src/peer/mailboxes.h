// Bounded queues between the step loop and the network.
//
// Outbox (one per neighbour): at most one message in flight and one pending per kind.
// When the link is slower than the update rate, a new asynchronous message is folded
// into the pending one (Message::absorb) instead of queued, so memory per link is
// bounded whatever the link's speed and the step loop never blocks on it. Synchronous
// messages are never folded; the algorithms bound them.
//
// Inbox: reassembles segments (at most 8 unfinished messages per sender), then keeps one
// pending asynchronous message per (sender, kind), folding newer ones in (model deltas
// excepted: kept in order, at most kDeltas per sender, never folded), and synchronous
// messages by (sender, round, phase): at most kSyncMessages per sender, over at most
// kSyncRounds rounds; more are refused.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "hearsay/clock.h"
#include "message.h"

namespace hearsay {

class Outbox {
 public:
  using Send = std::function<void(GossipEngine::Message&&, std::function<void(const SendStatus&)>)>;
  // `send` puts a message on the wire and calls back once every segment has left.
  Outbox(Send send, Mixer& mixer) : send_(std::move(send)), mixer_(mixer) {}
  void offer(GossipEngine::Message&& m);
  size_t buffered_bytes() const;
  // The memory its messages hold, a snapshot shared with other outboxes counted once over
  // all who pass the same `seen` (a peer's memory event).
  uint64_t held_memory(std::unordered_set<const void*>& seen) const;
  uint64_t failed() const;
  // The sender's step of the oldest message not yet reported sent (in flight, pending or
  // folded into a pending one); none when the outbox is empty.
  std::optional<uint64_t> oldest_unsent_step() const;
  // Whether a synchronous message of this round and phase waits or is on its way (a join
  // answer not yet sent: a neighbour that asks again gets no second model queued).
  bool holds_sync(uint64_t round, uint32_t phase) const;

 private:
  void launch(GossipEngine::Message&& m);  // without mu_ held
  void note_in_flight_shared(const GossipEngine::Message& m);  // with mu_ held
  void on_done(const SendStatus& s);

  Send send_;
  Mixer& mixer_;
  mutable std::mutex mu_;
  bool busy_ = false;                                     // GUARDED_BY(mu_)
  size_t in_flight_bytes_ = 0;                            // GUARDED_BY(mu_)
  const void* in_flight_shared_ = nullptr;                // GUARDED_BY(mu_): its shared tensor or encoded bytes, counted once over the outboxes
  size_t in_flight_shared_bytes_ = 0;                     // GUARDED_BY(mu_)
  uint64_t in_flight_step_ = 0;                           // GUARDED_BY(mu_): its oldest part's step
  std::optional<std::pair<uint64_t, uint32_t>> in_flight_sync_;  // GUARDED_BY(mu_): its (round, phase), if synchronous
  std::map<int, uint64_t> pending_step_;                  // GUARDED_BY(mu_): each pending one's oldest part
  std::map<int, GossipEngine::Message> pending_;          // GUARDED_BY(mu_), by fold_slot()
  std::deque<GossipEngine::Message> sync_;                // GUARDED_BY(mu_)
  uint64_t failed_ = 0;                                   // GUARDED_BY(mu_)
};

class Inbox {
 public:
  // With `keep_payloads` (a peer that gossips on its device), asynchronous messages keep
  // the payloads they arrived as when their codec allows (Message::payloads).
  // `clock` (null: real time) is what wait_sync waits on: the simulator's virtual clock
  // in a simulated cluster.
  // With `lean` (a host peer), arrivals other than push-sum shares keep only their
  // payloads, no decoded copy (Message::kept_only); each segment is still decoded and
  // checked as it arrives. wait_sync hands a synchronous one out so (the engine decodes
  // it for callers that want the values whole).
  explicit Inbox(Mixer& mixer, bool keep_payloads = false, Clock* clock = nullptr, bool lean = false);
  // Adds one wire segment, decoding its payload into the message; complete messages
  // become available. Returns why it was dropped (it does not fit the message it claims
  // to belong to, or its payload does not decode), or an empty string.
  // `held` (may be null): how many of the message's segments the inbox now holds, in
  // order (all of them once it is complete; 0 for a resumable message's later segment
  // whose first it does not hold; kNoAnswer while another thread decodes a segment of it,
  // the old connection's reader after a cut). A resumable message's segment it holds
  // already (resent after a cut), or one out of its order, is skipped, not refused.
  std::string add_segment(int from, const wire::Update& u, const uint8_t* payload, size_t bytes, uint32_t* held = nullptr);
  std::vector<GossipEngine::Message> take_async();
  // Waits until the message is there, `stop` is set or the timeout passes.
  // When the message was refused (non-finite values), returns at once with the reason in
  // `refused`.
  std::optional<GossipEngine::Message> wait_sync(int from, uint64_t round, uint32_t phase, double timeout_s,
                                                 const std::atomic<bool>& stop, std::string* refused = nullptr);
  void wake();
  // Drops the synchronous messages held for which stale(from, round, phase) is true.
  void forget_sync(const std::function<bool(int, uint64_t, uint32_t)>& stale);
  // Senders whose synchronous (round, phase) message is waiting; takes those messages.
  std::vector<int> take_senders_of(uint64_t round, uint32_t phase);
  // Whether `from`'s synchronous (round, phase) message is held, not yet taken.
  bool holds_sync_from(int from, uint64_t round, uint32_t phase) const;
  size_t buffered_bytes() const;
  uint64_t held_memory(std::unordered_set<const void*>& seen) const;

  static constexpr uint32_t kNoAnswer = UINT32_MAX;
  static constexpr size_t kSyncRounds = 4;     // distinct rounds held per sender
  static constexpr size_t kSyncMessages = 64;  // synchronous messages held per sender
  static constexpr size_t kDeltas = 16;        // model deltas held per sender

 private:
  struct Partial {
    GossipEngine::Message m;
    uint32_t have = 0, count = 0;
    uint64_t lo = 0;
    uint64_t filled = 0;  // elements of the segments taken so far
    bool keep = true;  // every segment so far could be kept (keep_payloads_)
    std::shared_ptr<GossipEngine::Encoded> kept;
  };
  // With mu_ held. Returns why a message was refused, or empty.
  std::string complete(GossipEngine::Message&& m);

  Mixer& mixer_;
  const bool keep_payloads_;
  const bool lean_;
  Clock* clock_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<int, uint64_t>, Partial> partial_;                    // GUARDED_BY(mu_)
  // The last resumable messages completed, (sender, update id) with their segment counts:
  // a resend of one whose last acknowledgement was lost is answered whole, not as unknown.
  std::deque<std::tuple<int, uint64_t, uint32_t, uint64_t>> completed_;    // GUARDED_BY(mu_), kCompleted at most (+ its tensor's length)
  // Messages whose segment is being decoded (taken out of partial_ meanwhile).
  std::set<std::pair<int, uint64_t>> decoding_;                            // GUARDED_BY(mu_)
  static constexpr size_t kCompleted = 64;
  std::map<std::pair<int, int>, GossipEngine::Message> async_;            // GUARDED_BY(mu_)
  std::map<int, std::deque<GossipEngine::Message>> deltas_;               // GUARDED_BY(mu_), in arrival order
  std::map<std::tuple<int, uint64_t, uint32_t>, GossipEngine::Message> sync_;  // GUARDED_BY(mu_)
  // The last synchronous message refused per sender, with why (wait_sync reports it).
  std::map<std::tuple<int, uint64_t, uint32_t>, std::string> refused_sync_;   // GUARDED_BY(mu_), one per sender
};

}  // namespace hearsay
