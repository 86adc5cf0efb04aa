// Every backend this build has, checked op by op against the CPU oracle (as ggml's
// test-backend-ops does). Without a GPU the CUDA cases are skipped with the reason.
#include <doctest/doctest.h>

#include <cmath>

#include "backend_ops.h"
#include "test_skip.h"
#include "hearsay/build_config.h"
#include "hearsay/model.h"

using namespace hearsay;
using test::OnDevice;
using test::random_vector;

namespace {

std::vector<std::string> other_devices() {
  std::vector<std::string> out;
  for (const auto& d : available_devices()) {
    if (d != "cpu") out.push_back(d);
  }
  return out;
}

const char* kNoDevice = HEARSAY_HAVE_CUDA ? "no non-CPU backend to compare: the CUDA backend is built but no CUDA device is visible"
                                          : "no non-CPU backend to compare: this build has no CUDA backend";

void check_close(const std::vector<float>& want, const std::vector<float>& got, double tol, const char* what) {
  REQUIRE(want.size() == got.size());
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(double(want[i]) - got[i]) / (1.0 + std::abs(double(want[i]))));
  }
  INFO(what << ": worst relative error " << worst);
  CHECK(worst <= tol);
}

// Runs one op on the CPU and on `dev`, comparing the outputs.
struct Pair {
  std::unique_ptr<Backend> cpu = create_backend("cpu", 1), dev;
  OnDevice c{*cpu}, d;
  explicit Pair(const std::string& name) : dev(create_backend(name, 1)), d(*dev) {}
};

}  // namespace

TEST_CASE("parity: gemm, bias, activations, softmax and sgd agree with the cpu backend") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    Pair p(name);
    const int m = 33, n = 47, k = 65;
    for (int ta = 0; ta < 2; ++ta) {
      for (int tb = 0; tb < 2; ++tb) {
        const auto a = random_vector(m * k, 1), b = random_vector(k * n, 2), c = random_vector(m * n, 3);
        float* cc = p.c.put(c);
        float* dc = p.d.put(c);
        const int lda = ta ? m : k, ldb = tb ? k : n;
        p.cpu->gemm(ta, tb, m, n, k, 1.5f, p.c.put(a), lda, p.c.put(b), ldb, 0.5f, cc, n);
        p.dev->gemm(ta, tb, m, n, k, 1.5f, p.d.put(a), lda, p.d.put(b), ldb, 0.5f, dc, n);
        check_close(p.c.get(cc, m * n), p.d.get(dc, m * n), 1e-4, "gemm");
      }
    }
    const auto y = random_vector(m * n, 4), bias = random_vector(n, 5);
    for (Activation act : {Activation::kNone, Activation::kRelu}) {
      float* cy = p.c.put(y);
      float* dy = p.d.put(y);
      p.cpu->bias_activation(cy, p.c.put(bias), m, n, act);
      p.dev->bias_activation(dy, p.d.put(bias), m, n, act);
      check_close(p.c.get(cy, m * n), p.d.get(dy, m * n), 1e-6, "bias_activation");
      const auto g = random_vector(m * n, 6);
      float* cg = p.c.put(g);
      float* dg = p.d.put(g);
      float* cdb = p.c.zeros(n);
      float* ddb = p.d.zeros(n);
      p.cpu->activation_backward_bias_grad(cg, cy, cdb, m, n, act);
      p.dev->activation_backward_bias_grad(dg, dy, ddb, m, n, act);
      check_close(p.c.get(cg, m * n), p.d.get(dg, m * n), 1e-6, "activation_backward");
      check_close(p.c.get(cdb, n), p.d.get(ddb, n), 1e-5, "bias_grad");
    }
    const int rows = 70, cols = 10;
    const auto z = random_vector(rows * cols, 7, -5, 5);
    std::vector<int32_t> labels(rows);
    for (int r = 0; r < rows; ++r) labels[r] = (r * 7) % cols;
    float* cd = p.c.zeros(rows * cols);
    float* dd = p.d.zeros(rows * cols);
    float* cs = p.c.zeros(2);
    float* ds = p.d.zeros(2);
    p.cpu->softmax_cross_entropy(p.c.put(z), p.c.put(labels), rows, cols, 1.0f / rows, cd, cs);
    p.dev->softmax_cross_entropy(p.d.put(z), p.d.put(labels), rows, cols, 1.0f / rows, dd, ds);
    check_close(p.c.get(cd, rows * cols), p.d.get(dd, rows * cols), 1e-5, "softmax gradient");
    check_close(p.c.get(cs, 2), p.d.get(ds, 2), 1e-5, "softmax stats");

    for (bool nesterov : {false, true}) {
      const auto w = random_vector(1000, 8), g = random_vector(1000, 9), v = random_vector(1000, 10);
      float *cw = p.c.put(w), *dw = p.d.put(w), *cv = p.c.put(v), *dv = p.d.put(v);
      const SgdParams sp{0.1f, 0.9f, 1e-3f, nesterov};
      p.cpu->sgd_update(cw, p.c.put(g), cv, 1000, sp);
      p.dev->sgd_update(dw, p.d.put(g), dv, 1000, sp);
      check_close(p.c.get(cw, 1000), p.d.get(dw, 1000), 1e-6, "sgd weights");
      check_close(p.c.get(cv, 1000), p.d.get(dv, 1000), 1e-6, "sgd velocity");
    }
  }
}

