// The GPT (src/model/gpt.cpp): each transformer kernel's backward pass against central
// differences of its forward pass, the whole model's gradient the same way, and its loss
// and gradients against an independent PyTorch implementation on the same weights and
// batch (tests/model/gpt_reference.py made tests/model/data/gpt_reference.txt).
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <tuple>

#include "../../src/model/gpt.h"
#include "hearsay/backend.h"
#include "hearsay/error.h"
#include "hearsay/model.h"
#include "hearsay/rng.h"

using namespace hearsay;

namespace {

std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks d(objective)/d(input[i]) == analytic[i] for every i by central differences, where
// objective(input) is a scalar computed in double from a kernel's float outputs.
void check_against_differences(std::vector<float>& input, const std::vector<float>& analytic,
                               const std::function<double()>& objective, const char* what, float eps = 1e-2f) {
  REQUIRE(analytic.size() == input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const float saved = input[i];
    input[i] = saved + eps;
    const double up = objective();
    input[i] = saved - eps;
    const double down = objective();
    input[i] = saved;
    const double numeric = (up - down) / (2.0 * eps);
    INFO(what << "[" << i << "]: analytic " << analytic[i] << ", numeric " << numeric);
    CHECK(std::abs(numeric - analytic[i]) <= 2e-3 + 1e-2 * std::abs(numeric));
  }
}

}  // namespace

TEST_CASE("gpt kernels: layernorm's backward pass matches finite differences in x, gamma and beta") {
  auto b = create_backend("cpu", 1);
  const int rows = 3, c = 8;
  std::vector<float> x = uniform(rows * c, 1), gamma = uniform(c, 2, 0.5f, 1.5f), beta = uniform(c, 3);
  const std::vector<float> r = uniform(rows * c, 4);  // objective: sum(y * r)
  std::vector<float> y(rows * c), mean(rows), rstd(rows);
  auto objective = [&] {
    b->layernorm_forward(x.data(), gamma.data(), beta.data(), rows, c, y.data(), mean.data(), rstd.data());
    return dot(y, r);
  };
  objective();
  std::vector<float> dx(rows * c, 0.5f), dgamma(c, 9.0f), dbeta(c, 9.0f);  // dx accumulates onto 0.5
  b->layernorm_backward(r.data(), x.data(), gamma.data(), mean.data(), rstd.data(), rows, c, dx.data(),
                        dgamma.data(), dbeta.data());
  for (auto& v : dx) v -= 0.5f;
  check_against_differences(x, dx, objective, "dx");
  check_against_differences(gamma, dgamma, objective, "dgamma");
  check_against_differences(beta, dbeta, objective, "dbeta");
}

TEST_CASE("gpt kernels: bias plus GELU's backward pass matches finite differences, and GELU is the tanh form") {
  auto b = create_backend("cpu", 1);
  const int rows = 4, cols = 6;
  std::vector<float> x = uniform(rows * cols, 5, -3.0f, 3.0f), bias = uniform(cols, 6);
  const std::vector<float> r = uniform(rows * cols, 7);
  std::vector<float> pre, out(rows * cols);
  auto objective = [&] {
    pre = x;
    b->bias_gelu_forward(pre.data(), bias.data(), out.data(), rows, cols);
    return dot(out, r);
  };
  objective();
  const float v = pre[0];
  CHECK(out[0] == doctest::Approx(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)))).epsilon(1e-6));
  std::vector<float> dpre(rows * cols), dbias(cols, 9.0f);
  b->gelu_backward_bias_grad(r.data(), pre.data(), dpre.data(), dbias.data(), rows, cols);
  check_against_differences(x, dpre, objective, "dpre");
  check_against_differences(bias, dbias, objective, "dbias");
}

