// The simulated wire and clock (docs/ARCHITECTURE.md, "The simulator"). Every peer of a
// simulated cluster is a SimGrid actor running the ordinary step loop, engine and
// algorithm; what they see of time and the network is this file's:
//
//   SimClock      a peer's Clock on SimGrid's virtual time: sleep_for is the actor's
//                 sleep, wait_for releases the engine's lock and waits on a SimGrid
//                 condition that the network signals when something reached the peer.
//   SimTransport  a peer's Transport: send() queues the frame on the directed link;
//                 nothing is simulated inside it.
//   SimNetwork    the links: each directed link with frames queued is carried by one
//                 actor (a carrier), one frame after another, as SimGrid
//                 communications between the two peers' hosts (latency and bandwidth
//                 from the platform, shared with every other flow on the same links),
//                 each frame then decoded with the real FrameDecoder into the receiver's
//                 engine. A carrier whose link has emptied waits a while for the next
//                 link to carry before it ends: starting an actor (its context and
//                 stack) costs more than carrying a small frame.
//
// The one rule that keeps this sound: engine code never yields to the simulation.
// Every SimGrid call (a sleep, a wait, a communication, starting an actor) is made by
// this code at a point where no engine lock is held: a peer's sleep or wait, or a link
// actor between frames. send() from inside the engine (often under its locks) only
// queues; the link's actor is started at the next such point (flush()).
#pragma once

#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Mutex.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "hearsay/clock.h"
#include "hearsay/rng.h"
#include "hearsay/transport.h"
#include "sim_platform.h"

namespace hearsay::sim {

// Thrown out of a crashed peer's next sleep or wait: its step loop unwinds, losing
// everything since its last checkpoint, as a killed process would. Not a std::exception,
// so that no handler of the engine's takes it for an error of its own.
struct SimulatedCrash {};

class SimNetwork;

class SimClock final : public Clock {
 public:
  SimClock(SimNetwork& net, int peer);
  double now() const override;
  void sleep_for(double seconds) override;
  bool wait_for(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout_s,
                const std::function<bool()>& ready) override;
  bool simulated() const override { return true; }
  // Something reached this peer (a frame, a send's completion, a stop): a waiting peer
  // checks its condition again. Called only from simulation code, never under an engine lock.
  void wake();
  // The peer's next sleep or wait throws SimulatedCrash.
  void crash() { crashed_ = true; }
  void revive() { crashed_ = false; }

 private:
  void check_crash() const;
  SimNetwork& net_;
  int peer_;
  bool crashed_ = false;
  uint64_t wakes_ = 0;  // wake() calls so far: a wake before the wait is not lost
  simgrid::s4u::MutexPtr mu_;
  simgrid::s4u::ConditionVariablePtr cv_;
};

class SimTransport final : public Transport {
 public:
  SimTransport(SimNetwork& net, int peer) : net_(net), peer_(peer) {}
  ~SimTransport() override;
  std::string kind() const override { return "simulated"; }
  void set_receiver(Receiver receiver) override { receiver_ = std::move(receiver); }
  void set_link_listener(LinkListener listener) override { listener_ = std::move(listener); }
  std::string listen(const std::string& address) override { return address; }
  void connect(const std::string&, const std::string&) override {}
  void send(const std::string& peer_id, OutFrame frame, SendCallback done) override;
  LinkStats link_stats(const std::string& peer_id) const override;
  std::vector<std::string> connected_peers() const override;
  TransportCounters counters() const override;
  void close() override;

  // From the network: a frame arrived for the engine.
  void deliver(const std::string& from, InFrame&& frame) {
    if (receiver_ && !closed_) receiver_(from, std::move(frame));
  }

 private:
  SimNetwork& net_;
  int peer_;
  bool closed_ = false;
  Receiver receiver_;
  LinkListener listener_;
};

// Counters the simulator reports (docs/SIMULATION.md, "Speed").
struct SimCounters {
  uint64_t frames = 0;          // frames carried end to end
  uint64_t frames_lost = 0;     // dropped by the link's loss probability
  uint64_t frames_dropped = 0;  // to or from a peer that was down
  uint64_t retries = 0;         // transfers cut by a link going down, carried again
  uint64_t link_actors = 0;     // carrier actors started (a carrier carries or delivers many links in turn)
  uint64_t waits = 0, sleeps = 0;
};

class SimNetwork {
 public:
  SimNetwork(const SimPlatform& platform, std::vector<std::string> names, uint64_t seed);
  ~SimNetwork();
  int size() const { return static_cast<int>(names_.size()); }
  const std::string& name(int i) const { return names_[i]; }
  int index_of(const std::string& name) const;
  const SimPlatform& platform() const { return platform_; }

  // A peer's incarnation: up with its transport and clock, or down (crashed, not yet
  // back). Frames queued to or from an earlier incarnation are dropped, their
  // completions never run (the engine that sent them is gone).
  void peer_up(int i, SimTransport* transport, SimClock* clock);
  void peer_down(int i);
  bool up(int i) const { return peers_[i].transport != nullptr; }
  SimClock* clock(int i) const { return peers_[i].clock; }

