// The algorithm registry: an algorithm registered from this test binary alone
// (extra/never_communicate.cpp and its options message, nothing of src/ or proto/) runs
// from a config with its own options, and the registry is the one list of algorithms.
#include <doctest/doctest.h>

#include <stdexcept>

#include "hearsay/config.pb.h"
#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/error.h"
#include "../../src/peer/algorithm_registry.h"

using namespace hearsay;

namespace {

std::string config_text(const std::string& gossip) {
  return "seed: 5\n"
         "model { kind: LOGREG }\n"
         "data { format: SYNTHETIC synthetic_train: 512 synthetic_test: 256 synthetic_dim: 64 num_classes: 3 }\n"
         "optim { lr: 0.1 }\n"
         "train { batch_size: 16 max_steps: 40 }\n"
         "cluster {\n"
         "  peers { name: \"a\" address: \"127.0.0.1:1\" }\n"
         "  peers { name: \"b\" address: \"127.0.0.1:2\" }\n"
         "  gossip {\n" +
         gossip +
         "  }\n"
         "}\n";
}

ClusterResult run_from_config(const config::Config& c) {
  ClusterSpec s;
  s.base = peer_spec(c);
  s.peers = c.cluster().peers_size();
  s.gossip = gossip_spec(c.cluster());
  return run_cluster(s);
}

}  // namespace

TEST_CASE("registry: an algorithm registered from the tests alone runs from a config with its own options") {
  const std::string never = "    algorithm: \"never_communicate\"\n";
  // lr_scale 0: the option reaches the algorithm, so no peer's model moves.
  const auto frozen = run_from_config(parse_config(
      config_text(never + "    [hearsay.test.never_communicate] { lr_scale: 0 }\n"), "never.textproto"));
  // Its default (1): the peers train, each on its own shard.
  const auto trained = run_from_config(parse_config(config_text(never), "never.textproto"));
  REQUIRE(frozen.peers.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CAPTURE(i);
    CHECK(frozen.peers[i].steps == 40);
    CHECK(frozen.final_params[i] == frozen.initial_params[i]);
    CHECK(trained.final_params[i] != trained.initial_params[i]);
    // It never communicates: what leaves a peer is the transport's own handshake, less
    // than one model (any gossip message of this dense model carries at least one).
    const uint64_t model_bytes = sizeof(float) * frozen.initial_params[i].size();
    CHECK(frozen.peers[i].bytes_sent < model_bytes);
    CHECK(trained.peers[i].bytes_sent < model_bytes);
  }
  // Two peers alone on different shards end apart.
  CHECK(trained.final_params[0] != trained.final_params[1]);
}

TEST_CASE("registry: an algorithm's options are checked where it declares them, and errors point at the field") {
  CHECK_THROWS_WITH_AS(parse_config(config_text("    algorithm: \"never_communicate\"\n"
                                                "    [hearsay.test.never_communicate] {\n"
                                                "      lr_scale: -1 }\n"),
                                    "bad.textproto"),
                       doctest::Contains("bad.textproto:12:7: cluster.gossip.[hearsay.test.never_communicate].lr_scale: must be >= 0"),
                       InputError);
  // A built-in algorithm's options the same way, and what the runtime spec carries.
  CHECK_THROWS_WITH_AS(parse_config(config_text("    algorithm: \"diloco\"\n"
                                                "    [hearsay.algorithms.diloco] { outer_momentum: 1 }\n"),
                                    "d.textproto"),
                       doctest::Contains("d.textproto:11:35: cluster.gossip.[hearsay.algorithms.diloco].outer_momentum: must be in [0, 1)"),
                       InputError);
  const auto c = parse_config(config_text("    algorithm: \"diloco\"\n    [hearsay.algorithms.diloco] { outer_lr: 0.5 }\n"), "ok");
  CHECK(gossip_spec(c.cluster()).options == "outer_lr: 0.5");
  // Another algorithm's options beside the chosen one's apply only when it is chosen.
  const auto both = parse_config(config_text("    algorithm: \"sgp\" topology: \"exponential\"\n    [hearsay.algorithms.diloco] { outer_lr: 0.5 }\n"), "ok");
  CHECK(gossip_spec(both.cluster()).options.empty());
  // sgp's delay bound needs to know who pushes to a peer in a round: a random topology is refused, naming the option.
  CHECK_THROWS_WITH_AS(parse_config(config_text("    algorithm: \"sgp\" topology: \"random\"\n"), "r.textproto"),
                       doctest::Contains("cluster.gossip.overlap_tau: the delay bound waits for each round's pushes"), InputError);
  CHECK_NOTHROW(parse_config(config_text("    algorithm: \"sgp\" topology: \"random\"\n    [hearsay.algorithms.sgp] { overlap_tau: 0 }\n"),
                             "r0.textproto"));
  // An unknown algorithm's error lists the registered ones, the test's among them.
  CHECK_THROWS_WITH_AS(parse_config(config_text("    algorithm: \"nope\"\n"), "n.textproto"),
                       doctest::Contains("unknown 'nope'; use adpsgd, allreduce, choco, delta_gossip, demo, dgc, diloco, dpsgd, gossip_grad, local_sgd, "
                                         "never_communicate, sgp, streaming_diloco"),
                       InputError);
}

TEST_CASE("registry: it is the one list of algorithms, with what each declares") {
  const auto names = gossip_algorithms();
  CHECK(names == std::vector<std::string>{"adpsgd", "allreduce", "choco", "delta_gossip", "demo", "dgc", "diloco", "dpsgd", "gossip_grad", "local_sgd",
                                          "never_communicate", "sgp", "streaming_diloco"});
  for (const char* sync : {"allreduce", "dpsgd", "local_sgd", "diloco", "streaming_diloco", "dgc", "demo"}) CHECK(is_synchronous(sync));
  CHECK(find_algorithm("demo")->owns_update);
  CHECK_FALSE(find_algorithm("dgc")->owns_update);
  for (const char* async : {"adpsgd", "gossip_grad", "sgp", "choco", "never_communicate", "delta_gossip"}) CHECK_FALSE(is_synchronous(async));
  CHECK(find_algorithm("dpsgd")->undirected_topology);
  CHECK(find_algorithm("choco")->undirected_topology);
  CHECK_FALSE(find_algorithm("adpsgd")->undirected_topology);
  // Each kind of message an algorithm sends travels as it declared; a kind it did not
  // declare is a bug, refused at the send.
  CHECK(find_algorithm("gossip_grad")->compression_of(MessageKind::kGradient) == Compression::kUpdate);
  CHECK(find_algorithm("gossip_grad")->compression_of(MessageKind::kModel) == Compression::kModel);
  CHECK(find_algorithm("choco")->compression_of(MessageKind::kModelDelta) == Compression::kUpdate);
  CHECK_THROWS_AS(find_algorithm("never_communicate")->compression_of(MessageKind::kModel), std::logic_error);
  // A second registration under a taken name is refused.
  AlgorithmEntry twice = *find_algorithm("never_communicate");
  CHECK_THROWS_AS(register_algorithm(twice), std::logic_error);
}
