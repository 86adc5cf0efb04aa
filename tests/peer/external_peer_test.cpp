// The external peer alone, in C++: a framework's loop (here a native model driven by
// hand, as the PyTorch front end drives torch's) pushes its steps into an ExternalPeer.
// Both peer loops record their runs through one StepLedger, so the same config, data and
// model must give the native peer's events, value for value.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "hearsay/config.h"
#include "hearsay/error.h"
#include "hearsay/external_peer.h"
#include "hearsay/peer.h"
#include "test_util.h"

using namespace hearsay;
using nlohmann::json;

namespace {

// Evaluations every 10 steps and at the end (24 steps: the last is not a multiple), step
// events every 4, an emulated evaluation time.
const char* kConfig = R"(
  name: "solo"
  seed: 5
  model { kind: MLP hidden: [16] }
  data { format: SYNTHETIC synthetic_train: 512 synthetic_test: 256 synthetic_dim: 8 num_classes: 3
         synthetic_separation: 0.8 }
  optim { lr: 0.1 momentum: 0.5 schedule: COSINE }
  train { batch_size: 16 max_steps: 24 eval_every_steps: 10 emulated_eval_s: 0.001 }
  log { every_steps: 4 }
)";

std::vector<json> events(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(json::parse(line));
  }
  return out;
}

// The events without what measures this machine's time, and without the memory events:
// a framework's peer holds other buffers (its optimizer's state is the framework's).
std::vector<json> without_times(const std::vector<json>& evs) {
  std::vector<json> out;
  for (auto e : evs) {
    if (e["event"] == "memory") continue;
    for (const char* k : {"t", "unix_time", "samples_per_s", "train_s", "eval_s", "time_to_target_s", "model", "compute_s",
                        "compute_utilisation"}) e.erase(k);
    out.push_back(std::move(e));
  }
  return out;
}

// The first memory event of a log.
json first_memory(const std::vector<json>& evs) {
  for (const auto& e : evs) {
    if (e["event"] == "memory") return e;
  }
  return json();
}

// One run of the config, extended by `extra`, by each loop; the events of both, times left out.
struct BothLoops {
  std::vector<json> native, external;
  json native_memory, external_memory;  // each loop's first memory event
  int evals = 0;  // evaluations the external peer asked its framework for
};

BothLoops run_both(const std::string& extra) {
  test::TempDir dir;
  const std::string config = dir.file("solo.textproto");
  const std::string text = std::string(kConfig) + extra;
  test::write_file(config, text);
  BothLoops out;

  // The native loop.
  {
    EventLog log(dir.file("native.jsonl"), "solo");
    Peer p(peer_spec(parse_config(text, config, {})), log, nullptr);
    p.run();
  }

  // The framework's loop: its own copy of the same model, stepped by hand.
  ExternalPeerOptions o;
  o.config_path = config;
  o.log_path = dir.file("external.jsonl");
  o.quiet = true;
  ExternalPeer ext(o);
  const PeerSpec& spec = ext.spec();
  auto backend = create_backend("cpu");
  const int batch = spec.train.batch_size;
  auto model = create_model(spec.model, *backend, std::max(batch, spec.train.eval_batch_size), spec.seed);
  auto optimizer = create_optimizer(*backend, model->num_params(), spec.optimizer);
  ExternalModel m;
  m.params = model->params();
  m.grads = model->grads();
  m.num_params = model->num_params();
  m.views = model->param_views();
  m.optimizer_step = [&](float lr) { optimizer->step(model->params(), model->grads(), lr); };
  ext.attach(std::move(m));
  const Dataset& train = ext.data().train;
  const Dataset& test = ext.data().test;
  std::vector<float> x(static_cast<size_t>(batch) * train.dim());
  std::vector<int32_t> y(static_cast<size_t>(batch));
  while (ext.running()) {
    ext.next_batch(batch, x.data(), nullptr, y.data());
    const BatchStats s = model->forward_backward(Batch{x.data(), y.data(), batch});
    ext.step({s.loss_sum, s.correct, s.count}, ext.scheduled_lr());
    if (!ext.eval_due()) continue;
    BatchStats total;
    for (int64_t start = 0; start < test.size; start += spec.train.eval_batch_size) {
      const int n = static_cast<int>(std::min<int64_t>(spec.train.eval_batch_size, test.size - start));
      const BatchStats e = model->evaluate(Batch{test.row(start), test.labels.data() + start, n});
      total.loss_sum += e.loss_sum;
      total.correct += e.correct;
      total.count += e.count;
    }
    ext.record_eval(total.accuracy(), total.loss());
    ++out.evals;
  }
  ext.finish();
  const auto native = events(dir.file("native.jsonl")), external = events(dir.file("external.jsonl"));
  out.native = without_times(native);
  out.external = without_times(external);
  out.native_memory = first_memory(native);
  out.external_memory = first_memory(external);
  return out;
}

