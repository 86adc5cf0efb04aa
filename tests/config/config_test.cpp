#include <doctest/doctest.h>

#include <filesystem>

#include "hearsay/config.h"
#include "hearsay/error.h"

using namespace hearsay;

TEST_CASE("config: defaults apply to fields left out") {
  const auto c = parse_config("name: \"x\"\nmodel { hidden: [8] }\n", "t.textproto");
  CHECK(c.name() == "x");
  CHECK(c.device() == "cpu");
  CHECK(c.train().batch_size() == 64);
  CHECK(c.optim().lr() == doctest::Approx(0.05));
  CHECK(c.model().hidden_size() == 1);
}

TEST_CASE("config: an unknown field is reported with file, line and column") {
  CHECK_THROWS_WITH_AS(parse_config("name: \"x\"\ntrain {\n  batch_sise: 3\n}\n", "a.textproto"),
                       doctest::Contains("a.textproto:3:"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("name: \"x\"\ntrain {\n  batch_sise: 3\n}\n", "a.textproto"),
                       doctest::Contains("batch_sise"), InputError);
}

TEST_CASE("config: a mistyped value is reported where it is") {
  CHECK_THROWS_WITH_AS(parse_config("train { batch_size: \"big\" }", "b.textproto"), doctest::Contains("b.textproto:1:"),
                       InputError);
  CHECK_THROWS_WITH_AS(parse_config("model { kind: TRANSFORMER }", "c.textproto"), doctest::Contains("TRANSFORMER"),
                       InputError);
}

TEST_CASE("config: out-of-range values name the field and its line") {
  CHECK_THROWS_WITH_AS(parse_config("seed: 3\ntrain {\n  batch_size: 0\n}\n", "d.textproto"),
                       doctest::Contains("d.textproto:3:3: train.batch_size: must be in [1, 65536]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("model {\n  hidden: 16\n  hidden: -4\n}\n", "e.textproto"),
                       doctest::Contains("e.textproto:3:3: model.hidden[1]"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("optim { momentum: 1.5 }", "f"), doctest::Contains("optim.momentum"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("data { num_shards: 2 shard: 2 }", "g"), doctest::Contains("data.shard"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("data { format: LIBSVM }", "h"), doctest::Contains("train_path"), InputError);
}

TEST_CASE("config: a missing file is an input error naming it") {
  CHECK_THROWS_WITH_AS(load_config_file("/nonexistent/x.textproto"), doctest::Contains("/nonexistent/x.textproto"), InputError);
}

TEST_CASE("config: every ready config in configs/ loads") {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(HEARSAY_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    CAPTURE(entry.path().string());
    CHECK_NOTHROW(load_config_file(entry.path().string()));
    ++count;
  }
  CHECK(count >= 1);
}

TEST_CASE("config: the model spec follows the data's shape") {
  const auto c = parse_config("model { kind: CNN conv_channels: [4, 8] }", "m");
  Dataset images;
  images.height = images.width = 28;
  images.num_classes = 10;
  const ModelSpec s = model_spec(c.model(), images);
  CHECK(s.kind == ModelSpec::Kind::kCnn);
  CHECK(s.conv_channels == std::vector<int>{4, 8});
  Dataset flat;
  flat.channels = 123;
  flat.num_classes = 2;
  CHECK_THROWS_WITH_AS(model_spec(c.model(), flat), doctest::Contains("impossible model shape"), InputError);
}

TEST_CASE("config: --set fragments override the file and are checked like it") {
  const auto c = parse_config("train { batch_size: 32 epochs: 2 }\nmodel { hidden: [8] }", "base",
                              {"train { batch_size: 128 }", "device: \"cpu\""});
  CHECK(c.train().batch_size() == 128);
  CHECK(c.train().epochs() == doctest::Approx(2));
  CHECK_THROWS_WITH_AS(parse_config("train { batch_size: 32 }", "base", {"train { batch_size: -1 }"}),
                       doctest::Contains("--set #1:1:"), InputError);
  CHECK_THROWS_WITH_AS(parse_config("", "base", {"trian { }"}), doctest::Contains("--set #1:1:"), InputError);
}
