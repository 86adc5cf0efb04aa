#include <doctest/doctest.h>

#include <cmath>

#include "hearsay/error.h"
#include "hearsay/optim.h"

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

TEST_CASE("sgd: momentum minimises a quadratic, Nesterov included") {
  auto b = create_backend("cpu", 1);
  for (bool nesterov : {false, true}) {
    Sgd sgd(*b, 2, SgdParams{0.1f, 0.9f, 0.0f, nesterov});
    std::vector<float> w{3.0f, -2.0f}, g(2);
    for (int i = 0; i < 300; ++i) {
      g[0] = 2 * w[0];  // f = w0^2 + 4 w1^2
      g[1] = 8 * w[1];
      sgd.step(w.data(), g.data(), 0.05f);
    }
    CHECK(std::abs(w[0]) < 1e-3);
    CHECK(std::abs(w[1]) < 1e-3);
  }
}

namespace {

SgdParams adamw_params(float weight_decay) {
  SgdParams p;
  p.kind = OptimizerKind::kAdamW;
  p.weight_decay = weight_decay;
  return p;  // beta1 0.9, beta2 0.999, eps 1e-8
}

}  // namespace

TEST_CASE("adamw: three steps match a hand-computed reference, bias correction and decoupled decay included") {
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
  Sgd opt(*b, 3, adamw_params(0.5f));
  REQUIRE(opt.kind() == OptimizerKind::kAdamW);
  CHECK(opt.velocity() == nullptr);
  REQUIRE(opt.first_moment() != nullptr);
  REQUIRE(opt.second_moment() != nullptr);
  std::vector<float> w{1.0f, -2.0f, 0.5f};
  const std::vector<std::vector<float>> grads{{0.5f, -0.25f, 0.0f}, {-0.1f, 0.3f, 0.0f}, {0.2f, 0.2f, 0.0f}};
  const float lrs[] = {0.1f, 0.05f, 0.1f};  // step() takes the schedule's rate
  const double want_w[3][3] = {{0.850000002, -1.8, 0.475},
                               {0.803198699, -1.76214724, 0.463125},
                               {0.702922771, -1.71300941, 0.43996875}};
  const double want_m[3][3] = {{0.05, -0.025, 0}, {0.035, 0.0075, 0}, {0.0515, 0.02675, 0}};
  const double want_v[3][3] = {{0.00025, 6.25e-05, 0}, {0.00025975, 0.0001524375, 0}, {0.00029949025, 0.000192285063, 0}};
  const double coupled_w[3][3] = {{0.900000001, -1.9, 0.400000004},
                                  {0.85608295, -1.85310658, 0.350593716},
                                  {0.765094431, -1.7593847, 0.252910528}};
  for (int t = 0; t < 3; ++t) {
    CAPTURE(t + 1);
    opt.step(w.data(), grads[t].data(), lrs[t]);
    CHECK(opt.steps() == t + 1);
    const Sgd::State s = opt.state();
    for (int i = 0; i < 3; ++i) {
      CAPTURE(i);
      CHECK(w[i] == doctest::Approx(want_w[t][i]).epsilon(1e-6));
      CHECK(std::abs(w[i] - coupled_w[t][i]) > 0.04);  // the coupled rule is far off
      CHECK(s.m[i] == doctest::Approx(want_m[t][i]).epsilon(1e-6));
      CHECK(s.v[i] == doctest::Approx(want_v[t][i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("adamw: without weight decay a zero gradient leaves a weight where it is") {
  auto b = create_backend("cpu", 1);
  Sgd opt(*b, 2, adamw_params(0.0f));
  std::vector<float> w{0.75f, -3.0f};
  const std::vector<float> g{0.0f, 1.0f};
  for (int i = 0; i < 10; ++i) opt.step(w.data(), g.data(), 0.01f);
  CHECK(w[0] == 0.75f);
  // A constant gradient moves the other by lr per step (m/c1 = g, sqrt(v/c2) = |g|).
  CHECK(w[1] == doctest::Approx(-3.1).epsilon(1e-5));
}

TEST_CASE("adamw: minimises an ill-conditioned quadratic, with and without weight decay") {
  auto b = create_backend("cpu", 1);
  for (float wd : {0.0f, 0.01f}) {
    CAPTURE(wd);
    Sgd opt(*b, 2, adamw_params(wd));
    std::vector<float> w{3.0f, -2.0f}, g(2);
    auto f = [&] { return w[0] * w[0] + 100 * w[1] * w[1]; };
    const float f0 = f();
    for (int i = 0; i < 600; ++i) {
      g[0] = 2 * w[0];  // f = w0^2 + 100 w1^2
      g[1] = 200 * w[1];
      opt.step(w.data(), g.data(), 0.05f);
    }
    CHECK(opt.steps() == 600);
    CHECK(std::abs(w[0]) < 1e-3);
    CHECK(std::abs(w[1]) < 1e-3);
    CHECK(f() < 1e-6 * f0);
  }
}

TEST_CASE("optimizer state: a restored AdamW goes on exactly as the original, and a mismatched state is refused") {
  auto b = create_backend("cpu", 1);
  const size_t n = 5;
  Sgd a(*b, n, adamw_params(0.1f));
  std::vector<float> wa{0.5f, -1.0f, 2.0f, 0.0f, 1.5f}, g(n);
  auto grad = [&](const std::vector<float>& w, int step) {
    for (size_t i = 0; i < n; ++i) g[i] = std::sin(0.7f * step + float(i)) + 0.3f * w[i];
  };
  for (int s = 0; s < 7; ++s) {
    grad(wa, s);
    a.step(wa.data(), g.data(), 0.02f);
  }
  const Sgd::State saved = a.state();
  CHECK(saved.kind == OptimizerKind::kAdamW);
  CHECK(saved.steps == 7);
  REQUIRE(saved.m.size() == n);
  REQUIRE(saved.v.size() == n);
  CHECK(saved.velocity.empty());

  Sgd r(*b, n, adamw_params(0.1f));
  r.restore(saved, "test");
  CHECK(r.steps() == 7);
  std::vector<float> wr = wa;
  for (int s = 7; s < 12; ++s) {
    grad(wa, s);
    a.step(wa.data(), g.data(), 0.02f);
    r.step(wr.data(), g.data(), 0.02f);
  }
  CHECK(wr == wa);  // bit for bit: moments and the bias correction's step count came back
  // A fresh optimizer (moments zero, step 1) would not have.
  Sgd fresh(*b, n, adamw_params(0.1f));
  std::vector<float> wf = wa;
  grad(wa, 12);
  a.step(wa.data(), g.data(), 0.02f);
  fresh.step(wf.data(), g.data(), 0.02f);
  CHECK(wf != wa);

  Sgd sgd(*b, n, SgdParams{0.1f, 0.9f, 0.0f, false});
  CHECK_THROWS_WITH_AS(sgd.restore(saved, "ckpt x"), doctest::Contains("ckpt x: holds the state of optimizer 'adamw', but this config's optim.kind is 'sgd'"), InputError);
  CHECK_THROWS_WITH_AS(r.restore(sgd.state(), "ckpt y"), doctest::Contains("optimizer 'sgd', but this config's optim.kind is 'adamw'"), InputError);
  Sgd::State short_state = saved;
  short_state.v.pop_back();
  CHECK_THROWS_WITH_AS(r.restore(short_state, "ckpt z"), doctest::Contains("ckpt z: the optimizer's second moment (v) holds 4 values"), InputError);
}

TEST_CASE("optimizer state: SGD's velocity round-trips") {
  auto b = create_backend("cpu", 1);
  Sgd a(*b, 2, SgdParams{0.1f, 0.9f, 0.0f, true});
  std::vector<float> w{1.0f, -1.0f};
  const std::vector<float> g{0.5f, 0.25f};
  a.step(w.data(), g.data(), 0.1f);
  a.step(w.data(), g.data(), 0.1f);
  const Sgd::State s = a.state();
  CHECK(s.kind == OptimizerKind::kSgd);
  CHECK(s.steps == 2);
  REQUIRE(s.velocity.size() == 2);
  CHECK(s.velocity[0] == doctest::Approx(0.5 * 1.9));
  CHECK(s.m.empty());
  Sgd r(*b, 2, SgdParams{0.1f, 0.9f, 0.0f, true});
  r.restore(s, "test");
  std::vector<float> wr = w;
  a.step(w.data(), g.data(), 0.1f);
  r.step(wr.data(), g.data(), 0.1f);
  CHECK(wr == w);
}
