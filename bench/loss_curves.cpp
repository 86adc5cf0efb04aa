// hearsay-curves: every step's training loss, as exact hex floats, for one seed: one peer
// alone (SGD, and AdamW) and an in-process cluster of 4 peers under each algorithm. A
// refactor that claims to change no arithmetic diffs this output before and after (the
// synchronous algorithms and the lone peer must match bit for bit; the asynchronous ones
// depend on thread timing and are compared by their seed-to-seed spread).
//   build/bin/hearsay-curves [all|single|sync|async|ALGORITHM] [SEED]
#include <cstdio>
#include <string>
#include <vector>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/peer.h"

using namespace hearsay;

namespace {

const char* kMlp = R"(
  name: "c" seed: 7 device: "cpu" threads: 1
  model { kind: MLP hidden: [64] }
  data { format: IDX dir: "/usr/share/datasets/fashion-mnist" }
  optim { lr: 0.05 momentum: 0.9 nesterov: true schedule: COSINE warmup_steps: 20 }
  train { batch_size: 32 max_steps: 200 eval_every_steps: 100 }
  log { every_steps: 50 }
)";

void print(const std::string& tag, int peer, const TrainResult& r) {
  std::printf("%s peer %d steps %lld acc %.17g loss %.17g\n", tag.c_str(), peer, static_cast<long long>(r.steps),
              r.final_test_acc, r.final_test_loss);
  std::printf("%s peer %d curve", tag.c_str(), peer);
  for (double l : r.losses) std::printf(" %a", l);
  std::printf("\n");
}

struct Run {
  std::string tag, algorithm, codec;
  bool synchronous;
};

}  // namespace

int main(int argc, char** argv) try {
  const std::string which = argc > 1 ? argv[1] : "all";
  const std::string seed = "seed: " + std::string(argc > 2 ? argv[2] : "7");
  if (which == "all" || which == "single") {
    EventLog log("", "single");
    Peer adamw(peer_spec(parse_config(kMlp, "curves", {seed, "model { hidden: [256, 256] } optim { optimizer: \"adamw\" lr: 0.001 nesterov: false }"})),
               log, nullptr);
    print("single-adamw", 0, adamw.run());
    Peer sgd(peer_spec(parse_config(kMlp, "curves", {seed})), log, nullptr);
    print("single-sgd", 0, sgd.run());
  }
  const std::vector<Run> runs = {{"allreduce", "allreduce", "", true},       {"allreduce-powersgd", "allreduce", "powersgd", true},
                                 {"allreduce-int8", "allreduce", "int8", true}, {"dpsgd", "dpsgd", "", true},
                                 {"local_sgd", "local_sgd", "", true},          {"diloco", "diloco", "", true},
                                 {"adpsgd", "adpsgd", "", false},               {"gossip_grad", "gossip_grad", "", false},
                                 {"sgp", "sgp", "", false},                     {"choco", "choco", "topk", false}};
  for (const Run& run : runs) {
    const bool wanted = which == "all" || which == run.tag || (which == "sync" && run.synchronous) ||
                        (which == "async" && !run.synchronous);
    if (!wanted) continue;
    ClusterSpec s;
    s.base = peer_spec(parse_config(kMlp, "curves", {seed}));
    s.peers = 4;
    s.gossip.algorithm = run.algorithm;
    s.gossip.topology.kind = run.algorithm == "sgp" ? "exponential" : run.algorithm == "adpsgd" ? "random" : "ring";
    if (run.algorithm == "local_sgd" || run.algorithm == "diloco") s.gossip.options = "local_steps: 4";
    if (!run.codec.empty()) s.gossip.codec.name = run.codec;
    if (run.codec == "powersgd") s.gossip.codec.rank = 2;
    if (run.codec == "topk") s.gossip.codec.density = 0.1;
    const ClusterResult r = run_cluster(s);
    for (size_t i = 0; i < r.peers.size(); ++i) print(run.tag, static_cast<int>(i), r.peers[i]);
  }
  return 0;
} catch (const InputError& e) {
  std::fprintf(stderr, "hearsay-curves: %s\n", e.what());
  return 2;
}
