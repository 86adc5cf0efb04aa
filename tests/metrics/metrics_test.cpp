// The /metrics board and server (src/metrics): what a scrape returns, in Prometheus's text
// format, and how the server answers what is not a scrape.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "hearsay/error.h"
#include "hearsay/metrics.h"

using namespace hearsay;

namespace {

// A connection to 127.0.0.1:port (test client only).
int dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  return fd;
}

// One HTTP request to 127.0.0.1:port, the whole answer back (test client only).
std::string http(int port, const std::string& request) {
  const int fd = dial(port);
  REQUIRE(write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// The status code of an HTTP answer's first line ("HTTP/1.x 200 OK" -> 200); 0 if none.
int status(const std::string& answer) {
  if (answer.rfind("HTTP/1.", 0) != 0 || answer.size() < 12) return 0;
  return std::stoi(answer.substr(9, 3));
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("metrics board: steps, loss and the gossip figures come out in the exposition format, each family once") {
  MetricsBoard board(std::map<std::string, std::string>{{"peer", "eu-0"}, {"cluster", "c\"1"}});
  const std::string before = board.render();
  CHECK(before.find("hearsay_steps_total 0\n") != std::string::npos);
  CHECK(before.find("hearsay_test_accuracy_ratio") == std::string::npos);  // no evaluation yet
  CHECK(before.find("hearsay_link_sent_bytes_total") == std::string::npos);  // no gossip yet
  CHECK(before.find("hearsay_info{cluster=\"c\\\"1\",peer=\"eu-0\"} 1\n") != std::string::npos);

  board.on_step(7, 0.25, 32);
  board.on_step(8, 0.5, 32);
  board.on_eval(0.875, 0.4);
  MetricsBoard::Gossip g;
  g.links.push_back({.neighbour = "us-1", .connected = true, .bytes_sent = 1200, .bytes_received = 800, .queue_frames = 2,
                     .queue_bytes = 90, .rtt_s = 0.04});
  g.links.push_back({.neighbour = "eu-1", .connected = false});
  g.bytes_sent_by_kind = {{"gradient", 1000}, {"model", 200}};
  g.refused = {{"norm", 3}};
  g.quarantined = 1;
  for (int64_t tau : {0, 1, 3, 3, 300}) g.staleness.add(tau);
  CHECK(board.offer_gossip(g));
  const std::string m = board.render();
  CHECK(m.find("hearsay_steps_total 8\n") != std::string::npos);
  CHECK(m.find("hearsay_samples_total 64\n") != std::string::npos);
  CHECK(m.find("hearsay_train_loss 0.5\n") != std::string::npos);
  CHECK(m.find("hearsay_test_accuracy_ratio 0.875\n") != std::string::npos);
  CHECK(m.find("hearsay_connections 1\n") != std::string::npos);
  CHECK(m.find("hearsay_link_sent_bytes_total{neighbour=\"us-1\"} 1200\n") != std::string::npos);
  CHECK(m.find("hearsay_link_connected{neighbour=\"eu-1\"} 0\n") != std::string::npos);
  CHECK(m.find("hearsay_link_rtt_seconds{neighbour=\"us-1\"} 0.040000000000000001\n") != std::string::npos);
  CHECK(m.find("hearsay_link_rtt_seconds{neighbour=\"eu-1\"}") == std::string::npos);  // unknown: left out
  CHECK(m.find("hearsay_sent_bytes_total{kind=\"gradient\"} 1000\n") != std::string::npos);
  CHECK(m.find("hearsay_updates_refused_total{reason=\"norm\"} 3\n") != std::string::npos);
  // The histogram's buckets are cumulative, +Inf holds everything, with its sum and count.
  CHECK(m.find("hearsay_staleness_steps_bucket{le=\"0\"} 1\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_bucket{le=\"2\"} 2\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_bucket{le=\"4\"} 4\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_bucket{le=\"256\"} 4\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_bucket{le=\"+Inf\"} 5\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_sum 307\n") != std::string::npos);
  CHECK(m.find("hearsay_staleness_steps_count 5\n") != std::string::npos);
  CHECK(count(m, "# TYPE hearsay_link_sent_bytes_total counter\n") == 1);
  CHECK(count(m, "# TYPE hearsay_staleness_steps histogram\n") == 1);
  CHECK(m.back() == '\n');
}

TEST_CASE("metrics board: memory by owner and where, and compute utilisation, once offered") {
  MetricsBoard board(std::map<std::string, std::string>{{"peer", "eu-0"}});
  const std::string before = board.render();
  CHECK(before.find("hearsay_memory_bytes") == std::string::npos);  // nothing measured yet
  CHECK(before.find("hearsay_compute_utilisation_ratio") == std::string::npos);
  MemoryUse m;
  m.host = {{"model", 800}, {"outboxes", 400}};
  m.device = {{"optimizer", 1600}};
  CHECK(board.offer_memory(m));
  board.on_compute(0.875);
  const std::string after = board.render();
  CHECK(after.find("hearsay_memory_bytes{owner=\"model\",where=\"host\"} 800\n") != std::string::npos);
  CHECK(after.find("hearsay_memory_bytes{owner=\"outboxes\",where=\"host\"} 400\n") != std::string::npos);
  CHECK(after.find("hearsay_memory_bytes{owner=\"optimizer\",where=\"device\"} 1600\n") != std::string::npos);
  CHECK(count(after, "# TYPE hearsay_memory_bytes gauge\n") == 1);
  CHECK(after.find("hearsay_compute_utilisation_ratio 0.875\n") != std::string::npos);
}

TEST_CASE("metrics board: a refusal's text never becomes a label value, each renders under one of a fixed set") {
  MetricsBoard board(std::map<std::string, std::string>{{"peer", "p"}});
  MetricsBoard::Gossip g;
  // Whatever the keys say (the guard counts by kind already; the board holds to it anyway).
  g.refused = {{"norm", 2},
               {"norm: 3.2e+06 is 1e+06 times this peer's model (3.2); the bound is 10 times", 1},
               {"segments: segment 7 does not follow the one before it", 1},
               {"segment 9 does not follow the one before it", 4},
               {"codec id 77: unknown", 1},
               {"codec fp16: payload of 3 bytes for 8 elements; expected 16", 1},
               {"x\"} 1\nhearsay_evil{a=\"", 5}};
  REQUIRE(board.offer_gossip(g));
  const std::string m = board.render();
  CHECK(m.find("hearsay_updates_refused_total{reason=\"norm\"} 3\n") != std::string::npos);
  CHECK(m.find("hearsay_updates_refused_total{reason=\"segments\"} 1\n") != std::string::npos);
  CHECK(m.find("hearsay_updates_refused_total{reason=\"codec\"} 2\n") != std::string::npos);
  CHECK(m.find("hearsay_updates_refused_total{reason=\"other\"} 9\n") != std::string::npos);
  CHECK(m.find("hearsay_evil") == std::string::npos);
  const std::string prefix = "hearsay_updates_refused_total{reason=\"";
  size_t samples = 0;
  for (size_t at = m.find(prefix); at != std::string::npos; at = m.find(prefix, at + 1), ++samples) {
    const size_t from = at + prefix.size();
    const std::string value = m.substr(from, m.find('"', from) - from);
    CHECK_MESSAGE(std::find(kRefusalReasons.begin(), kRefusalReasons.end(), value) != kRefusalReasons.end(), value);
  }
  CHECK(samples == 4);
  // Every kind the guard's callers produce, and the unforeseen.
  CHECK(refusal_reason("non-finite: element 17 is NaN of segment 0") == "non-finite");
  CHECK(refusal_reason("synchronous: already holding 9 messages over 3 rounds from this peer") == "synchronous");
  CHECK(refusal_reason("backlog: already holding 4 model deltas from this peer (at most 4)") == "backlog");
  CHECK(refusal_reason("codec: the receiver's scale is not finite") == "codec");
  CHECK(refusal_reason("normal: looks like norm") == "other");
  CHECK(refusal_reason("") == "other");
}

TEST_CASE("metrics server: GET /metrics is the board, other paths 404, other methods 405") {
  MetricsBoard board(std::map<std::string, std::string>{{"peer", "p"}});
  board.on_step(3, 1.5, 8);
  MetricsServer server("127.0.0.1:0", [&] { return board.render(); }, "peer p: --metrics");
  REQUIRE(server.port() > 0);
  const std::string ok = http(server.port(), "GET /metrics HTTP/1.0\r\n\r\n");
  CHECK(status(ok) == 200);
  CHECK(ok.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(ok.find("hearsay_steps_total 3\n") != std::string::npos);
  CHECK(status(http(server.port(), "GET /other HTTP/1.0\r\n\r\n")) == 404);
  const std::string post = http(server.port(), "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  CHECK(status(post) == 405);
  CHECK(post.find("Allow: GET, HEAD") != std::string::npos);
  // Garbage instead of a request gets an error status, and the server still serves.
  CHECK(status(http(server.port(), "\x01\x02 nonsense\r\n\r\n")) != 200);
  CHECK(http(server.port(), "GET /metrics HTTP/1.0\r\n\r\n").find("hearsay_steps_total 3\n") != std::string::npos);
}

TEST_CASE("metrics server: a body is never waited for, and a client trickling its headers is closed at the deadline") {
  MetricsServer server("127.0.0.1:0", [] { return std::string("hearsay_steps_total 1\n"); }, "peer p: --metrics");
  // Each answered as soon as the headers are in, the body (short of its length, or endless) never read.
  CHECK(status(http(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 10\r\n\r\nab")) == 400);
  CHECK(status(http(server.port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n")) == 405);
  CHECK(status(http(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")) == 400);
  CHECK(status(http(server.port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")) == 400);
  // A header byte every 200 ms would reset an idle timeout forever; the deadline (2 s
  // from accept) closes the connection all the same.
  const int fd = dial(server.port());
  const std::string start = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  REQUIRE(write(fd, start.data(), start.size()) == static_cast<ssize_t>(start.size()));
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double closed_after = -1;
  while (closed_after < 0 && elapsed() < 6) {
    pollfd p{fd, POLLIN, 0};
    char c;
    if (poll(&p, 1, 200) > 0) {
      if (read(fd, &c, 1) <= 0) closed_after = elapsed();
    } else if (send(fd, "a", 1, MSG_NOSIGNAL) < 0) {
      closed_after = elapsed();
    }
  }
  close(fd);
  CHECK(closed_after > 1.5);
  CHECK(closed_after < 3.0);
  CHECK(status(http(server.port(), "GET /metrics HTTP/1.0\r\n\r\n")) == 200);
}

TEST_CASE("metrics server: a port in use or an address not this host's is refused naming the peer and the address") {
  MetricsServer first("127.0.0.1:0", [] { return std::string(); }, "peer a: --metrics");
  const std::string taken = "127.0.0.1:" + std::to_string(first.port());
  try {
    MetricsServer second(taken, [] { return std::string(); }, "peer b: --metrics");
    FAIL("a second server on a port in use started");
  } catch (const InputError& e) {
    const std::string what = e.what();
    CHECK(what.find("peer b: --metrics") != std::string::npos);
    CHECK(what.find(taken) != std::string::npos);
  }
  CHECK_THROWS_WITH_AS(MetricsServer("192.0.2.1:0", [] { return std::string(); }, "peer c: --metrics"),
                       doctest::Contains("peer c: --metrics: cannot serve metrics at '192.0.2.1:0'"), InputError);
  CHECK_THROWS_WITH_AS(MetricsServer("no-such-host.invalid:9", [] { return std::string(); }, "peer d: --metrics"),
                       doctest::Contains("peer d: --metrics: cannot resolve 'no-such-host.invalid:9'"), InputError);
  CHECK_THROWS_AS(MetricsServer("no port", [] { return std::string(); }, "peer e: --metrics"), InputError);
}
