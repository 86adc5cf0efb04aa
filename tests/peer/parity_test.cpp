// Bit parity (gossip.parity_check, src/peer/engine_parity.cpp): one peer's model (or, under
// streaming_diloco, its outer model) altered by one bit after an outer step
// (PeerNetwork::flip_bit_after_step) is named at the next digest exchange, repairs itself
// from the majority, and the run ends with the model the unaltered run ends with, bit for
// bit. Without the check the same bit spreads into every peer's model.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"

using namespace hearsay;

namespace {

const char* kSmall = R"(
  name: "parity" seed: 5
  model { kind: MLP hidden: [16] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 12 num_classes: 4 }
  optim { optimizer: "adamw" lr: 0.01 }
  train { batch_size: 16 epochs: 0 max_steps: 16 eval_every_steps: 1000000 }
  log { every_steps: 1000 }
)";

ClusterResult run(const std::string& algorithm, const std::string& options, bool parity, int64_t flip_after,
                  const std::string& log_dir = "") {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "parity-test", {}));
  s.peers = 3;
  s.gossip.algorithm = algorithm;
  s.gossip.options = options;
  s.gossip.topology.kind = "ring";
  s.gossip.parity_check = parity;
  s.log_dir = log_dir;
  if (flip_after > 0) s.flip_bit_after_step = {-1, flip_after, -1};
  return run_cluster(s);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace

TEST_CASE("parity: a bit flipped after an outer step is named, repaired from the majority, and the run ends as unaltered") {
  // streaming_diloco's checked copies are its outer model and momentum (its model is each
  // peer's own): the flip lands in its outer model.
  for (const auto& [algorithm, options] : {std::pair<std::string, std::string>{"diloco", "local_steps: 4"},
                                           {"local_sgd", "local_steps: 4"},
                                           {"allreduce", ""},
                                           {"streaming_diloco", "local_steps: 4 fragments: 2 overlap_steps: 0"}}) {
    CAPTURE(algorithm);
    const ClusterResult clean = run(algorithm, options, true, 0);
    const ClusterResult spread = run(algorithm, options, false, 8);  // after the second outer step
    const std::string dir = "/tmp/hearsay-parity-test-" + algorithm;
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const ClusterResult repaired = run(algorithm, options, true, 8, dir);
    // The fault matters: without the check the flipped bit reaches every peer's model.
    for (int i = 0; i < 3; ++i) CHECK(!same_bits(spread.final_params[i], clean.final_params[i]));
    // With it, every peer ends as the unaltered run does.
    for (int i = 0; i < 3; ++i) CHECK(same_bits(repaired.final_params[i], clean.final_params[i]));
    // Every peer named peer1, and peer1 took the model from peer0.
    for (int i = 0; i < 3; ++i) {
      const std::string log = slurp(dir + "/peer" + std::to_string(i) + ".jsonl");
      CHECK(log.find("\"event\":\"parity\",\"step\":8") != std::string::npos);
      CHECK(log.find("\"differ\":[\"peer1\"],\"from\":\"peer0\",\"repaired\":" + std::string(i == 1 ? "true" : "false")) !=
            std::string::npos);
    }
  }
}

TEST_CASE("parity: with two peers no digest has a majority: the difference is named and nothing is repaired") {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "parity-test", {}));
  s.peers = 2;
  s.gossip.algorithm = "allreduce";
  s.gossip.topology.kind = "ring";
  s.gossip.parity_check = true;
  s.flip_bit_after_step = {-1, 8};
  const std::string dir = "/tmp/hearsay-parity-test-pair";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  s.log_dir = dir;
  const ClusterResult r = run_cluster(s);
  // Neither copy was taken: the two models stay apart (allreduce adds the same update to both).
  CHECK(!same_bits(r.final_params[0], r.final_params[1]));
  for (int i = 0; i < 2; ++i) {
    const std::string log = slurp(dir + "/peer" + std::to_string(i) + ".jsonl");
    CHECK(log.find("\"differ\":[\"peer1\"],\"from\":\"\",\"repaired\":false") != std::string::npos);
  }
}

TEST_CASE("parity: gossip.parity_check is refused at load with an algorithm it cannot serve, naming the field") {
  const std::string cluster = R"(
    cluster { id: "c" secret_env: "HEARSAY_SECRET"
      peers { name: "a" address: "127.0.0.1:1" } peers { name: "b" address: "127.0.0.1:2" } peers { name: "c" address: "127.0.0.1:3" }
      gossip { algorithm: "ALGORITHM" parity_check: true } })";
  for (const char* algorithm : {"adpsgd", "dpsgd", "gossip_grad"}) {
    std::string text = std::string(kSmall) + cluster;
    text.replace(text.find("ALGORITHM"), 9, algorithm);
    CHECK_THROWS_WITH_AS(parse_config(text, "p.textproto"), doctest::Contains("cluster.gossip.parity_check"), InputError);
  }
  std::string ok = std::string(kSmall) + cluster;
  ok.replace(ok.find("ALGORITHM"), 9, "diloco");
  CHECK_NOTHROW(parse_config(ok, "p.textproto"));
}
