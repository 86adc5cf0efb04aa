// The transport suite: streaming throughput and ping-pong for each built transport on
// loopback, beside the machine's own tools measured in the same run (iperf3 for TCP,
// fi_pingpong for libfabric providers). Rows: "tcp" is plain TCP (tls off), "tls" is the
// tcp transport with TLS (its default), measured at 1 and 16 MiB in rounds alternating
// with plain tcp, so their ratio comes from the same moments of the same run.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hearsay/wire.pb.h"
#include "bench_util.h"
#include "hearsay/command_line.h"
#include "hearsay/error.h"
#include "hearsay/transport.h"

namespace hearsay::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<size_t> sizes{4096, 65536, 1 << 20, 16 << 20};
  std::vector<std::string> transports;
  double seconds = 1.0;
  int rounds = 3;
  bool tools = true;
};

std::string size_name(size_t s) {
  if (s >= (1 << 20)) return std::to_string(s >> 20) + "MiB";
  if (s >= 1024) return std::to_string(s >> 10) + "KiB";
  return std::to_string(s) + "B";
}

// `row`: a transport kind, "tcp" meaning plain TCP, or "tls" (tcp with TLS).
TransportOptions options_for(const std::string& peer, const std::string& row) {
  TransportOptions o;
  o.tls = row == "tls";
  o.peer_id = peer;
  o.cluster_id = "bench";
  o.secret = "bench-secret";
  o.heartbeat_interval_s = 1.0;
  o.limits.max_payload_bytes = 64u << 20;
  return o;
}

OutFrame frame_of(const std::shared_ptr<std::vector<uint8_t>>& payload) {
  wire::Envelope e;
  auto* u = e.mutable_update();
  u->set_tensor_length(payload->size() / 4);
  u->set_segment_length(payload->size() / 4);
  return make_frame(e, payload->data(), payload->size(), payload);
}

// A connected pair: b sends to a; a may echo back.
//
// Everything the transports' threads touch (the receivers, the send callbacks) lives here,
// not on a function's stack, and is declared before the transports, so it outlives their
// threads: a send callback that ran after stream() had returned once decremented a dead
// stack slot, by then part of pingpong's condition-variable wait, and hearsay-bench died
// with SIGSEGV in pthread_cond_clockwait.
struct Pair {
  std::mutex mu;
  std::condition_variable cv;
  size_t in_flight = 0;  // sends not yet completed; GUARDED_BY(mu)
  std::atomic<uint64_t> a_bytes{0}, a_frames{0}, b_frames{0};
  std::atomic<bool> echo{false};
  std::shared_ptr<std::vector<uint8_t>> echo_payload;  // GUARDED_BY(mu)
  std::unique_ptr<Transport> a, b;

  // Wakes a waiter on cv; taking the mutex first means a waiter between testing its
  // predicate and sleeping cannot miss it.
  void wake() {
    { std::lock_guard<std::mutex> lock(mu); }
    cv.notify_all();
  }

