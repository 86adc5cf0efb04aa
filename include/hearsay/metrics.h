// Live metrics of a running peer in Prometheus's text exposition format (docs/OPERATIONS.md,
// "Metrics"): a board that the peer's step loop and its gossip engine fill, and a small
// HTTP server (libmicrohttpd) that serves the board at /metrics.
//
// The step loop never waits on a scrape: its per-step figures are atomics, and the gossip
// figures are handed over with try_lock at the engine's log points (a scrape that is
// copying them at that moment gets them at the next point instead).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace hearsay {

// Staleness buckets (upper bounds, in steps) of hearsay_staleness_steps; +Inf after them.
inline constexpr std::array<int64_t, 10> kStalenessBuckets = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};

// A cumulative histogram of staleness (steps) of everything the mixer weighed.
struct StalenessHistogram {
  std::array<uint64_t, kStalenessBuckets.size() + 1> counts{};  // per bucket, not cumulative; last: +Inf
  uint64_t count = 0;
  double sum = 0;
  // Inline: the mixer records into it on every update, also in programs without src/metrics.
  void add(int64_t tau) {
    size_t b = 0;
    while (b < kStalenessBuckets.size() && tau > kStalenessBuckets[b]) ++b;
    ++counts[b];
    ++count;
    sum += static_cast<double>(tau);
  }
};

// The values of hearsay_updates_refused_total's reason label, and the keys of the log's
// `refused`: a fixed set. A refusal's text is "kind: details", and its details come off the
// wire (indices, sizes, a codec id), so a label made of the text would be a new series per
// bad update. Inline: the update guard counts by it, also in programs without src/metrics.
inline constexpr std::array<std::string_view, 7> kRefusalReasons = {
    "backlog", "codec", "non-finite", "norm", "segments", "synchronous", "other"};

// The kind of a refusal's text, always one of kRefusalReasons: the text before its first
// ':' ("codec" for every "codec NAME: ..."), or "other" for anything unforeseen.
inline std::string_view refusal_reason(std::string_view why) {
  std::string_view kind = why.substr(0, why.find(':'));
  if (kind.starts_with("codec ")) kind = "codec";
  for (const std::string_view k : kRefusalReasons) {
    if (k == kind) return k;
  }
  return "other";
}

// What a peer holds, by owner and by where it lives (docs/LOGS.md, the `memory` event):
// bytes of host memory and of the device's (a GPU peer's model, gradient, optimizer state
// and activations).
struct MemoryUse {
  std::map<std::string, uint64_t> host, device;
  uint64_t total() const {
    uint64_t t = 0;
    for (const auto* side : {&host, &device}) {
      for (const auto& [owner, bytes] : *side) t += bytes;
    }
    return t;
  }
};

class MetricsBoard {
 public:
  // `labels`: constant labels of hearsay_info (peer, cluster, algorithm, transport, device).
  explicit MetricsBoard(std::map<std::string, std::string> labels);

  // From the step loop, every step: lock-free.
  void on_step(int64_t steps, double loss, int64_t batch_size);
  // After each evaluation: lock-free.
  void on_eval(double accuracy, double loss);
  // The peer's compute utilisation so far (docs/LOGS.md), at its log points: lock-free.
  void on_compute(double utilisation) { utilisation_ = utilisation; }

  // What the gossip engine knows at its log points.
  struct Link {
    std::string neighbour;
    bool connected = false;
    uint64_t bytes_sent = 0, bytes_received = 0, queue_frames = 0, queue_bytes = 0;
    double rtt_s = -1;  // < 0: unknown
  };
  struct Gossip {
    std::vector<Link> links;
    std::map<std::string, uint64_t> bytes_sent_by_kind;  // gradient, model, model_delta, push_sum
    uint64_t applied = 0, dropped = 0, coalesced = 0;    // totals so far
    uint64_t rejected = 0;
    std::map<std::string, uint64_t> refused;  // by reason (rendered under refusal_reason() of each)
    uint64_t quarantined = 0;
    uint64_t buffered_bytes = 0;
    StalenessHistogram staleness;
  };
  // Never waits: returns false (and drops this copy) while a scrape is reading the last one.
  bool offer_gossip(Gossip g);
  // What the peer holds, by owner (its memory events); the same never-waiting rule.
  bool offer_memory(const MemoryUse& m);

  // The whole board in the text exposition format 0.0.4 (one scrape).
  std::string render() const;

 private:
  std::map<std::string, std::string> labels_;
  std::atomic<int64_t> steps_{0}, samples_{0};
  std::atomic<double> loss_{0}, steps_per_s_{0};
  std::atomic<double> test_acc_{-1}, test_loss_{-1};
  std::atomic<int64_t> evals_{0};
  std::atomic<double> utilisation_{-1};
  // The step rate over windows of at least a second (step loop only).
  double window_start_s_ = -1;
  int64_t window_start_steps_ = 0;
  mutable std::mutex gossip_mu_;
  Gossip gossip_;  // GUARDED_BY(gossip_mu_)
  bool has_gossip_ = false;
  mutable std::mutex memory_mu_;
  MemoryUse memory_;  // GUARDED_BY(memory_mu_)
};

// Serves render() at http://ADDRESS/metrics on its own thread (HEAD too; any other path
// 404, any other method 405, a request with a body or two Content-Lengths 400, each answered
// as soon as its headers are in, without reading a body). One request per connection; at
// most 256 connections at once (128 from one address), each closed 2 s after it was
// accepted however slowly it sends (docs/OPERATIONS.md, "Metrics").
class MetricsServer {
 public:
  // `address`: HOST:PORT ([v6]:PORT; port 0 picks one). Throws InputError naming `what`
  // (e.g. "peer eu-0: --metrics") and the address when it cannot listen there.
  MetricsServer(const std::string& address, std::function<std::string()> render, const std::string& what);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;
  int port() const { return port_; }

 private:
  struct Daemon;
  std::function<std::string()> render_;
  std::unique_ptr<Daemon> daemon_;
  int port_ = 0;
};

// This process's resident memory in bytes (from /proc/self/statm); 0 where unknown.
uint64_t resident_memory_bytes();

}  // namespace hearsay
