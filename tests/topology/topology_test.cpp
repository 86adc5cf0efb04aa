#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <stdexcept>

#include "hearsay/error.h"
#include "hearsay/topology.h"

using namespace hearsay;

namespace {

// Every peer reaches every other through the targets used over `rounds` rounds.
bool strongly_connected(const Topology& t, int rounds) {
  const int n = t.size();
  std::vector<std::set<int>> out(n);
  Rng rng(1);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < n; ++i) {
      for (int j : t.targets(i, r, rng)) {
        REQUIRE(j != i);
        REQUIRE(j >= 0);
        REQUIRE(j < n);
        out[i].insert(j);
      }
    }
  }
  for (int s = 0; s < n; ++s) {
    std::vector<bool> seen(n, false);
    std::function<void(int)> visit = [&](int v) {
      if (seen[v]) return;
      seen[v] = true;
      for (int w : out[v]) visit(w);
    };
    visit(s);
    if (!std::all_of(seen.begin(), seen.end(), [](bool b) { return b; })) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("topology: every kind yields a connected graph over a few rounds") {
  for (const std::string kind : {"ring", "torus", "exponential", "complete", "star", "random", "hierarchical", "bandwidth"}) {
    for (int n : {2, 3, 8, 12}) {
      CAPTURE(kind);
      CAPTURE(n);
      TopologySpec spec;
      spec.kind = kind;
      if (kind == "hierarchical") {
        for (int i = 0; i < n; ++i) spec.site_of.push_back(i % 2);
      }
      auto t = make_topology(spec, n);
      CHECK(strongly_connected(*t, 64));
    }
  }
}

TEST_CASE("topology: ring, torus and exponential have their documented neighbours") {
  TopologySpec s;
  Rng rng(1);
  s.kind = "ring";
  CHECK(make_topology(s, 5)->neighbours(0) == std::vector<int>{4, 1});
  s.kind = "torus";
  CHECK(make_topology(s, 9)->neighbours(4) == std::vector<int>{1, 3, 5, 7});
  s.kind = "star";
  CHECK(make_topology(s, 4)->neighbours(0) == std::vector<int>{1, 2, 3});
  CHECK(make_topology(s, 4)->neighbours(2) == std::vector<int>{0});
  s.kind = "exponential";
  auto e = make_topology(s, 8);
  CHECK(e->targets(3, 0, rng) == std::vector<int>{4});
  CHECK(e->targets(3, 1, rng) == std::vector<int>{5});
  CHECK(e->targets(3, 2, rng) == std::vector<int>{7});
  CHECK(e->targets(3, 3, rng) == std::vector<int>{4});
}

TEST_CASE("topology: hierarchical gossip stays inside the site except every cross_every-th round") {
  TopologySpec s;
  s.kind = "hierarchical";
  s.site_of = {0, 0, 0, 1, 1, 1};
  s.cross_every = 4;
  auto t = make_topology(s, 6);
  Rng rng(2);
  for (int r = 0; r < 40; ++r) {
    const int j = t->targets(1, r, rng)[0];
    CHECK((s.site_of[j] != 0) == (r % 4 == 3));
  }
}

TEST_CASE("topology: bandwidth-aware choice favours fast links but keeps every edge above the floor") {
  TopologySpec s;
  s.kind = "bandwidth";
  s.floor = 0.2;
  auto t = make_topology(s, 4);
  t->observe_throughput(0, 1, 1e9);
  t->observe_throughput(0, 2, 1e6);
  t->observe_throughput(0, 3, 1e6);
  Rng rng(3);
  int counts[4] = {};
  for (int r = 0; r < 30000; ++r) ++counts[t->targets(0, r, rng)[0]];
  CHECK(counts[0] == 0);
  CHECK(counts[1] > 20000);
  // Floor: 0.2 of the uniform 1/3 for each slow edge.
  CHECK(counts[2] > 0.8 * 30000 * 0.2 / 3);
  CHECK(counts[3] > 0.8 * 30000 * 0.2 / 3);
}

TEST_CASE("topology: random_regular is a connected d-regular undirected graph, the same on every peer") {
  TopologySpec spec;
  spec.kind = "random_regular";
  spec.degree = 4;
  const auto a = make_topology(spec, 1024), b = make_topology(spec, 1024);
  Rng rng(1);
  std::vector<int> seen(1024, 0);
  std::vector<int> todo{0};
  seen[0] = 1;
  for (int i = 0; i < 1024; ++i) {
    const auto n = a->neighbours(i);
    REQUIRE(n.size() == 4);
    CHECK(n == b->neighbours(i));  // every peer builds the same graph
    CHECK(a->targets(i, 7, rng) == n);
    for (int j : n) {
      CHECK(j != i);
      const auto back = a->neighbours(j);
      CHECK(std::find(back.begin(), back.end(), i) != back.end());  // undirected
    }
    CHECK(std::set<int>(n.begin(), n.end()).size() == 4);  // no edge twice
  }
  for (size_t k = 0; k < todo.size(); ++k) {
    for (int j : a->neighbours(todo[k])) {
      if (!seen[j]) {
        seen[j] = 1;
        todo.push_back(j);
      }
    }
  }
  CHECK(todo.size() == 1024);  // connected
  spec.degree = 3;
  CHECK_THROWS_WITH_AS(make_topology(spec, 5), doctest::Contains("must be even"), InputError);
  spec.degree = 5;
  CHECK_THROWS_WITH_AS(make_topology(spec, 5), doctest::Contains("degree must be in [1, 4]"), InputError);
}

TEST_CASE("topology: bad specs are input errors") {
  TopologySpec s;
  s.kind = "hypercube";
  CHECK_THROWS_WITH_AS(make_topology(s, 4), doctest::Contains("hypercube"), InputError);
  s.kind = "ring";
  CHECK_THROWS_AS(make_topology(s, 1), InputError);
  s.kind = "hierarchical";
  s.site_of = {0, 1};
  CHECK_THROWS_AS(make_topology(s, 4), InputError);
}

TEST_CASE("topology: one registered by a program is built by name, and the registry lists every topology") {
  // Everyone sends to peer 0, and peer 0 to peer 1: a hub with a way back.
  class Hub final : public Topology {
   public:
    explicit Hub(int n) : Topology(n) {}
    std::vector<int> targets(int peer, int64_t, Rng&) const override { return neighbours(peer); }
    std::vector<int> neighbours(int peer) const override { return {peer == 0 ? 1 : 0}; }
  };
  topologies().add("hub", [](const TopologySpec&, int n) { return std::unique_ptr<Topology>(std::make_unique<Hub>(n)); });
  TopologySpec spec;
  spec.kind = "hub";
  const auto t = make_topology(spec, 5);
  CHECK(t->neighbours(3) == std::vector<int>{0});
  CHECK(t->neighbours(0) == std::vector<int>{1});
  CHECK(topologies().names() == std::vector<std::string>{"bandwidth", "complete", "exponential", "hierarchical", "hub", "random",
                                                    "random_regular", "ring", "star", "torus"});
  CHECK_THROWS_AS(topologies().add("ring", [](const TopologySpec&, int n) { return std::unique_ptr<Topology>(); }),
                  std::logic_error);
  spec.kind = "mesh";
  CHECK_THROWS_WITH_AS(make_topology(spec, 4), doctest::Contains("topology 'mesh': unknown; use bandwidth, complete"), InputError);
}
