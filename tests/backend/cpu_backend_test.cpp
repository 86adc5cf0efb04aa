// The CPU backend checked against naive double-precision references: it is the oracle
// every other backend is compared with, so it must itself be right.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hearsay/backend.h"
#include "test_util.h"

#include "backend_ops.h"

using namespace hearsay;
using test::random_vector;

namespace {

std::unique_ptr<Backend> cpu() { return create_backend("cpu", 1); }

}  // namespace

TEST_CASE("cpu gemm matches the naive product for every transpose combination") {
  auto b = cpu();
  const int m = 7, n = 5, k = 9;
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const auto a = random_vector(m * k, 1), bm = random_vector(k * n, 2);
      auto c = random_vector(m * n, 3);
      const auto c0 = c;
      const int lda = ta ? m : k, ldb = tb ? k : n;
      b->gemm(ta, tb, m, n, k, 0.5f, a.data(), lda, bm.data(), ldb, 2.0f, c.data(), n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double s = 0;
          for (int p = 0; p < k; ++p) {
            const double av = ta ? a[p * m + i] : a[i * k + p];
            const double bv = tb ? bm[j * k + p] : bm[p * n + j];
            s += av * bv;
          }
          CHECK(c[i * n + j] == doctest::Approx(0.5 * s + 2.0 * c0[i * n + j]).epsilon(1e-5));
        }
      }
    }
  }
}

TEST_CASE("cpu bias_activation adds the bias per column and applies ReLU") {
  auto b = cpu();
  std::vector<float> y{-1, 2, 0.5f, -3, 1, 1};
  const std::vector<float> bias{0.5f, -1, 1};
  b->bias_activation(y.data(), bias.data(), 2, 3, Activation::kRelu);
  CHECK(y == std::vector<float>{0, 1, 1.5f, 0, 0, 2});
  std::vector<float> z{-1, 2, 0.5f};
  b->bias_activation(z.data(), bias.data(), 1, 3, Activation::kNone);
  CHECK(z == std::vector<float>{-0.5f, 1, 1.5f});
}

TEST_CASE("cpu activation backward masks by the output and sums the bias gradient") {
  auto b = cpu();
  std::vector<float> dy{1, 2, 3, 4, 5, 6};
  const std::vector<float> y{0, 1, 2, 3, 0, 5};
  std::vector<float> db(3, 99.0f);
  b->activation_backward_bias_grad(dy.data(), y.data(), db.data(), 2, 3, Activation::kRelu);
  CHECK(dy == std::vector<float>{0, 2, 3, 4, 0, 6});
  CHECK(db == std::vector<float>{4, 2, 9});
}

TEST_CASE("cpu softmax cross-entropy: loss, gradient and accuracy match the definition") {
  auto b = cpu();
  const int rows = 4, cols = 6;
  const auto z = random_vector(rows * cols, 9, -3, 3);
  const std::vector<int32_t> labels{0, 5, 2, 2};
  std::vector<float> d(rows * cols);
  float stats[2];
  b->softmax_cross_entropy(z.data(), labels.data(), rows, cols, 0.25f, d.data(), stats);
  double loss = 0;
  int correct = 0;
  for (int r = 0; r < rows; ++r) {
    double sum = 0;
    int best = 0;
    for (int c = 0; c < cols; ++c) {
      sum += std::exp(static_cast<double>(z[r * cols + c]));
      if (z[r * cols + c] > z[r * cols + best]) best = c;
    }
    loss += std::log(sum) - z[r * cols + labels[r]];
    correct += best == labels[r];
    for (int c = 0; c < cols; ++c) {
      const double p = std::exp(static_cast<double>(z[r * cols + c])) / sum;
      CHECK(d[r * cols + c] == doctest::Approx(0.25 * (p - (c == labels[r]))).epsilon(1e-5));
    }
  }
  CHECK(stats[0] == doctest::Approx(loss).epsilon(1e-5));
  CHECK(stats[1] == correct);
}

TEST_CASE("cpu softmax cross-entropy is stable for huge logits") {
  auto b = cpu();
  const std::vector<float> z{1000.0f, -1000.0f, 999.0f};
  const std::vector<int32_t> label{2};
  std::vector<float> d(3);
  float stats[2];
  b->softmax_cross_entropy(z.data(), label.data(), 1, 3, 1.0f, d.data(), stats);
  CHECK(std::isfinite(stats[0]));
  CHECK(stats[0] == doctest::Approx(std::log(1.0 + std::exp(-1.0)) + 1.0).epsilon(1e-4));
}

TEST_CASE("cpu sgd_update follows the heavy-ball and Nesterov rules with weight decay") {
  auto b = cpu();
  for (bool nesterov : {false, true}) {
    std::vector<float> w{1.0f, -2.0f}, v{0.5f, 0.25f};
    const std::vector<float> g{0.1f, 0.2f};
    const SgdParams p{0.1f, 0.9f, 0.01f, nesterov};
    b->sgd_update(w.data(), g.data(), v.data(), 2, p);
    for (int i = 0; i < 2; ++i) {
      const double w0 = i == 0 ? 1.0 : -2.0, v0 = i == 0 ? 0.5 : 0.25;
      const double gi = g[i] + 0.01 * w0;
      const double vi = 0.9 * v0 + gi;
      CHECK(v[i] == doctest::Approx(vi));
      CHECK(w[i] == doctest::Approx(w0 - 0.1 * (nesterov ? gi + 0.9 * vi : vi)));
    }
  }
  std::vector<float> w{1.0f}, g{0.5f};
  b->sgd_update(w.data(), g.data(), nullptr, 1, SgdParams{0.1f, 0.0f, 0.0f, false});
  CHECK(w[0] == doctest::Approx(0.95));
}

