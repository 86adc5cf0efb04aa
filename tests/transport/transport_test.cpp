// Every transport built, through the same tests (gloo-style): message kinds, admission,
// reconnects, bad frames.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <asio.hpp>
#include <cstring>
#include <filesystem>
#include <map>
#include <fstream>
#include <thread>

#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "../../src/transport/session.h"
#include "transport_harness.h"
#include "test_util.h"

using namespace hearsay;
using test::Node;
using test::options_for;
using test::Pair;
using test::update_frame;

TEST_CASE("transports: updates and credits round-trip, heartbeats measure the RTT, Bye ends the link") {
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
      CHECK(f.envelope->update().update_id() == 7);
      REQUIRE(f.payload.size() == values.size() * sizeof(float));
      CHECK(std::memcmp(f.payload.data(), values.data(), f.payload.size()) == 0);
    }
    {
      std::lock_guard<std::mutex> lock(p.b.mu);
      CHECK(p.b.got[0].second.envelope->credit().acked_update_id() == 7);
    }
    {
      // The send's callback runs when the sender's write completes, which may come after
      // the receiver already has the frame: wait for it.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
      std::unique_lock<std::mutex> lock(mu);
      while (status.error == "never called" && std::chrono::steady_clock::now() < until) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        lock.lock();
      }
      CHECK(status.ok);
      CHECK(status.error.empty());
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
    // b redials a, and its refused dials come after as unreachable events: the down one says why.
    const auto down = std::find_if(p.b.events.rbegin(), p.b.events.rend(),
                                   [](const LinkEvent& e) { return e.kind == LinkEvent::Kind::kDown; });
    REQUIRE(down != p.b.events.rend());
    const std::string& reason = down->reason;
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
      REQUIRE(to_a.envelope->update().update_id() == k);
      const auto want_a = values_of(k, floats[i]);
      REQUIRE(to_a.payload.size() == want_a.size() * sizeof(float));
      CHECK(std::memcmp(to_a.payload.data(), want_a.data(), to_a.payload.size()) == 0);
      const auto& to_b = p.b.got[k].second;
      REQUIRE(to_b.envelope->update().update_id() == k + 100);
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
    // Known, not ours: libfabric 1.17's ofi_rxm over tcp sometimes crashes in its progress
    // (a spinlock of a connection already freed) when the peer closes while large messages
    // are in flight: 2 of 30 runs at 123a122, 5 of 30 now, more under load. Left out here
    // until it is worked around; docs/WIRE.md says so.
    if (kind == "fabric:tcp;ofi_rxm" || kind == "fabric") continue;
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

TEST_CASE("transports: once set_receiver returns, the receiver it replaced is not running, so its owner may go") {
  // What GossipEngine's destructor relies on: it unsets its receiver and is then freed.
  // Before set_receiver waited, a frame being delivered on the transport's thread ran on
  // into the freed engine (engine_test crashed so in CI).
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    std::atomic<bool> entered{false}, left{false};
    p.b.t->set_receiver([&](const std::string&, InFrame&&) {
      entered = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      left = true;
    });
    p.a.t->send("b", update_frame(std::vector<float>(16, 1.0f), 1), nullptr);
    for (int i = 0; i < 1000 && !entered; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    REQUIRE(entered);
    p.b.t->set_receiver(nullptr);
    CHECK(left);
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
    CHECK(p.a.got[0].second.envelope->update().update_id() == 2);
    CHECK(p.a.got[0].second.payload.size() == big.size() * sizeof(float));
  }
}