  explicit Pair(const std::string& row) {
    const std::string kind = row == "tls" ? "tcp" : row;
    a = create_transport(kind, options_for("a", row));
    b = create_transport(kind, options_for("b", row));
    a->set_receiver([this](const std::string&, InFrame&& f) {
      a_bytes += f.payload.size();
      ++a_frames;
      if (echo) {
        std::shared_ptr<std::vector<uint8_t>> payload;
        {
          std::lock_guard<std::mutex> lock(mu);
          payload = echo_payload;
        }
        a->send("b", frame_of(payload), nullptr);
      }
      wake();
    });
    b->set_receiver([this](const std::string&, InFrame&&) {
      ++b_frames;
      wake();
    });
    b->connect("a", a->listen("127.0.0.1:0"));
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!(b->link_stats("a").connected && a->link_stats("b").connected)) {
      if (Clock::now() > deadline) throw InputError("transport bench: " + kind + " did not connect on loopback");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // close() fails what is still queued, so every send callback has run when it returns.
  ~Pair() {
    b->close();
    a->close();
  }
};

// Bytes per second received while b streams `size`-byte frames at a for ~seconds.
double stream(Pair& p, size_t size, double seconds) {
  auto payload = std::make_shared<std::vector<uint8_t>>(size, 7);
  const size_t window = std::max<size_t>(2, std::min<size_t>(256, (32u << 20) / size));
  p.echo = false;
  const uint64_t start_bytes = p.a_bytes;
  const auto t0 = Clock::now();
  const auto end = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  uint64_t sent = 0;
  while (Clock::now() < end) {
    {
      // Sleep, not spin, while the window is full: on two cores a spinning sender steals
      // the CPU the transports need.
      std::unique_lock<std::mutex> lock(p.mu);
      p.cv.wait_until(lock, end, [&] { return p.in_flight < window; });
      if (p.in_flight >= window) break;
      ++p.in_flight;
    }
    Pair* pair = &p;  // the callback may run on a transport thread after this returns
    p.b->send("a", frame_of(payload), [pair](const SendStatus&) {
      std::lock_guard<std::mutex> lock(pair->mu);
      --pair->in_flight;
      pair->cv.notify_all();
    });
    ++sent;
  }
  // Wait for what was sent to arrive.
  const uint64_t want = start_bytes + sent * size;
  std::unique_lock<std::mutex> lock(p.mu);
  p.cv.wait_for(lock, std::chrono::seconds(30), [&] { return p.a_bytes >= want; });
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!p.cv.wait_for(lock, std::chrono::seconds(30), [&] { return p.in_flight == 0; })) {
    throw std::runtime_error("transport bench: " + std::to_string(p.in_flight) + " sends of " + size_name(size) +
                     " still incomplete 30 s after the stream ended");
  }
  return static_cast<double>(p.a_bytes - start_bytes) / elapsed;
}

// Round trips of `size` bytes each way; returns seconds per round trip (median of rounds).
double pingpong(Pair& p, size_t size, int iters) {
  auto payload = std::make_shared<std::vector<uint8_t>>(size, 3);
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.echo_payload = payload;
  }
  p.echo = true;
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const uint64_t before = p.b_frames;
    const auto t0 = Clock::now();
    p.b->send("a", frame_of(payload), nullptr);
    std::unique_lock<std::mutex> lock(p.mu);
    if (!p.cv.wait_for(lock, std::chrono::seconds(10), [&] { return p.b_frames > before; })) break;
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  p.echo = false;
  return median(times);
}

std::string run_command(const std::string& cmd) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  pclose(f);
  return out;
}

// iperf3 on loopback, bits per second; < 0 if unavailable.
double iperf3_bps(double seconds, int port) {
  if (run_command("command -v iperf3").empty()) return -1;
  const std::string server = "iperf3 -s -1 -p " + std::to_string(port) + " >/dev/null 2>&1 &";
  if (std::system(server.c_str()) != 0) return -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const std::string out = run_command("iperf3 -c 127.0.0.1 -p " + std::to_string(port) + " -t " +
                                      std::to_string(std::max(1, static_cast<int>(seconds + 0.5))) + " -J");
  const auto end = out.find("\"sum_received\"");
  if (end == std::string::npos) return -1;
  const auto bps = out.find("\"bits_per_second\":", end);
  return bps == std::string::npos ? -1 : std::atof(out.c_str() + bps + 18);
}

// fi_pingpong between two processes on this machine: MB/s as it prints it (bytes / s /
// 1e6) and microseconds per transfer; < 0 if unavailable.
std::pair<double, double> fi_pingpong(const std::string& provider, size_t size, int iters, int port) {
  if (run_command("command -v fi_pingpong").empty()) return {-1, -1};
  // IP providers are pinned to the loopback domain, as hearsay's own endpoints are.
  const std::string common = "fi_pingpong -p '" + provider + "' -e rdm -S " + std::to_string(size) + " -I " +
                             std::to_string(iters) + (provider.find("tcp") != std::string::npos ? " -d lo" : "");
  const std::string p = std::to_string(port);
  if (std::system(("timeout 60 " + common + " -B " + p + " >/dev/null 2>&1 &").c_str()) != 0) return {-1, -1};
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  const std::string out = run_command("timeout 60 " + common + " -P " + p + " 127.0.0.1");
  // The last line: bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
  std::istringstream lines(out);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (!line.empty() && std::isdigit(static_cast<unsigned char>(line[0]))) last = line;
  }
  std::istringstream f(last);
  std::string bytes, sent, ack, total, time;
  double mbps = -1, usec = -1;
  f >> bytes >> sent >> ack >> total >> time >> mbps >> usec;
  return {mbps, usec};
}

}  // namespace

