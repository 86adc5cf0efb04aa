#include "sim_network.h"

#include <simgrid/Exception.hpp>
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Comm.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>
#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/Mailbox.hpp>

#include <algorithm>

#include "hearsay/error.h"
#include "hearsay/wire.h"

namespace hearsay::sim {

namespace s4u = simgrid::s4u;

// --- SimClock ------------------------------------------------------------------------

SimClock::SimClock(SimNetwork& net, int peer)
    : net_(net), peer_(peer), mu_(s4u::Mutex::create()), cv_(s4u::ConditionVariable::create()) {}

double SimClock::now() const { return s4u::Engine::get_clock(); }

void SimClock::check_crash() const {
  if (crashed_) throw SimulatedCrash{};
}

void SimClock::sleep_for(double seconds) {
  check_crash();
  net_.flush();
  ++net_.mutable_counters().sleeps;
  if (seconds > 0) s4u::this_actor::sleep_for(seconds);
  check_crash();
}

bool SimClock::wait_for(std::unique_lock<std::mutex>& lock, std::condition_variable&, double timeout_s,
                        const std::function<bool()>& ready) {
  const double deadline = now() + timeout_s;
  while (!ready()) {
    check_crash();
    if (now() >= deadline) return false;
    // The engine's lock is released while virtual time passes, so that the carriers
    // can hand this peer what it waits for. Taking the SimGrid mutex lets other actors
    // run first, and one of them may wake this peer before it waits: wake() counts, and
    // a wake since the check above sends it back to check again instead of waiting.
    const uint64_t seen = wakes_;
    lock.unlock();
    net_.flush();
    ++net_.mutable_counters().waits;
    {
      std::unique_lock<s4u::Mutex> sim_lock(*mu_);
      if (wakes_ == seen) cv_->wait_until(sim_lock, deadline);
    }
    lock.lock();
  }
  return true;
}

void SimClock::wake() {
  ++wakes_;
  cv_->notify_all();
}

// --- SimTransport --------------------------------------------------------------------

SimTransport::~SimTransport() { close(); }

void SimTransport::send(const std::string& peer_id, OutFrame frame, SendCallback done) {
  const int to = net_.index_of(peer_id);
  if (to < 0 || to == peer_) throw InputError("simulated transport: no peer '" + peer_id + "' to send to");
  // The simulated wire cannot corrupt a frame: no checksum to compute and check (as over
  // TLS, the real peers' default, whose record MAC checks instead).
  omit_crc(frame);
  net_.enqueue(peer_, to, std::move(frame), std::move(done));
}

LinkStats SimTransport::link_stats(const std::string& peer_id) const {
  const int to = net_.index_of(peer_id);
  if (to < 0 || to == peer_) return {};
  return net_.link_stats(peer_, to);
}

std::vector<std::string> SimTransport::connected_peers() const {
  std::vector<std::string> out;
  for (int j = 0; j < net_.size(); ++j) {
    if (j != peer_ && net_.up(j)) out.push_back(net_.name(j));
  }
  return out;
}

TransportCounters SimTransport::counters() const {
  TransportCounters c;
  if (const uint64_t lost = net_.lost(peer_); lost > 0) c.rejected["simulated_loss"] = lost;
  return c;
}

void SimTransport::close() {
  closed_ = true;
  receiver_ = nullptr;
}

// --- SimNetwork ----------------------------------------------------------------------

SimNetwork::SimNetwork(const SimPlatform& platform, std::vector<std::string> names, uint64_t seed)
    : platform_(platform), names_(std::move(names)), seed_(seed), peers_(names_.size()),
      carrier_mu_(s4u::Mutex::create()), route_mu_(s4u::Mutex::create()), route_cv_(s4u::ConditionVariable::create()) {
  for (size_t i = 0; i < names_.size(); ++i) index_[names_[i]] = static_cast<int>(i);
  sinks_.resize(names_.size());
}

SimNetwork::~SimNetwork() = default;

int SimNetwork::index_of(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

void SimNetwork::peer_up(int i, SimTransport* transport, SimClock* clock) {
  ++peers_[i].incarnation;
  peers_[i].transport = transport;
  peers_[i].clock = clock;
}

void SimNetwork::peer_down(int i) {
  ++peers_[i].incarnation;
  peers_[i].transport = nullptr;
  // The clock stays: the crashed actor still has to unwind through it.
}

SimNetwork::Link& SimNetwork::link(int from, int to) {
  const uint64_t key = static_cast<uint64_t>(from) * names_.size() + static_cast<uint64_t>(to);
  auto it = links_.find(key);
  if (it == links_.end()) {
    it = links_.emplace(key, Link{}).first;
    it->second.rng = Rng(seed_ * 7919 + key, 91);
  }
  return it->second;
}

const SimNetwork::Link* SimNetwork::find_link(int from, int to) const {
  const auto it = links_.find(static_cast<uint64_t>(from) * names_.size() + static_cast<uint64_t>(to));
  return it == links_.end() ? nullptr : &it->second;
}

void SimNetwork::enqueue(int from, int to, OutFrame frame, SendCallback done) {
  Link& l = link(from, to);
  l.queued_bytes += frame.size();
  l.queue.push_back({std::move(frame), std::move(done), peers_[from].incarnation, peers_[to].incarnation});
  if (!l.running) {
    l.running = true;  // its actor is owed: flush() starts it
    to_start_.push_back({from, to, false});
  }
}

void SimNetwork::flush() {
  while (!to_start_.empty()) {
    std::vector<Job> start;
    start.swap(to_start_);
    for (const Job& job : start) {
      if (!idle_carriers_.empty()) {
        Carrier* c = idle_carriers_.back();
        idle_carriers_.pop_back();
        c->job = job;
        const s4u::ConditionVariablePtr cv = c->cv;  // held: notify_one may let other actors run
        cv->notify_one();
        continue;
      }
      ++counters_.link_actors;
      s4u::Actor::create("carrier " + std::to_string(counters_.link_actors), platform_.hosts[job.from],
                         [this, job] { carrier_body(job); });
    }
  }
}

// How long a carrier with nothing to carry waits for a link before it ends. Long enough
// that the links of a step loop (a frame every few virtual milliseconds to a second) find
// one waiting; the carriers alive are then those of the busiest second, not of the run.
constexpr double kCarrierLinger_s = 1.0;

void SimNetwork::carrier_body(Job job) {
  Carrier me{.cv = s4u::ConditionVariable::create(), .job = job};
  // However this actor ends, it leaves the idle list (flush() and close() hand work to
  // carriers by pointer).
  struct LeaveIdle {
    std::vector<Carrier*>& idle;
    Carrier* me;
    ~LeaveIdle() {
      const auto it = std::find(idle.begin(), idle.end(), me);
      if (it != idle.end()) idle.erase(it);
    }
  } leave{idle_carriers_, &me};
  for (;;) {
    if (me.job.deliver) {
      deliver_in_air(me.job.from, me.job.to);
    } else {
      carry(me.job.from, me.job.to);
    }
    me.job = {};
    if (closing_) return;
    idle_carriers_.push_back(&me);
    const double deadline = s4u::Engine::get_clock() + kCarrierLinger_s;
    {
      // Taking the lock lets other actors run (a SimGrid call), so the link may be handed
      // over before the wait: the predicate is checked under the lock.
      std::unique_lock<s4u::Mutex> lock(*carrier_mu_);
      me.cv->wait_until(lock, deadline, [&] { return me.job.from >= 0 || closing_; });
    }
    if (me.job.from < 0) return;  // not handed a job: ends (LeaveIdle)
  }
}

void SimNetwork::wait_for_route(int from, int to) {
  std::vector<s4u::Link*> route;
  double latency = 0;
  for (;;) {
    route.clear();
    platform_.hosts[from]->route_to(platform_.hosts[to], route, &latency);
    if (closing_ || std::all_of(route.begin(), route.end(), [](const s4u::Link* l) { return l->is_on(); })) return;
    std::unique_lock<s4u::Mutex> lock(*route_mu_);
    route_cv_->wait(lock);
  }
}

void SimNetwork::routes_changed() { route_cv_->notify_all(); }

void SimNetwork::close() {
  closing_ = true;
  route_cv_->notify_all();
  // One at a time off the list: each notify lets other actors run (and carriers end).
  while (!idle_carriers_.empty()) {
    const s4u::ConditionVariablePtr cv = idle_carriers_.back()->cv;
    idle_carriers_.pop_back();
    cv->notify_one();
  }
}

void SimNetwork::carry(int from, int to) {
  Link& l = link(from, to);
  const int sa = platform_.site_of[from], sb = platform_.site_of[to];
  const double jitter = platform_.jitter_s.count({sa, sb}) ? platform_.jitter_s.at({sa, sb}) : 0.0;
  const double loss = platform_.loss.count({sa, sb}) ? platform_.loss.at({sa, sb}) : 0.0;
  while (!l.queue.empty()) {
    Queued q = std::move(l.queue.front());
    l.queue.pop_front();
    l.in_flight = true;
    const size_t bytes = q.frame.size();
    SendStatus status;
    const bool ends_up = !closing_ && q.from_incarnation == peers_[from].incarnation && q.to_incarnation == peers_[to].incarnation &&
                         up(from) && up(to);
    if (!ends_up) {
      status = {false, "simulated: peer down"};
      ++counters_.frames_dropped;
    } else {
      // A link that goes down mid-frame, or is down now, holds the frame until the route
      // is back and then carries it whole (TCP riding out an outage).
      for (;;) {
        wait_for_route(from, to);
        if (closing_) break;
        try {
          transfer(l, from, to, bytes);
          break;
        } catch (const simgrid::NetworkFailureException&) {
          ++counters_.retries;
        }
      }
      if (closing_) {
        status = {false, "simulated: the run is over"};
      } else if (loss > 0 && l.rng.uniform() < loss) {
        status = {false, "simulated loss"};
        ++counters_.frames_lost;
        ++peers_[from].lost;
      } else if (platform_.completes_at_departure) {
        // Its last byte has left: the sender hears of it now (below), the frame arrives a
        // route's latency later, after any frame sent before it (TCP keeps order).
        if (l.latency_s < 0) {
          std::vector<s4u::Link*> route;
          l.latency_s = 0;
          platform_.hosts[from]->route_to(platform_.hosts[to], route, &l.latency_s);
        }
        const double jitter_s = jitter > 0 ? 2 * jitter * l.rng.uniform() : 0.0;
        l.last_arrival = std::max(l.last_arrival, s4u::Engine::get_clock() + l.latency_s + jitter_s);
        l.air.push_back({l.last_arrival, std::move(q.frame), q.to_incarnation});
        if (!l.delivering) {
          l.delivering = true;  // a carrier is owed: flush() (below) hands it the delivery
          to_start_.push_back({from, to, true});
        }
      } else {
        if (jitter > 0) s4u::this_actor::sleep_for(2 * jitter * l.rng.uniform());
        hand_over(l, from, to, q.frame, q.to_incarnation);
      }
    }
    l.queued_bytes -= bytes;
    l.in_flight = false;
    // The sender hears of its frame only if the engine that sent it still runs.
    if (q.done && q.from_incarnation == peers_[from].incarnation && up(from)) q.done(status);
    if (up(from) && peers_[from].clock != nullptr) peers_[from].clock->wake();
    if (up(to) && peers_[to].clock != nullptr) peers_[to].clock->wake();
    flush();
  }
  l.running = false;
}

void SimNetwork::transfer(Link& l, int from, int to, size_t bytes) {
  if (l.mailbox == nullptr) {
    if (!sinks_[to]) {
      // The permanent receiver a flow to this host needs: it never takes anything (the
      // carrier takes its own frame back), and ends with the run (a daemon).
      sinks_[to] = s4u::Actor::create("sink " + names_[to], platform_.hosts[to], [] { s4u::this_actor::sleep_for(1e15); });
      sinks_[to]->daemonize();
    }
    // Named for this network alone: a process may run simulations one after another
    // (the tests do), and SimGrid keeps a mailbox, its receiver too, by its name.
    static uint64_t networks = 0;
    if (serial_ == 0) serial_ = ++networks;
    l.mailbox = s4u::Mailbox::by_name("network " + std::to_string(serial_) + " link " + names_[from] + " > " + names_[to]);
    l.mailbox->set_receiver(sinks_[to]);
  }
  // The flow leaves from the host of the actor that puts it.
  if (s4u::this_actor::get_host() != platform_.hosts[from]) s4u::this_actor::set_host(platform_.hosts[from]);
  static int token;  // the payload pointer the put carries; the frame itself stays in the link
  try {
    l.mailbox->put(&token, bytes);
  } catch (const simgrid::NetworkFailureException&) {
    // The failed comm is still in the mailbox: taken out (it throws again) before a retry.
    try {
      l.mailbox->get<int>();
    } catch (const simgrid::NetworkFailureException&) {
    }
    throw;
  }
  l.mailbox->get<int>();  // the comm just done, the only one on this link's mailbox
}

void SimNetwork::hand_over(Link& l, int from, int to, const OutFrame& frame, uint64_t to_incarnation) {
  l.bytes += frame.size();
  ++l.frames;
  ++counters_.frames;
  // The receiver may have gone down while the frame travelled.
  if (to_incarnation != peers_[to].incarnation || !up(to)) return;
  FrameDecoder decoder;
  decoder.accept_unchecked_payloads(true);
  // The header, then the payload where it lies: fed in two pieces, as a socket would, not
  // copied into one string first (SimTransport::send marked the frame as without a CRC).
  HEARSAY_CHECK(frame.sealed, "simulated wire: a frame of " + names_[from] + " was not sealed");
  const auto deliver = [&](InFrame&& f) { peers_[to].transport->deliver(names_[from], std::move(f)); };
  FrameError err = decoder.feed(reinterpret_cast<const uint8_t*>(frame.head.data()), frame.head.size(), deliver);
  if (err == FrameError::kNone && frame.payload_size > 0) err = decoder.feed(frame.payload, frame.payload_size, deliver);
  HEARSAY_CHECK(err == FrameError::kNone, "simulated wire: a frame of " + names_[from] + " does not decode: " + decoder.detail());
}

void SimNetwork::deliver_in_air(int from, int to) {
  Link& l = link(from, to);
  while (!l.air.empty() && !closing_) {
    s4u::this_actor::sleep_until(l.air.front().arrives_at);
    if (closing_) break;
    Link::InAir f = std::move(l.air.front());
    l.air.pop_front();
    hand_over(l, from, to, f.frame, f.to_incarnation);
    if (up(to) && peers_[to].clock != nullptr) peers_[to].clock->wake();
    flush();  // what the receiver sent in answer
  }
  l.air.clear();
  l.delivering = false;
}

LinkStats SimNetwork::link_stats(int from, int to) const {
  LinkStats s;
  s.connected = up(from) && up(to);
  if (const Link* out = find_link(from, to)) {
    s.bytes_sent = out->bytes;
    s.frames_sent = out->frames;
    s.queue_depth = out->queue.size() + (out->in_flight ? 1 : 0);
    s.queue_bytes = out->queued_bytes;
  }
  if (const Link* in = find_link(to, from)) {
    s.bytes_received = in->bytes;
    s.frames_received = in->frames;
  }
  return s;
}

uint64_t SimNetwork::lost(int from) const { return peers_[from].lost; }

}  // namespace hearsay::sim