TEST_CASE("gpt kernels: causal attention's backward pass matches finite differences, and no query sees a later key") {
  auto b = create_backend("cpu", 1);
  // A short context (one block of queries), and one of 130 (the CPU kernels' blocks of 64
  // queries: two whole ones and a partial one).
  for (const auto& [batch, t, c, heads] : {std::tuple{2, 5, 8, 2}, std::tuple{1, 130, 4, 1}}) {
    CAPTURE(t);
    const int rows = batch * t;
    std::vector<float> qkv = uniform(rows * 3 * c, 8);
    const std::vector<float> r = uniform(rows * c, 9);
    std::vector<float> out(rows * c), lse(batch * heads * t);
    auto objective = [&] {
      b->attention_forward(qkv.data(), batch, t, c, heads, out.data(), lse.data());
      return dot(out, r);
    };
    objective();
    std::vector<float> dqkv(rows * 3 * c, 9.0f);
    b->attention_backward(r.data(), qkv.data(), out.data(), lse.data(), batch, t, c, heads, dqkv.data());
    check_against_differences(qkv, dqkv, objective, "dqkv");
    // Causality: the first token's output is its own value; changing the last token's key
    // and value moves no earlier output.
    for (int k = 0; k < c; ++k) CHECK(out[k] == doctest::Approx(qkv[2 * c + k]).epsilon(1e-6));
    const std::vector<float> before = out;
    for (int k = c; k < 3 * c; ++k) qkv[(t - 1) * 3 * c + k] += 1.0f;
    objective();
    for (int i = 0; i < (t - 1) * c; ++i) CHECK(out[i] == before[i]);
  }
}

TEST_CASE("gpt kernels: the embedding gathers token and position rows and its backward pass scatter-adds them") {
  auto b = create_backend("cpu", 1);
  const int vocab = 5, t = 3, c = 2, rows = 2 * t;
  const std::vector<float> wte = uniform(vocab * c, 10), wpe = uniform(t * c, 11);
  const std::vector<int32_t> tokens = {4, 0, 4, 1, 1, 2};
  std::vector<float> y(rows * c);
  b->embedding_forward(tokens.data(), wte.data(), wpe.data(), rows, t, c, vocab, y.data());
  CHECK(y[2 * c + 1] == wte[4 * c + 1] + wpe[2 * c + 1]);
  CHECK(y[3 * c] == wte[1 * c] + wpe[0]);
  const std::vector<float> dy = uniform(rows * c, 12);
  std::vector<float> dwte(vocab * c, 0.0f), dwpe(t * c, 0.0f);
  b->embedding_backward(dy.data(), tokens.data(), rows, t, c, dwte.data(), dwpe.data());
  CHECK(dwte[4 * c] == doctest::Approx(dy[0] + dy[2 * c]));
  CHECK(dwte[3 * c] == 0.0f);
  CHECK(dwpe[c + 1] == doctest::Approx(dy[c + 1] + dy[4 * c + 1]));
}

namespace {

GptSpec tiny_gpt() { return GptSpec{.vocab = 256, .context = 6, .layers = 2, .heads = 2, .width = 8}; }

struct TokenBatch {
  std::vector<int32_t> x, y;
};

TokenBatch token_batch(int rows, int context, uint64_t seed) {
  Rng rng(seed);
  TokenBatch b;
  for (int i = 0; i < rows * context; ++i) {
    b.x.push_back(static_cast<int32_t>(rng.below(256)));
    b.y.push_back(static_cast<int32_t>(rng.below(256)));
  }
  return b;
}

}  // namespace