// How many events of `kind` the log has.
int count(const std::vector<json>& evs, const std::string& kind) {
  return static_cast<int>(std::count_if(evs.begin(), evs.end(), [&](const json& e) { return e["event"] == kind; }));
}

// A framework's model of one flat tensor whose optimizer does nothing.
ExternalModel flat_model(std::vector<float>& params, std::vector<float>& grads) {
  ExternalModel m;
  m.params = params.data();
  m.grads = grads.data();
  m.num_params = params.size();
  m.views = {ParamView{"w", 0, params.size(), {static_cast<int>(params.size())}}};
  m.optimizer_step = [](float) {};
  return m;
}

}  // namespace

TEST_CASE("external peer alone: the same config, data and model give the native peer's start, step, eval and end events") {
  // To the last step; then with a target that ends the run (alone) at its first evaluation.
  for (const std::string extra : {"", "train { target_test_acc: 0.5 }"}) {
    CAPTURE(extra);
    const BothLoops r = run_both(extra);
    REQUIRE(r.native.size() == r.external.size());
    for (size_t i = 0; i < r.native.size(); ++i) {
      CAPTURE(i);
      CHECK(r.native[i].dump() == r.external[i].dump());
    }
    // Both account for the model, 8 bytes a parameter (value and gradient); the native
    // peer's backend also holds SGD's momentum (4) and its activations.
    REQUIRE(r.native_memory.is_object());
    REQUIRE(r.external_memory.is_object());
    CHECK(r.native_memory["host"]["model"] == r.external_memory["host"]["model"]);
    CHECK(r.native_memory["host"]["optimizer"] == r.native_memory["host"]["model"].get<int64_t>() / 2);
    REQUIRE(!r.native.empty());
    const json& end = r.native.back();
    CHECK(end["event"] == "end");
    if (extra.empty()) {
      CHECK(r.evals == 3);  // steps 10, 20 and the last, 24
      CHECK(count(r.native, "step") == 6);
      CHECK(end["steps"] == 24);
      CHECK_FALSE(end.contains("steps_to_target"));
    } else {
      CHECK(r.evals == 1);
      CHECK(end["steps"] == 10);
      CHECK(end["steps_to_target"] == 10);  // both loops say at which step it was reached
    }
  }
}

TEST_CASE("external peer alone: a diverged step, a stop and a bad evaluation are said as the native peer says them") {
  test::TempDir dir;
  const std::string config = dir.file("solo.textproto");
  test::write_file(config, kConfig);
  ExternalPeerOptions o;
  o.config_path = config;
  o.log_path = dir.file("external.jsonl");
  o.quiet = true;
  ExternalPeer ext(o);
  std::vector<float> params(10, 0.0f), grads(10, 0.0f);
  ext.attach(flat_model(params, grads));
  CHECK_THROWS_WITH_AS(ext.record_eval(1.5, 0.1), doctest::Contains("not a fraction in [0, 1]"), InputError);
  ext.step({1.0, 1, 16}, 0.1f);
  ext.stop();
  CHECK_FALSE(ext.running());
  ext.finish();
  auto evs = events(dir.file("external.jsonl"));
  REQUIRE(!evs.empty());
  CHECK(evs.back()["event"] == "end");
  CHECK(evs.back()["steps"] == 1);
  CHECK(evs.back()["stopped"] == true);  // a stopped run says so, as the native peer's end does

  ExternalPeerOptions o2 = o;
  o2.log_path = dir.file("diverged.jsonl");
  ExternalPeer bad(o2);
  bad.attach(flat_model(params, grads));
  CHECK_THROWS_WITH_AS(bad.step({std::nan(""), 0, 16}, 0.1f),
                       doctest::Contains("training diverged at step 0 (loss is not finite) with no neighbour's update"),
                       InputError);
  CHECK(events(dir.file("diverged.jsonl")).back()["event"] == "diverged");
}