TEST_CASE("transports: a probe is answered inside the transport with its byte count, and only the reply is delivered") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    Pair p(kind, options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    const std::vector<uint8_t> payload(300000, 7);
    wire::Envelope probe;
    probe.mutable_probe()->set_seq(41);
    p.b.t->send("a", make_frame(probe, payload.data(), payload.size()), nullptr);
    REQUIRE(p.b.wait_frames(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    {
      std::lock_guard<std::mutex> lock(p.b.mu);
      REQUIRE(p.b.got.size() == 1);
      const auto& reply = p.b.got[0].second.envelope->probe();
      CHECK(reply.is_reply());
      CHECK(reply.seq() == 41);
      CHECK(reply.bytes() == payload.size());
      CHECK(p.b.got[0].second.payload.size() == 0);
    }
    std::lock_guard<std::mutex> lock(p.a.mu);
    CHECK(p.a.got.empty());  // the probe itself never reaches the receiver
  }
}

TEST_CASE("tcp: a dial that reaches no one is told as unreachable, with why, once while the reason stays the same") {
  Node b(create_transport("tcp", options_for("b")));
  int port = 0;
  {
    // A port that was free a moment ago: nothing listens there now.
    asio::io_context io;
    asio::ip::tcp::acceptor probe(io, asio::ip::tcp::endpoint(asio::ip::address_v4::loopback(), 0));
    port = probe.local_endpoint().port();
  }
  b.t->connect("a", "127.0.0.1:" + std::to_string(port));
  b.t->connect("c", "no-such-host.invalid:1");
  REQUIRE(b.wait_event(LinkEvent::Kind::kUnreachable, 5.0, 2));
  std::this_thread::sleep_for(std::chrono::milliseconds(800));  // several retries (back-off 20-200 ms)
  std::lock_guard<std::mutex> lock(b.mu);
  std::map<std::string, std::vector<std::string>> by_peer;
  for (const auto& e : b.events) {
    if (e.kind == LinkEvent::Kind::kUnreachable) by_peer[e.peer_id].push_back(e.reason);
  }
  REQUIRE(by_peer["a"].size() == 1);
  CHECK(by_peer["a"][0] == "connect to 127.0.0.1:" + std::to_string(port) + ": Connection refused");
  REQUIRE(by_peer["c"].size() == 1);
  CHECK(by_peer["c"][0].find("cannot resolve no-such-host.invalid") == 0);
  CHECK(b.t->counters().rejected.empty());  // no stranger's doing: nothing counted
}

TEST_CASE("tcp: a child forked after listen does not keep the port open: once the transport closes, a dial is refused") {
  auto t = create_transport("tcp", options_for("a"));
  const std::string at = t->listen("127.0.0.1:0");
  const int port = std::stoi(at.substr(at.rfind(':') + 1));
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t child = ::fork();  // as a DataLoader worker forked after init(), still alive below
  if (child == 0) {
    // Past fork(): the fork handlers have run here. Say so, then live on.
    const char byte = 1;
    (void)!::write(ready[1], &byte, 1);
    ::sleep(5);
    ::_exit(0);
  }
  REQUIRE(child > 0);
  ::close(ready[1]);
  char byte = 0;
  CHECK(::read(ready[0], &byte, 1) == 1);  // a loaded machine may run the child late
  ::close(ready[0]);
  t->close();
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to);
  const int err = errno;
  ::close(fd);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  // With the child's copy of the listening socket, the kernel would accept into its backlog.
  CHECK(rc != 0);
  CHECK(err == ECONNREFUSED);
}

