// A peer's end of a transport for tests: records what arrives and which links came and
// went, and waits (bounded) for conditions.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hearsay/wire.pb.h"
#include "hearsay/transport.h"

namespace hearsay::test {

// How much longer waits may take in this build. Under ThreadSanitizer a fabric endpoint's
// start took 12.3 s against 0.27 s (a 2-core VM where every page of TSan's shadow that a
// large buffer touches is a copy-on-write fault with a TLB flush across CPUs): the waits
// and the handshake timeout stretch by this much, and timing bounds' lateness allowances
// with them (earliness bounds stay as they are).
#if defined(__SANITIZE_THREAD__)
constexpr double kSlowBuild = 10.0;
#else
constexpr double kSlowBuild = 1.0;
#endif

inline TransportOptions options_for(const std::string& peer, const std::string& secret = "s3cret",
                                    const std::string& cluster = "test-cluster") {
  TransportOptions o;
  o.peer_id = peer;
  o.site = "site-" + peer;
  o.cluster_id = cluster;
  o.secret = secret;
  o.heartbeat_interval_s = 0.1;
  o.handshake_timeout_s = 2.0 * kSlowBuild;
  o.reconnect_initial_s = 0.02;
  o.reconnect_max_s = 0.2;
  return o;
}

struct Node {
  std::unique_ptr<Transport> t;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::pair<std::string, InFrame>> got;
  std::vector<LinkEvent> events;

  explicit Node(std::unique_ptr<Transport> transport) : t(std::move(transport)) {
    t->set_receiver([this](const std::string& from, InFrame&& f) {
      std::lock_guard<std::mutex> lock(mu);
      got.emplace_back(from, std::move(f));
      cv.notify_all();
    });
    t->set_link_listener([this](const LinkEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(e);
      cv.notify_all();
    });
  }
  ~Node() { t->close(); }

  // Waits up to `seconds` for pred (called under the lock).
  bool wait(const std::function<bool()>& pred, double seconds = 5.0) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::duration<double>(seconds * kSlowBuild), pred);
  }
  bool wait_frames(size_t n, double seconds = 5.0) {
    return wait([&] { return got.size() >= n; }, seconds);
  }
  bool wait_event(LinkEvent::Kind kind, double seconds = 5.0, size_t count = 1) {
    return wait([&] {
      size_t c = 0;
      for (const auto& e : events) c += e.kind == kind;
      return c >= count;
    }, seconds);
  }
  bool wait_connected(const std::string& peer, double seconds = 5.0) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds * kSlowBuild);
    while (std::chrono::steady_clock::now() < deadline) {
      if (t->link_stats(peer).connected) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  size_t events_of(LinkEvent::Kind kind) {
    std::lock_guard<std::mutex> lock(mu);
    size_t c = 0;
    for (const auto& e : events) c += e.kind == kind;
    return c;
  }
};

inline std::string local_address(const std::string& kind) { return kind == "inproc" ? "" : "127.0.0.1:0"; }

// Two peers on one kind of transport: a listens, b dials a.
struct Pair {
  Node a, b;
  Pair(const std::string& kind, TransportOptions oa, TransportOptions ob)
      : a(create_transport(kind, oa)), b(create_transport(kind, ob)) {
    const std::string addr = a.t->listen(local_address(kind));
    b.t->connect(oa.peer_id, addr);
  }
};

// A gradient update carrying `values`: copied into the frame, or sent from where they are
// when `owner` keeps them alive.
inline OutFrame update_frame(const std::vector<float>& values, uint64_t id, std::shared_ptr<const void> owner = nullptr) {
  wire::Envelope e;
  auto* u = e.mutable_update();
  u->set_sender("a");
  u->set_clock(id);
  u->set_update_id(id);
  u->set_kind(wire::GRADIENT);
  u->set_tensor_length(values.size());
  u->set_segment_length(values.size());
  return make_frame(e, reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float), std::move(owner));
}

}  // namespace hearsay::test