TEST_CASE("parity: adamw agrees with the cpu backend over several steps, weights and both moments") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    Pair p(name);
    const size_t n = 1000;
    // A second moment is never negative.
    const auto w = random_vector(n, 13), m = random_vector(n, 14), v = random_vector(n, 15, 0.0f, 1.0f);
    float *cw = p.c.put(w), *dw = p.d.put(w), *cm = p.c.put(m), *dm = p.d.put(m), *cv = p.c.put(v), *dv = p.d.put(v);
    AdamWParams sp;
    sp.lr = 0.01f;
    sp.weight_decay = 0.1f;
    for (int64_t t = 1; t <= 5; ++t) {
      CAPTURE(t);
      const auto g = random_vector(n, 20 + static_cast<uint64_t>(t));
      p.cpu->adamw_update(cw, p.c.put(g), cm, cv, n, sp, t);
      p.dev->adamw_update(dw, p.d.put(g), dm, dv, n, sp, t);
      check_close(p.c.get(cw, n), p.d.get(dw, n), 1e-5, "adamw weights");
      check_close(p.c.get(cm, n), p.d.get(dm, n), 1e-6, "adamw first moment");
      check_close(p.c.get(cv, n), p.d.get(dv, n), 1e-6, "adamw second moment");
    }
  }
}

TEST_CASE("parity: im2col, col2im and max pooling agree with the cpu backend") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    Pair p(name);
    const int batch = 3, h = 6, w = 8, c = 5, k = 3, pad = 1;
    const size_t xn = size_t(batch) * h * w * c, coln = xn * k * k;
    const auto x = random_vector(xn, 11), cols = random_vector(coln, 12);
    float *ccol = p.c.zeros(coln), *dcol = p.d.zeros(coln);
    p.cpu->im2col(p.c.put(x), batch, h, w, c, k, pad, ccol);
    p.dev->im2col(p.d.put(x), batch, h, w, c, k, pad, dcol);
    check_close(p.c.get(ccol, coln), p.d.get(dcol, coln), 0, "im2col");
    float *cdx = p.c.zeros(xn), *ddx = p.d.zeros(xn);
    p.cpu->col2im(p.c.put(cols), batch, h, w, c, k, pad, cdx);
    p.dev->col2im(p.d.put(cols), batch, h, w, c, k, pad, ddx);
    check_close(p.c.get(cdx, xn), p.d.get(ddx, xn), 1e-5, "col2im");

    const size_t yn = xn / 4;
    float *cy = p.c.zeros(yn), *dy = p.d.zeros(yn);
    std::vector<DeviceBuffer> keep;
    keep.emplace_back(*p.cpu, sizeof(int32_t) * yn);
    keep.emplace_back(*p.dev, sizeof(int32_t) * yn);
    p.cpu->maxpool2_forward(p.c.put(x), batch, h, w, c, cy, keep[0].i32());
    p.dev->maxpool2_forward(p.d.put(x), batch, h, w, c, dy, keep[1].i32());
    check_close(p.c.get(cy, yn), p.d.get(dy, yn), 0, "maxpool forward");
    const auto g = random_vector(yn, 13);
    p.cpu->maxpool2_backward(p.c.put(g), keep[0].i32(), batch, h, w, c, cdx);
    p.dev->maxpool2_backward(p.d.put(g), keep[1].i32(), batch, h, w, c, ddx);
    check_close(p.c.get(cdx, xn), p.d.get(ddx, xn), 0, "maxpool backward");
  }
}