TEST_CASE("tcp: a transport closed with its links up lets every connection go in close(), while its io context lives") {
  // A connection left in the link table was destroyed after the io context it was made on,
  // in the transport's destructor: freed memory read (AddressSanitizer, 5 peers at the end
  // of a run). After close() the table holds none.
  for (int round = 0; round < 3; ++round) {
    CAPTURE(round);
    Pair p("tcp", options_for("a"), options_for("b"));
    REQUIRE(p.b.wait_connected("a"));
    REQUIRE(p.a.wait_connected("b"));
    p.a.t->send("b", update_frame(std::vector<float>(1 << 16, 1.0f), 1), nullptr);  // something under way
    p.a.t->close();
    CHECK(p.a.t->connected_peers().empty());
    CHECK_FALSE(p.a.t->link_stats("b").connected);
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

TEST_CASE("admission: a wrong secret or a wrong cluster is refused and counted, nothing is delivered") {
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
      INFO("a's first link event: " << p.a.events.front().reason);
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
    CHECK(p.a.got[0].second.envelope->update().update_id() == 3);
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
  auto o = options_for("a");
  o.tls = false;  // the frames themselves, in clear (with TLS, garbage fails its handshake)
  Node a(create_transport("tcp", o));
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
  Session a(oa, "b-address", "b", Session::Hooks{[&](OutFrame f) { to_b.push_back(std::move(f)); },
                                           [&](const std::string& r) { a_rejected = r; }, [](const std::string&) {},
                                           [](InFrame&&) {}, [](const std::string&) {}});
  Session b(ob, "a-address", "", Session::Hooks{[&](OutFrame f) { to_a.push_back(std::move(f)); },
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

// TLS (tcp) and the bounds on what strangers may hold.
namespace {

using asio::ip::tcp;

tcp::endpoint endpoint_of(const std::string& address) {
  const auto colon = address.rfind(':');
  return {asio::ip::make_address(address.substr(0, colon)), static_cast<unsigned short>(std::stoi(address.substr(colon + 1)))};
}

// A TCP relay between a dialler and `target` that keeps a copy of every byte it passes.
class Tap {
 public:
  explicit Tap(const std::string& target) : target_(endpoint_of(target)), acceptor_(io_, endpoint_of("127.0.0.1:0")) {
    accepting_ = std::thread([this] {
      for (;;) {
        auto in = std::make_shared<tcp::socket>(io_);
        auto out = std::make_shared<tcp::socket>(io_);
        asio::error_code ec;
        acceptor_.accept(*in, ec);
        if (ec) return;
        out->connect(target_, ec);
        if (ec) continue;
        std::lock_guard<std::mutex> lock(mu_);
        sockets_.push_back(in);
        sockets_.push_back(out);
        pumps_.emplace_back([this, in, out] { pump(*in, *out); });
        pumps_.emplace_back([this, in, out] { pump(*out, *in); });
      }
    });
  }
  ~Tap() {
    ::shutdown(acceptor_.native_handle(), SHUT_RDWR);  // wakes the blocked accept
    accepting_.join();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& s : sockets_) ::shutdown(s->native_handle(), SHUT_RDWR);
    }
    for (auto& t : pumps_) t.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(acceptor_.local_endpoint().port()); }
  std::string seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void pump(tcp::socket& from, tcp::socket& to) {
    char buf[65536];
    asio::error_code ec;
    for (;;) {
      const size_t n = from.read_some(asio::buffer(buf), ec);
      if (ec) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        seen_.append(buf, n);
      }
      asio::write(to, asio::buffer(buf, n), ec);
      if (ec) break;
    }
    ::shutdown(to.native_handle(), SHUT_WR);
  }

  asio::io_context io_;
  tcp::endpoint target_;
  tcp::acceptor acceptor_;
  std::thread accepting_;
  std::mutex mu_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;  // GUARDED_BY(mu_)
  std::vector<std::thread> pumps_;                      // GUARDED_BY(mu_) while accepting_ runs
  std::string seen_;                                    // GUARDED_BY(mu_)
};

TransportOptions with_tls(TransportOptions o, bool tls) {
  o.tls = tls;
  return o;
}


size_t reasons_with(Node& n, const std::string& text) {
  std::lock_guard<std::mutex> lock(n.mu);
  size_t c = 0;
  for (const auto& e : n.events) c += e.reason.find(text) != std::string::npos;
  return c;
}

}  // namespace

TEST_CASE("tls (tcp): a wrong secret fails the TLS handshake, counted as rejected, nothing delivered") {
  Pair p("tcp", options_for("a"), options_for("b", "guess"));
  REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected));
  REQUIRE(p.b.wait_event(LinkEvent::Kind::kRejected));
  p.b.t->send("a", update_frame({1.0f}, 1), nullptr);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK_FALSE(p.a.t->link_stats("b").connected);
  CHECK_FALSE(p.b.t->link_stats("a").connected);
  CHECK(p.a.got.empty());
  CHECK(p.a.t->counters().rejected["admission"] >= 1);
  CHECK(p.a.t->counters().connections_admitted == 0);
  std::lock_guard<std::mutex> lock(p.a.mu);
  // Refused in the TLS handshake, before any Hello: the listener never saw a name.
  CHECK(p.a.events.front().reason.find("TLS") != std::string::npos);
  CHECK(p.a.events.front().peer_id.empty());
}

