// diloco and streaming_diloco (src/peer/algorithms/): the outer steps' defining
// invariants on in-process clusters: after an outer step every peer holds the same
// global model (diloco) or fragment (streaming, merge factor 0), bit for bit, under
// every codec and across sites; fragments not yet synchronised differ; and Streaming
// DiLoCo with one fragment, no overlap and alpha 0 is DiLoCo.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hearsay/cluster.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"

using namespace hearsay;

namespace {

// An MLP of two units (fc1, fc2): streaming_diloco's two fragments.
const char* kSmall = R"(
  name: "dl" seed: 9
  model { kind: MLP hidden: [16] }
  data { format: SYNTHETIC synthetic_train: 2048 synthetic_test: 256 synthetic_dim: 12 num_classes: 4 }
  optim { optimizer: "adamw" lr: 0.01 }
  train { batch_size: 16 epochs: 0 eval_every_steps: 1000000 }
  log { every_steps: 1000 }
)";

ClusterResult run(const std::string& algorithm, const std::string& options, int steps, const std::string& codec = "none",
                  std::vector<int> site_of = {}, bool site_replicas = false) {
  ClusterSpec s;
  s.base = peer_spec(parse_config(kSmall, "diloco-test", {"train { max_steps: " + std::to_string(steps) + " }"}));
  s.peers = site_of.empty() ? 4 : static_cast<int>(site_of.size());
  s.gossip.algorithm = algorithm;
  s.gossip.options = options;
  s.gossip.topology.kind = "ring";
  s.gossip.topology.site_of = std::move(site_of);
  s.gossip.codec.name = codec;
  s.gossip.site_replicas = site_replicas;
  return run_cluster(s);
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, 4 * n) == 0; }

// fc1's parameters (weight [16, 12] and bias [16]) lead the flat buffer; fc2's follow.
constexpr size_t kFc1 = 16 * 12 + 16;

}  // namespace

TEST_CASE("diloco: after each outer step every peer holds the same model bit for bit, under every codec and across sites") {
  for (const char* codec : {"none", "fp16", "int8"}) {
    for (const std::vector<int>& sites : {std::vector<int>{}, std::vector<int>{0, 0, 1, 1}}) {
      CAPTURE(codec);
      CAPTURE(sites.size());
      const ClusterResult r = run("diloco", "local_steps: 4", 8, codec, sites);
      REQUIRE(r.final_params.size() == 4);
      const size_t n = r.final_params[0].size();
      CHECK(!same_bits(r.initial_params[0].data(), r.final_params[0].data(), n));
      for (int i = 1; i < 4; ++i) CHECK(same_bits(r.final_params[0].data(), r.final_params[i].data(), n));
    }
  }
}

TEST_CASE("diloco composed with a sparse outer codec: after each outer step every peer holds the same model bit for bit, "
          "what top-k did not send stays in the residual, and it sends a fraction of the bytes") {
  const ClusterResult dense = run("diloco", "local_steps: 4", 8, "none", {0, 0, 1, 1});
  for (const char* codec : {"topk", "randomk", "sign"}) {
    CAPTURE(codec);
    const ClusterResult r = run("diloco", std::string("local_steps: 4 outer_codec: \"") + codec + "\"", 8, "none", {0, 0, 1, 1});
    REQUIRE(r.final_params.size() == 4);
    const size_t n = r.final_params[0].size();
    CHECK(!same_bits(r.initial_params[0].data(), r.final_params[0].data(), n));
    for (int i = 1; i < 4; ++i) CHECK(same_bits(r.final_params[0].data(), r.final_params[i].data(), n));
    CHECK(!same_bits(dense.final_params[0].data(), r.final_params[0].data(), n));
    // The saved state ends with the residual (anchor, velocity, residual: three optional
    // vectors); each peer's holds what its codec left out, so it is not zero.
    const std::string& state = r.algorithm_state[0];
    REQUIRE(state.size() == 3 * (8 + 8 + 4 * n));
    std::vector<float> residual(n);
    std::memcpy(residual.data(), state.data() + state.size() - 4 * n, 4 * n);
    CHECK(std::any_of(residual.begin(), residual.end(), [](float v) { return v != 0.0f; }));
    for (size_t i = 0; i < 4; ++i) CHECK(r.peers[i].bytes_sent < dense.peers[i].bytes_sent);
  }
}

