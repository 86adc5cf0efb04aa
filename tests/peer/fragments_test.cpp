// streaming_diloco's fragments (src/peer/algorithms/fragments.cpp): a transformer's blocks
// are its units, dealt out in turn, so two fragments are about half the model each.
#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "hearsay/backend.h"

#include "../../src/model/gpt.h"
#include "../../src/peer/algorithms/fragments.h"

using namespace hearsay;

TEST_CASE("fragments: a parameter's unit is its name up to the block's number, or its first part") {
  CHECK(unit_of("h.3.attn.c_attn.weight") == "h.3");
  CHECK(unit_of("h.3.ln_1.weight") == "h.3");
  CHECK(unit_of("h.12.mlp.c_proj.bias") == "h.12");
  CHECK(unit_of("transformer.h.3.mlp.c_fc.weight") == "transformer.h.3");
  CHECK(unit_of("layer1.0.conv1.weight") == "layer1.0");
  CHECK(unit_of("wte") == "wte");
  CHECK(unit_of("ln_f.weight") == "ln_f");
  CHECK(unit_of("fc1.weight") == "fc1");
}

TEST_CASE("fragments: a GPT's two fragments are every other block, each about half the model, each block whole in one") {
  auto backend = create_backend("cpu", 1);
  const GptSpec spec{.vocab = 256, .context = 16, .layers = 6, .heads = 2, .width = 32};
  Gpt model(spec, *backend, 1, 1);
  const auto fragments = fragments_of(model, 2);
  REQUIRE(fragments.size() == 2);
  size_t sizes[2] = {0, 0};
  for (int f = 0; f < 2; ++f) {
    for (const auto& [at, n] : fragments[static_cast<size_t>(f)]) sizes[f] += n;
  }
  CHECK(sizes[0] + sizes[1] == model.num_params());
  // wte (256 x 32) and three blocks against wpe (16 x 32) and three blocks: within 10%.
  CHECK(static_cast<double>(sizes[0]) / static_cast<double>(sizes[1]) == doctest::Approx(1.0).epsilon(0.1));
  // Every tensor of block l is in fragment (l + 1) % 2 (wte and wpe are units 0 and 1).
  for (const ParamView& v : model.param_views()) {
    if (v.name.rfind("h.", 0) != 0) continue;
    const int block = std::stoi(v.name.substr(2));
    const auto& mine = fragments[static_cast<size_t>((block + 2) % 2)];
    CAPTURE(v.name);
    CHECK(std::find(mine.begin(), mine.end(), std::make_pair(v.offset, v.size)) != mine.end());
  }
}