TEST_CASE("gpt: the whole model's gradient matches finite differences of its loss in every parameter") {
  auto backend = create_backend("cpu", 1);
  const GptSpec spec = tiny_gpt();
  const int rows = 2;
  Gpt model(spec, *backend, rows, 3);
  // Weights far from GPT-2's 0.02 scale, so attention is not uniform and every path
  // carries gradient the differences can see.
  std::vector<float> p = model.get_params();
  Rng rng(4);
  for (auto& v : p) v += rng.uniform(-0.3f, 0.3f);
  model.set_params(p);
  const TokenBatch tb = token_batch(rows, spec.context, 5);
  const Batch batch{tb.x.data(), tb.y.data(), rows};
  model.forward_backward(batch);
  std::vector<float> grad(model.num_params());
  backend->download(grad.data(), model.grads(), sizeof(float) * grad.size());
  const float eps = 1e-2f;
  size_t checked = 0;
  for (const ParamView& view : model.param_views()) {
    for (size_t j = 0; j < view.size; ++j) {
      const size_t i = view.offset + j;
      const float saved = p[i];
      p[i] = saved + eps;
      model.set_params(p);
      const double up = model.evaluate(batch).loss();
      p[i] = saved - eps;
      model.set_params(p);
      const double down = model.evaluate(batch).loss();
      p[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      INFO(view.name << "[" << j << "]: analytic " << grad[i] << ", numeric " << numeric);
      CHECK(std::abs(numeric - grad[i]) <= 1e-3 + 2e-2 * std::abs(numeric));
      ++checked;
    }
  }
  model.set_params(p);
  CHECK(checked > 1000);
}

TEST_CASE("gpt: loss and gradients equal PyTorch's on the same weights and batch to 1e-4 relative") {
  // Read the reference: "loss X", then "name norm i:g i:g i:g i:g" per tensor.
  std::ifstream in(std::string(HEARSAY_SOURCE_DIR) + "/tests/model/data/gpt_reference.txt");
  REQUIRE(in.good());
  std::string word;
  double ref_loss = 0.0;
  in >> word >> ref_loss;
  REQUIRE(word == "loss");
  struct Ref {
    double norm;
    std::vector<std::pair<size_t, double>> entries;
  };
  std::map<std::string, Ref> refs;
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string name, pick;
    Ref r{};
    ls >> name >> r.norm;
    while (ls >> pick) {
      const size_t colon = pick.find(':');
      r.entries.emplace_back(std::stoull(pick.substr(0, colon)), std::stod(pick.substr(colon + 1)));
    }
    refs[name] = r;
  }

  // The same model, weights and batch as tests/model/gpt_reference.py.
  auto backend = create_backend("cpu", 1);
  const GptSpec spec{.vocab = 256, .context = 16, .layers = 2, .heads = 2, .width = 32};
  const int rows = 3;
  Gpt model(spec, *backend, rows, 1);
  std::vector<float> p(model.num_params());
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(0.1 * std::sin(0.37 * static_cast<double>(i) + 1.0));
  for (const ParamView& view : model.param_views()) {
    if (view.name.find("ln_") != std::string::npos && view.name.ends_with(".weight")) {
      for (size_t j = 0; j < view.size; ++j) p[view.offset + j] += 1.0f;
    }
  }
  model.set_params(p);
  std::vector<int32_t> x, y;
  for (int r = 0; r < rows; ++r) {
    for (int t = 0; t < spec.context; ++t) {
      const int i = r * (spec.context + 1) + t;
      x.push_back((i * 37 + 11) % 256);
      y.push_back(((i + 1) * 37 + 11) % 256);
    }
  }
  const BatchStats s = model.forward_backward(Batch{x.data(), y.data(), rows});
  CHECK(s.count == rows * spec.context);
  CHECK(s.loss() == doctest::Approx(ref_loss).epsilon(1e-4));
  std::vector<float> grad(model.num_params());
  backend->download(grad.data(), model.grads(), sizeof(float) * grad.size());
  REQUIRE(refs.size() == model.param_views().size());
  for (const ParamView& view : model.param_views()) {
    REQUIRE(refs.count(view.name) == 1);
    const Ref& r = refs[view.name];
    double norm = 0.0;
    for (size_t j = 0; j < view.size; ++j) norm += static_cast<double>(grad[view.offset + j]) * grad[view.offset + j];
    INFO(view.name);
    CHECK(std::sqrt(norm) == doctest::Approx(r.norm).epsilon(1e-4));
    for (const auto& [j, g] : r.entries) {
      INFO(view.name << "[" << j << "]");
      CHECK(std::abs(grad[view.offset + j] - g) <= 1e-4 * r.norm);
    }
  }
}

TEST_CASE("gpt: an impossible shape is refused naming the field") {
  auto backend = create_backend("cpu", 1);
  GptSpec s = tiny_gpt();
  s.heads = 3;
  CHECK_THROWS_WITH_AS(Gpt(s, *backend, 1, 1), doctest::Contains("model.gpt.heads (3) must divide width (8)"), InputError);
  s = tiny_gpt();
  s.context = 0;
  CHECK_THROWS_WITH_AS(Gpt(s, *backend, 1, 1), doctest::Contains("model.gpt.context must be in [1, 4096]"), InputError);
}

TEST_CASE("gpt: the logits after a prompt do not depend on what pads the context after it") {
  auto backend = create_backend("cpu", 1);
  Gpt model(tiny_gpt(), *backend, 2, 7);
  const std::vector<float> a = model.next_token_logits({72, 105});
  // The same prompt as the first two tokens of a full window: the same logits at position 1.
  const std::vector<int32_t> x = {72, 105, 33, 200, 1, 9};
  const std::vector<int32_t> y(6, 0);
  model.evaluate(Batch{x.data(), y.data(), 1});
  const std::vector<float> b = model.next_token_logits({72, 105});
  REQUIRE(a.size() == 256);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == b[i]);
  CHECK_THROWS_AS(model.next_token_logits({}), InputError);
}