TEST_CASE("tls (tcp): the payload is not on the wire in clear, without TLS it is") {
  // Bytes of a pattern no TLS record would hold by chance, as finite floats.
  const std::string marker = "PLAINTEXT-MARKER-OF-HEARSAY-TEST";
  std::vector<float> values(4096);
  for (size_t i = 0; i < values.size() * sizeof(float); ++i) {
    reinterpret_cast<char*>(values.data())[i] = marker[i % marker.size()];
  }
  for (const bool tls : {true, false}) {
    CAPTURE(tls);
    Node a(create_transport("tcp", with_tls(options_for("a"), tls)));
    Tap tap(a.t->listen("127.0.0.1:0"));
    Node b(create_transport("tcp", with_tls(options_for("b"), tls)));
    b.t->connect("a", tap.address());
    REQUIRE(b.wait_connected("a"));
    b.t->send("a", update_frame(values, 5), nullptr);
    REQUIRE(a.wait_frames(1));
    CHECK(a.got[0].second.payload.size() == values.size() * sizeof(float));
    CHECK(std::memcmp(a.got[0].second.payload.data(), values.data(), values.size() * sizeof(float)) == 0);
    const std::string wire = tap.seen();
    CHECK(wire.size() > values.size() * sizeof(float));
    CHECK((wire.find(marker) != std::string::npos) == !tls);
    CHECK((wire.find("site-b") != std::string::npos) == !tls);  // in b's Hello
  }
}

TEST_CASE("tls (tcp): on and off both round-trip, a peer with TLS and one without fail fast, saying why") {
  for (const bool tls : {true, false}) {
    CAPTURE(tls);
    Pair p("tcp", with_tls(options_for("a"), tls), with_tls(options_for("b"), tls));
    REQUIRE(p.b.wait_connected("a"));
    const std::vector<float> big(786433, 0.25f);
    p.b.t->send("a", update_frame(big, 9), nullptr);
    p.a.t->send("b", update_frame({1.0f, 2.0f}, 10), nullptr);
    REQUIRE(p.a.wait_frames(1));
    REQUIRE(p.b.wait_frames(1));
    CHECK(p.a.got[0].second.payload.size() == big.size() * sizeof(float));
    CHECK(p.b.got[0].second.envelope->update().update_id() == 10);
  }
  for (const bool listener_tls : {true, false}) {
    CAPTURE(listener_tls);
    const auto t0 = std::chrono::steady_clock::now();
    Pair p("tcp", with_tls(options_for("a"), listener_tls), with_tls(options_for("b"), !listener_tls));
    REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected, 1.5));  // well before the 2 s handshake timeout
    REQUIRE(p.b.wait_event(LinkEvent::Kind::kRejected, 1.5));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(1500));
    // The side without TLS recognises a TLS handshake; the side with it says the peer does
    // not speak TLS (or closed the connection).
    Node& plain = listener_tls ? p.b : p.a;
    Node& tls = listener_tls ? p.a : p.b;
    CHECK(reasons_with(plain, "cluster.tls") >= 1);
    CHECK(reasons_with(tls, "TLS") >= 1);
    CHECK(p.a.got.empty());
    CHECK(p.a.t->counters().connections_admitted == 0);
  }
}

TEST_CASE("tcp: unadmitted connections are capped, small and timed out, an honest peer still gets in") {
  auto oa = options_for("a");
  oa.handshake_timeout_s = 1.0;
  Node a(create_transport("tcp", oa));
  const std::string addr = a.t->listen("127.0.0.1:0");
  const long rss0 = test::rss_bytes();
  asio::io_context io;
  std::vector<std::unique_ptr<tcp::socket>> idle;  // connect, then say nothing
  for (int i = 0; i < 200; ++i) {
    idle.push_back(std::make_unique<tcp::socket>(io));
    idle.back()->connect(endpoint_of(addr));
  }
  REQUIRE(a.wait([&] { return a.events.size() >= 200 - 64; }, 5.0));
  const long held = test::rss_bytes() - rss0;
  const auto counters = a.t->counters();
  CHECK(counters.rejected.at("admission") == 200 - 64);
  CHECK(reasons_with(a, "too many unadmitted connections") == 200 - 64);
  // 64 connections in their TLS handshake, each with small buffers (a 4 KiB read buffer,
  // Asio's and OpenSSL's TLS buffers): a few MiB, where a 256 KiB buffer each was 50 MiB.
  MESSAGE("RSS held by 64 unadmitted connections: " << held / 1024 << " KiB");
  if (!test::kSanitized) CHECK(held < 12L * 1024 * 1024);
  // They time out (they sent nothing at all), and an honest peer then gets in. (Waited
  // for: on a loaded machine the 64 timers fire over a while, and the first to fire
  // already lets an honest peer in.)
  CHECK(a.wait([&] {
    size_t timed_out = 0;  // a.mu is held
    for (const auto& e : a.events) timed_out += e.reason.find("within the handshake timeout") != std::string::npos;
    return timed_out == 64;
  }, 10.0));
  Node b(create_transport("tcp", options_for("b")));
  b.t->connect("a", addr);
  REQUIRE(b.wait_connected("a", 6.0));
  CHECK(reasons_with(a, "within the handshake timeout") == 64);
  b.t->send("a", update_frame({7.0f}, 1), nullptr);
  CHECK(a.wait_frames(1));
}

