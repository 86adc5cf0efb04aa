// The transfer suite (issue 41, Done when 3): one model message of a gigabyte between two
// gossip engines over TCP (TLS) behind an emulated WAN link, whole and with its connection
// cut half way (a relay on loopback that drops it: tests/transport/tcp_relay.h). What it
// shows: the message arrives, bit for bit; the heartbeats keep the link up while it is
// busy (a liveness timeout of 5 s, and no link event of death but the cut); after the cut
// the stream goes on from the receiver's last acknowledgement, and the bytes sent for the
// message stay within 1.1 of its size; the bytes queued on the link (the transport's
// queue: sent by the engine, not yet on the wire) stay within the stream window.
//
//   hearsay-bench transfer [--mib 1024] [--mbps 100] [--latency-ms 20] [--window-mib 64]
//
// One JSON line per run ("whole", "cut").
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../tests/transport/tcp_relay.h"
#include "bench_util.h"
#include "hearsay/command_line.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/emulated.h"
#include "hearsay/gossip.h"
#include "hearsay/log.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/peer.h"
#include "hearsay/transport.h"
#include "hearsay/wire.pb.h"
#include "../src/peer/message.h"

namespace hearsay::bench {
namespace {

// Counts the bytes of the update frames handed to the transport it wraps (every
// connection's, resends included), and what its link queues at the most.
class CountingTransport final : public Transport {
 public:
  explicit CountingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string kind() const override { return inner_->kind(); }
  void set_receiver(Receiver r) override { inner_->set_receiver(std::move(r)); }
  void set_link_listener(LinkListener l) override { inner_->set_link_listener(std::move(l)); }
  std::string listen(const std::string& address) override { return inner_->listen(address); }
  void connect(const std::string& peer, const std::string& address) override { inner_->connect(peer, address); }
  void send(const std::string& peer, OutFrame frame, SendCallback done) override {
    update_bytes += frame.size();
    inner_->send(peer, std::move(frame), std::move(done));
  }
  LinkStats link_stats(const std::string& peer) const override { return inner_->link_stats(peer); }
  std::vector<std::string> connected_peers() const override { return inner_->connected_peers(); }
  TransportCounters counters() const override { return inner_->counters(); }
  void close() override { inner_->close(); }
  std::atomic<uint64_t> update_bytes{0};