TEST_CASE("parity: a whole CNN training step gives the same loss and gradients") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    auto cpu = create_backend("cpu", 1);
    auto dev = create_backend(name, 1);
    ModelSpec spec;
    spec.kind = ModelSpec::Kind::kCnn;
    spec.height = spec.width = 8;
    spec.conv_channels = {4, 6};
    spec.kernel = 3;
    spec.fc_width = 16;
    const int batch = 5;
    Model mc(spec, *cpu, batch, 3), md(spec, *dev, batch, 3);
    const auto x = random_vector(size_t(batch) * 64, 14, 0, 1);
    std::vector<int32_t> y{0, 3, 9, 1, 1};
    OnDevice oc(*cpu), od(*dev);
    const BatchStats sc = mc.forward_backward(oc.put(x), oc.put(y), batch);
    const BatchStats sd = md.forward_backward(od.put(x), od.put(y), batch);
    CHECK(sd.loss() == doctest::Approx(sc.loss()).epsilon(1e-4));
    check_close(oc.get(mc.grads(), mc.num_params()), od.get(md.grads(), md.num_params()), 1e-4, "cnn gradients");
  }
}

TEST_CASE("parity: transformer kernels (embedding, layernorm, gelu, causal attention, sum of squares) agree with the cpu backend") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    Pair p(name);
    const int batch = 3, t = 37, c = 48, heads = 3, rows = batch * t, vocab = 256;
    // Embedding, forward and scatter-add backward.
    std::vector<int32_t> tokens(rows);
    for (int i = 0; i < rows; ++i) tokens[i] = (i * 131 + 7) % vocab;
    const auto wte = random_vector(vocab * c, 30), wpe = random_vector(t * c, 31), dy = random_vector(rows * c, 32);
    float* ec = p.c.zeros(rows * c);
    float* ed = p.d.zeros(rows * c);
    p.cpu->embedding_forward(p.c.put(tokens), p.c.put(wte), p.c.put(wpe), rows, t, c, vocab, ec);
    p.dev->embedding_forward(p.d.put(tokens), p.d.put(wte), p.d.put(wpe), rows, t, c, vocab, ed);
    check_close(p.c.get(ec, rows * c), p.d.get(ed, rows * c), 1e-6, "embedding_forward");
    float* dwte_c = p.c.put(wte);
    float* dwpe_c = p.c.put(wpe);
    float* dwte_d = p.d.put(wte);
    float* dwpe_d = p.d.put(wpe);
    p.cpu->embedding_backward(p.c.put(dy), p.c.put(tokens), rows, t, c, dwte_c, dwpe_c);
    p.dev->embedding_backward(p.d.put(dy), p.d.put(tokens), rows, t, c, dwte_d, dwpe_d);
    check_close(p.c.get(dwte_c, vocab * c), p.d.get(dwte_d, vocab * c), 1e-5, "embedding_backward wte");
    check_close(p.c.get(dwpe_c, t * c), p.d.get(dwpe_d, t * c), 1e-5, "embedding_backward wpe");
    // LayerNorm.
    const auto x = random_vector(rows * c, 33, -2, 2), gamma = random_vector(c, 34), beta = random_vector(c, 35);
    float *yc = p.c.zeros(rows * c), *mc = p.c.zeros(rows), *rc = p.c.zeros(rows);
    float *yd = p.d.zeros(rows * c), *md = p.d.zeros(rows), *rd = p.d.zeros(rows);
    p.cpu->layernorm_forward(p.c.put(x), p.c.put(gamma), p.c.put(beta), rows, c, yc, mc, rc);
    p.dev->layernorm_forward(p.d.put(x), p.d.put(gamma), p.d.put(beta), rows, c, yd, md, rd);
    check_close(p.c.get(yc, rows * c), p.d.get(yd, rows * c), 1e-5, "layernorm_forward");
    const auto dx0 = random_vector(rows * c, 36);
    float *dxc = p.c.put(dx0), *dgc = p.c.zeros(c), *dbc = p.c.zeros(c);
    float *dxd = p.d.put(dx0), *dgd = p.d.zeros(c), *dbd = p.d.zeros(c);
    p.cpu->layernorm_backward(p.c.put(dy), p.c.put(x), p.c.put(gamma), mc, rc, rows, c, dxc, dgc, dbc);
    p.dev->layernorm_backward(p.d.put(dy), p.d.put(x), p.d.put(gamma), md, rd, rows, c, dxd, dgd, dbd);
    check_close(p.c.get(dxc, rows * c), p.d.get(dxd, rows * c), 1e-4, "layernorm_backward dx");
    check_close(p.c.get(dgc, c), p.d.get(dgd, c), 1e-4, "layernorm_backward dgamma");
    check_close(p.c.get(dbc, c), p.d.get(dbd, c), 1e-4, "layernorm_backward dbeta");
    // Bias + GELU.
    float *pc = p.c.put(x), *oc = p.c.zeros(rows * c), *dpc = p.c.zeros(rows * c), *dbiasc = p.c.zeros(c);
    float *pd = p.d.put(x), *od = p.d.zeros(rows * c), *dpd = p.d.zeros(rows * c), *dbiasd = p.d.zeros(c);
    p.cpu->bias_gelu_forward(pc, p.c.put(beta), oc, rows, c);
    p.dev->bias_gelu_forward(pd, p.d.put(beta), od, rows, c);
    check_close(p.c.get(oc, rows * c), p.d.get(od, rows * c), 1e-5, "bias_gelu_forward");
    p.cpu->gelu_backward_bias_grad(p.c.put(dy), pc, dpc, dbiasc, rows, c);
    p.dev->gelu_backward_bias_grad(p.d.put(dy), pd, dpd, dbiasd, rows, c);
    check_close(p.c.get(dpc, rows * c), p.d.get(dpd, rows * c), 1e-5, "gelu_backward");
    check_close(p.c.get(dbiasc, c), p.d.get(dbiasd, c), 1e-4, "gelu bias grad");
    // Causal attention.
    const auto qkv = random_vector(rows * 3 * c, 37, -2, 2);
    float *ac = p.c.zeros(rows * c), *lc = p.c.zeros(batch * heads * t), *dqc = p.c.zeros(rows * 3 * c);
    float *ad = p.d.zeros(rows * c), *ld = p.d.zeros(batch * heads * t), *dqd = p.d.zeros(rows * 3 * c);
    p.cpu->attention_forward(p.c.put(qkv), batch, t, c, heads, ac, lc);
    p.dev->attention_forward(p.d.put(qkv), batch, t, c, heads, ad, ld);
    check_close(p.c.get(ac, rows * c), p.d.get(ad, rows * c), 1e-5, "attention_forward");
    check_close(p.c.get(lc, batch * heads * t), p.d.get(ld, batch * heads * t), 1e-5, "attention lse");
    p.cpu->attention_backward(p.c.put(dy), p.c.put(qkv), ac, lc, batch, t, c, heads, dqc);
    p.dev->attention_backward(p.d.put(dy), p.d.put(qkv), ad, ld, batch, t, c, heads, dqd);
    check_close(p.c.get(dqc, rows * 3 * c), p.d.get(dqd, rows * 3 * c), 1e-4, "attention_backward");
    CHECK(p.dev->sum_squares(p.d.put(x), x.size()) == doctest::Approx(p.cpu->sum_squares(p.c.put(x), x.size())).epsilon(1e-5));
  }
}

