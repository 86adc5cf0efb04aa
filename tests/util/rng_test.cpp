#include <doctest/doctest.h>

#include <cmath>

#include "hearsay/rng.h"

using hearsay::Rng;

TEST_CASE("rng: same seed and stream give the same sequence, other streams differ") {
  Rng a(5), b(5), c(5, 1);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    CHECK(x == b.next_u64());
    differs |= x != c.next_u64();
  }
  CHECK(differs);
}

TEST_CASE("rng: below(n) stays in range and hits every value") {
  Rng r(1);
  int seen[7] = {};
  for (int i = 0; i < 7000; ++i) {
    const uint64_t v = r.below(7);
    REQUIRE(v < 7);
    ++seen[v];
  }
  for (int count : seen) CHECK(count > 800);
}

TEST_CASE("rng: normal and gamma have the right first moments") {
  Rng r(3);
  double sum = 0, sq = 0, g = 0, g_small = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double x = r.normal();
    sum += x;
    sq += x * x;
    g += r.gamma(2.5);
    g_small += r.gamma(0.3);
  }
  CHECK(std::abs(sum / n) < 0.01);
  CHECK(std::abs(sq / n - 1.0) < 0.02);
  CHECK(std::abs(g / n - 2.5) < 0.03);
  CHECK(std::abs(g_small / n - 0.3) < 0.01);
}
