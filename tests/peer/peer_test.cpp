#include <doctest/doctest.h>

#include <cmath>
#include <sstream>

#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/config.pb.h"
#include "hearsay/config.h"
#include "hearsay/error.h"
#include "hearsay/peer.h"
#include "test_util.h"

using namespace hearsay;

namespace {

const char* kSynthetic = R"(
  name: "p"
  seed: 9
  model { kind: MLP hidden: [16] }
  data { format: SYNTHETIC synthetic_train: 2000 synthetic_test: 500 synthetic_dim: 20 num_classes: 4 }
  optim { lr: 0.05 momentum: 0.9 }
  train { batch_size: 32 epochs: 2 }
  log { every_steps: 10 }
)";

// The number after `key` in a log line, e.g. number_after(line, R"("t":)").
double number_after(const std::string& line, const std::string& key) {
  return std::stod(line.substr(line.find(key) + key.size()));
}

TrainResult train(const std::string& set = "", const std::string& log_path = "") {
  const auto cfg = parse_config(kSynthetic, "test", {set});
  EventLog log(log_path, cfg.name());
  Peer peer(peer_spec(cfg), log, nullptr);
  return peer.run();
}

}  // namespace

TEST_CASE("peer: the same seed gives a bit-identical loss curve on the CPU") {
  const TrainResult a = train(), b = train();
  REQUIRE(a.losses.size() == 125);  // 2 epochs * 2000 / 32
  CHECK(a.losses == b.losses);
  const TrainResult c = train("seed: 10");
  CHECK(a.losses != c.losses);
}

TEST_CASE("peer: training on separable data learns it") {
  const TrainResult r = train();
  CHECK(r.final_test_acc > 0.9);
  CHECK(r.losses.back() < r.losses.front());
}

TEST_CASE("peer: stops at max_steps and at the target accuracy") {
  CHECK(train("train { max_steps: 7 }").steps == 7);
  const TrainResult r = train("train { target_test_acc: 0.5 eval_every_steps: 5 }");
  REQUIRE(r.time_to_target_s.has_value());
  CHECK(r.steps < 125);
  CHECK(r.final_test_acc >= 0.5);
}

TEST_CASE("peer: restarted from a checkpoint at its last step, a peer evaluates the model it holds") {
  // It once took no step, evaluated nothing and reported 0.00%.
  test::TempDir dir;
  const std::string ckpt = "checkpoint { dir: \"" + dir.file("ckpt") + "\" }";
  const TrainResult first = train(ckpt);
  REQUIRE(first.steps == 125);
  REQUIRE(first.final_test_acc > 0.9);
  const TrainResult again = train(ckpt, dir.file("again.jsonl"));
  CHECK(again.steps == 125);
  CHECK(again.losses.empty());
  CHECK(again.final_test_acc == first.final_test_acc);
  CHECK(again.final_test_loss == first.final_test_loss);
  const std::string log = test::read_file(dir.file("again.jsonl"));
  CHECK(log.find(R"("event":"resume","step":125)") != std::string::npos);
  CHECK(log.find(R"("event":"eval","step":125)") != std::string::npos);
}

TEST_CASE("peer: with AdamW, a run resumed from a checkpoint halfway takes the same steps as one run straight through") {
  // The second half's losses match bit for bit only if the moments and the step count
  // (the bias correction) came back with the parameters and the sampler.
  test::TempDir dir;
  const std::string ckpt = " checkpoint { dir: \"" + dir.file("ckpt") + "\" }";
  auto adamw = [](int steps) {
    return "optim { optimizer: \"adamw\" lr: 0.01 weight_decay: 0.01 } train { batch_size: 32 epochs: 2 max_steps: " + std::to_string(steps) + " }";
  };
  const TrainResult straight = train(adamw(100));
  REQUIRE(straight.losses.size() == 100);
  CHECK(straight.final_test_acc > 0.9);
  CHECK(straight.losses != train("optim { lr: 0.01 } train { max_steps: 100 }").losses);  // SGD's differ
  const TrainResult first = train(adamw(40) + ckpt);
  REQUIRE(first.losses.size() == 40);
  CHECK(std::vector<double>(straight.losses.begin(), straight.losses.begin() + 40) == first.losses);
  const TrainResult second = train(adamw(100) + ckpt, dir.file("second.jsonl"));
  CHECK(test::read_file(dir.file("second.jsonl")).find(R"("event":"resume","step":40)") != std::string::npos);
  REQUIRE(second.losses.size() == 60);
  CHECK(std::vector<double>(straight.losses.begin() + 40, straight.losses.end()) == second.losses);
  CHECK(second.final_test_acc == straight.final_test_acc);
  // The same checkpoint under SGD is refused as another run's, naming both optimizers.
  CHECK_THROWS_WITH_AS(train("train { max_steps: 200 }" + ckpt),
                       doctest::Contains("not this run's checkpoint: it was trained under another config (its optim differs "
                                         "from this config's; optimizer 'adamw' there, 'sgd' here)"),
                       InputError);
}

