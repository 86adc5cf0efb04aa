#include <doctest/doctest.h>

#include <cmath>

#include "hearsay/error.h"
#include "hearsay/mixer.h"

using namespace hearsay;

TEST_CASE("mixer: each staleness weighting follows its formula") {
  MixerSpec s;
  s.weighting = MixerSpec::Weighting::kPolynomial;
  s.alpha = 0.5;
  CHECK(Mixer(s).staleness_weight(0) == doctest::Approx(1.0));
  CHECK(Mixer(s).staleness_weight(3) == doctest::Approx(0.5));
  s.weighting = MixerSpec::Weighting::kExponential;
  s.lambda = 0.1;
  CHECK(Mixer(s).staleness_weight(10) == doctest::Approx(std::exp(-1.0)));
  s.weighting = MixerSpec::Weighting::kInverse;
  CHECK(Mixer(s).staleness_weight(0) == doctest::Approx(1.0));
  CHECK(Mixer(s).staleness_weight(4) == doctest::Approx(0.25));
  s.weighting = MixerSpec::Weighting::kConstant;
  CHECK(Mixer(s).staleness_weight(100) == doctest::Approx(1.0));
  CHECK(parse_weighting("inverse") == MixerSpec::Weighting::kInverse);
  CHECK_THROWS_AS(parse_weighting("linear"), InputError);
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
  s.weighting = MixerSpec::Weighting::kConstant;
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
