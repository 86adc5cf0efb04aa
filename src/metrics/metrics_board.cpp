// The board behind /metrics (include/hearsay/metrics.h): names and types follow
// Prometheus's conventions (a hearsay_ prefix, base units, _total on counters, _bytes and
// _seconds suffixes), one HELP and TYPE line per family.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string_view>
#include <unistd.h>

#include "hearsay/metrics.h"

namespace hearsay {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// A label value escaped as the exposition format asks: backslash, double quote, newline.
std::string escape_label(const std::string& v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string number(uint64_t v) { return std::to_string(v); }

class Text {
 public:
  void family(const char* name, const char* type, const char* help) {
    out_ += "# HELP ";
    out_ += name;
    out_ += ' ';
    out_ += help;
    out_ += "\n# TYPE ";
    out_ += name;
    out_ += ' ';
    out_ += type;
    out_ += '\n';
  }
  void sample(const std::string& name, const std::string& labels, const std::string& value) {
    out_ += name;
    if (!labels.empty()) out_ += "{" + labels + "}";
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  // A family of one sample without labels.
  void scalar(const char* name, const char* type, const char* help, const std::string& value) {
    family(name, type, help);
    sample(name, "", value);
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

std::string label(const char* key, const std::string& value) { return std::string(key) + "=\"" + escape_label(value) + "\""; }

}  // namespace

MetricsBoard::MetricsBoard(std::map<std::string, std::string> labels) : labels_(std::move(labels)) {}

void MetricsBoard::on_step(int64_t steps, double loss, int64_t batch_size) {
  steps_.store(steps, std::memory_order_relaxed);
  samples_.fetch_add(batch_size, std::memory_order_relaxed);
  loss_.store(loss, std::memory_order_relaxed);
  const double t = now_s();
  if (window_start_s_ < 0) {
    window_start_s_ = t;
    window_start_steps_ = steps;
  } else if (t - window_start_s_ >= 1.0) {
    steps_per_s_.store(static_cast<double>(steps - window_start_steps_) / (t - window_start_s_), std::memory_order_relaxed);
    window_start_s_ = t;
    window_start_steps_ = steps;
  }
}

void MetricsBoard::on_eval(double accuracy, double loss) {
  test_acc_.store(accuracy, std::memory_order_relaxed);
  test_loss_.store(loss, std::memory_order_relaxed);
  evals_.fetch_add(1, std::memory_order_relaxed);
}

bool MetricsBoard::offer_gossip(Gossip g) {
  std::unique_lock<std::mutex> lock(gossip_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  gossip_ = std::move(g);
  has_gossip_ = true;
  return true;
}

bool MetricsBoard::offer_memory(const MemoryUse& m) {
  std::unique_lock<std::mutex> lock(memory_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  memory_ = m;
  return true;
}

std::string MetricsBoard::render() const {
  Gossip g;
  bool has_gossip = false;
  {
    std::lock_guard<std::mutex> lock(gossip_mu_);
    if (has_gossip_) g = gossip_;
    has_gossip = has_gossip_;
  }
  Text t;
  std::string info;
  for (const auto& [k, v] : labels_) {
    // Appended in two steps: GCC 12 warns (-Wrestrict, a false positive) on "," + label().
    if (!info.empty()) info += ',';
    info += label(k.c_str(), v);
  }
  t.family("hearsay_info", "gauge", "What this peer is: its name, cluster, algorithm, transport and device.");
  t.sample("hearsay_info", info, "1");
  t.scalar("hearsay_steps_total", "counter", "Training steps taken.", number(static_cast<uint64_t>(steps_.load())));
  t.scalar("hearsay_samples_total", "counter", "Training samples consumed.", number(static_cast<uint64_t>(samples_.load())));
  t.scalar("hearsay_steps_per_second", "gauge", "Steps per second over the last window of at least a second.", number(steps_per_s_.load()));
  t.scalar("hearsay_train_loss", "gauge", "Loss of the last training step.", number(loss_.load()));
  if (evals_.load() > 0) {
    t.scalar("hearsay_test_accuracy_ratio", "gauge", "Test accuracy of the last evaluation, 0 to 1.", number(test_acc_.load()));
    t.scalar("hearsay_test_loss", "gauge", "Test loss of the last evaluation.", number(test_loss_.load()));
  }
  if (utilisation_.load() >= 0) {
    t.scalar("hearsay_compute_utilisation_ratio", "gauge",
             "The share of training time in the peer's own forward, backward and optimizer passes, 0 to 1.",
             number(utilisation_.load()));
  }
  t.scalar("hearsay_evaluations_total", "counter", "Evaluations on the test set.", number(static_cast<uint64_t>(evals_.load())));
  t.scalar("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", number(resident_memory_bytes()));
  MemoryUse memory;
  {
    std::lock_guard<std::mutex> lock(memory_mu_);
    memory = memory_;
  }
  if (memory.total() > 0) {
    t.family("hearsay_memory_bytes", "gauge", "Bytes this peer holds, by owner and where (host or device): its memory events.");
    for (const auto& [where, side] : {std::pair{"host", &memory.host}, std::pair{"device", &memory.device}}) {
      for (const auto& [owner, bytes] : *side) {
        t.sample("hearsay_memory_bytes", label("owner", owner) + "," + label("where", where), number(bytes));
      }
    }
  }
  if (!has_gossip) return t.take();

  uint64_t connected = 0;
  for (const auto& l : g.links) connected += l.connected ? 1 : 0;
  t.scalar("hearsay_connections", "gauge", "Neighbours connected now.", number(connected));
  // One family per link figure, a sample per neighbour (left out where `value` says "").
  auto per_link = [&](const char* name, const char* type, const char* help,
                      const std::function<std::string(const Link&)>& value) {
    t.family(name, type, help);
    for (const auto& l : g.links) {
      if (std::string v = value(l); !v.empty()) t.sample(name, label("neighbour", l.neighbour), v);
    }
  };
  per_link("hearsay_link_connected", "gauge", "Whether the link to a neighbour is up (1) or not (0).",
           [](const Link& l) { return std::string(l.connected ? "1" : "0"); });
  per_link("hearsay_link_sent_bytes_total", "counter", "Bytes sent to a neighbour (frames, headers included).",
           [](const Link& l) { return number(l.bytes_sent); });
  per_link("hearsay_link_received_bytes_total", "counter", "Bytes received from a neighbour.",
           [](const Link& l) { return number(l.bytes_received); });
  per_link("hearsay_link_queue_frames", "gauge", "Frames queued for a neighbour and not yet on the wire.",
           [](const Link& l) { return number(l.queue_frames); });
  per_link("hearsay_link_queue_bytes", "gauge", "Bytes queued for a neighbour and not yet on the wire.",
           [](const Link& l) { return number(l.queue_bytes); });
  per_link("hearsay_link_rtt_seconds", "gauge", "Smoothed heartbeat round trip to a neighbour (links where it is known).",
           [](const Link& l) { return l.rtt_s >= 0 ? number(l.rtt_s) : std::string(); });
  t.family("hearsay_sent_bytes_total", "counter", "Bytes of updates put on the wire, by what they carry.");
  for (const auto& [kind, bytes] : g.bytes_sent_by_kind) t.sample("hearsay_sent_bytes_total", label("kind", kind), number(bytes));
  t.scalar("hearsay_updates_applied_total", "counter", "Neighbours' updates mixed in.", number(g.applied));
  t.scalar("hearsay_updates_dropped_total", "counter", "Neighbours' updates dropped as too stale (or answers given up on).", number(g.dropped));
  t.scalar("hearsay_updates_coalesced_total", "counter", "Updates folded into a newer one before they were mixed or sent.", number(g.coalesced));
  t.scalar("hearsay_updates_rejected_total", "counter", "Updates refused by the update guard or from quarantined neighbours.", number(g.rejected));
  t.family("hearsay_updates_refused_total", "counter", "Updates the guard refused, by reason.");
  // Folded into the fixed reasons whatever the keys say: a label value never carries text
  // from the wire (the guard counts by kind already; this holds for any caller).
  std::map<std::string_view, uint64_t> refused;
  for (const auto& [why, n] : g.refused) refused[refusal_reason(why)] += n;
  for (const auto& [why, n] : refused) t.sample("hearsay_updates_refused_total", label("reason", std::string(why)), number(n));
  t.scalar("hearsay_quarantined_neighbours", "gauge", "Neighbours whose updates are quarantined now.", number(g.quarantined));
  t.scalar("hearsay_buffered_bytes", "gauge", "Bytes of arrived updates waiting to be mixed.", number(g.buffered_bytes));
  t.family("hearsay_staleness_steps", "histogram", "Staleness (steps) of the updates the mixer weighed.");
  uint64_t cumulative = 0;
  for (size_t b = 0; b < kStalenessBuckets.size(); ++b) {
    cumulative += g.staleness.counts[b];
    t.sample("hearsay_staleness_steps_bucket", label("le", std::to_string(kStalenessBuckets[b])), number(cumulative));
  }
  cumulative += g.staleness.counts.back();
  t.sample("hearsay_staleness_steps_bucket", label("le", "+Inf"), number(cumulative));
  t.sample("hearsay_staleness_steps_sum", "", number(g.staleness.sum));
  t.sample("hearsay_staleness_steps_count", "", number(g.staleness.count));
  return t.take();
}

uint64_t resident_memory_bytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  if (!(statm >> size >> resident)) return 0;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace hearsay
