// A peer's memory events (docs/LOGS.md, `memory`): every owner counted by its owner, so a
// figure in bytes a parameter can be checked against what each algorithm's paper keeps.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "test_util.h"

using namespace hearsay;
using nlohmann::json;

namespace {

// An MLP of 256 -> 2048 -> 512 -> 4 (1.58M parameters: each model-sized buffer is 6.3 MB,
// well over the 1 MiB a memory event waits for), momentum SGD.
const char* kConfig = R"(
  name: "m"
  seed: 2
  model { kind: MLP hidden: [2048, 512] }
  data { format: SYNTHETIC synthetic_train: 512 synthetic_test: 64 synthetic_dim: 256 num_classes: 4 }
  optim { lr: 0.01 momentum: 0.9 }
  train { batch_size: 16 max_steps: 12 eval_every_steps: 1000000 }
  log { every_steps: 4 }
)";

struct Owners {
  int64_t params = 0;
  std::vector<json> memory;  // peer0's memory events
};

Owners run(const std::string& algorithm, const std::string& options) {
  test::TempDir dir;
  ClusterSpec s;
  s.base = peer_spec(parse_config(kConfig, "memory-test", {}));
  s.peers = 2;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = "complete";
  s.gossip.options = options;
  s.log_dir = dir.path();
  run_cluster(s);
  Owners o;
  std::ifstream in(dir.file("peer0.jsonl"));
  for (std::string line; std::getline(in, line);) {
    const json e = json::parse(line);
    if (e["event"] == "start") o.params = e["params"];
    if (e["event"] == "memory") o.memory.push_back(e);
  }
  return o;
}

int64_t largest(const Owners& o, const std::string& owner) {
  int64_t most = 0;
  for (const auto& e : o.memory) most = std::max<int64_t>(most, e["host"].value(owner, int64_t{0}));
  return most;
}

}  // namespace

TEST_CASE("memory: each owner is counted by its owner: the model, momentum SGD's velocity, diloco's outer model and momentum, adpsgd's open exchange at most") {
  const Owners diloco = run("diloco", "local_steps: 4");
  const Owners adpsgd = run("adpsgd", "");
  for (const Owners* o : {&diloco, &adpsgd}) {
    REQUIRE(o->params > 1000000);
    REQUIRE(o->memory.size() >= 1);
    CHECK(o->memory[0]["step"] == 0);  // at the start, after the start event
    CHECK(largest(*o, "model") == 8 * o->params);
    CHECK(largest(*o, "optimizer") == 4 * o->params);
    CHECK(o->memory.back()["resident_bytes"].get<int64_t>() > 0);
  }
  // DiLoCo keeps the outer model and its Nesterov momentum (Douillard et al. 2023): 8 bytes
  // a parameter, counted once its first outer step made them (a later event).
  CHECK(largest(diloco, "algorithm") == 8 * diloco.params);
  CHECK(diloco.memory.size() >= 2);
  // adpsgd keeps nothing of its own but the base of an exchange it opened: the model it
  // sent, as the codec's bytes (here fp32), one buffer for every target of its round.
  CHECK(largest(adpsgd, "algorithm") <= 4 * adpsgd.params);
}