 private:
  std::unique_ptr<Transport> inner_;
};

struct Options {
  double mib = 1024;
  double mbps = 100;
  double latency_ms = 20;
  double window_mib = 64;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(const Options& opt) {
  // A model of about the message's size: an MLP 16 -> 16384 -> H -> 4 (widths are at most
  // 65536), the second layer's weights the bulk of it.
  const auto params = static_cast<uint64_t>(opt.mib * (1 << 20) / 4);
  const uint64_t first = 16384, second = std::max<uint64_t>(1, params / (first + 5));
  const std::string config = "name: \"transfer\" seed: 1 model { kind: MLP hidden: [" + std::to_string(first) + ", " +
                             std::to_string(second) + "] } data { format: SYNTHETIC synthetic_train: 64 synthetic_test: 16 synthetic_dim: 16 "
                             "num_classes: 4 } train { batch_size: 1 epochs: 1 }";
  const PeerSpec spec = peer_spec(parse_config(config, "transfer-bench", {}));
  const std::vector<std::string> ids{"a", "b"};
  std::vector<std::unique_ptr<Transport>> transports;
  CountingTransport* counted = nullptr;
  std::vector<std::string> addresses;
  std::mutex events_mu;
  std::vector<std::string> downs;  // link deaths either side saw
  LinkModel link;
  link.bandwidth_bps = opt.mbps * 1e6;
  link.latency_s = opt.latency_ms / 1000;
  for (int i = 0; i < 2; ++i) {
    TransportOptions o;
    o.peer_id = ids[i];
    o.secret = "transfer-bench";
    o.cluster_peers = ids;
    o.heartbeat_interval_s = 1;
    o.liveness_timeout_s = 5;  // the heartbeat timeout
    std::unique_ptr<Transport> t = create_emulated_transport(create_transport("tcp", o), link, {}, 1 + i);
    if (i == 0) {
      auto c = std::make_unique<CountingTransport>(std::move(t));
      counted = c.get();
      t = std::move(c);
    }
    t->set_link_listener([&, me = ids[i]](const LinkEvent& e) {
      if (e.kind != LinkEvent::Kind::kDown) return;
      std::lock_guard<std::mutex> lock(events_mu);
      downs.push_back(me + ": " + e.peer_id + " down (" + e.reason + ")");
    });
    addresses.push_back(t->listen("127.0.0.1:0"));
    transports.push_back(std::move(t));
  }
  test::TcpRelay relay(addresses[1]);
  transports[0]->connect("b", relay.address());
  RealClock clock;
  while (transports[0]->connected_peers().empty() || transports[1]->connected_peers().empty()) clock.sleep_for(0.01);

  GossipSpec g;
  g.algorithm = "gossip_grad";
  g.topology.kind = "ring";
  g.stream_window_bytes = static_cast<uint64_t>(opt.window_mib * (1 << 20));
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Trainable>> models;
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<std::unique_ptr<EventLog>> logs;
  std::vector<std::unique_ptr<GossipEngine>> engines;
  for (int i = 0; i < 2; ++i) {
    backends.push_back(create_backend("cpu"));
    models.push_back(create_model(spec.model, *backends[i], 1, spec.seed));
    optimizers.push_back(create_optimizer(*backends[i], models[i]->num_params(), spec.optimizer));
    logs.push_back(std::make_unique<EventLog>("", ids[i]));
    engines.push_back(make_gossip_engine(g, ids, i, *transports[i], *models[i], *optimizers[i], clock, *logs[i], 7));
  }
  const size_t n = models[0]->num_params();
  // A model as a neighbour would send it: a's own, moved a little (the receiver's guard
  // refuses one far from its own norm).
  std::vector<float> x = models[0]->get_params();
  for (size_t k = 0; k < n; ++k) x[k] += static_cast<float>(k % 1009) * 1e-6f;

  for (const bool cut : {false, true}) {
    {
      std::lock_guard<std::mutex> lock(events_mu);
      downs.clear();
    }
    counted->update_bytes = 0;
    const int cuts_before = relay.cuts();
    if (cut) relay.cut_after(2 * n);  // half of the message's 4n bytes
    std::atomic<bool> done{false};
    std::atomic<uint64_t> max_queued{0};
    std::thread sampler([&] {
      while (!done) {
        const uint64_t q = transports[0]->link_stats("b").queue_bytes;
        if (q > max_queued) max_queued = q;
        clock.sleep_for(0.05);
      }
    });
    const auto t0 = std::chrono::steady_clock::now();
    engines[0]->send(1, {.kind = MessageKind::kModel}, x);
    std::vector<GossipEngine::Message> got;
    std::string error;
    try {
      engines[0]->wait_sent(0);  // the stream ends at the receiver's last acknowledgement
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (got.empty() && std::chrono::steady_clock::now() < deadline) {
        got = engines[1]->take_async();
        if (got.empty()) clock.sleep_for(0.01);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
    const double took = seconds_since(t0);
    done = true;
    sampler.join();
    const bool whole = got.size() == 1 && got[0].data.size() == n && std::memcmp(got[0].data.data(), x.data(), 4 * n) == 0;
    std::lock_guard<std::mutex> lock(events_mu);
    std::string down_list;
    for (const auto& d : downs) down_list += (down_list.empty() ? "\"" : ",\"") + d + "\"";
    std::printf(
        "{\"bench\":\"transfer\",\"run\":\"%s\",\"message_bytes\":%llu,\"link_mbps\":%g,\"latency_ms\":%g,"
        "\"window_bytes\":%llu,\"liveness_timeout_s\":5,\"arrived_whole\":%s,\"seconds\":%.2f,\"goodput_mbps\":%.1f,"
        "\"bytes_sent\":%llu,\"sent_over_message\":%.4f,\"max_queued_bytes\":%llu,\"cuts\":%d,\"link_downs\":[%s],"
        "\"error\":\"%s\"}\n",
        cut ? "cut" : "whole", static_cast<unsigned long long>(4 * n), opt.mbps, opt.latency_ms,
        static_cast<unsigned long long>(g.stream_window_bytes), whole ? "true" : "false", took, 8.0 * 4 * n / took / 1e6,
        static_cast<unsigned long long>(counted->update_bytes.load()), double(counted->update_bytes.load()) / double(4 * n),
        static_cast<unsigned long long>(max_queued.load()), relay.cuts() - cuts_before, down_list.c_str(), error.c_str());
    std::fflush(stdout);
  }
  engines.clear();
  for (auto& t : transports) t->close();
  return 0;
}

}  // namespace

int run_transfer_bench(int argc, char** argv) {
  Options o;
  CommandLine("transfer bench")
      .number("--mib", &o.mib, 1, 65536, "a message size in MiB")
      .number("--mbps", &o.mbps, 1, 1e6, "a link bandwidth in Mbit/s")
      .number("--latency-ms", &o.latency_ms, 0, 10000, "a one-way latency in ms")
      .number("--window-mib", &o.window_mib, 1, 65536, "a stream window in MiB")
      .parse(argc, argv, 0);
  return run(o);
}

}  // namespace hearsay::bench
