// The checks a peer makes before it mixes a neighbour's update, and the quarantine.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "../../src/peer/update_guard.h"
#include "hearsay/backend.h"

using namespace hearsay;

TEST_CASE("guard: the first non-finite value is found and placed, finite data passes") {
  std::vector<float> x(1000, 1.5f);
  CHECK(find_non_finite(x.data(), x.size()).empty());
  x[999] = std::numeric_limits<float>::infinity();
  CHECK(find_non_finite(x.data(), x.size()) == "element 999 is infinite");
  x[17] = std::nanf("");
  CHECK(find_non_finite(x.data(), x.size()) == "element 17 is NaN");
  // Huge but finite values are the norm check's business, not this one's.
  x.assign(8, 3e38f);
  CHECK(find_non_finite(x.data(), x.size()).empty());
}

TEST_CASE("guard: the pass with the sum of squares finds the same values and sums as host_sum_squares, bit for bit") {
  // Lengths with and without a tail past the last eight, values of every magnitude.
  for (size_t n : {size_t{0}, size_t{5}, size_t{8}, size_t{1003}, size_t{50890}}) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = std::ldexp(std::sin(0.37f * static_cast<float>(i) + 0.1f), static_cast<int>(i % 41) - 20);
    double sq = -1;
    CHECK(find_non_finite(x.data(), n, &sq).empty());
    const double reference = host_sum_squares(x.data(), n);
    CHECK(std::memcmp(&sq, &reference, sizeof sq) == 0);
    if (n < 8) continue;
    // One non-finite value in the vector body, then one in the tail, each placed.
    std::vector<float> bad = x;
    bad[3] = -std::numeric_limits<float>::infinity();
    CHECK(find_non_finite(bad.data(), n, &sq) == "element 3 is infinite");
    bad = x;
    bad[n - 1] = std::nanf("");
    CHECK(find_non_finite(bad.data(), n, &sq) == "element " + std::to_string(n - 1) + " is NaN");
  }
}

TEST_CASE("guard: an update's norm is bounded relative to the receiver's model or gradient") {
  UpdateGuardSpec s;  // ratio 10
  CHECK(check_update_norm(s, MessageKind::kModel, 90, 1, 10, 0).empty());
  CHECK(check_update_norm(s, MessageKind::kModel, 110, 1, 10, 0).find("norm: 110 is 11 times this peer's model") == 0);
  CHECK(check_update_norm(s, MessageKind::kModel, 9, 1, 0, 0).empty());  // a model at zero: compared with 1
  CHECK_FALSE(check_update_norm(s, MessageKind::kModelDelta, 11, 1, 0, 0).empty());
  // Gradients against our own; a sum of 3 coalesced gradients may be 3 times larger.
  CHECK(check_update_norm(s, MessageKind::kGradient, 25, 1, 100, 2).find("this peer's gradient") != std::string::npos);
  CHECK(check_update_norm(s, MessageKind::kGradient, 25, 3, 100, 2).empty());
  CHECK(check_update_norm(s, MessageKind::kGradient, 1e9, 1, 100, 0).empty());  // no gradient of ours yet
  s.max_norm_ratio = 0;  // off by choice
  CHECK(check_update_norm(s, MessageKind::kModel, 1e30, 1, 1, 1).empty());
}

