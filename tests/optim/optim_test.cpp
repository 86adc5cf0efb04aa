#include "hearsay/optim.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "hearsay/error.h"

using namespace hearsay;

TEST_CASE("schedule: constant, step and cosine give the documented rates") {
  LrSchedule s;
  s.base_lr = 0.1f;
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(1000) == doctest::Approx(0.1));
  s.kind = LrSchedule::Kind::kStep;
  s.step_size = 10;
  s.gamma = 0.5f;
  CHECK(s.at(9) == doctest::Approx(0.1));
  CHECK(s.at(10) == doctest::Approx(0.05));
  CHECK(s.at(25) == doctest::Approx(0.025));
  s.kind = LrSchedule::Kind::kCosine;
  s.total_steps = 100;
  s.min_lr = 0.01f;
  CHECK(s.at(0) == doctest::Approx(0.1));
  CHECK(s.at(50) == doctest::Approx(0.055));
  CHECK(s.at(100) == doctest::Approx(0.01));
  CHECK(s.at(500) == doctest::Approx(0.01));
}

TEST_CASE("schedule: linear warm-up ramps to the base rate, then the schedule starts") {
  LrSchedule s;
  s.base_lr = 1.0f;
  s.warmup_steps = 4;
  s.kind = LrSchedule::Kind::kCosine;
  s.total_steps = 14;
  CHECK(s.at(0) == doctest::Approx(0.25));
  CHECK(s.at(3) == doctest::Approx(1.0));
  CHECK(s.at(4) == doctest::Approx(1.0));
  CHECK(s.at(9) == doctest::Approx(0.5));
  CHECK(s.at(14) == doctest::Approx(0.0));
}

namespace {

std::unique_ptr<Optimizer> sgd(Backend& b, size_t n, float momentum, bool nesterov) {
  OptimizerSpec spec;
  spec.momentum = momentum;
  spec.nesterov = nesterov;
  return create_optimizer(b, n, spec);
}

std::unique_ptr<Optimizer> adamw(Backend& b, size_t n, float weight_decay) {
  OptimizerSpec spec;
  spec.name = "adamw";
  spec.weight_decay = weight_decay;
  return create_optimizer(b, n, spec);  // beta1 0.9, beta2 0.999, eps 1e-8
}

}  // namespace

TEST_CASE(
    "registry: hearsay's optimizers by name, and an unknown name or a bad hyper-parameter is refused, "
    "naming it") {
  auto b = create_backend("cpu", 1);
  const auto names = optimizers().names();
  REQUIRE(names.size() >= 2);
  CHECK(std::is_sorted(names.begin(), names.end()));
  CHECK(std::count(names.begin(), names.end(), "sgd") == 1);
  CHECK(std::count(names.begin(), names.end(), "adamw") == 1);
  CHECK(sgd(*b, 3, 0.9f, false)->name() == "sgd");
  CHECK(adamw(*b, 3, 0.0f)->name() == "adamw");
  OptimizerSpec spec;
  spec.name = "adam";
  CHECK_THROWS_WITH_AS(create_optimizer(*b, 3, spec),
                       doctest::Contains("optimizer 'adam': unknown; use adamw, sgd"),
                       InputError);
  CHECK_THROWS_WITH_AS(sgd(*b, 3, 1.0f, false),
                       doctest::Contains("optimizer 'sgd': momentum must be in [0, 1), got 1"),
                       InputError);
  CHECK_THROWS_WITH_AS(sgd(*b, 3, 0.0f, true),
                       doctest::Contains("optimizer 'sgd': nesterov needs momentum > 0"),
                       InputError);
  spec.name = "adamw";
  spec.beta2 = 1.0f;
  CHECK_THROWS_WITH_AS(create_optimizer(*b, 3, spec),
                       doctest::Contains("optimizer 'adamw': beta2 must be in [0, 1), got 1"),
                       InputError);
  spec.beta2 = 0.999f;
  spec.eps = 0.0f;
  CHECK_THROWS_WITH_AS(create_optimizer(*b, 3, spec),
                       doctest::Contains("optimizer 'adamw': eps must be a positive number"),
                       InputError);
  spec.eps = 1e-8f;
  spec.nesterov = true;
  CHECK_THROWS_WITH_AS(create_optimizer(*b, 3, spec),
                       doctest::Contains("optimizer 'adamw': nesterov applies to sgd only"),
                       InputError);
}

