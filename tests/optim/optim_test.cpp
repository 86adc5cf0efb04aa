#include <doctest/doctest.h>

#include <cmath>

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
