// Finite-difference checks of every layer's backward pass and of the softmax
// cross-entropy loss, through whole models so that input gradients (dx) are covered too:
// a layer's dx only matters through the parameters of the layers below it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "hearsay/model.h"
#include "hearsay/rng.h"

using namespace hearsay;

namespace {

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch random_batch(const ModelSpec& s, int n, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  b.x.resize(size_t(n) * s.input_dim());
  for (auto& v : b.x) v = rng.uniform(-1.0f, 1.0f);
  for (int i = 0; i < n; ++i) b.y.push_back(static_cast<int32_t>(rng.below(s.num_classes)));
  return b;
}

// Compares the analytic gradient with central differences on every parameter (models here
// are small). Returns the number of parameters checked.
size_t check_gradients(const ModelSpec& spec, uint64_t seed) {
  auto backend = create_backend("cpu", 1);
  const int n = 4;
  Model model(spec, *backend, n, seed);
  // Small random biases too, so ReLU units are not all exactly at their kink.
  std::vector<float> p = model.get_params();
  Rng rng(seed + 1);
  for (auto& v : p) v += rng.uniform(-0.05f, 0.05f);
  model.set_params(p);
  const Batch b = random_batch(spec, n, seed + 2);
  model.forward_backward(b.x.data(), b.y.data(), n);
  std::vector<float> grad(model.num_params());
  std::copy_n(model.grads(), grad.size(), grad.begin());

  const float eps = 1e-3f;
  const double center = model.evaluate(b.x.data(), b.y.data(), n).loss();
  size_t checked = 0, kinks = 0;
  for (const ParamView& view : model.param_views()) {
    for (size_t j = 0; j < view.size; ++j) {
      const size_t i = view.offset + j;
      const float saved = p[i];
      p[i] = saved + eps;
      model.set_params(p);
      const double up = model.evaluate(b.x.data(), b.y.data(), n).loss();
      p[i] = saved - eps;
      model.set_params(p);
      const double down = model.evaluate(b.x.data(), b.y.data(), n).loss();
      p[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      // Where a ReLU or a max-pool choice flips inside [w - eps, w + eps] the loss has a
      // kink and no finite difference is meaningful; the one-sided slopes disagree there.
      const double right = (up - center) / eps, left = (center - down) / eps;
      // There the analytic gradient must still lie between the two one-sided slopes.
      INFO(view.name << "[" << j << "]: analytic " << grad[i] << ", numeric " << numeric << " (left " << left
                     << ", right " << right << ")");
      const double tol = 2e-3 + 2e-2 * std::abs(numeric);
      if (std::abs(right - left) > tol) {
        ++kinks;
        CHECK(grad[i] >= std::min(left, right) - tol);
        CHECK(grad[i] <= std::max(left, right) + tol);
        continue;
      }
      CHECK(std::abs(numeric - grad[i]) <= tol);
      ++checked;
    }
  }
  INFO("kinks skipped: " << kinks << " of " << checked + kinks);
  CHECK(kinks * 50 <= checked + kinks);  // at most 2% of parameters sit on a kink
  return checked + kinks;
}

}  // namespace

TEST_CASE("gradient check: logistic regression (dense layer, no activation, softmax loss)") {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kLogReg;
  s.channels = 6;
  s.num_classes = 4;
  CHECK(check_gradients(s, 10) == 6 * 4 + 4);
}

TEST_CASE("gradient check: MLP (dense + ReLU layers and their input gradients)") {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kMlp;
  s.channels = 7;
  s.hidden = {6, 5};
  s.num_classes = 3;
  CHECK(check_gradients(s, 20) == (7 * 6 + 6) + (6 * 5 + 5) + (5 * 3 + 3));
}

TEST_CASE("gradient check: CNN (conv via im2col, max pooling, col2im input gradients)") {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kCnn;
  s.height = 8;
  s.width = 8;
  s.channels = 2;
  s.conv_channels = {3, 4};
  s.kernel = 3;
  s.fc_width = 5;
  s.num_classes = 3;
  CHECK(check_gradients(s, 30) > 100);
}

TEST_CASE("gradient check: CNN with a kernel larger than the feature map (padding only)") {
  ModelSpec s;
  s.kind = ModelSpec::Kind::kCnn;
  s.height = 4;
  s.width = 6;
  s.channels = 1;
  s.conv_channels = {2};
  s.kernel = 5;
  s.fc_width = 3;
  s.num_classes = 2;
  CHECK(check_gradients(s, 40) > 50);
}