namespace {

// An optimizer from outside src/optim, as a program would add one: sign descent, w -=
// lr * sign(g), on the host (the CPU backend's pointers are host memory).
class SignDescent final : public Optimizer {
 public:
  explicit SignDescent(size_t n) : n_(n) {}
  const std::string& name() const override { return name_; }
  void step(float* w, const float* g, float lr) override {
    for (size_t i = 0; i < n_; ++i) w[i] -= lr * static_cast<float>((g[i] > 0) - (g[i] < 0));
    ++steps_;
  }
  int64_t steps() const override { return steps_; }
  OptimizerState save_state() const override { return {name_, steps_, {}}; }
  void load_state(const OptimizerState& s, const std::string& where) override {
    if (s.optimizer != name_) throw InputError(where + ": not sign descent's state");
    steps_ = s.steps;
  }

 private:
  std::string name_ = "test_sign_descent";
  size_t n_;
  int64_t steps_ = 0;
};

}  // namespace

TEST_CASE(
    "registry: a program adds its own optimizer, which the registry then makes by name like "
    "hearsay's own") {
  auto b = create_backend("cpu", 1);
  optimizers().add("test_sign_descent", [](Backend&, size_t n, const OptimizerSpec&) {
    return std::make_unique<SignDescent>(n);
  });
  const auto names = optimizers().names();
  CHECK(std::count(names.begin(), names.end(), "test_sign_descent") == 1);
  CHECK_THROWS_AS(optimizers().add("test_sign_descent", [](Backend&, size_t n, const OptimizerSpec&) {
                                       return std::make_unique<SignDescent>(n);
                                     }),
                  std::logic_error);
  CHECK_THROWS_AS(optimizers().add("sgd",
                                     [](Backend&, size_t n, const OptimizerSpec&) {
                                       return std::make_unique<SignDescent>(n);
                                     }),
                  std::logic_error);
  OptimizerSpec spec;
  spec.name = "test_sign_descent";
  const auto opt = create_optimizer(*b, 2, spec);
  std::vector<float> w{1.0f, 1.0f};
  const std::vector<float> g{0.5f, -3.0f};
  opt->step(w.data(), g.data(), 0.25f);
  CHECK(w == std::vector<float>{0.75f, 1.25f});
  CHECK(opt->save_state().optimizer == "test_sign_descent");
}

TEST_CASE("sgd: momentum minimises a quadratic, Nesterov included") {
  auto b = create_backend("cpu", 1);
  for (bool nesterov : {false, true}) {
    const auto opt = sgd(*b, 2, 0.9f, nesterov);
    std::vector<float> w{3.0f, -2.0f}, g(2);
    for (int i = 0; i < 300; ++i) {
      g[0] = 2 * w[0];  // f = w0^2 + 4 w1^2
      g[1] = 8 * w[1];
      opt->step(w.data(), g.data(), 0.05f);
    }
    CHECK(std::abs(w[0]) < 1e-3);
    CHECK(std::abs(w[1]) < 1e-3);
  }
}

TEST_CASE("sgd: each step is the backend's sgd_update with the step's rate, bit for bit") {
  // The optimizer adds nothing to the kernel's arithmetic: a run through it and a run of
  // the kernel by hand agree exactly, with weight decay, for both momentum rules and none.
  auto b = create_backend("cpu", 1);
  for (float momentum : {0.0f, 0.9f}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && momentum == 0) continue;
      CAPTURE(momentum);
      CAPTURE(nesterov);
      OptimizerSpec spec;
      spec.momentum = momentum;
      spec.nesterov = nesterov;
      spec.weight_decay = 1e-3f;
      const auto opt = create_optimizer(*b, 3, spec);
      std::vector<float> w{0.5f, -1.5f, 2.0f}, by_hand = w, velocity(3, 0.0f);
      for (int s = 0; s < 5; ++s) {
        const std::vector<float> g{std::sin(float(s)), 0.1f * float(s), -0.7f};
        const float lr = 0.1f / float(s + 1);
        opt->step(w.data(), g.data(), lr);
        b->sgd_update(by_hand.data(), g.data(), momentum == 0 ? nullptr : velocity.data(), 3,
                      SgdParams{lr, momentum, 1e-3f, nesterov});
      }
      CHECK(w == by_hand);
      CHECK(opt->steps() == 5);
      const OptimizerState s = opt->save_state();
      CHECK(s.buffers.count("velocity") == (momentum == 0 ? 0u : 1u));
      if (momentum != 0) CHECK(s.buffers.at("velocity") == velocity);
    }
  }
}