TEST_CASE("cpu adamw_update: decoupled decay, both moments and the bias correction of step t") {
  // From m = 0.1, v = 0.01 at step t = 3 (lr 0.1, wd 0.2, beta1 0.9, beta2 0.999):
  //   w = 1 * (1 - 0.02) - 0.1 * (0.11 / (1 - 0.9^3)) / (sqrt(0.01003 / (1 - 0.999^3)) + 1e-8)
  // (float64 reference 0.957812091); a zero gradient with zero moments only decays.
  auto b = cpu();
  std::vector<float> w{1.0f, -0.5f}, m{0.1f, 0.0f}, v{0.01f, 0.0f};
  const std::vector<float> g{0.2f, 0.0f};
  AdamWParams p;
  p.lr = 0.1f;
  p.weight_decay = 0.2f;
  b->adamw_update(w.data(), g.data(), m.data(), v.data(), 2, p, 3);
  CHECK(m[0] == doctest::Approx(0.11));
  CHECK(v[0] == doctest::Approx(0.01003));
  CHECK(w[0] == doctest::Approx(0.957812091).epsilon(1e-6));
  CHECK(m[1] == 0.0f);
  CHECK(v[1] == 0.0f);
  CHECK(w[1] == doctest::Approx(-0.49).epsilon(1e-7));
}

TEST_CASE("cpu col2im is the adjoint of im2col") {
  // <im2col(x), c> == <x, col2im(c)> for all x, c: the backward pass is exactly the
  // transpose of the forward gather, padding included.
  auto b = cpu();
  const int batch = 2, h = 5, w = 4, ch = 3, k = 3, pad = 1;
  const size_t cols_n = size_t(batch) * h * w * k * k * ch, x_n = size_t(batch) * h * w * ch;
  const auto x = random_vector(x_n, 4), c = random_vector(cols_n, 5);
  std::vector<float> cols(cols_n), dx(x_n);
  b->im2col(x.data(), batch, h, w, ch, k, pad, cols.data());
  b->col2im(c.data(), batch, h, w, ch, k, pad, dx.data());
  double lhs = 0, rhs = 0;
  for (size_t i = 0; i < cols_n; ++i) lhs += double(cols[i]) * c[i];
  for (size_t i = 0; i < x_n; ++i) rhs += double(x[i]) * dx[i];
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
  // The centre tap of a 3x3 patch at (b=0, y=0, x=0) is x itself.
  const size_t centre = (1 * k + 1) * ch;
  CHECK(cols[centre] == x[0]);
  CHECK(cols[0] == 0.0f);  // top-left tap reads padding
}

TEST_CASE("cpu maxpool picks the max of each 2x2 window and routes the gradient to it") {
  auto b = cpu();
  // One 2x4 image with 1 channel: windows {1,5,2,0} and {3,4,8,7}.
  const std::vector<float> x{1, 5, 3, 4, 2, 0, 8, 7};
  std::vector<float> y(2);
  std::vector<int32_t> arg(2);
  b->maxpool2_forward(x.data(), 1, 2, 4, 1, y.data(), arg.data());
  CHECK(y == std::vector<float>{5, 8});
  const std::vector<float> dy{10, 20};
  std::vector<float> dx(8, -1.0f);
  b->maxpool2_backward(dy.data(), arg.data(), 1, 2, 4, 1, dx.data());
  CHECK(dx == std::vector<float>{0, 10, 0, 0, 0, 0, 20, 0});
}

TEST_CASE("cpu axpy and scale") {
  auto b = cpu();
  std::vector<float> x{1, 2, 3}, y{1, 1, 1};
  b->axpy(3, 2.0f, x.data(), y.data());
  CHECK(y == std::vector<float>{3, 5, 7});
  b->scale(3, 0.5f, y.data());
  CHECK(y == std::vector<float>{1.5f, 2.5f, 3.5f});
}

TEST_CASE("cpu backend: buffers of every size come zeroed and 64-byte aligned, and mapped ones take no memory until written") {
  auto b = create_backend("cpu");
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096}, (size_t{1} << 20) - 1, size_t{1} << 20, (size_t{3} << 20) + 5}) {
    CAPTURE(bytes);
    DeviceBuffer buf(*b, bytes);
    REQUIRE(buf.data() != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(buf.data()) % 64 == 0);
    const auto* p = static_cast<const unsigned char*>(buf.data());
    CHECK(std::all_of(p, p + bytes, [](unsigned char c) { return c == 0; }));
    std::memset(buf.data(), 0xab, bytes);  // written to the end: no overrun into a header
  }
  // 1 GiB allocated and freed 8 times: resident memory grows by what is written (one page
  // each), not by what is allocated, and freeing gives the mapping back.
  const long before = test::rss_bytes();
  for (int i = 0; i < 8; ++i) {
    DeviceBuffer big(*b, size_t{1} << 30);
    static_cast<char*>(big.data())[0] = 1;
  }
  std::vector<DeviceBuffer> held;
  for (int i = 0; i < 4; ++i) held.emplace_back(*b, size_t{256} << 20);
  // A sanitizer's own memory dominates its process's RSS (test_util.h): plain builds only.
  if (!test::kSanitized) CHECK(test::rss_bytes() - before < (64L << 20));
}
