#include <doctest/doctest.h>

#include <algorithm>
#include <stdexcept>

#include <cmath>

#include "hearsay/error.h"
#include "hearsay/mixer.h"
#include "../../src/mixer/robust.h"

using namespace hearsay;

TEST_CASE("mixer: each staleness weighting follows its formula") {
  MixerSpec s;
  s.weighting = "polynomial";
  s.alpha = 0.5;
  CHECK(Mixer(s).staleness_weight(0) == doctest::Approx(1.0));
  CHECK(Mixer(s).staleness_weight(3) == doctest::Approx(0.5));
  s.weighting = "exponential";
  s.lambda = 0.1;
  CHECK(Mixer(s).staleness_weight(10) == doctest::Approx(std::exp(-1.0)));
  s.weighting = "inverse";
  CHECK(Mixer(s).staleness_weight(0) == doctest::Approx(1.0));
  CHECK(Mixer(s).staleness_weight(4) == doctest::Approx(0.25));
  s.weighting = "constant";
  CHECK(Mixer(s).staleness_weight(100) == doctest::Approx(1.0));
  s.weighting = "linear";
  CHECK_THROWS_WITH_AS(Mixer{s}, doctest::Contains("unknown; use constant, exponential, inverse, polynomial"), InputError);
}

TEST_CASE("mixer: a staleness weighting registered by a program is chosen by name, and names are not taken twice") {
  staleness_weightings().add("halving", [](double tau, const MixerSpec&) { return std::pow(0.5, tau); });
  MixerSpec s;
  s.weighting = "halving";
  CHECK(Mixer(s).staleness_weight(3) == doctest::Approx(0.125));
  const auto names = staleness_weightings().names();
  CHECK(std::find(names.begin(), names.end(), "halving") != names.end());
  CHECK_THROWS_AS(staleness_weightings().add("polynomial", [](double, const MixerSpec&) { return 1.0; }), std::logic_error);
}

TEST_CASE("mixer: staleness is measured from logical clocks and stale updates are dropped and counted") {
  MixerSpec s;
  s.tau_max = 5;
  Mixer m(s);
  CHECK(m.model(10, 8, 0.5, 0, 0).tau == 2);
  CHECK(m.model(3, 8, 0.5, 0, 0).tau == 0);  // a sender ahead of us is not stale
  const auto d = m.model(20, 8, 0.5, 0, 0);
  CHECK(d.drop);
  CHECK(d.tau == 12);
  const auto stats = m.take_stats();
  CHECK(stats.applied == 2);
  CHECK(stats.dropped == 1);
  CHECK(stats.tau_max == 12);
  CHECK(m.take_stats().applied == 0);  // a new window
}

TEST_CASE("mixer: model averaging stays a convex combination whatever the weights") {
  MixerSpec s;
  s.weighting = "constant";
  s.weight_by_samples = true;
  Mixer m(s);
  // A peer that has seen 100x more samples than us still gets at most max_share.
  const auto d = m.model(1, 1, 0.5, 10, 1000);
  CHECK(d.weight <= 0.5);
  CHECK(d.weight > 0.0);
  // A slow peer that has learnt little counts for little.
  CHECK(m.model(1, 1, 0.5, 1000, 10).weight == doctest::Approx(2 * 0.5 * 10 / 1010.0));
  for (int tau = 0; tau < 50; ++tau) {
    const double w = m.model(100, 100 - tau, 0.5, 5, 5).weight;
    CHECK(w >= 0.0);
    CHECK(w <= 0.5);
  }
}

TEST_CASE("robust mixing: centered clipping cuts an outlying difference to the median length, trimmed mean drops the extremes") {
  MixerSpec s;
  s.robust = MixerSpec::Robust::kCenteredClip;
  RobustMixing clip(s);
  const std::vector<float> x{0, 0};
  for (int i = 0; i < 5; ++i) CHECK(clip.target(1, x, {3, 4}) == std::vector<float>{3, 4});  // length 5: the median
  const auto cut = clip.target(2, x, {-300, -400});  // length 500, from a liar
  CHECK(cut[0] == doctest::Approx(-3.0f));
  CHECK(cut[1] == doctest::Approx(-4.0f));
  CHECK(clip.clipped() == 1);

  s.robust = MixerSpec::Robust::kTrimmedMean;
  s.trim = 0.2;
  RobustMixing trim(s);
  // Own model 1; neighbours 2, 3, 4 and a liar at 1000: with m = 5 one is cut each side.
  trim.target(1, {1}, {2});
  trim.target(2, {1}, {3});
  trim.target(3, {1}, {4});
  const auto t = trim.target(4, {1}, {1000});
  CHECK(t[0] == doctest::Approx(3.0f));  // mean of 2, 3, 4

  s.robust = MixerSpec::Robust::kNone;
  RobustMixing none(s);
  CHECK(none.target(1, x, {-300, -400}) == std::vector<float>{-300, -400});
  CHECK_THROWS_AS(parse_robust("median"), InputError);
}

TEST_CASE("mixer: the staleness percentiles come from a uniform sample of the whole window (reservoir sampling)") {
  // 100,000 updates with tau = 0, 1, ..., 99,999: far more than the sample keeps. A uniform
  // sample has its median near 50,000 and its 90th percentile near 90,000; keeping the
  // last values instead would put both near 99,000.
  MixerSpec s;
  s.tau_max = 1 << 30;
  Mixer m(s);
  const int n = 100000;
  for (int tau = 0; tau < n; ++tau) m.gradient(static_cast<uint64_t>(tau), 0);
  const auto stats = m.take_stats();
  MESSAGE("p50 " << stats.tau_p50 << ", p90 " << stats.tau_p90 << ", max " << stats.tau_max);
  CHECK(std::fabs(stats.tau_p50 - (n - 1) / 2.0) < 0.03 * n);
  CHECK(std::fabs(stats.tau_p90 - 0.9 * (n - 1)) < 0.03 * n);
  CHECK(stats.applied == static_cast<uint64_t>(n));
}
