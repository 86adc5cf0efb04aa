// Two GossipEngines over inproc transports, without a Peer around them: the engine alone
// (engine_test.cpp) and its device path (device_gossip_test.cpp) are tested on this pair.
#pragma once
#include <doctest/doctest.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/clock.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/gossip.h"
#include "hearsay/log.h"
#include "hearsay/model.h"
#include "hearsay/optim.h"
#include "hearsay/peer.h"
#include "hearsay/rng.h"
#include "hearsay/transport.h"
#include "../../src/peer/message.h"

namespace hearsay::test {

// An MLP of 16 -> 64 -> 4 (1,348 parameters): large enough that top-k keeps dozens.
inline constexpr const char* kConfig = R"(
  name: "dev"
  seed: 11
  model { kind: MLP hidden: [64] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 1024 synthetic_dim: 16 num_classes: 4
         synthetic_separation: 0.6 }
  optim { lr: 0.05 momentum: 0.5 }
  train { batch_size: 16 epochs: 6 eval_every_steps: 1000000 }
  log { every_steps: 16 }
)";

// A transport that keeps a copy of every frame it is asked to send (head and payload, as
// the engine built them), then sends it through the transport it wraps.
class RecordingTransport final : public Transport {
 public:
  explicit RecordingTransport(std::unique_ptr<Transport> inner) : inner_(std::move(inner)) {}
  std::string kind() const override { return "recording(" + inner_->kind() + ")"; }
  void set_receiver(Receiver r) override { inner_->set_receiver(std::move(r)); }
  void set_link_listener(LinkListener l) override { inner_->set_link_listener(std::move(l)); }
  std::string listen(const std::string& address) override { return inner_->listen(address); }
  void connect(const std::string& peer, const std::string& address) override { inner_->connect(peer, address); }
  void send(const std::string& peer, OutFrame frame, SendCallback done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      frames_.push_back(frame.head + std::string(reinterpret_cast<const char*>(frame.payload), frame.payload_size));
    }
    inner_->send(peer, std::move(frame), std::move(done));
  }
  LinkStats link_stats(const std::string& peer) const override { return inner_->link_stats(peer); }
  std::vector<std::string> connected_peers() const override { return inner_->connected_peers(); }
  TransportCounters counters() const override { return inner_->counters(); }
  void close() override { inner_->close(); }
  std::vector<std::string> frames() const {
    std::lock_guard<std::mutex> lock(mu_);
    return frames_;
  }

 private:
  std::unique_ptr<Transport> inner_;
  mutable std::mutex mu_;
  std::vector<std::string> frames_;  // GUARDED_BY(mu_)
};

// How a Pair is built, beyond its devices: the transport, the peers' config, and where
// "a" dials "b" (`dial_through`: given b's address, the address to dial instead, a relay's).
struct PairOptions {
  std::string transport = "inproc";
  std::string config = kConfig;
  std::function<std::string(const std::string&)> dial_through;
};

// Two peers over inproc: "a" on `device_a` (its frames recorded), "b" on `device_b`.
struct Pair {
  Pair(const GossipSpec& gossip, const std::string& device_a, const std::string& device_b, const PairOptions& options = {}) {
    const PeerSpec spec = peer_spec(parse_config(options.config, "device-gossip-test", {}));
    const std::vector<std::string> ids{"a", "b"};
    std::vector<std::string> addresses;
    for (int i = 0; i < 2; ++i) {
      TransportOptions o;
      o.peer_id = ids[i];
      o.secret = "device-gossip-test";
      o.cluster_peers = ids;
      auto t = create_transport(options.transport, o);
      if (i == 0) {
        auto r = std::make_unique<RecordingTransport>(std::move(t));
        recorder = r.get();
        t = std::move(r);
      }
      addresses.push_back(t->listen(options.transport == "inproc" ? "" : "127.0.0.1:0"));
      transports.push_back(std::move(t));
    }
    transports[0]->connect("b", options.dial_through ? options.dial_through(addresses[1]) : addresses[1]);
    const double deadline = clock.now() + 20;
    for (auto& t : transports) {
      while (t->connected_peers().empty()) {
        REQUIRE(clock.now() < deadline);
        clock.sleep_for(0.005);
      }
    }
    for (int i = 0; i < 2; ++i) {
      backends.push_back(create_backend(i == 0 ? device_a : device_b));
      models.push_back(create_model(spec.model, *backends[i], 16, spec.seed));
      optimizers.push_back(create_optimizer(*backends[i], models[i]->num_params(), spec.optimizer));
      logs.push_back(std::make_unique<EventLog>("", ids[i]));
      engines.push_back(make_gossip_engine(gossip, ids, i, *transports[i], *models[i], *optimizers[i], clock,
                                                       *logs[i], 7));
    }
  }
  ~Pair() {
    engines.clear();
    for (auto& t : transports) t->close();
  }
  size_t n() const { return models[0]->num_params(); }
  // The asynchronous arrivals at peer `i`, waited for until there is one (20 s at most).
  std::vector<GossipEngine::Message> await_arrivals(int i) {
    const double deadline = clock.now() + 20;
    std::vector<GossipEngine::Message> got;
    while (got.empty()) {
      REQUIRE(clock.now() < deadline);
      clock.sleep_for(0.002);
      got = engines[i]->take_async();
    }
    return got;
  }

  RealClock clock;
  RecordingTransport* recorder = nullptr;
  std::vector<std::unique_ptr<Transport>> transports;
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<std::unique_ptr<Trainable>> models;
  std::vector<std::unique_ptr<Optimizer>> optimizers;
  std::vector<std::unique_ptr<EventLog>> logs;
  std::vector<std::unique_ptr<GossipEngine>> engines;
};

inline std::vector<float> normal_vector(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

}  // namespace hearsay::test
