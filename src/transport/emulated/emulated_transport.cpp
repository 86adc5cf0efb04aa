#include <atomic>
#include <cmath>
#include <thread>
#include <utility>

#include "../timed_executor.h"
#include "shared_pipe.h"
#include "hearsay/process.h"
#include "hearsay/emulated.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay {

void check_link_model(const LinkModel& m, const std::string& where) {
  auto fail = [&](const std::string& field, const std::string& why) {
    throw InputError(where + ": " + field + " " + why);
  };
  if (!(m.latency_s >= 0) || !std::isfinite(m.latency_s)) fail("latency", "must be a finite number >= 0");
  if (!(m.jitter_s >= 0) || !std::isfinite(m.jitter_s)) fail("jitter", "must be a finite number >= 0");
  if (!(m.bandwidth_bps >= 0) || !std::isfinite(m.bandwidth_bps)) fail("bandwidth", "must be a finite number >= 0 (0: unlimited)");
  if (!(m.loss >= 0 && m.loss < 1)) fail("loss", "must be in [0, 1)");
  for (const auto& [start, end] : m.outages) {
    if (!(start >= 0 && end > start) || !std::isfinite(end)) fail("outage", "must be [start, end) with 0 <= start < end");
  }
}

namespace {

using Clock = TimedExecutor::Clock;

class EmulatedTransport final : public Transport {
 public:
  EmulatedTransport(std::unique_ptr<Transport> inner, LinkModel def, std::map<std::string, LinkModel> per_peer, uint64_t seed)
      : inner_(std::move(inner)), default_(std::move(def)), per_peer_(std::move(per_peer)), rng_(seed, 77),
        start_(Clock::now()) {
    check_link_model(default_, "emulated link (default)");
    for (const auto& [peer, m] : per_peer_) check_link_model(m, "emulated link to '" + peer + "'");
    for (const auto& [peer, m] : per_peer_) {
      if (!m.pipe.empty() && pipes_.count(m.pipe) == 0) pipes_[m.pipe] = SharedPipe::open(m.pipe_scope, m.pipe);
    }
    if (!default_.pipe.empty()) pipes_[default_.pipe] = SharedPipe::open(default_.pipe_scope, default_.pipe);
    thread_ = std::thread([this] { run_thread("the link emulation's thread", [this] { clock_.run(); }); });
    set_link_listener(nullptr);
  }
  ~EmulatedTransport() override { close(); }

  std::string kind() const override { return "emulated(" + inner_->kind() + ")"; }
  void set_receiver(Receiver r) override { inner_->set_receiver(std::move(r)); }
  // A connection that drops takes the frames on its emulated link with it, as a TCP
  // connection's do: each link counts its connections' ends (an epoch), and a frame of an
  // earlier epoch is failed at its departure, or lost in flight, never delivered over the
  // next connection out of its order.
  void set_link_listener(LinkListener l) override {
    inner_->set_link_listener([this, l = std::move(l)](const LinkEvent& e) {
      if (e.kind == LinkEvent::Kind::kDown) {
        std::lock_guard<std::mutex> lock(mu_);
        Link& link = links_[e.peer_id];
        ++link.epoch;
        link.free_at = link.last_arrival = Clock::now();  // its queue went with the connection
        link.dead_frames += std::exchange(link.in_flight, 0);
        link.dead_bytes += std::exchange(link.in_flight_bytes, 0);
      }
      if (l) l(e);
    });
  }
  std::string listen(const std::string& address) override { return inner_->listen(address); }
  void connect(const std::string& peer_id, const std::string& address) override { inner_->connect(peer_id, address); }
  // The frames move on the inner transport, from the caller's memory.
  MemoryRegistration register_memory(void* data, size_t bytes, MemoryKind kind) override {
    return inner_->register_memory(data, bytes, kind);
  }

