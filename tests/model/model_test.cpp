#include <doctest/doctest.h>

#include "hearsay/error.h"
#include "hearsay/model.h"

using namespace hearsay;

namespace {

ModelSpec mlp(std::vector<int> hidden) {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kMlp;
  s.height = s.width = 28;
  s.hidden = std::move(hidden);
  return s;
}

}  // namespace

TEST_CASE("model: parameter views tile the flat buffer in order, with no gaps") {
  auto b = create_backend("cpu", 1);
  Model m(mlp({256, 256}), *b, 8, 1);
  CHECK(m.num_params() == (784 * 256 + 256) + (256 * 256 + 256) + (256 * 10 + 10));
  size_t next = 0;
  for (const auto& v : m.param_views()) {
    CHECK(v.offset == next);
    next += v.size;
  }
  CHECK(next == m.num_params());
  CHECK(m.param_views().front().name == "fc1.weight");
  CHECK(m.param_views().front().shape == std::vector<int>{256, 784});
}

TEST_CASE("model: initialisation is deterministic in the seed") {
  auto b = create_backend("cpu", 1);
  Model a(mlp({32}), *b, 4, 7), c(mlp({32}), *b, 4, 7), d(mlp({32}), *b, 4, 8);
  CHECK(a.get_params() == c.get_params());
  CHECK(a.get_params() != d.get_params());
}

TEST_CASE("model: impossible shapes are input errors that say what is wrong") {
  auto b = create_backend("cpu", 1);
  CHECK_THROWS_WITH_AS(Model(mlp({256, 0}), *b, 8, 1), doctest::Contains("hidden[1]"), InputError);
  ModelSpec flat_cnn;
  flat_cnn.kind = ModelSpec::Kind::kCnn;
  flat_cnn.channels = 123;
  flat_cnn.conv_channels = {8};
  CHECK_THROWS_WITH_AS(Model(flat_cnn, *b, 8, 1), doctest::Contains("cnn needs image input"), InputError);
  ModelSpec odd = mlp({});
  odd.kind = ModelSpec::Kind::kCnn;
  odd.height = 14;
  odd.width = 14;
  odd.conv_channels = {4, 4, 4};
  CHECK_THROWS_WITH_AS(Model(odd, *b, 8, 1), doctest::Contains("even height and width"), InputError);
  ModelSpec one_class = mlp({4});
  one_class.num_classes = 1;
  CHECK_THROWS_AS(Model(one_class, *b, 8, 1), InputError);
  CHECK_THROWS_AS(Model(mlp({4}), *b, 0, 1), InputError);
}

TEST_CASE("model: CNN layers shape the data as documented") {
  auto b = create_backend("cpu", 1);
  ModelSpec s = mlp({});
  s.kind = ModelSpec::Kind::kCnn;
  s.conv_channels = {16, 32};
  Model m(s, *b, 2, 1);
  const std::string summary = m.summary();
  CHECK(summary.find("conv1 28x28x1 -> 28x28x16") != std::string::npos);
  CHECK(summary.find("pool2 14x14x32 -> 7x7x32") != std::string::npos);
  CHECK(summary.find("fc1 7x7x32 -> 1x1x128") != std::string::npos);
}
