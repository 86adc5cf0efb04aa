#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "hearsay/config.pb.h"
#include "hearsay/config.h"
#include "hearsay/error.h"
#include "test_util.h"

using namespace hearsay;

TEST_CASE("config: defaults apply to fields left out") {
  const auto c = parse_config("name: \"x\"\nmodel { hidden: [8] }\n", "t.textproto");
  CHECK(c.name() == "x");
  CHECK(c.device() == "cpu");
  CHECK(c.train().batch_size() == 64);
  CHECK(c.optim().lr() == doctest::Approx(0.05));
  CHECK(c.model().hidden_size() == 1);
}

TEST_CASE("config: an unknown field is reported with file, line and column") {
  CHECK_THROWS_WITH_AS(parse_config("name: \"x\"\ntrain {\n  batch_sise: 3\n}\n", "a.textproto"),
                       doctest::Contains("a.textproto:3:"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("name: \"x\"\ntrain {\n  batch_sise: 3\n}\n", "a.textproto"),
                       doctest::Contains("batch_sise"), InputError);
}

TEST_CASE("config: a mistyped value is reported where it is") {
  CHECK_THROWS_WITH_AS(parse_config("train { batch_size: \"big\" }", "b.textproto"), doctest::Contains("b.textproto:1:"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("model { kind: TRANSFORMER }", "c.textproto"), doctest::Contains("TRANSFORMER"),
                       InputError);
}

TEST_CASE("config: out-of-range values name the field and its line") {
  CHECK_THROWS_WITH_AS(parse_config("seed: 3\ntrain {\n  batch_size: 0\n}\n", "d.textproto"),
                       doctest::Contains("d.textproto:3:3: train.batch_size: must be in [1, 65536]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("model {\n  hidden: 16\n  hidden: -4\n}\n", "e.textproto"),
                       doctest::Contains("e.textproto:3:3: model.hidden[1]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { momentum: 1.5 }", "f"), doctest::Contains("optim.momentum"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("data { num_shards: 2 shard: 2 }", "g"), doctest::Contains("data.shard"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("data { format: LIBSVM }", "h"), doctest::Contains("train_path"), InputError);
}

TEST_CASE("config: optim.optimizer names the optimizer, which gets its hyper-parameters, and their checks name the place") {
  const auto sgd = optimizer_spec(parse_config("optim { lr: 0.1 momentum: 0.5 nesterov: true }", "a").optim());
  CHECK(sgd.name == "sgd");  // the default
  CHECK(sgd.momentum == doctest::Approx(0.5));
  CHECK(sgd.nesterov);
  const auto c = parse_config("optim {\n  optimizer: \"adamw\"\n  lr: 0.001\n  weight_decay: 0.1\n  beta2: 0.95\n}\n", "b");
  const auto p = optimizer_spec(c.optim());
  CHECK(p.name == "adamw");
  CHECK(p.weight_decay == doctest::Approx(0.1));
  CHECK(p.beta1 == doctest::Approx(0.9));  // the defaults: torch.optim.AdamW's
  CHECK(p.beta2 == doctest::Approx(0.95));
  CHECK(p.eps == doctest::Approx(1e-8));
  CHECK_THROWS_WITH_AS(parse_config("optim {\n  optimizer: \"adamw\"\n  beta1: 1.0\n}\n", "c.textproto"),
                       doctest::Contains("c.textproto:3:3: optim.beta1: must be in [0, 1), got 1"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { optimizer: \"adamw\" beta2: -0.1 }", "d.textproto"),
                       doctest::Contains("d.textproto:1:28: optim.beta2: must be in [0, 1)"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { optimizer: \"adamw\" eps: 0 }", "e.textproto"),
                       doctest::Contains("e.textproto:1:28: optim.eps: must be a positive number"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { optimizer: \"adamw\" nesterov: true }", "f.textproto"),
                       doctest::Contains("f.textproto:1:28: optim.nesterov: applies to optimizer sgd only"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { beta2: 0.95 }", "g.textproto"),
                       doctest::Contains("g.textproto:1:9: optim.beta2: applies to optimizer adamw only"), InputError);
  // An unknown name is refused at its place, with the names the registry knows.
  CHECK_THROWS_WITH_AS(parse_config("seed: 1\noptim {\n  optimizer: \"lion\"\n}\n", "h.textproto"),
                       doctest::Contains("h.textproto:3:3: optim.optimizer: unknown 'lion'; known optimizers: adamw, sgd"),
                       InputError);
  // --set switches a config to AdamW and is checked like the file.
  CHECK(optimizer_spec(parse_config("optim { lr: 0.1 momentum: 0.9 }", "i", {"optim { optimizer: \"adamw\" }"}).optim()).name ==
        "adamw");
  CHECK_THROWS_WITH_AS(parse_config("optim { lr: 0.1 }", "j.textproto", {"optim { optimizer: \"adamw\" eps: -1 }"}),
                       doctest::Contains("optim.eps: must be a positive number, got -1"), InputError);
}

TEST_CASE("config: the deprecated optim.kind still names the optimizer, and contradicting optim.optimizer is an error") {
  CHECK(optimizer_spec(parse_config("optim { kind: ADAMW lr: 0.001 }", "a").optim()).name == "adamw");
  CHECK(optimizer_spec(parse_config("optim { kind: SGD momentum: 0.5 }", "b").optim()).name == "sgd");
  // Saying the same thing twice is allowed.
  CHECK(optimizer_spec(parse_config("optim { kind: ADAMW optimizer: \"adamw\" }", "c").optim()).name == "adamw");
  // The checks follow the name the kind stands for.
  CHECK_THROWS_WITH_AS(parse_config("optim { kind: ADAMW nesterov: true }", "d.textproto"),
                       doctest::Contains("d.textproto:1:21: optim.nesterov: applies to optimizer sgd only"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim {\n  optimizer: \"sgd\"\n  kind: ADAMW\n}\n", "e.textproto"),
                       doctest::Contains("e.textproto:3:3: optim.kind: ADAMW (deprecated) stands for optimizer 'adamw', but "
                                         "optim.optimizer is 'sgd'; name the one you mean with optimizer alone"),
                       InputError);
  // An old command line's --set over a config that names its optimizer: refused at the override.
  CHECK_THROWS_WITH_AS(parse_config("optim { optimizer: \"sgd\" }", "f.textproto", {"optim { kind: ADAMW }"}),
                       doctest::Contains("optim.kind: ADAMW (deprecated) stands for optimizer 'adamw'"), InputError);
  // Read without validation (a message built in code), the conversion refuses it too.
  config::OptimConfig both;
  both.set_optimizer("adamw");
  both.set_kind(config::OptimConfig::SGD);
  CHECK_THROWS_WITH_AS(optimizer_name(both), doctest::Contains("optim.kind: SGD (deprecated) stands for optimizer 'sgd'"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { kind: ADAM }", "h.textproto"), doctest::Contains("ADAM"), InputError);
}

TEST_CASE("config: checks of nested and repeated fields give the line and column of the field itself") {
  // Once "cluster.gossip: choco: consensus_step ..." at the gossip block, or the first
  // site link for any site link's error; now the field that is wrong.
  const std::string cluster = "cluster {\n"                                            // 1
                              "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"  // 2
                              "  peers { name: \"b\" site: \"y\" address: \"h:2\"\n"    // 3
                              "          slowdown: 0.5 }\n";                              // 4
  CHECK_THROWS_WITH_AS(parse_config(cluster + "}\n", "p.textproto"),
                       doctest::Contains("p.textproto:4:11: cluster.peers[1].slowdown: must be >= 1"), InputError);
  const std::string two = "cluster {\n"
                          "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                          "  peers { name: \"b\" site: \"y\" address: \"h:2\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(two + "  gossip {\n    algorithm: \"choco\"\n    [hearsay.algorithms.choco] {\n    consensus_step: 2 }\n  }\n}\n", "q.textproto"),
                       doctest::Contains("q.textproto:7:5: cluster.gossip.[hearsay.algorithms.choco].consensus_step: must be in (0, 1]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config(two + "  gossip { codec {\n    name: \"topk\"\n      density: 0 } }\n}\n", "r.textproto"),
                       doctest::Contains("r.textproto:6:7: cluster.gossip.codec.density: must be in (0, 1]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config(two +
                                        "  site_links { site_a: \"x\" site_b: \"y\" link { latency_ms: 5 } }\n"
                                        "  site_links { site_a: \"y\" site_b: \"x\"\n"
                                        "    link { latency_ms: -5 } }\n}\n",
                                    "s.textproto"),
                       doctest::Contains("s.textproto:6:12: cluster.site_links[1].link.latency_ms: must be a finite number >= 0"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(two + "  site_links { site_a: \"x\" site_b: \"mars\" }\n}\n", "t.textproto"),
                       doctest::Contains("t.textproto:4:28: cluster.site_links[0].site_b: site 'mars' has no peer"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { momentum: 0 nesterov: true }\n", "u.textproto"),
                       doctest::Contains("u.textproto:1:21: optim.nesterov"), InputError);
  // A field the file leaves at its default has no line: the error names the file alone.
  CHECK_THROWS_WITH_AS(parse_config("optim { schedule: STEP }\n", "w.textproto"),
                       doctest::Contains("w.textproto: optim.step_size: must be >= 1"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("train {\n  epochs: 0\n}\n", "v.textproto"),
                       doctest::Contains("v.textproto:2:3: train.epochs"), InputError);
}

TEST_CASE("config: evaluation by the clock and by steps together is refused at its place") {
  CHECK_THROWS_WITH_AS(parse_config("train {\n  eval_every_steps: 10\n  eval_every_s: 2\n}\n", "e.textproto"),
                       doctest::Contains("e.textproto:3:3: train.eval_every_s: and eval_every_steps are both set"), InputError);
  CHECK_NOTHROW(parse_config("train { eval_every_s: 2 }\n", "ok.textproto"));
}

TEST_CASE("config: the guard, robust mixing and Byzantine fault injection are checked at their place") {
  const std::string two = "cluster {\n"
                          "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                          "  peers { name: \"b\" site: \"y\" address: \"h:2\" byzantine: \"loud\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(two + "}\n", "b.textproto"),
                       doctest::Contains("b.textproto:3:46: cluster.peers[1].byzantine: unknown 'loud'"), InputError);
  const std::string ok = "cluster {\n"
                         "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                         "  peers { name: \"b\" site: \"y\" address: \"h:2\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(ok + "  gossip { robust: \"median\" }\n}\n", "r.textproto"),
                       doctest::Contains("r.textproto:4:12: cluster.gossip.robust: unknown 'median'"), InputError);
  CHECK_THROWS_WITH_AS(parse_config(ok + "  gossip {\n    guard { max_norm_ratio: -1 } }\n}\n", "g.textproto"),
                       doctest::Contains("g.textproto:5:13: cluster.gossip.guard.max_norm_ratio"), InputError);
  CHECK_NOTHROW(parse_config(ok + "  gossip { robust: \"trimmed_mean\" guard { strikes: 0 } }\n}\n", "fine.textproto"));
}

TEST_CASE("config: so many epochs or steps that the step count would overflow are refused at load, with the place") {
  // 1e300 epochs once overflowed the step count: the run trained nothing, reported 0.00% and exited 0.
  CHECK_THROWS_WITH_AS(parse_config("model { hidden: [8] }\ntrain { epochs: 1e300 }\n", "e.textproto"),
                       doctest::Contains("e.textproto:2:9: train.epochs: must be in [0, 1e6], got 1e+300"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("train { epochs: inf }", "f.textproto"), doctest::Contains("f.textproto:1:9: train.epochs"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("train { max_steps: 9223372036854775807 }", "g.textproto"),
                       doctest::Contains("g.textproto:1:9: train.max_steps: must be in [0, 1e15]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("", "base", {"train { epochs: 2e6 }"}), doctest::Contains("--set #1:1:9: train.epochs"),
                       InputError);
  CHECK_NOTHROW(parse_config("train { epochs: 1e6 max_steps: 1000 }", "h.textproto"));
}

TEST_CASE("config: a directory given as the config file is refused, not read as an empty config") {
  test::TempDir dir;
  CHECK_THROWS_WITH_AS(load_config_file(dir.path()), doctest::Contains(("config " + dir.path() + ": is a directory").c_str()),
                       InputError);
  CHECK_THROWS_WITH_AS(load_config_file(dir.file("none.textproto")),
                       doctest::Contains(("config " + dir.file("none.textproto") + ": cannot open: No such file").c_str()), InputError);
  test::write_file(dir.file("ok.textproto"), "name: \"from-file\"\nmodel { kind: LOGREG }\ndata { format: SYNTHETIC }\n");
  CHECK(load_config_file(dir.file("ok.textproto")).name() == "from-file");
}

TEST_CASE("config: an empty file, or one that names neither a cluster nor a model and its data, is refused") {
  test::TempDir dir;
  for (const std::string text : {"", "# nothing\n", "name: \"x\"\n", "model { kind: LOGREG }\n", "data { format: SYNTHETIC }\n"}) {
    CAPTURE(text);
    test::write_file(dir.file("c.textproto"), text);
    CHECK_THROWS_WITH_AS(load_config_file(dir.file("c.textproto")),
                         doctest::Contains(("config " + dir.file("c.textproto") + ": sets neither cluster nor both model and data").c_str()),
                         InputError);
  }
  // What a --set adds counts: the model and data may come from the command line.
  test::write_file(dir.file("c.textproto"), "model { kind: LOGREG }\n");
  CHECK(load_config_file(dir.file("c.textproto"), {"data { format: SYNTHETIC }"}).model().kind() == config::ModelConfig::LOGREG);
}

TEST_CASE("config: a peer's name is letters, digits, '.', '_' and '-' (it names the peer's log file), at most 64 of them") {
  const std::string head = "cluster { peers { name: \"a\" address: \"127.0.0.1:1\" } peers { name: ";
  for (const std::string& bad : std::vector<std::string>{"\"../x\"", "\"a b\"", "\".a\"", "\"" + std::string(65, 'n') + "\""}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_config(head + bad + " address: \"127.0.0.1:2\" } }", "t.textproto"),
                         doctest::Contains("t.textproto:1:62: cluster.peers[1].name: '"), InputError);
  }
  CHECK(parse_config(head + "\"us-east_1.b\" address: \"127.0.0.1:2\" } }", "t.textproto").cluster().peers(1).name() == "us-east_1.b");
}

TEST_CASE("config: a cluster secret shorter than 16 bytes is refused, naming where it came from") {
  test::TempDir dir;
  config::ClusterConfig c;
  c.set_secret_file(dir.file("secret"));
  test::write_file(dir.file("secret"), "x\n");
  CHECK_THROWS_WITH_AS(load_cluster_secret(c), doctest::Contains(("cluster.secret_file '" + dir.file("secret") + "'").c_str()), InputError);
  CHECK_THROWS_WITH_AS(load_cluster_secret(c), doctest::Contains("1 bytes; it must have at least 16"), InputError);
  test::write_file(dir.file("secret"), "0123456789abcdef\n");  // 16 bytes; the newline is not part of it
  CHECK(load_cluster_secret(c) == "0123456789abcdef");

  config::ClusterConfig e;
  e.set_secret_env("HEARSAY_TEST_SHORT_SECRET");
  setenv("HEARSAY_TEST_SHORT_SECRET", "fifteen-bytes..", 1);
  CHECK_THROWS_WITH_AS(load_cluster_secret(e), doctest::Contains("cluster.secret_env: environment variable HEARSAY_TEST_SHORT_SECRET"),
                       InputError);
  setenv("HEARSAY_TEST_SHORT_SECRET", "sixteen-bytes...", 1);
  CHECK(load_cluster_secret(e) == "sixteen-bytes...");
  unsetenv("HEARSAY_TEST_SHORT_SECRET");
}

TEST_CASE("config: a missing file is an input error naming it") {
  CHECK_THROWS_WITH_AS(load_config_file("/nonexistent/x.textproto"), doctest::Contains("/nonexistent/x.textproto"), InputError);
}

TEST_CASE("config: every ready config in configs/ loads") {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HEARSAY_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    CAPTURE(entry.path().string());
    CHECK_NOTHROW(load_config_file(entry.path().string()));
    ++count;
  }
  CHECK(count >= 1);
}

TEST_CASE("config: the model spec follows the data's shape") {
  const auto c = parse_config("model { kind: CNN conv_channels: [4, 8] }", "m");
  Dataset images;
  images.height = images.width = 28;
  images.num_classes = 10;
  const ModelSpec s = model_spec(c.model(), images);
  CHECK(s.kind == ModelSpec::Kind::kCnn);
  CHECK(s.conv_channels == std::vector<int>{4, 8});
  Dataset flat;
  flat.channels = 123;
  flat.num_classes = 2;
  CHECK_THROWS_WITH_AS(model_spec(c.model(), flat), doctest::Contains("impossible model shape"), InputError);
}

TEST_CASE("config: --set fragments override the file and are checked like it") {
  const auto c = parse_config("train { batch_size: 32 epochs: 2 }\nmodel { hidden: [8] }", "base",
                              {"train { batch_size: 128 }", "device: \"cpu\""});
  CHECK(c.train().batch_size() == 128);
  CHECK(c.train().epochs() == doctest::Approx(2));
  CHECK_THROWS_WITH_AS(parse_config("train { batch_size: 32 }", "base", {"train { batch_size: -1 }"}),
                       doctest::Contains("--set #1:1:"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("", "base", {"trian { }"}), doctest::Contains("--set #1:1:"), InputError);
}

TEST_CASE("config: dpsgd on a directed topology, and a negative sgp overlap bound, are refused at their place") {
  const std::string four = "cluster {\n"
                           "  peers { name: \"a\" address: \"h:1\" }\n"
                           "  peers { name: \"b\" address: \"h:2\" }\n"
                           "  peers { name: \"c\" address: \"h:3\" }\n"
                           "  peers { name: \"d\" address: \"h:4\" }\n";
  // The one-peer exponential graph on 4 peers: 0 sends to 1 and 2, 1 to 2 and 3.
  CHECK_THROWS_WITH_AS(parse_config(four + "  gossip {\n    algorithm: \"dpsgd\"\n    topology: \"exponential\"\n  }\n}\n", "d.textproto"),
                       doctest::Contains("d.textproto:8:5: cluster.gossip.topology: dpsgd needs an undirected topology"),
                       InputError);
  for (const std::string undirected : {"ring", "torus", "complete", "star", "random"}) {
    CAPTURE(undirected);
    CHECK_NOTHROW(parse_config(four + "  gossip { algorithm: \"dpsgd\" topology: \"" + undirected + "\" }\n}\n", "ok.textproto"));
  }
  CHECK_NOTHROW(parse_config(four + "  gossip { algorithm: \"sgp\" topology: \"exponential\" [hearsay.algorithms.sgp] { overlap_tau: 4 } }\n}\n", "ok.textproto"));
  CHECK_THROWS_WITH_AS(parse_config(four + "  gossip { algorithm: \"sgp\"\n    [hearsay.algorithms.sgp] {\n    overlap_tau: -1 } }\n}\n", "t.textproto"),
                       doctest::Contains("t.textproto:8:5: cluster.gossip.[hearsay.algorithms.sgp].overlap_tau: must be >= 0"), InputError);
}

TEST_CASE("config: a gossip field that became an algorithm's option is an error that says where it went") {
  const std::string cluster = "cluster {\n  peers { name: \"a\" address: \"h:1\" }\n  peers { name: \"b\" address: \"h:2\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(cluster + "  gossip { algorithm: \"local_sgd\" local_steps: 4 }\n}\n", "old.textproto"),
                       doctest::Contains("'local_steps' is an option of delta_gossip, diloco, local_sgd or streaming_diloco now, "
                                         "set inside the gossip block as [hearsay.algorithms.delta_gossip] { local_steps: ... }"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("seed: 1", "s", {"cluster { gossip { consensus_step: 0.3 } }"}),
                       doctest::Contains("--set #1:1:"), InputError);
}

TEST_CASE("config: an absurd link latency, jitter, bandwidth or virtual time is refused at its place") {
  const std::string two = "cluster {\n"                                           // 1
                          "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"  // 2
                          "  peers { name: \"b\" site: \"y\" address: \"h:2\" }\n"; // 3
  // 1e308 ms was accepted, and a simulation over it never ended.
  CHECK_THROWS_WITH_AS(parse_config(two + "  default_link {\n    latency_ms: 1e308 }\n}\n", "l.textproto"),
                       doctest::Contains("l.textproto:5:5: cluster.default_link.latency_ms: must be a finite number >= 0 and at "
                                         "most 3600000 ms (an hour), got 1e+308"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(two + "  default_link { jitter_ms: inf }\n}\n", "j.textproto"),
                       doctest::Contains("j.textproto:4:18: cluster.default_link.jitter_ms: must be a finite number >= 0"), InputError);
  for (const std::string bad : {"1e300", "1e-300", "-1", "nan", "10000001"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_config(two + "  site_links { site_a: \"x\" site_b: \"y\"\n    link { bandwidth_mbps: " + bad + " } }\n}\n",
                                      "b.textproto"),
                         doctest::Contains("b.textproto:5:12: cluster.site_links[0].link.bandwidth_mbps: must be 0 (unlimited) or "
                                           "in [0.001, 1e7] Mbit/s"),
                         InputError);
  }
  for (const std::string fine : {"0", "0.001", "1e7"}) {
    CAPTURE(fine);
    CHECK_NOTHROW(parse_config(two + "  default_link { latency_ms: 3600000 jitter_ms: 5 bandwidth_mbps: " + fine + " }\n}\n", "ok"));
  }
  // A simulated site's access link, a fault's time and the run's virtual time, likewise.
  const std::string simulated = two + "}\nexperiment {\n  simulate: true\n  simulation {\n";  // simulation: line 7
  CHECK_THROWS_WITH_AS(parse_config(simulated + "    sites { site: \"x\" uplink_mbps: 1e12 }\n  }\n}\n", "s.textproto"),
                       doctest::Contains("s.textproto:8:23: experiment.simulation.sites[0].uplink_mbps: must be 0 (unlimited)"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(simulated + "    faults { peer: \"a\" for_s: 1e308 }\n  }\n}\n", "f.textproto"),
                       doctest::Contains("f.textproto:8:24: experiment.simulation.faults[0].for_s: must be in (0, 1e9] seconds"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(simulated + "    max_virtual_s: 1e300\n  }\n}\n", "v.textproto"),
                       doctest::Contains("v.textproto:8:5: experiment.simulation.max_virtual_s: must be in [0, 1e9] seconds"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("train {\n  emulated_step_s: 1e300 }\n", "t.textproto"),
                       doctest::Contains("t.textproto:2:3: train.emulated_step_s: must be a finite number >= 0 and at most 1e9 seconds"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("cluster {\n  peers { name: \"a\" address: \"h:1\" }\n  peers { name: \"b\" address: \"h:2\" slowdown: 1e300 }\n}\n",
                                    "w.textproto"),
                       doctest::Contains("w.textproto:3:36: cluster.peers[1].slowdown: must be >= 1 and at most 1e6, got 1e+300"),
                       InputError);
}

TEST_CASE("config: 100,000 simulated peers are refused at load by the memory estimate, before anything is allocated") {
  // They once allocated for 89 s and ended in std::bad_alloc (exit 1). The model makes the
  // estimate (21M parameters x 4 buffers a peer: 31 TiB) beyond any machine the tests run on.
  std::string text = "model { kind: MLP hidden: [4096, 4096] }\n"        // 1
                     "data { format: SYNTHETIC synthetic_dim: 1024 }\n"  // 2
                     "experiment { simulate: true }\n"                   // 3
                     "cluster {\n";                                      // 4
  text.reserve(4 << 20);
  for (int i = 0; i < 100000; ++i) {
    const std::string k = std::to_string(i);
    text += "  peers { name: \"p" + k + "\" address: \"h:" + k + "\" }\n";  // the first on line 5
  }
  text += "}\n";
  const auto start = std::chrono::steady_clock::now();
  std::string message;
  try {
    parse_config(text, "m.textproto");
  } catch (const InputError& e) {
    message = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(message);
  CHECK(message.find("m.textproto:5:3: cluster.peers: 100000 simulated peers need at least ") != std::string::npos);
  CHECK(message.find("21020682 parameters x 4 model-sized buffers") != std::string::npos);
  CHECK(message.find("; simulate fewer peers or a smaller model") != std::string::npos);
  // A parse of 4.5 MB and an estimate: a few tenths of a second in a release build (the
  // bound leaves room for a sanitized one).
  CHECK(seconds < 5.0);
}

TEST_CASE("config: a model no machine here can hold is refused at load, at the model or at the peers this machine runs") {
  // A 20B-parameter GPT (width 12288, 11 layers) with AdamW: 4 model-sized buffers of 80 GB,
  // beyond any machine the tests run on, refused before the data is read or anything made.
  const std::string big = "model { kind: GPT gpt { layers: 11 heads: 96 width: 12288 context: 128 } }\n"  // 1
                          "data { format: SYNTHETIC }\n"                                                   // 2
                          "optim { optimizer: \"adamw\" }\n";                                              // 3
  CHECK_THROWS_WITH_AS(parse_config(big, "big.textproto"),
                       doctest::Contains("big.textproto:1:1: model: a peer of this model needs at least "), InputError);
  CHECK_THROWS_WITH_AS(parse_config(big, "big.textproto"),
                       doctest::Contains("x 4 model-sized buffers: parameters, gradient, AdamW's two moments;"), InputError);
  // Checkpoints add their snapshot: a copy of the parameters and of AdamW's moments.
  CHECK_THROWS_WITH_AS(parse_config(big + "checkpoint { dir: \"/tmp/c\" }\n", "big.textproto"),
                       doctest::Contains("x 7 model-sized buffers: parameters, gradient, AdamW's two moments, the checkpoints' "
                                         "snapshot of the parameters and the optimizer's state;"),
                       InputError);
  // The 85M GPT fits alone; 8,000 of its peers at loopback addresses (hearsay-run starts them
  // all here) with diloco do not, and the error is at cluster.peers, counting diloco's own.
  std::string many = "model { kind: GPT gpt { layers: 12 heads: 12 width: 768 context: 128 } }\n"  // 1
                     "data { format: SYNTHETIC }\n"                                              // 2
                     "cluster { secret_env: \"S\" gossip { algorithm: \"diloco\" }\n";          // 3
  CHECK_NOTHROW(parse_config(many.substr(0, many.find("cluster")), "one.textproto"));
  for (int i = 0; i < 8000; ++i) {
    many += "  peers { name: \"p" + std::to_string(i) + "\" address: \"127.0.0.1:" + std::to_string(20000 + i) + "\" }\n";
  }
  many += "}\n";
  std::string message;
  try {
    parse_config(many, "many.textproto");
  } catch (const InputError& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("many.textproto:4:3: cluster.peers: 8000 peers on this machine (at loopback addresses) need at least ") !=
        std::string::npos);
  CHECK(message.find("2 of diloco's own, one model arriving, each") != std::string::npos);
}

TEST_CASE("config: a 10 MB name, or a name with a control byte, is refused at its place and not quoted back") {
  const std::string huge(10 << 20, 'n');
  std::string message;
  try {
    parse_config("seed: 1\nname: \"" + huge + "\"\n", "n.textproto");
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK(message.find("n.textproto:2:1: name: is 10485760 bytes long; a name has at most 128 bytes of printable ASCII") !=
        std::string::npos);
  CHECK(message.size() < 1000);
  CHECK_THROWS_WITH_AS(parse_config("name: \"runs/../../x\"", "d.textproto"),
                       doctest::Contains("d.textproto:1:1: name: 'runs/../../x' has a '/'"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("cluster {\n  id: \"a\\nb\"\n}\n", "i.textproto"),
                       doctest::Contains("i.textproto:2:3: cluster.id: has byte 0x0a at offset 1; a name is printable ASCII"),
                       InputError);
  const std::string two = "cluster {\n"
                          "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                          "  peers { name: \"b\" address: \"h:2\"\n"
                          "          site: \"" + std::string(129, 's') + "\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(two + "}\n", "s.textproto"),
                       doctest::Contains("s.textproto:4:11: cluster.peers[1].site: is 129 bytes long"), InputError);
  // A site link's sites are checked before they are quoted in "has no peer".
  const std::string ok = "cluster {\n"
                         "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                         "  peers { name: \"b\" site: \"y\" address: \"h:2\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(ok + "  site_links { site_a: \"x\" site_b: \"" + huge + "\" }\n}\n", "l.textproto"),
                       doctest::Contains("l.textproto:4:28: cluster.site_links[0].site_b: is 10485760 bytes long"), InputError);
  // Any other value quoted back in an error is cut to 64 bytes.
  message.clear();
  try {
    parse_config(ok + "  gossip { algorithm: \"" + huge + "\" }\n}\n", "a.textproto");
  } catch (const InputError& e) {
    message = e.what();
  }
  CHECK(message.find("a.textproto:4:12: cluster.gossip.algorithm: unknown 'nnnn") != std::string::npos);
  CHECK(message.find("... (10485760 bytes)'") != std::string::npos);
  CHECK(message.size() < 1000);
  CHECK(parse_config("name: \"" + std::string(128, 'n') + "\"", "ok").name().size() == 128);
}

TEST_CASE("config: site_codec or site_split without site_replicas is refused, saying it would be ignored") {
  const std::string cluster = "cluster {\n"
                              "  peers { name: \"a\" site: \"eu\" address: \"h:1\" }\n"
                              "  peers { name: \"b\" site: \"eu\" address: \"h:2\" }\n"
                              "  peers { name: \"c\" site: \"us\" address: \"h:3\" }\n";
  CHECK_THROWS_WITH_AS(parse_config(cluster + "  site_codec: \"fp16\"\n}\n", "c.textproto"),
                       doctest::Contains("c.textproto:5:3: cluster.site_codec: 'fp16' is set, but cluster.site_replicas is off, "
                                         "and only a site's gradient sum under site_replicas uses it: remove it, or set "
                                         "site_replicas: true"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(cluster + "  site_split: \"equal\"\n}\n", "s.textproto"),
                       doctest::Contains("s.textproto:5:3: cluster.site_split: 'equal' is set, but cluster.site_replicas is off"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config(cluster + "  site_replicas: false site_codec: \"\"\n}\n", "e.textproto"),
                       doctest::Contains("e.textproto:5:24: cluster.site_codec: '' is set"), InputError);
  CHECK_NOTHROW(parse_config(cluster + "  site_replicas: true site_codec: \"fp16\" site_split: \"equal\"\n}\n", "ok"));
  // A --set that turns site replicas on makes them apply.
  CHECK_NOTHROW(parse_config(cluster + "  site_codec: \"fp16\"\n}\n", "ok", {"cluster { site_replicas: true }"}));
}

TEST_CASE("config: an error in a block written twice keeps the line and column of the value it is about") {
  // Text format merges the two blocks; the error once lost its place, or named the first.
  CHECK_THROWS_WITH_AS(parse_config("train { epochs: 1 }\ntrain {\n  batch_size: 0\n}\n", "a.textproto"),
                       doctest::Contains("a.textproto:3:3: train.batch_size: must be in [1, 65536]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("train { batch_size: 3 }\ntrain { batch_size: 0 }\n", "b.textproto"),
                       doctest::Contains("b.textproto:2:9: train.batch_size: must be in [1, 65536], got 0"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { lr: 0.1 }\noptim { momentum: 0.5 }\noptim {\n  nesterov: true momentum: 0 }\n", "c.textproto"),
                       doctest::Contains("c.textproto:4:3: optim.nesterov: needs momentum > 0"), InputError);
  // A repeated field's elements count across the blocks, and across the --set fragments.
  const std::string two = "cluster {\n"
                          "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                          "}\n"
                          "cluster {\n"
                          "  peers { name: \"b\" site: \"y\" address: \"h:2\" slowdown: 0.5 }\n"
                          "}\n";
  CHECK_THROWS_WITH_AS(parse_config(two, "d.textproto"),
                       doctest::Contains("d.textproto:5:46: cluster.peers[1].slowdown: must be >= 1"), InputError);
  const std::string fine = "cluster {\n"
                           "  peers { name: \"a\" site: \"x\" address: \"h:1\" }\n"
                           "  peers { name: \"b\" site: \"y\" address: \"h:2\" }\n"
                           "  site_links { site_a: \"x\" site_b: \"y\" link { latency_ms: 5 } }\n"
                           "}\n";
  CHECK_THROWS_WITH_AS(parse_config(fine, "e.textproto", {"cluster { site_links { site_a: \"x\" site_b: \"x\" link { latency_ms: -1 } } }"}),
                       doctest::Contains("--set #1:1:55: cluster.site_links[1].link.latency_ms"), InputError);
  // The short form of a repeated field: each element at its value.
  CHECK_THROWS_WITH_AS(parse_config("model { hidden: [8, -4] }", "f.textproto"),
                       doctest::Contains("f.textproto:1:21: model.hidden[1]: width must be in [1, 65536]"), InputError);
}