TEST_CASE("streaming_diloco: a fragment just merged with alpha 0 is the same on every peer, the other is not, "
          "with and without overlap") {
  // H = 4, two fragments: fc1 syncs after steps 3, 7, ..., fc2 after steps 1, 5, .... With
  // tau = 0 and 8 steps, fc1 was merged after the last step; with tau = 1 and 9 steps,
  // fc1's outer step (sent after step 7) was merged after the last. fc2 then has had
  // two local steps since its own merge.
  for (const auto& [tau, steps] : {std::pair{0, 8}, std::pair{1, 9}}) {
    CAPTURE(tau);
    const ClusterResult r = run("streaming_diloco",
                                "local_steps: 4 fragments: 2 mix_alpha: 0 overlap_steps: " + std::to_string(tau), steps,
                                "none", {0, 0, 1, 1});
    REQUIRE(r.final_params.size() == 4);
    const size_t n = r.final_params[0].size();
    for (int i = 1; i < 4; ++i) {
      CHECK(same_bits(r.final_params[0].data(), r.final_params[i].data(), kFc1));
      CHECK(!same_bits(r.final_params[0].data() + kFc1, r.final_params[i].data() + kFc1, n - kFc1));
    }
  }
}

TEST_CASE("streaming_diloco: with one fragment, no overlap and alpha 0 it is diloco, bit for bit") {
  const ClusterResult d = run("diloco", "local_steps: 4 outer_lr: 0.7 outer_momentum: 0.9", 12, "fp16");
  const ClusterResult s = run("streaming_diloco",
                              "local_steps: 4 fragments: 1 overlap_steps: 0 mix_alpha: 0 outer_lr: 0.7 outer_momentum: 0.9", 12,
                              "fp16");
  REQUIRE(d.final_params.size() == 4);
  REQUIRE(s.final_params.size() == 4);
  for (int i = 0; i < 4; ++i) {
    CHECK(same_bits(d.final_params[i].data(), s.final_params[i].data(), d.final_params[i].size()));
  }
}

TEST_CASE("diloco with site replicas: between outer steps a site's peers hold the same model bit for bit and the sites "
          "differ, and after an outer step every peer does") {
  // H = 4: the outer step falls after steps 3 and 7. After 6 steps each site has taken
  // two inner steps of its own since; after 8 the outer step has just been applied.
  for (const char* codec : {"none", "int8"}) {
    CAPTURE(codec);
    const ClusterResult mid = run("diloco", "local_steps: 4", 6, codec, {0, 0, 1, 1}, true);
    REQUIRE(mid.final_params.size() == 4);
    const size_t n = mid.final_params[0].size();
    CHECK(same_bits(mid.final_params[0].data(), mid.final_params[1].data(), n));
    CHECK(same_bits(mid.final_params[2].data(), mid.final_params[3].data(), n));
    CHECK(!same_bits(mid.final_params[0].data(), mid.final_params[2].data(), n));
    const ClusterResult end = run("diloco", "local_steps: 4", 8, codec, {0, 0, 1, 1}, true);
    REQUIRE(end.final_params.size() == 4);
    for (int i = 1; i < 4; ++i) CHECK(same_bits(end.final_params[0].data(), end.final_params[i].data(), n));
  }
  // Each peer its own replica (the default): the peers of a site part after the outer step.
  const ClusterResult alone = run("diloco", "local_steps: 4", 6, "none", {0, 0, 1, 1});
  REQUIRE(alone.final_params.size() == 4);
  CHECK(!same_bits(alone.final_params[0].data(), alone.final_params[1].data(), alone.final_params[0].size()));
}