  // SimTransport::send: queue only (see the rule above).
  void enqueue(int from, int to, OutFrame frame, SendCallback done);
  // Hands each link with frames newly queued to a carrier (an idle one, else a new one).
  // Only from simulation code: it lets other actors run.
  void flush();
  LinkStats link_stats(int from, int to) const;
  uint64_t lost(int from) const;
  // A link of the platform went down or came back (faults): transfers waiting for their
  // route are woken to try again.
  void routes_changed();
  // The run is over (its last peer finished): carriers drop what they still hold and
  // end, those waiting for a route that is down included, so that the simulation ends.
  void close();
  const SimCounters& counters() const { return counters_; }
  SimCounters& mutable_counters() { return counters_; }

 private:
  struct Queued {
    OutFrame frame;
    SendCallback done;
    uint64_t from_incarnation, to_incarnation;
  };
  struct Link {
    std::deque<Queued> queue;
    bool running = false;  // its actor is alive
    bool in_flight = false;
    uint64_t queued_bytes = 0;
    uint64_t bytes = 0, frames = 0;  // carried to the receiver, whole frames
    Rng rng{1};                      // loss and jitter draws
    // Completion at departure: frames sent and not yet arrived, in order, each with the
    // virtual time it arrives; a carrier delivers them (`delivering` while one is owed or
    // at it).
    struct InAir {
      double arrives_at;
      OutFrame frame;
      uint64_t to_incarnation;
    };
    std::deque<InAir> air;
    bool delivering = false;
    double last_arrival = 0;
    double latency_s = -1;  // the route's, once looked up
    // The link's own mailbox, its receiver the sink on the destination's host: a frame's
    // transfer is a put there, taken back at once (transfer(), below).
    simgrid::s4u::Mailbox* mailbox = nullptr;
  };
  struct End {
    SimTransport* transport = nullptr;
    SimClock* clock = nullptr;
    uint64_t incarnation = 0;
    uint64_t lost = 0;
  };
  Link& link(int from, int to);
  const Link* find_link(int from, int to) const;
  // A link's work for a carrier: carrying its queue, or (completion at departure)
  // delivering its frames in the air.
  struct Job {
    int from = -1, to = -1;  // -1 while a carrier waits for one
    bool deliver = false;
  };
  // One carrier actor: does the job it was started for, then each job flush() hands it,
  // until none comes for kCarrierLinger_s or the run closes. Carriers are pooled because
  // starting a SimGrid actor (its context and stack) costs more than most frames.
  struct Carrier {
    simgrid::s4u::ConditionVariablePtr cv;
    Job job;
  };
  void carrier_body(Job job);
  void carry(int from, int to);  // one link's queue, to its end
  // One frame's bytes from `from`'s host to `to`'s over link `l`, in the carrier's actor:
  // SimGrid's flow from host to host. Throws NetworkFailureException if a link of the
  // route goes down meanwhile.
  //
  // Why not s4u::Comm::sendto: SimGrid 3.32 detaches every host-to-host comm and keeps
  // it in its maestro's activity std::list, which each comm's end walks whole to remove
  // it: with ~4,000 frames in flight (1,024 peers) that walk was 11% of the run. A put
  // on a mailbox with a permanent receiver starts at once as sendto's comm does (the same
  // flow, the same times), is the carrier's own activity, and is taken back by a get.
  void transfer(Link& l, int from, int to, size_t bytes);
  std::vector<simgrid::s4u::ActorPtr> sinks_;  // per host, made on first use: receives nothing
  uint64_t serial_ = 0;                         // this network's number in the process, for its mailboxes' names
  // Completion at departure: delivers the link's frames in the air, each at its time.
  void deliver_in_air(int from, int to);
  // A frame that has arrived on link `l` (from -> to, held by the caller: no second
  // lookup a frame): counted, decoded and handed to the receiver's engine if the receiver
  // is still the incarnation it was sent to.
  void hand_over(Link& l, int from, int to, const OutFrame& frame, uint64_t to_incarnation);
  // Waits until every link on the route from -> to is on again.
  void wait_for_route(int from, int to);

  const SimPlatform& platform_;
  std::vector<std::string> names_;
  std::unordered_map<std::string, int> index_;
  uint64_t seed_;
  std::vector<End> peers_;
  std::unordered_map<uint64_t, Link> links_;  // by from x n + to
  std::vector<Job> to_start_;  // jobs that flush() hands to a carrier
  std::vector<Carrier*> idle_carriers_;         // waiting for a link, the latest last
  simgrid::s4u::MutexPtr carrier_mu_;
  bool closing_ = false;
  simgrid::s4u::MutexPtr route_mu_;
  simgrid::s4u::ConditionVariablePtr route_cv_;
  SimCounters counters_;
};

}  // namespace hearsay::sim