int run_transport_bench(int argc, char** argv) {
  Options o;
  o.transports = available_transports();
  o.transports.erase(std::remove(o.transports.begin(), o.transports.end(), "inproc"), o.transports.end());
  o.transports.insert(o.transports.begin() + 1, "tls");
  CommandLine("transport bench")
      .size_list("--sizes", &o.sizes, 1, size_t{1} << 30, "a list of message sizes in bytes")
      .text_list("--transports", &o.transports, "a list of transports")
      .number("--seconds", &o.seconds, 1e-3, 3600, "a number of seconds")
      .integer("--rounds", &o.rounds, 1, 1000, "a number of rounds")
      .flag({"--no-tools"}, [&o] { o.tools = false; })
      .parse(argc, argv, 0);
  int port = 26000 + static_cast<int>(getpid() % 2000);
  for (const auto& kind : o.transports) {
    Pair p(kind);
    if (kind == "tls") {
      // Paired rounds: plain tcp, then TLS, per round; the ratio is the median of the
      // rounds' ratios.
      Pair plain("tcp");
      for (size_t size : {size_t{1} << 20, size_t{16} << 20}) {
        std::vector<double> tls, tcp, ratio;
        for (int r = 0; r < o.rounds; ++r) {
          tcp.push_back(stream(plain, size, o.seconds) * 8 / 1e9);
          tls.push_back(stream(p, size, o.seconds) * 8 / 1e9);
          ratio.push_back(tls.back() / tcp.back());
        }
        JsonObject extra;
        extra.add("rounds", o.rounds).add("seconds", o.seconds).add("tcp_gbps", median(tcp));
        emit("transport", "tls/" + size_name(size), "stream_gbps", median(tls), "Gbit/s", &extra);
        emit("transport", "tls/" + size_name(size), "fraction_of_tcp", median(ratio), "ratio");
      }
      emit("transport", "tls/64B", "rtt_us", pingpong(p, 64, 2000) * 1e6, "us");
      continue;
    }
    for (size_t size : o.sizes) {
      const std::string c = kind + "/" + size_name(size);
      std::vector<double> ours, tool;
      for (int r = 0; r < o.rounds; ++r) {
        ours.push_back(stream(p, size, o.seconds) * 8 / 1e9);
        if (o.tools && kind == "tcp" && size >= (1 << 20)) tool.push_back(iperf3_bps(o.seconds, ++port) / 1e9);
      }
      JsonObject extra;
      extra.add("rounds", o.rounds).add("seconds", o.seconds);
      emit("transport", c, "stream_gbps", median(ours), "Gbit/s", &extra);
      if (!tool.empty() && median(tool) > 0) {
        emit("transport", "iperf3/loopback", "stream_gbps", median(tool), "Gbit/s");
        emit("transport", c, "fraction_of_iperf3", median(ours) / median(tool), "ratio");
      }
    }
    // Small-message latency and the 1 MiB ping-pong fi_pingpong measures.
    const double rtt = pingpong(p, 64, 2000);
    emit("transport", kind + "/64B", "rtt_us", rtt * 1e6, "us");
    const size_t big = 1 << 20;
    std::vector<double> ours, tool;
    for (int r = 0; r < o.rounds; ++r) {
      ours.push_back(2.0 * big / pingpong(p, big, 200) / 1e6);
      if (o.tools && kind.rfind("fabric:", 0) == 0) tool.push_back(fi_pingpong(kind.substr(7), big, 200, ++port).first);
    }
    emit("transport", kind + "/1MiB", "pingpong_MBps", median(ours), "MB/s");
    if (!tool.empty() && median(tool) > 0) {
      emit("transport", "fi_pingpong:" + kind.substr(7) + "/1MiB", "pingpong_MBps", median(tool), "MB/s");
      emit("transport", kind + "/1MiB", "fraction_of_fi_pingpong", median(ours) / median(tool), "ratio");
    }
  }
  return 0;
}

}  // namespace hearsay::bench
