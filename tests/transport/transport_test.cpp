// Every transport built, through the same tests (gloo-style): message kinds, admission,
// reconnects, bad frames.
#include <doctest/doctest.h>

#include <asio.hpp>
#include <cstring>
#include <thread>

#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "../../src/transport/session.h"
#include "transport_harness.h"

using namespace hearsay;
using test::Node;
using test::options_for;

namespace {

OutFrame update_frame(const std::vector<float>& values, uint64_t id) {
  wire::Envelope e;
  auto* u = e.mutable_update();
  u->set_sender("a");
  u->set_clock(id);
  u->set_update_id(id);
  u->set_kind(wire::GRADIENT);
  u->set_tensor_length(values.size());
  u->set_segment_length(values.size());
  return make_frame(e, reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float));
}

// a listens, b dials a.
struct Pair {
  Node a, b;
  Pair(const std::string& kind, TransportOptions oa, TransportOptions ob)
      : a(create_transport(kind, oa)), b(create_transport(kind, ob)) {
    const std::string addr = a.t->listen(test::local_address(kind));
    b.t->connect(oa.peer_id, addr);
  }
};

}  // namespace

TEST_CASE("transports: updates and credits round-trip; heartbeats measure the RTT; Bye ends the link") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    const std::vector<float> values{1.0f, -2.5f, 3.0f, 1e-30f};
    SendStatus status{false, "never called"};
    std::mutex mu;
    p.b.t->send("a", update_frame(values, 7), [&](const SendStatus& s) {
      std::lock_guard<std::mutex> lock(mu);
      status = s;
    });
    wire::Envelope credit;
    credit.mutable_credit()->set_credits(3);
    credit.mutable_credit()->set_acked_update_id(7);
    p.a.t->send("b", make_frame(credit), nullptr);
    REQUIRE(p.a.wait_frames(1));
    REQUIRE(p.b.wait_frames(1));
    {
      std::lock_guard<std::mutex> lock(p.a.mu);
      const auto& [from, f] = p.a.got[0];
      CHECK(from == "b");
      CHECK(f.envelope.update().update_id() == 7);
      REQUIRE(f.payload.size() == values.size() * sizeof(float));
      CHECK(std::memcmp(f.payload.data(), values.data(), f.payload.size()) == 0);
    }
    {
      std::lock_guard<std::mutex> lock(p.b.mu);
      CHECK(p.b.got[0].second.envelope.credit().acked_update_id() == 7);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      CHECK(status.ok);
    }
    // Heartbeats every 100 ms give both sides an RTT.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (p.b.t->link_stats("a").rtt_s < 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const LinkStats s = p.b.t->link_stats("a");
    CHECK(s.rtt_s >= 0);
    CHECK(s.rtt_s < 1.0);
    CHECK(s.frames_sent >= 3);  // Hello, proof, update (+ heartbeats)
    CHECK(s.bytes_sent > values.size() * sizeof(float));
    // Closing a says Bye: b sees the link go down with the reason. (On fabric the
    // bootstrap socket's close can overtake the Bye message; both are orderly ends.)
    p.a.t->close();
    REQUIRE(p.b.wait_event(LinkEvent::Kind::kDown));
    std::lock_guard<std::mutex> lock(p.b.mu);
    const std::string& reason = p.b.events.back().reason;
    CHECK((reason.find("bye") != std::string::npos || reason.find("closed by peer") != std::string::npos));
  }
}