TEST_CASE("peer: the log has start, step, eval and end events with the documented fields") {
  test::TempDir dir;
  train("", dir.file("p.jsonl"));
  const std::string log = test::read_file(dir.file("p.jsonl"));
  CHECK(log.find(R"("event":"start")") != std::string::npos);
  for (const char* field : {R"("event":"step","step":10,"epoch":)", R"("loss":)", R"("lr":)", R"("samples_per_s":)",
                            R"("event":"eval")", R"("test_acc":)", R"("test_loss":)", R"("event":"end")"}) {
    CAPTURE(field);
    CHECK(log.find(field) != std::string::npos);
  }
}

// The share of each class among the samples a peer of `data_set` trained on: its sampler's
// order of its shard, as the checkpoint it wrote at its end records it.
std::vector<double> classes_trained_on(const std::string& data_set, const test::TempDir& dir, const std::string& name) {
  const auto cfg = parse_config(kSynthetic, "test",
                                {data_set, "name: \"" + name + "\" train { max_steps: 1 } checkpoint { dir: \"" + dir.path() + "\" }"});
  PeerSpec spec = peer_spec(cfg);
  const std::vector<int32_t> labels = spec.data.train.labels;
  EventLog log("", cfg.name());
  Peer(std::move(spec), log, nullptr).run();
  const auto c = read_checkpoint(dir.file(name + ".ckpt"), 1 << 26);
  REQUIRE(c.has_value());
  REQUIRE(c->sampler_order_size() > 0);
  std::vector<double> share(4, 0.0);
  for (const int64_t i : c->sampler_order()) share.at(static_cast<size_t>(labels.at(static_cast<size_t>(i)))) += 1.0;
  for (double& v : share) v /= c->sampler_order_size();
  return share;
}

// Total variation distance between two class distributions: 0 for the same, 1 for disjoint.
double total_variation(const std::vector<double>& a, const std::vector<double>& b) {
  double d = 0;
  for (size_t k = 0; k < a.size(); ++k) d += std::abs(a[k] - b[k]);
  return d / 2;
}

TEST_CASE("peer: shards of a non-IID split train on different data") {
  // The classes each peer's samples hold: under Dirichlet(0.1) over 4 shards, each shard is
  // mostly one or two classes; an IID split (the control, with which a check of the loss
  // curves alone passed too: the sampler's seed differs by shard) gives every shard about
  // the whole set's even mix.
  test::TempDir dir;
  const std::string dirichlet = "data { partition: DIRICHLET dirichlet_alpha: 0.1 num_shards: 4 shard: ";
  const std::string iid = "data { partition: IID num_shards: 4 shard: ";
  const double non_iid_apart = total_variation(classes_trained_on(dirichlet + "0 }", dir, "d0"),
                                               classes_trained_on(dirichlet + "1 }", dir, "d1"));
  const double iid_apart = total_variation(classes_trained_on(iid + "0 }", dir, "i0"), classes_trained_on(iid + "1 }", dir, "i1"));
  MESSAGE("class distributions of shards 0 and 1 apart (total variation): Dirichlet(0.1) " << non_iid_apart << ", IID "
                                                                                            << iid_apart);
  CHECK(non_iid_apart > 0.5);
  CHECK(iid_apart < 0.1);
}