TEST_CASE(
    "adamw: three steps match a hand-computed reference, bias correction and decoupled decay "
    "included") {
  // Reference: torch.optim.AdamW's rule in float64 (a short Python script):
  //   w *= 1 - lr*wd;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
  //   w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
  // Step 1 by hand, w = 1, g = 0.5, lr = 0.1, wd = 0.5: decay gives 0.95; m/c1 = 0.5 and
  // sqrt(v/c2) = 0.5, so the update is lr * 1 = 0.1 and w = 0.85. Without the bias
  // correction the update would be lr * 0.05 / sqrt(0.00025) = 0.316.
  // The third parameter's gradient is always 0: decoupled decay shrinks it by (1 - lr*wd)
  // per step (0.475, 0.463125, 0.43996875), while decay coupled into the gradient (Adam
  // with L2) would move it by about lr per step (0.4, 0.3506, 0.2529).
  auto b = create_backend("cpu", 1);
  const auto opt = adamw(*b, 3, 0.5f);
  REQUIRE(opt->name() == "adamw");
  std::vector<float> w{1.0f, -2.0f, 0.5f};
  const std::vector<std::vector<float>> grads{
      {0.5f, -0.25f, 0.0f}, {-0.1f, 0.3f, 0.0f}, {0.2f, 0.2f, 0.0f}};
  const float lrs[] = {0.1f, 0.05f, 0.1f};  // step() takes the schedule's rate
  const double want_w[3][3] = {{0.850000002, -1.8, 0.475},
                               {0.803198699, -1.76214724, 0.463125},
                               {0.702922771, -1.71300941, 0.43996875}};
  const double want_m[3][3] = {{0.05, -0.025, 0}, {0.035, 0.0075, 0}, {0.0515, 0.02675, 0}};
  const double want_v[3][3] = {
      {0.00025, 6.25e-05, 0}, {0.00025975, 0.0001524375, 0}, {0.00029949025, 0.000192285063, 0}};
  const double coupled_w[3][3] = {{0.900000001, -1.9, 0.400000004},
                                  {0.85608295, -1.85310658, 0.350593716},
                                  {0.765094431, -1.7593847, 0.252910528}};
  for (int t = 0; t < 3; ++t) {
    CAPTURE(t + 1);
    opt->step(w.data(), grads[t].data(), lrs[t]);
    CHECK(opt->steps() == t + 1);
    const OptimizerState s = opt->save_state();
    REQUIRE(s.buffers.size() == 2);  // m and v; no velocity
    const auto& m = s.buffers.at("m");
    const auto& v = s.buffers.at("v");
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(w[i] == doctest::Approx(want_w[t][i]).epsilon(1e-6));
      CHECK(std::abs(w[i] - coupled_w[t][i]) > 0.04);  // the coupled rule is far off
      CHECK(m[i] == doctest::Approx(want_m[t][i]).epsilon(1e-6));
      CHECK(v[i] == doctest::Approx(want_v[t][i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("adamw: without weight decay a zero gradient leaves a weight where it is") {
  auto b = create_backend("cpu", 1);
  const auto opt = adamw(*b, 2, 0.0f);
  std::vector<float> w{0.75f, -3.0f};
  const std::vector<float> g{0.0f, 1.0f};
  for (int i = 0; i < 10; ++i) opt->step(w.data(), g.data(), 0.01f);
  CHECK(w[0] == 0.75f);
  // A constant gradient moves the other by lr per step (m/c1 = g, sqrt(v/c2) = |g|).
  CHECK(w[1] == doctest::Approx(-3.1).epsilon(1e-5));
}

TEST_CASE("adamw: minimises an ill-conditioned quadratic, with and without weight decay") {
  auto b = create_backend("cpu", 1);
  for (float wd : {0.0f, 0.01f}) {
    CAPTURE(wd);
    const auto opt = adamw(*b, 2, wd);
    std::vector<float> w{3.0f, -2.0f}, g(2);
    auto f = [&] { return w[0] * w[0] + 100 * w[1] * w[1]; };
    const float f0 = f();
    for (int i = 0; i < 600; ++i) {
      g[0] = 2 * w[0];  // f = w0^2 + 100 w1^2
      g[1] = 200 * w[1];
      opt->step(w.data(), g.data(), 0.05f);
    }
    CHECK(opt->steps() == 600);
    CHECK(std::abs(w[0]) < 1e-3);
    CHECK(std::abs(w[1]) < 1e-3);
    CHECK(f() < 1e-6 * f0);
  }
}

TEST_CASE(
    "optimizer state: a restored AdamW goes on exactly as the original, and a mismatched state is "
    "refused") {
  auto b = create_backend("cpu", 1);
  const size_t n = 5;
  const auto a = adamw(*b, n, 0.1f);
  std::vector<float> wa{0.5f, -1.0f, 2.0f, 0.0f, 1.5f}, g(n);
  auto grad = [&](const std::vector<float>& w, int step) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.7f * step + float(i)) + 0.3f * w[i];
  };
  for (int s = 0; s < 7; ++s) {
    grad(wa, s);
    a->step(wa.data(), g.data(), 0.02f);
  }
  const OptimizerState saved = a->save_state();
  CHECK(saved.optimizer == "adamw");
  CHECK(saved.steps == 7);
  REQUIRE(saved.buffers.size() == 2);
  REQUIRE(saved.buffers.at("m").size() == n);
  REQUIRE(saved.buffers.at("v").size() == n);

  const auto r = adamw(*b, n, 0.1f);
  r->load_state(saved, "test");
  CHECK(r->steps() == 7);
  std::vector<float> wr = wa;
  for (int s = 7; s < 12; ++s) {
    grad(wa, s);
    a->step(wa.data(), g.data(), 0.02f);
    r->step(wr.data(), g.data(), 0.02f);
  }
  CHECK(wr == wa);  // bit for bit: moments and the bias correction's step count came back
  // A fresh optimizer (moments zero, step 1) would not have.
  const auto fresh = adamw(*b, n, 0.1f);
  std::vector<float> wf = wa;
  grad(wa, 12);
  a->step(wa.data(), g.data(), 0.02f);
  fresh->step(wf.data(), g.data(), 0.02f);
  CHECK(wf != wa);

  const auto momentum = sgd(*b, n, 0.9f, false);
  CHECK_THROWS_WITH_AS(momentum->load_state(saved, "ckpt x"),
                       doctest::Contains("ckpt x: holds the state of optimizer 'adamw', but this "
                                         "config's optim.optimizer is 'sgd'"),
                       InputError);
  CHECK_THROWS_WITH_AS(
      r->load_state(momentum->save_state(), "ckpt y"),
      doctest::Contains("optimizer 'sgd', but this config's optim.optimizer is 'adamw'"),
      InputError);
  // A refused state changes nothing: r still goes on as a does.
  OptimizerState short_state = saved;
  short_state.buffers.at("v").pop_back();
  CHECK_THROWS_WITH_AS(
      r->load_state(short_state, "ckpt z"),
      doctest::Contains(
          "ckpt z: the optimizer's buffer 'v' holds 4 values, the model has 5 parameters"),
      InputError);
  OptimizerState without_v = saved;
  without_v.buffers.erase("v");
  CHECK_THROWS_WITH_AS(
      r->load_state(without_v, "ckpt w"),
      doctest::Contains("ckpt w: the state of optimizer 'adamw' lacks its buffer 'v'"), InputError);
  OptimizerState foreign = saved;
  foreign.buffers["velocity"] = std::vector<float>(n);
  CHECK_THROWS_WITH_AS(
      r->load_state(foreign, "ckpt f"),
      doctest::Contains("ckpt f: holds a buffer 'velocity' that optimizer 'adamw' does not keep"),
      InputError);
  OptimizerState negative = saved;
  negative.steps = -1;
  CHECK_THROWS_WITH_AS(r->load_state(negative, "ckpt n"),
                       doctest::Contains("ckpt n: the optimizer's step count is negative"),
                       InputError);
  CHECK(r->steps() == 12);
}

TEST_CASE("optimizer state: SGD's velocity round-trips") {
  auto b = create_backend("cpu", 1);
  const auto a = sgd(*b, 2, 0.9f, true);
  std::vector<float> w{1.0f, -1.0f};
  const std::vector<float> g{0.5f, 0.25f};
  a->step(w.data(), g.data(), 0.1f);
  a->step(w.data(), g.data(), 0.1f);
  const OptimizerState s = a->save_state();
  CHECK(s.optimizer == "sgd");
  CHECK(s.steps == 2);
  REQUIRE(s.buffers.size() == 1);
  const auto& velocity = s.buffers.at("velocity");
  REQUIRE(velocity.size() == 2);
  CHECK(velocity[0] == doctest::Approx(0.5 * 1.9));
  const auto r = sgd(*b, 2, 0.9f, true);
  r->load_state(s, "test");
  std::vector<float> wr = w;
  a->step(w.data(), g.data(), 0.1f);
  r->step(wr.data(), g.data(), 0.1f);
  CHECK(wr == w);
  // Without momentum SGD keeps no buffer, and a velocity saved with momentum has nowhere
  // to go: it is dropped, the step count kept.
  const auto plain = sgd(*b, 2, 0.0f, false);
  CHECK(plain->save_state().buffers.empty());
  plain->load_state(s, "test");
  CHECK(plain->steps() == 2);
}

TEST_CASE("grad_clip_norm: sgd and adamw read the gradient scaled, bit for bit as a scaled copy, and hold no copy of it") {
  auto backend = create_backend("cpu", 1);
  const size_t n = 1000;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = 0.37f * static_cast<float>(i % 17) - 2.1f;
  double sq = 0;
  for (float x : g) sq += static_cast<double>(x) * x;
  for (const char* name : {"sgd", "adamw"}) {
    CAPTURE(name);
    OptimizerSpec spec;
    spec.name = name;
    if (spec.name == "sgd") spec.momentum = 0.9f;
    spec.weight_decay = 0.01f;
    auto plain = create_optimizer(*backend, n, spec);
    spec.grad_clip_norm = 0.5f;
    auto clipped = create_optimizer(*backend, n, spec);
    // What the clip used to do: a copy of the gradient, scaled by the backend.
    std::vector<float> scaled = g;
    backend->scale(n, static_cast<float>(0.5 / std::sqrt(sq)), scaled.data());
    std::vector<float> w_plain(n, 0.25f), w_clipped(n, 0.25f);
    for (int step = 0; step < 3; ++step) {
      plain->step(w_plain.data(), scaled.data(), 0.01f);
      clipped->step(w_clipped.data(), g.data(), 0.01f);
    }
    CHECK(w_clipped == w_plain);
    CHECK(clipped->state_bytes() == plain->state_bytes());  // no model-sized copy of the gradient
  }
}

TEST_CASE("grad_clip_norm: a gradient above the bound steps as if scaled to it, one below is untouched, the buffer stays") {
  auto backend = create_backend("cpu", 1);
  OptimizerSpec spec;
  spec.name = "sgd";
  spec.grad_clip_norm = 1.0f;
  auto opt = create_optimizer(*backend, 2, spec);
  std::vector<float> w = {0.0f, 0.0f};
  const std::vector<float> big = {3.0f, 4.0f};  // norm 5: stepped as (0.6, 0.8)
  opt->step(w.data(), big.data(), 1.0f);
  CHECK(w[0] == doctest::Approx(-0.6));
  CHECK(w[1] == doctest::Approx(-0.8));
  CHECK(big[0] == 3.0f);
  const std::vector<float> small = {0.3f, 0.4f};  // norm 0.5: as it is
  opt->step(w.data(), small.data(), 1.0f);
  CHECK(w[0] == doctest::Approx(-0.9));
  CHECK(w[1] == doctest::Approx(-1.2));
  CHECK(opt->name() == "sgd");
  CHECK(opt->steps() == 2);
  spec.grad_clip_norm = -1.0f;
  CHECK_THROWS_WITH_AS(create_optimizer(*backend, 2, spec), doctest::Contains("optim.grad_clip_norm must be a positive"),
                       InputError);
}