TEST_CASE("guard: strikes in a row quarantine a neighbour until the cool-down, a good update resets the count") {
  UpdateGuardSpec s;
  s.strikes = 3;
  s.quarantine_s = 10;
  UpdateGuard g(s, 3);
  CHECK_FALSE(g.refuse(1, 0.0, "norm: too big"));
  CHECK_FALSE(g.refuse(1, 0.1, "norm: too big"));
  g.pass(1);  // an honest update in between: the run starts again
  CHECK_FALSE(g.refuse(1, 0.2, "norm: too big"));
  CHECK_FALSE(g.refuse(1, 0.3, "non-finite: element 0 is NaN"));
  CHECK(g.refuse(1, 0.4, "norm: too big"));
  CHECK_FALSE(g.admits(1, 5.0));
  CHECK(g.admits(0, 5.0));
  CHECK(g.admits(2, 5.0));
  CHECK(g.quarantined() == std::vector<int>{1});
  CHECK(g.admits(1, 10.5));
  CHECK(g.quarantined().empty());
  const auto events = g.take_events();
  REQUIRE(events.size() == 2);
  CHECK(events[0].quarantined);
  CHECK(events[0].reason == "norm: too big");
  CHECK_FALSE(events[1].quarantined);
  CHECK(g.refused().at("norm") == 4);
  CHECK(g.refused().at("non-finite") == 1);
}

TEST_CASE("guard: a full backlog (the receiver's own pace) is counted but never quarantines the sender") {
  UpdateGuardSpec s;
  s.strikes = 3;
  s.quarantine_s = 10;
  UpdateGuard g(s, 2);
  for (int i = 0; i < 10; ++i) {
    CHECK_FALSE(g.refuse(1, 0.1 * i, "backlog: already holding 16 model deltas from this peer (at most 16)"));
  }
  CHECK(g.admits(1, 1.0));
  CHECK(g.quarantined().empty());
  CHECK(g.refused().at("backlog") == 10);
  // The backlog refusals did not add to the strikes either: two real ones do not reach three.
  CHECK_FALSE(g.refuse(1, 1.1, "norm: too big"));
  CHECK_FALSE(g.refuse(1, 1.2, "norm: too big"));
  CHECK(g.refuse(1, 1.3, "norm: too big"));
}

TEST_CASE("guard: refusals are counted by a fixed set of kinds, however many different texts a sender makes up") {
  UpdateGuardSpec s;
  s.strikes = 0;  // no quarantine: every refusal is counted
  UpdateGuard g(s, 2);
  for (int i = 0; i < 1000; ++i) {
    g.refuse(1, 0.0, "segments: segment " + std::to_string(i) + " does not follow the one before it");
    g.refuse(1, 0.0, "codec id " + std::to_string(i) + ": unknown");
    g.refuse(1, 0.0, "made up " + std::to_string(i));
  }
  const auto refused = g.refused();
  CHECK(refused == std::map<std::string, uint64_t>{{"codec", 1000}, {"other", 1000}, {"segments", 1000}});
}

TEST_CASE("guard: a site leader's rate must be this step's own rate or a share of it, its models a replica's norm both ways") {
  CHECK(check_site_rate(0.05f, 0.05f).empty());
  CHECK(check_site_rate(0.0125f, 0.05f).empty());  // gossip_grad's share, 1 / (1 + 3 targets)
  CHECK(check_site_rate(0.0f, 0.05f).empty());
  for (const float bad : {-0.05f, 0.1f, 1e30f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    CAPTURE(bad);
    const std::string why = check_site_rate(bad, 0.05f);
    CHECK(why.rfind("synchronous: its rate ", 0) == 0);
    CHECK(why.find("outside 0 .. 0.05, this step's rate on this peer's schedule") != std::string::npos);
  }
  UpdateGuardSpec spec;  // ratio 10
  CHECK(check_site_model_norm(spec, 30, 31).empty());
  CHECK(check_site_model_norm(spec, 300, 31).empty());
  CHECK(check_site_model_norm(spec, 3.2, 31).empty());
  CHECK(check_site_model_norm(spec, 0, 31).rfind("norm: its model's norm 0 is 0 times this peer's (31)", 0) == 0);  // zeros
  CHECK(check_site_model_norm(spec, 3.2e31, 31).rfind("norm: its model's norm 3.2e+31", 0) == 0);
  spec.max_norm_ratio = 0;  // the check switched off
  CHECK(check_site_model_norm(spec, 0, 31).empty());
}
