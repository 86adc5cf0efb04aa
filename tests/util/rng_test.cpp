#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

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

TEST_CASE("rng: normals() gives what normal() gives one by one, bit for bit, on any number of threads, and leaves the stream there") {
  // 2.5 chunks of 2^20, so the chunk boundaries and the threads' cuts are crossed.
  const size_t n = (size_t{5} << 20) / 2 + 7;
  Rng one(9, 3);
  std::vector<float> want(n);
  for (auto& v : want) v = static_cast<float>(one.normal()) * 0.02f;
  for (unsigned threads : {1u, 3u, 0u}) {
    CAPTURE(threads);
    Rng many(9, 3);
    std::vector<float> got(n);
    many.normals(got.data(), n, 0.02f, threads);
    CHECK(std::memcmp(got.data(), want.data(), n * sizeof(float)) == 0);
    CHECK(many.next_u64() == Rng(one).next_u64());  // the same place in the stream after
  }
}