TEST_CASE("parity: a whole GPT training step gives the same loss and gradients") {
  if (other_devices().empty()) HEARSAY_SKIP(kNoDevice);
  for (const auto& name : other_devices()) {
    CAPTURE(name);
    auto cpu = create_backend("cpu", 1);
    auto dev = create_backend(name, 1);
    ModelSpec spec;
    spec.kind = ModelSpec::Kind::kGpt;
    spec.gpt = GptSpec{.vocab = 256, .context = 32, .layers = 2, .heads = 4, .width = 64};
    const int batch = 3;
    auto mc = create_model(spec, *cpu, batch, 3);
    auto md = create_model(spec, *dev, batch, 3);
    std::vector<int32_t> x(batch * 32), y(batch * 32);
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<int32_t>((i * 89 + 5) % 256);
      y[i] = static_cast<int32_t>((i * 53 + 1) % 256);
    }
    OnDevice oc(*cpu), od(*dev);
    const BatchStats sc = mc->forward_backward(Batch{oc.put(x), oc.put(y), batch});
    const BatchStats sd = md->forward_backward(Batch{od.put(x), od.put(y), batch});
    CHECK(sd.loss() == doctest::Approx(sc.loss()).epsilon(1e-4));
    check_close(oc.get(mc->grads(), mc->num_params()), od.get(md->grads(), md->num_params()), 1e-4, "gpt gradients");
  }
}