// Sizes on both sides of fabric's direct-payload threshold (32 KiB) and of its 256 KiB
// messages, small frames between them, both directions at once.
TEST_CASE("transports: large and small updates arrive intact and in order, both ways at once") {
  const std::vector<size_t> floats{3, 8191, 8192, 8193, 262144, 5, 786433, 1, 65536, 2};
  auto values_of = [](uint64_t id, size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(id * 1000003 + i * 7 % 1009);
    return v;
  };
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < floats.size(); ++i) {
        const uint64_t id = round * floats.size() + i;
        p.b.t->send("a", update_frame(values_of(id, floats[i]), id), nullptr);
        p.a.t->send("b", update_frame(values_of(id + 100, floats[floats.size() - 1 - i]), id + 100), nullptr);
      }
    }
    const size_t n = 2 * floats.size();
    REQUIRE(p.a.wait_frames(n, 20.0));
    REQUIRE(p.b.wait_frames(n, 20.0));
    for (size_t k = 0; k < n; ++k) {
      CAPTURE(k);
      const size_t i = k % floats.size();
      const auto& to_a = p.a.got[k].second;
      REQUIRE(to_a.envelope.update().update_id() == k);
      const auto want_a = values_of(k, floats[i]);
      REQUIRE(to_a.payload.size() == want_a.size() * sizeof(float));
      CHECK(std::memcmp(to_a.payload.data(), want_a.data(), to_a.payload.size()) == 0);
      const auto& to_b = p.b.got[k].second;
      REQUIRE(to_b.envelope.update().update_id() == k + 100);
      const auto want_b = values_of(k + 100, floats[floats.size() - 1 - i]);
      REQUIRE(to_b.payload.size() == want_b.size() * sizeof(float));
      CHECK(std::memcmp(to_b.payload.data(), want_b.data(), to_b.payload.size()) == 0);
    }
    CHECK(p.a.t->counters().rejected.empty());
    CHECK(p.b.t->counters().rejected.empty());
  }
}

// A sender must never wait forever on a frame its receiver will not take: its outbox
// sends the next update only after the callback.
TEST_CASE("transports: every send's callback runs when the receiver goes away mid-stream") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    const std::vector<float> big(262144, 1.5f);  // 1 MiB
    constexpr int kFrames = 24;
    std::mutex mu;
    std::condition_variable cv;
    int called = 0, ok = 0;
    for (int i = 0; i < kFrames; ++i) {
      if (i == kFrames / 3) p.a.t->close();
      p.b.t->send("a", update_frame(big, i), [&](const SendStatus& s) {
        std::lock_guard<std::mutex> lock(mu);
        ++called;
        ok += s.ok;
        cv.notify_all();
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    CHECK(cv.wait_for(lock, std::chrono::seconds(10), [&] { return called == kFrames; }));
    CHECK(ok < kFrames);
  }
}

// A receiver that closes the link on a bad frame must not leave the sender holding the
// frame's payload (on fabric shm, a direct payload nobody posted a receive for).
TEST_CASE("transports: a sender lets go of a payload its receiver refused, and the link comes back") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    auto payload = std::make_shared<std::vector<float>>(262144, 2.0f);  // 1 MiB
    std::weak_ptr<std::vector<float>> watch = payload;
    OutFrame bad = update_frame({1.0f}, 1);
    bad.head.replace(0, 4, "JUNK");  // wrong magic: the stream cannot be trusted past it
    bad.sealed = true;
    bad.payload = reinterpret_cast<const uint8_t*>(payload->data());
    bad.payload_size = payload->size() * sizeof(float);
    bad.payload_owner = std::move(payload);
    p.b.t->send("a", std::move(bad), nullptr);
    REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!watch.expired() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    CHECK(watch.expired());
    // b redials; a large update then gets through.
    REQUIRE(p.b.wait_event(LinkEvent::Kind::kUp, 5.0, 2));
    const std::vector<float> big(262144, 3.0f);
    p.b.t->send("a", update_frame(big, 2), nullptr);
    REQUIRE(p.a.wait_frames(1));
    CHECK(p.a.got[0].second.envelope.update().update_id() == 2);
    CHECK(p.a.got[0].second.payload.size() == big.size() * sizeof(float));
  }
}

TEST_CASE("transports: send to an unknown peer fails at once, naming it") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Node n(create_transport(kind, options_for("solo")));
    SendStatus got;
    n.t->send("nobody", update_frame({1.0f}, 1), [&](const SendStatus& s) { got = s; });
    CHECK_FALSE(got.ok);
    CHECK(got.error.find("nobody") != std::string::npos);
  }
}