TEST_CASE("diloco with site replicas: a site of four passes its all-gather around the ring and its peers still hold the same "
          "model bit for bit, under every summable codec") {
  // Sites of 4 and 2: in the site of four the ring all-gather forwards each chunk twice,
  // encoded again (int8 and int4 with a scale recomputed from the decoded values) or, where
  // the codec would not give them back unchanged, as fp32; either way the bits must hold.
  for (const char* codec : {"none", "fp16", "int8", "int4"}) {
    CAPTURE(codec);
    const ClusterResult r = run("diloco", "local_steps: 100", 6, codec, {0, 0, 0, 0, 1, 1}, true);
    REQUIRE(r.final_params.size() == 6);
    const size_t n = r.final_params[0].size();
    for (int i = 1; i < 4; ++i) CHECK(same_bits(r.final_params[0].data(), r.final_params[i].data(), n));
    CHECK(same_bits(r.final_params[4].data(), r.final_params[5].data(), n));
    CHECK(!same_bits(r.final_params[0].data(), r.final_params[4].data(), n));
    // The site's gradients were averaged, not dropped: its peers moved from where they began.
    CHECK(!same_bits(r.final_params[0].data(), r.initial_params[0].data(), n));
  }
}

TEST_CASE("streaming_diloco with site replicas: a site's peers hold the same model bit for bit, the sites differ") {
  const ClusterResult r = run("streaming_diloco", "local_steps: 4 fragments: 2 mix_alpha: 0 overlap_steps: 1", 9, "int8",
                              {0, 0, 1, 1}, true);
  REQUIRE(r.final_params.size() == 4);
  const size_t n = r.final_params[0].size();
  CHECK(same_bits(r.final_params[0].data(), r.final_params[1].data(), n));
  CHECK(same_bits(r.final_params[2].data(), r.final_params[3].data(), n));
  // fc1 was merged after the last step (alpha 0: the global value); fc2 has trained since.
  CHECK(same_bits(r.final_params[0].data(), r.final_params[2].data(), kFc1));
  CHECK(!same_bits(r.final_params[0].data() + kFc1, r.final_params[2].data() + kFc1, n - kFc1));
}

TEST_CASE("streaming_diloco with outer_codec int4: its outer all-reduce is int4's whatever gossip.codec says, and a "
          "fragment just merged is the same on every peer") {
  // The inner steps send nothing (replica peer), so outer_codec int4 under gossip.codec
  // int8 must be, bit for bit, the run whose gossip.codec is int4.
  auto sync = [](const std::string& codec, const std::string& outer) {
    return run("streaming_diloco",
               "local_steps: 4 fragments: 2 mix_alpha: 0 overlap_steps: 0 outer_codec: \"" + outer + "\"", 8, codec,
               {0, 0, 1, 1});
  };
  const ClusterResult outer4 = sync("int8", "int4"), all4 = sync("int4", ""), all8 = sync("int8", "");
  REQUIRE(outer4.final_params.size() == 4);
  REQUIRE(all4.final_params.size() == 4);
  REQUIRE(all8.final_params.size() == 4);
  const size_t n = outer4.final_params[0].size();
  for (int i = 0; i < 4; ++i) {
    CHECK(same_bits(outer4.final_params[i].data(), all4.final_params[i].data(), n));
    CHECK(!same_bits(outer4.final_params[i].data(), all8.final_params[i].data(), kFc1));
    CHECK(same_bits(outer4.final_params[0].data(), outer4.final_params[i].data(), kFc1));
  }
}

TEST_CASE("streaming_diloco: options out of range are refused naming the field") {
  auto bad = [](const std::string& options) {
    return parse_config(std::string(kSmall) + "train { max_steps: 10 } cluster { secret_env: \"HOME\" peers { name: \"a\" address: \"127.0.0.1:1\" } "
                                              "peers { name: \"b\" address: \"127.0.0.1:2\" } "
                                              "gossip { algorithm: \"streaming_diloco\" "
                                              "[hearsay.algorithms.streaming_diloco] { " +
                            options + " } } }",
                        "s.textproto");
  };
  CHECK_THROWS_WITH_AS(bad("local_steps: 8 fragments: 2 overlap_steps: 4"),
                       doctest::Contains("streaming_diloco].overlap_steps: must be in [0, local_steps / fragments)"), InputError);
  CHECK_THROWS_WITH_AS(bad("fragments: 0"), doctest::Contains("streaming_diloco].fragments: must be in [1, local_steps]"),
                       InputError);
  CHECK_THROWS_WITH_AS(bad("mix_alpha: 1"), doctest::Contains("mix_alpha: must be in [0, 1)"), InputError);
  CHECK_THROWS_WITH_AS(bad("outer_codec: \"topk\""), doctest::Contains("streaming_diloco].outer_codec: 'topk': use none"),
                       InputError);
  CHECK_THROWS_WITH_AS(bad("replica: \"continent\""), doctest::Contains("streaming_diloco].replica: 'continent': use peer"),
                       InputError);
  // An old config's replica "site" is told where it went.
  CHECK_THROWS_WITH_AS(bad("replica: \"site\""), doctest::Contains("replica: 'site' moved: a site as one data-parallel replica is "
                                                                   "cluster { site_replicas: true } now"),
                       InputError);
  CHECK_NOTHROW(bad("local_steps: 8 fragments: 2 overlap_steps: 3"));
}