TEST_CASE("tcp: the acceptor and the dialler survive running out of descriptors") {
  Node a(create_transport("tcp", options_for("a")));
  const std::string addr = a.t->listen("127.0.0.1:0");
  Node b(create_transport("tcp", options_for("b")));
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  size_t open_now = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) open_now += !e.path().empty();
  asio::io_context io;
  tcp::socket warm(io);  // the client side's own epoll descriptor, taken now
  rlimit low = old;
  low.rlim_cur = std::min<rlim_t>(old.rlim_cur, open_now + 32);
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::vector<int> fill;
  std::vector<std::unique_ptr<tcp::socket>> clients;
  for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) fill.push_back(fd);
  // Free one descriptor at a time for a client: once the client has it and is connected,
  // the acceptor finds a connection waiting and no descriptor to take it with.
  for (int tries = 0; clients.size() < 3 && !fill.empty() && tries < 30; ++tries) {
    ::close(fill.back());
    fill.pop_back();
    auto s = std::make_unique<tcp::socket>(io);
    asio::error_code ec;
    s->open(tcp::v4(), ec);
    if (!ec) s->connect(endpoint_of(addr), ec);
    if (!ec) clients.push_back(std::move(s));
  }
  b.t->connect("a", addr);  // b's dials fail too, for want of a socket
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const bool exhausted = a.t->counters().rejected.count("accept") == 1;
  for (const int fd : fill) ::close(fd);
  clients.clear();
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(exhausted);
  CHECK(reasons_with(a, "accept: ") == 1);  // said once, however often it retried
  CHECK_FALSE(b.t->link_stats("a").connected);
  // Descriptors are back: the acceptor takes connections again, the dialler gets through.
  REQUIRE(b.wait_connected("a", 5.0));
  REQUIRE(a.wait_connected("b", 5.0));
  b.t->send("a", update_frame({3.0f}, 4), nullptr);
  CHECK(a.wait_frames(1));
}

TEST_CASE("admission: a second proven connection under a name replaces the first for good, names outside the cluster are refused") {
  for (const auto& kind : available_transports()) {
    CAPTURE(kind);
    auto member = [](const std::string& name) {
      auto o = options_for(name);
      o.cluster_peers = {"a", "b"};
      return o;
    };
    Node a(create_transport(kind, member("a")));
    const std::string addr = a.t->listen(test::local_address(kind));
    Node b(create_transport(kind, member("b")));
    b.t->connect("a", addr);
    REQUIRE(b.wait_connected("a"));
    // A restarted b (or anyone holding the secret) proves itself: it takes the name.
    Node b_again(create_transport(kind, member("b")));
    b_again.t->connect("a", addr);
    REQUIRE(b_again.wait_connected("a"));
    REQUIRE(b.wait_event(LinkEvent::Kind::kDown));
    {
      std::lock_guard<std::mutex> lock(b.mu);
      bool told = false;
      for (const auto& e : b.events) told |= e.reason.find("not redialled") != std::string::npos;
      CHECK(told);
    }
    // The displaced b does not dial again (it would take the name back, and b_again then
    // would, forever): 15 of its shortest back-offs later the name has changed hands once.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(a.t->counters().connections_replaced == 1);
    CHECK_FALSE(b.t->link_stats("a").connected);
    CHECK(b_again.t->link_stats("a").connected);
    b_again.t->send("a", update_frame({7.0f}, 1), nullptr);
    REQUIRE(a.wait_frames(1));
    // A name the cluster does not list: refused before anything is signed or delivered.
    Node mallory(create_transport(kind, options_for("mallory")));
    mallory.t->connect("a", addr);
    REQUIRE(a.wait_event(LinkEvent::Kind::kRejected));
    std::lock_guard<std::mutex> lock(a.mu);
    bool named = false;
    for (const auto& e : a.events) named |= e.reason.find("'mallory' is not a peer of cluster") != std::string::npos;
    CHECK(named);
    CHECK(a.got.size() == 1);
  }
}