TEST_CASE("admission: a wrong secret or a wrong cluster is refused and counted; nothing is delivered") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    for (int wrong_cluster = 0; wrong_cluster < 2; ++wrong_cluster) {
      Pair p(kind, options_for("a"), wrong_cluster ? options_for("b", "s3cret", "other") : options_for("b", "guess"));
      REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected));
      p.b.t->send("a", update_frame({1.0f}, 1), nullptr);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      CHECK_FALSE(p.a.t->link_stats("b").connected);
      CHECK(p.a.got.empty());
      CHECK(p.a.t->counters().rejected["admission"] >= 1);
      std::lock_guard<std::mutex> lock(p.a.mu);
      CHECK(p.a.events.front().reason.find(wrong_cluster ? "wrong cluster" : "wrong proof") != std::string::npos);
    }
  }
}

TEST_CASE("transports: a peer that restarts is reconnected to, and traffic resumes") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    auto a = std::make_unique<Node>(create_transport(kind, options_for("a")));
    const std::string addr = a->t->listen(kind == "inproc" ? "restart-a" : "127.0.0.1:0");
    Node b(create_transport(kind, options_for("b")));
    b.t->connect("a", addr);
    REQUIRE(b.wait_connected("a"));
    a.reset();  // a goes away...
    REQUIRE(b.wait_event(LinkEvent::Kind::kDown));
    a = std::make_unique<Node>(create_transport(kind, options_for("a")));
    a->t->listen(addr);  // ...and comes back at the same address
    REQUIRE(b.wait_connected("a", 5.0));
    b.t->send("a", update_frame({4.0f, 5.0f}, 2), nullptr);
    REQUIRE(a->wait_frames(1));
    CHECK(b.events_of(LinkEvent::Kind::kUp) == 2);
  }
}

TEST_CASE("transports: a bad update is dropped and counted while the link stays up") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    wire::Envelope e;
    auto* u = e.mutable_update();
    u->set_tensor_length(4);
    u->set_segment_offset(3);
    u->set_segment_length(2);  // past the end of the tensor
    const float two[2] = {1, 2};
    p.b.t->send("a", make_frame(e, reinterpret_cast<const uint8_t*>(two), sizeof(two)), nullptr);
    p.b.t->send("a", update_frame({9.0f}, 3), nullptr);
    REQUIRE(p.a.wait_frames(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(p.a.got.size() == 1);
    CHECK(p.a.got[0].second.envelope.update().update_id() == 3);
    CHECK(p.a.t->counters().rejected["bad_update"] == 1);
    CHECK(p.a.t->link_stats("b").connected);
  }
}

// Raw TCP clients that do not follow the protocol.
namespace {

std::string raw_exchange(const std::string& address, const std::string& bytes) {
  asio::io_context io;
  asio::ip::tcp::socket s(io);
  const auto colon = address.rfind(':');
  s.connect({asio::ip::make_address(address.substr(0, colon)), static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))});
  asio::write(s, asio::buffer(bytes));
  std::string got;
  char buf[4096];
  asio::error_code ec;
  for (;;) {
    const size_t n = s.read_some(asio::buffer(buf), ec);
    if (ec) break;
    got.append(buf, n);
  }
  return got;  // everything the server said before it closed
}

}  // namespace