TEST_CASE("diloco: a codec that cannot be summed carries the outer gradient as a sparse all-gather, and is refused where it "
          "would carry a site's sum") {
  auto config = [](const std::string& codec, const std::string& options, const std::string& cluster = "") {
    return parse_config(std::string(kSmall) + "train { max_steps: 10 } cluster { secret_env: \"HOME\" " + cluster +
                            " peers { name: \"a\" address: \"127.0.0.1:1\" } "
                            "peers { name: \"b\" address: \"127.0.0.1:2\" } "
                            "gossip { algorithm: \"diloco\" codec { name: \"" + codec + "\" } "
                            "[hearsay.algorithms.diloco] { " + options + " } } }",
                        "d.textproto");
  };
  CHECK_NOTHROW(config("topk", ""));
  CHECK_NOTHROW(config("int8", "outer_codec: \"powersgd\""));
  CHECK_THROWS_WITH_AS(config("int8", "outer_codec: \"zip\""), doctest::Contains("diloco].outer_codec: unknown 'zip'"), InputError);
  // Under site replicas the site's gradient sum travels under site_codec, else gossip.codec.
  CHECK_THROWS_WITH_AS(config("sign", "outer_codec: \"int8\"", "site_replicas: true"),
                       doctest::Contains("the site's gradient sum travels under gossip.codec unless cluster.site_codec is set, "
                                         "and 'sign' cannot be summed on the way"),
                       InputError);
  CHECK_THROWS_WITH_AS(config("int8", "", "site_replicas: true site_codec: \"topk\""),
                       doctest::Contains("cluster.site_codec: 'topk': use none, fp16, bf16, int8 or int4"), InputError);
  CHECK_NOTHROW(config("sign", "outer_codec: \"int8\"", "site_replicas: true site_codec: \"fp16\""));
  CHECK_NOTHROW(config("sign", "outer_codec: \"int4\""));  // the inner steps send nothing
  CHECK_NOTHROW(config("int4", "", "site_replicas: true"));
}

TEST_CASE("diloco: with outer_lr 1 and no momentum the outer step lands on the mean of the models: it is local_sgd") {
  // a <- a - 1 x mean(a - x_j) = mean(x_j): a flipped sign, a sum instead of a mean or a
  // stray momentum would land elsewhere. (diloco sums the deltas, local_sgd the models:
  // equal up to float rounding.)
  const ClusterResult d = run("diloco", "local_steps: 4 outer_lr: 1 outer_momentum: 0", 12);
  const ClusterResult l = run("local_sgd", "local_steps: 4", 12);
  REQUIRE(d.final_params.size() == 4);
  REQUIRE(l.final_params.size() == 4);
  double worst = 0, scale = 0;
  for (size_t k = 0; k < d.final_params[0].size(); ++k) {
    worst = std::max(worst, static_cast<double>(std::abs(d.final_params[0][k] - l.final_params[0][k])));
    scale = std::max(scale, static_cast<double>(std::abs(l.final_params[0][k])));
  }
  INFO("largest difference " << worst << " against a largest parameter of " << scale);
  CHECK(worst <= 1e-4 * scale);
  // And with outer_lr 0.5 it is not (the test can tell).
  const ClusterResult h = run("diloco", "local_steps: 4 outer_lr: 0.5 outer_momentum: 0", 12);
  double moved = 0;
  for (size_t k = 0; k < h.final_params[0].size(); ++k) {
    moved = std::max(moved, static_cast<double>(std::abs(h.final_params[0][k] - l.final_params[0][k])));
  }
  CHECK(moved > 100 * worst);
}