  void send(const std::string& peer_id, OutFrame frame, SendCallback done) override {
    const auto now = Clock::now();
    Clock::time_point leave, arrive;
    bool lost = false;
    uint64_t epoch = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const LinkModel& m = model(peer_id);
      Link& link = links_[peer_id];
      epoch = link.epoch;
      const double t = std::chrono::duration<double>(now - start_).count();
      for (const auto& [a, b] : m.outages) lost |= t >= a && t < b;
      if (m.loss > 0 && rng_.uniform() < m.loss) lost = true;
      const double transmit_s = m.bandwidth_bps > 0 ? 8.0 * static_cast<double>(frame.size()) / m.bandwidth_bps : 0.0;
      if (frame.urgent) {
        // A control frame (a heartbeat, an acknowledgement) is not queued behind the data
        // waiting: hearsay's tcp transport sends it ahead of its queue. It takes its own
        // few bytes' time and keeps no order with the data frames.
        leave = now + seconds_to_duration(transmit_s);
      } else if (m.pipe.empty()) {
        leave = std::max(now, link.free_at) + seconds_to_duration(transmit_s);
        link.free_at = leave;
      } else {
        // The shared pipe's clock is the steady clock's count, the same in every process.
        const auto ns = [](Clock::duration d) { return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count(); };
        const int64_t left = pipes_.at(m.pipe)->reserve(ns(now.time_since_epoch()), ns(seconds_to_duration(transmit_s)));
        leave = Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(left)));
      }
      double delay = m.latency_s;
      if (m.jitter_s > 0) delay = std::max(0.0, delay + (2.0 * rng_.uniform() - 1.0) * m.jitter_s);
      arrive = leave + seconds_to_duration(delay);
      if (!frame.urgent) {
        arrive = std::max(arrive, link.last_arrival);  // data frames keep their order, as on a TCP path
        link.last_arrival = arrive;
      }
      ++link.in_flight;
      link.in_flight_bytes += frame.size();
      if (lost) ++dropped_;
    }
    auto sent = std::make_shared<SendCallback>(std::move(done));
    // The sender hears back when the frame has left the emulated link, and hears that it
    // failed when it is lost (as a real transport reports a frame it could not deliver)...
    clock_.post(
        [this, sent, lost, peer_id, epoch] {
          if (!*sent) return;
          if (lost) return (*sent)({false, "emulated loss"});
          if (!same_epoch(peer_id, epoch)) return (*sent)({false, "emulated link: the connection to '" + peer_id + "' dropped"});
          (*sent)({});
        },
        leave);
    // ...and the frame reaches the real transport when it would arrive.
    const size_t bytes = frame.size();
    clock_.post(
        [this, peer_id, bytes, lost, epoch, f = std::make_shared<OutFrame>(std::move(frame))]() mutable {
          bool current;
          {
            std::lock_guard<std::mutex> lock(mu_);
            Link& link = links_[peer_id];
            current = link.epoch == epoch;
            // A frame of a dropped connection no longer counts as queued on the link.
            (current ? link.in_flight : link.dead_frames) -= 1;
            (current ? link.in_flight_bytes : link.dead_bytes) -= bytes;
          }
          if (!lost && current) inner_->send(peer_id, std::move(*f), nullptr);
        },
        arrive);
  }

  LinkStats link_stats(const std::string& peer_id) const override {
    LinkStats s = inner_->link_stats(peer_id);
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = links_.find(peer_id);
    if (it != links_.end()) {
      s.queue_depth += it->second.in_flight;
      s.queue_bytes += it->second.in_flight_bytes;
    }
    return s;
  }
  std::vector<std::string> connected_peers() const override { return inner_->connected_peers(); }
  TransportCounters counters() const override {
    TransportCounters c = inner_->counters();
    std::lock_guard<std::mutex> lock(mu_);
    if (dropped_ > 0) c.rejected["emulated_loss"] += dropped_;
    return c;
  }

  void close() override {
    if (closed_.exchange(true)) return;
    clock_.stop();
    if (thread_.joinable()) thread_.join();
    inner_->close();
  }

 private:
  struct Link {
    Clock::time_point free_at{}, last_arrival{};
    uint64_t in_flight = 0, in_flight_bytes = 0;
    uint64_t epoch = 0;  // connections to the peer that have dropped
    uint64_t dead_frames = 0, dead_bytes = 0;  // of dropped connections, their timers not yet run
  };
  bool same_epoch(const std::string& peer, uint64_t epoch) {
    std::lock_guard<std::mutex> lock(mu_);
    return links_[peer].epoch == epoch;
  }
  const LinkModel& model(const std::string& peer) const {
    const auto it = per_peer_.find(peer);
    return it == per_peer_.end() ? default_ : it->second;
  }

  std::unique_ptr<Transport> inner_;
  LinkModel default_;
  std::map<std::string, LinkModel> per_peer_;
  mutable std::mutex mu_;
  std::map<std::string, Link> links_;  // GUARDED_BY(mu_)
  std::map<std::string, std::shared_ptr<SharedPipe>> pipes_;  // by name; fixed after construction
  Rng rng_;                            // GUARDED_BY(mu_)
  uint64_t dropped_ = 0;               // GUARDED_BY(mu_)
  Clock::time_point start_;
  TimedExecutor clock_;
  std::thread thread_;
  std::atomic<bool> closed_{false};
};

}  // namespace

std::unique_ptr<Transport> create_emulated_transport(std::unique_ptr<Transport> inner, LinkModel default_model,
                                                     std::map<std::string, LinkModel> per_peer, uint64_t seed) {
  return std::make_unique<EmulatedTransport>(std::move(inner), std::move(default_model), std::move(per_peer), seed);
}

}  // namespace hearsay