TEST_CASE("peer: with eval_every_s, evaluations follow the clock, not the step count") {
  test::TempDir dir;
  // 200 epochs: long enough for several 5 ms slots even when the run is descheduled
  // (60 once gave 2 evaluations beside other tests).
  train("train { epochs: 200 eval_every_s: 0.005 }", dir.file("clock.jsonl"));
  // When each evaluation began: its event is written after it ran (t), and says how long
  // it took (eval_s); on a loaded machine (a sanitizer build) an evaluation may outlast a
  // 5 ms slot, so its end says nothing about when it was due.
  std::vector<double> times;
  std::istringstream log(test::read_file(dir.file("clock.jsonl")));
  // The slots are those of Unix time, which every peer of a cluster shares: the start
  // event's unix_time places the log's t on it.
  double unix_at_t0 = 0;
  for (std::string line; std::getline(log, line);) {
    if (line.find(R"("event":"start")") != std::string::npos) {
      unix_at_t0 = number_after(line, R"("unix_time":)") - number_after(line, R"("t":)");
    }
    if (line.find(R"("event":"eval")") == std::string::npos) continue;
    times.push_back(number_after(line, R"("t":)") - number_after(line, R"("eval_s":)"));
  }
  REQUIRE(times.size() >= 3);
  REQUIRE(unix_at_t0 > 1e9);
  // Each evaluation but the last (at the end) begins in its own 5 ms slot of Unix time (the
  // 1 ms allows for the moment between the decision and the start crossing a slot's edge).
  for (size_t i = 0; i + 2 < times.size(); ++i) {
    CHECK(std::floor((unix_at_t0 + times[i + 1]) / 0.005) > std::floor((unix_at_t0 + times[i] - 0.001) / 0.005));
  }
  // The first at least one period after the start.
  CHECK(times.front() >= 0.005 - 0.001);
}

TEST_CASE("peer: with emulated_eval_s, every evaluation takes that long on the real clock, and longer ones are counted") {
  test::TempDir dir;
  // 2 epochs of 63 steps, an evaluation at the end of each: 2 of them, each padded to 50 ms
  // (the real scoring of 500 rows takes well under 1 ms).
  train("train { emulated_eval_s: 0.05 }", dir.file("padded.jsonl"));
  std::istringstream log(test::read_file(dir.file("padded.jsonl")));
  int evals = 0;
  for (std::string line; std::getline(log, line);) {
    if (line.find(R"("event":"eval")") != std::string::npos) {
      ++evals;
      CHECK(number_after(line, R"("eval_s":)") >= 0.05);
    }
    if (line.find(R"("event":"end")") != std::string::npos) {
      CHECK(number_after(line, R"("emulated_eval_s":)") == doctest::Approx(0.05));
      CHECK(number_after(line, R"("eval_overruns":)") == 0);
    }
  }
  CHECK(evals == 2);
  // An emulated time no evaluation can meet: every one is counted as an overrun.
  train("train { emulated_eval_s: 1e-9 }", dir.file("short.jsonl"));
  const std::string short_log = test::read_file(dir.file("short.jsonl"));
  CHECK(short_log.find(R"("eval_overruns":2)") != std::string::npos);
}

TEST_CASE("peer: peers that started at different moments evaluate at the same moments of the shared clock") {
  // Two peers started 0.5 s apart, evaluating every second, each checking after every
  // 10 ms step: from the first whole second both may evaluate in, they are due together.
  EvalCadence a(1.0, 1000.30), b(1.0, 1000.80);
  std::vector<double> due_a, due_b;
  for (int k = 80; k < 600; ++k) {
    const double now = 1000 + k / 100.0;
    if (a.due(now)) due_a.push_back(now);
    if (b.due(now + 0.004)) due_b.push_back(now);
  }
  REQUIRE(due_a.size() >= 4);
  CHECK(due_a.front() >= 1001.30 - 1e-9);  // at least a period after its start
  CHECK(due_b.front() >= 1001.80 - 1e-9);
  // b's first is at 1002, a's at 1002 too (its first whole second after 1001.3), and then
  // every second for both.
  CHECK(due_a == std::vector<double>{1002, 1003, 1004, 1005});
  CHECK(due_b == due_a);
  // Off: never due.
  EvalCadence off(0, 1000);
  CHECK_FALSE(off.due(5000));
}