TEST_CASE("admission (tcp): garbage before Hello and an old protocol version close the connection") {
  Node a(create_transport("tcp", options_for("a")));
  const std::string addr = a.t->listen("127.0.0.1:0");
  raw_exchange(addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  wire::Envelope hello;
  hello.mutable_hello()->set_peer_id("old");
  hello.mutable_hello()->set_cluster_id("test-cluster");
  hello.mutable_hello()->set_protocol_version(0);
  hello.mutable_hello()->set_nonce(std::string(32, 'x'));
  raw_exchange(addr, flatten(make_frame(hello)));
  wire::Envelope update;
  update.mutable_update()->set_tensor_length(0);
  raw_exchange(addr, flatten(make_frame(update)));  // an update before any Hello
  REQUIRE(a.wait_event(LinkEvent::Kind::kRejected, 5.0, 3));
  const auto counters = a.t->counters();
  CHECK(counters.rejected.at("bad_magic") == 1);
  CHECK(counters.rejected.at("admission") == 2);
  CHECK(a.got.empty());
  std::lock_guard<std::mutex> lock(a.mu);
  CHECK(a.events[1].reason.find("protocol version 0 unsupported") != std::string::npos);
  CHECK(a.events[0].remote_address.rfind("127.0.0.1:", 0) == 0);
}

TEST_CASE("tcp: IPv6 and host names work") {
  Node a(create_transport("tcp", options_for("a")));
  Node b(create_transport("tcp", options_for("b")));
  std::string addr;
  try {
    addr = a.t->listen("[::1]:0");
  } catch (const std::exception& e) {
    MESSAGE("skipped IPv6: " << e.what());
    addr = a.t->listen("localhost:0");
  }
  b.t->connect("a", addr);
  CHECK(b.wait_connected("a"));
  Node c(create_transport("tcp", options_for("c")));
  const std::string port = a.t->listen("127.0.0.1:0").substr(10);
  c.t->connect("a", "localhost:" + port);
  CHECK(c.wait_connected("a"));
}

TEST_CASE("transports: bad setup is an input error") {
  auto o = options_for("x");
  o.secret.clear();
  CHECK_THROWS_WITH_AS(create_transport("tcp", o), doctest::Contains("secret is empty"), InputError);
  CHECK_THROWS_WITH_AS(create_transport("carrier-pigeon", options_for("x")), doctest::Contains("unknown"), InputError);
  Node n(create_transport("tcp", options_for("x")));
  CHECK_THROWS_WITH_AS(n.t->listen("no-port"), doctest::Contains("no-port"), InputError);
  CHECK_THROWS_WITH_AS(n.t->connect("y", "1.2.3.4:99999"), doctest::Contains("1.2.3.4:99999"), InputError);
}

TEST_CASE("session: an admitted neighbour silent past the liveness timeout is dropped") {
  // Transports tick their sessions every 100 ms; a live neighbour answers heartbeats, so
  // silence means a hung or vanished peer. Here the clock is driven by hand.
  auto oa = options_for("a");
  oa.liveness_timeout_s = 0.5;
  auto ob = options_for("b");
  std::vector<OutFrame> to_b, to_a;
  std::string a_rejected;
  Session a(oa, "b-address", Session::Hooks{[&](OutFrame f) { to_b.push_back(std::move(f)); },
                                           [&](const std::string& r) { a_rejected = r; }, [](const std::string&) {},
                                           [](InFrame&&) {}, [](const std::string&) {}});
  Session b(ob, "a-address", Session::Hooks{[&](OutFrame f) { to_a.push_back(std::move(f)); },
                                           [](const std::string&) {}, [](const std::string&) {}, [](InFrame&&) {},
                                           [](const std::string&) {}});
  auto pass = [](std::vector<OutFrame>& q, Session& to) {
    while (!q.empty()) {
      FrameDecoder d;
      const std::string bytes = flatten(q.front());
      q.erase(q.begin());
      d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& f) { to.on_frame(std::move(f)); });
    }
  };
  a.start();
  b.start();
  for (int i = 0; i < 3; ++i) {
    pass(to_b, b);
    pass(to_a, a);
  }
  REQUIRE(a.admitted());
  const auto now = std::chrono::steady_clock::now();
  a.tick(now + std::chrono::milliseconds(200));
  CHECK(a_rejected.empty());
  a.tick(now + std::chrono::seconds(2));
  CHECK(a_rejected.find("liveness: silent") != std::string::npos);
}
