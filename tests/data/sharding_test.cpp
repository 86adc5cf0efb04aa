#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "hearsay/data.h"
#include "hearsay/error.h"

using namespace hearsay;

namespace {

Dataset labelled(int n, int classes) {
  Dataset d;
  d.size = n;
  d.num_classes = classes;
  d.features.assign(n, 0.0f);
  for (int i = 0; i < n; ++i) d.labels.push_back(i % classes);
  return d;
}

void check_partition(const std::vector<std::vector<int64_t>>& shards, int64_t n) {
  std::vector<int> seen(n, 0);
  for (const auto& s : shards) {
    CHECK(!s.empty());
    for (int64_t i : s) ++seen[i];
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

}  // namespace

TEST_CASE("sharding: IID splits every sample to exactly one peer, evenly and deterministically") {
  const Dataset d = labelled(1003, 10);
  const auto a = shard_indices(d, 4, Partition::kIid, 0, 5);
  check_partition(a, d.size);
  for (const auto& s : a) CHECK((s.size() == 250 || s.size() == 251));
  CHECK(a == shard_indices(d, 4, Partition::kIid, 0, 5));
  CHECK(a != shard_indices(d, 4, Partition::kIid, 0, 6));
}

TEST_CASE("sharding: Dirichlet covers every sample and small alpha skews the labels") {
  const Dataset d = labelled(10000, 10);
  const auto skewed = shard_indices(d, 8, Partition::kDirichlet, 0.1, 1);
  check_partition(skewed, d.size);
  CHECK(skewed == shard_indices(d, 8, Partition::kDirichlet, 0.1, 1));
  // Largest single-class share of each shard, averaged: near 1/10 for IID, high for alpha 0.1.
  auto dominance = [&](const std::vector<std::vector<int64_t>>& shards) {
    double total = 0;
    for (const auto& s : shards) {
      std::vector<int> counts(10, 0);
      for (int64_t i : s) ++counts[d.labels[i]];
      total += double(*std::max_element(counts.begin(), counts.end())) / s.size();
    }
    return total / shards.size();
  };
  CHECK(dominance(skewed) > 0.5);
  CHECK(dominance(shard_indices(d, 8, Partition::kDirichlet, 1000.0, 1)) < 0.15);
}

TEST_CASE("sharding: impossible splits are input errors") {
  const Dataset d = labelled(3, 2);
  CHECK_THROWS_WITH_AS(shard_indices(d, 5, Partition::kIid, 0, 1), doctest::Contains("only 3 samples"), InputError);
  CHECK_THROWS_AS(shard_indices(d, 0, Partition::kIid, 0, 1), InputError);
  CHECK_THROWS_AS(shard_indices(labelled(100, 2), 2, Partition::kDirichlet, -1.0, 1), InputError);
}

TEST_CASE("sampler: each epoch visits the shard once, in a new order each epoch") {
  BatchSampler s({10, 11, 12, 13, 14, 15, 16}, 3);
  std::vector<int64_t> first(7), second(7);
  s.next(7, first.data());
  CHECK(std::set<int64_t>(first.begin(), first.end()).size() == 7);
  s.next(7, second.data());
  CHECK(s.epoch() == 2);
  CHECK(std::set<int64_t>(second.begin(), second.end()).size() == 7);
  CHECK(first != second);
  std::vector<int64_t> cross(10);
  s.next(10, cross.data());  // crosses into the third pass
  CHECK(s.epoch() == 3);
  CHECK(s.epochs_done() == doctest::Approx(3.0 + 3.0 / 7.0));
}

TEST_CASE("gather: copies rows and labels of the chosen samples") {
  Dataset d;
  d.size = 3;
  d.channels = 2;
  d.num_classes = 3;
  d.features = {0, 1, 10, 11, 20, 21};
  d.labels = {0, 1, 2};
  const int64_t idx[2] = {2, 0};
  float x[4];
  int32_t y[2];
  gather_batch(d, idx, 2, x, y);
  CHECK(std::vector<float>(x, x + 4) == std::vector<float>{20, 21, 0, 1});
  CHECK(y[0] == 2);
  CHECK(y[1] == 0);
}