namespace {

// A P-256 key and a certificate for `name` (subject CN and DNS SAN), signed by `ca`
// (self-signed when null), written as PEM to DIR/FILE.key and DIR/FILE.pem.
struct TestCert {
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
  std::string key_file, cert_file;
  TestCert(const std::string& dir, const std::string& file, const std::string& name, const TestCert* ca) {
    key = EVP_EC_gen("P-256");
    cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), static_cast<long>(std::hash<std::string>{}(file) & 0x7fffffff));
    X509_gmtime_adj(X509_getm_notBefore(cert), -3600);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_set_pubkey(cert, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(cert), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(name.c_str()), -1, -1, 0);
    X509_set_issuer_name(cert, ca != nullptr ? X509_get_subject_name(ca->cert) : X509_get_subject_name(cert));
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, ca != nullptr ? ca->cert : cert, cert, nullptr, nullptr, 0);
    for (const auto& [nid, value] : std::vector<std::pair<int, std::string>>{
             {NID_basic_constraints, ca != nullptr ? "CA:FALSE" : "critical,CA:TRUE"},
             {NID_subject_alt_name, ca != nullptr ? "DNS:" + name : "DNS:ca"}}) {
      X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
      X509_add_ext(cert, e, -1);
      X509_EXTENSION_free(e);
    }
    X509_sign(cert, ca != nullptr ? ca->key : key, EVP_sha256());
    key_file = dir + "/" + file + ".key";
    cert_file = dir + "/" + file + ".pem";
    FILE* k = std::fopen(key_file.c_str(), "w");
    PEM_write_PrivateKey(k, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(k);
    FILE* c = std::fopen(cert_file.c_str(), "w");
    PEM_write_X509(c, cert);
    std::fclose(c);
  }
  ~TestCert() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
};

TransportOptions with_cert(TransportOptions o, const TestCert& mine, const TestCert& ca) {
  o.tls_cert_file = mine.cert_file;
  o.tls_key_file = mine.key_file;
  o.tls_ca_file = ca.cert_file;
  return o;
}

}  // namespace

TEST_CASE("tls (tcp): per-site certificates: verified against the CA, the admitted name checked against the certificate") {
  const std::string dir = (std::filesystem::temp_directory_path() / ("hearsay-certs-" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  const TestCert ca(dir, "ca", "hearsay test CA", nullptr), other_ca(dir, "other-ca", "another CA", nullptr);
  const TestCert a_cert(dir, "a", "a", &ca), b_cert(dir, "b", "b", &ca), c_cert(dir, "c-as-x", "x", &ca),
      stranger(dir, "stranger", "b", &other_ca);
  {
    Pair p("tcp", with_cert(options_for("a"), a_cert, ca), with_cert(options_for("b"), b_cert, ca));
    REQUIRE(p.b.wait_connected("a"));
    p.b.t->send("a", update_frame({1.5f}, 1), nullptr);
    CHECK(p.a.wait_frames(1));
  }
  {
    // c has the secret and a good certificate, but one naming x: not admitted as c.
    Pair p("tcp", with_cert(options_for("a"), a_cert, ca), with_cert(options_for("c"), c_cert, ca));
    REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected));
    CHECK(reasons_with(p.a, "not named in its TLS certificate") >= 1);
    CHECK_FALSE(p.a.t->link_stats("c").connected);
  }
  {
    // A certificate from another CA fails the handshake.
    Pair p("tcp", with_cert(options_for("a"), a_cert, ca), with_cert(options_for("b"), stranger, other_ca));
    REQUIRE(p.a.wait_event(LinkEvent::Kind::kRejected));
    CHECK(reasons_with(p.a, "TLS") >= 1);
    CHECK(p.a.t->counters().connections_admitted == 0);
  }
  auto half = options_for("a");
  half.tls_cert_file = a_cert.cert_file;
  CHECK_THROWS_WITH_AS(create_transport("tcp", half), doctest::Contains("all three"), InputError);
  std::filesystem::remove_all(dir);
}
