#include "cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "hearsay/error.h"
#include "transformer_kernels.h"
#include "zeroed_memory.h"

namespace hearsay {
namespace {

// The windows of 2x2 max-pooling with stride 2 over NHWC images, which the forward and the
// backward pass walk alike: for each output pixel, visit(o, in) gets the offset o of its c
// channels in y (dy) and the offsets in[q] of its window's pixels in x (dx), q = 0..3 for
// (0,0), (0,1), (1,0), (1,1): the numbers argmax holds.
template <typename Visit>
void for_each_pool2_window(int batch, int h, int w, int c, Visit visit) {
  const int oh = h / 2, ow = w / 2;
  for (int b = 0; b < batch; ++b) {
    for (int oy = 0; oy < oh; ++oy) {
      for (int ox = 0; ox < ow; ++ox) {
        const size_t o = ((static_cast<size_t>(b) * oh + oy) * ow + ox) * c;
        size_t in[4];
        for (int q = 0; q < 4; ++q)
          in[q] = ((static_cast<size_t>(b) * h + 2 * oy + q / 2) * w + 2 * ox + q % 2) * c;
        visit(o, in);
      }
    }
  }
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) { openblas_set_num_threads(threads); }

  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }

  void* allocate(size_t bytes) override {
    void* p = allocate_zeroed(bytes);
    if (p == nullptr) throw BackendError("cpu: out of memory allocating " + std::to_string(bytes) + " bytes");
    return p;
  }
  void deallocate(void* ptr) override { free_zeroed(ptr); }
  void upload(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0 && dst != src) std::memmove(dst, src, bytes);
  }
  void fill_zero(void* dst, size_t bytes) override {
    if (bytes != 0) std::memset(dst, 0, bytes);
  }
  void synchronize() override {}

  void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
            const float* b, int ldb, float beta, float* c, int ldc) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }

  void axpy(size_t n, float alpha, const float* __restrict x, float* __restrict y) override {
    for (size_t i = 0; i < n; ++i) y[i] += alpha * x[i];
  }

  void scale(size_t n, float alpha, float* x) override {
    for (size_t i = 0; i < n; ++i) x[i] *= alpha;
  }

  void bias_activation(float* y, const float* bias, int rows, int cols, Activation act) override {
    for (int r = 0; r < rows; ++r) {
      float* __restrict row = y + static_cast<size_t>(r) * cols;
      if (bias != nullptr) {
        const float* __restrict b = bias;
        if (act == Activation::kRelu) {
          for (int c = 0; c < cols; ++c) row[c] = std::max(row[c] + b[c], 0.0f);
        } else {
          for (int c = 0; c < cols; ++c) row[c] += b[c];
        }
      } else if (act == Activation::kRelu) {
        for (int c = 0; c < cols; ++c) row[c] = std::max(row[c], 0.0f);
      }
    }
  }

  void activation_backward_bias_grad(float* dy, const float* y, float* dbias, int rows, int cols,
                                     Activation act) override {
    if (dbias != nullptr) std::memset(dbias, 0, sizeof(float) * cols);
    for (int r = 0; r < rows; ++r) {
      float* __restrict d = dy + static_cast<size_t>(r) * cols;
      const float* __restrict out = y + static_cast<size_t>(r) * cols;
      if (act == Activation::kRelu) {
        for (int c = 0; c < cols; ++c) d[c] = out[c] > 0.0f ? d[c] : 0.0f;
      }
      if (dbias != nullptr) {
        float* __restrict db = dbias;
        for (int c = 0; c < cols; ++c) db[c] += d[c];
      }
    }
  }

  void softmax_cross_entropy(const float* logits, const int32_t* labels, int rows, int cols,
                             float grad_scale, float* dlogits, float* stats) override {
    double loss = 0.0;
    int correct = 0;
    for (int r = 0; r < rows; ++r) {
      const float* __restrict z = logits + static_cast<size_t>(r) * cols;
      float* __restrict d = dlogits + static_cast<size_t>(r) * cols;
      const int label = labels[r];
      HEARSAY_CHECK(label >= 0 && label < cols, "label out of range");
      int best = 0;
      float zmax = z[0];
      for (int c = 1; c < cols; ++c) {
        if (z[c] > zmax) {
          zmax = z[c];
          best = c;
        }
      }
      float sum = 0.0f;
      for (int c = 0; c < cols; ++c) {
        d[c] = std::exp(z[c] - zmax);
        sum += d[c];
      }
      const float inv = 1.0f / sum;
      for (int c = 0; c < cols; ++c) d[c] *= inv * grad_scale;
      d[label] -= grad_scale;
      loss += std::log(sum) - (z[label] - zmax);
      correct += best == label;
    }
    stats[0] = static_cast<float>(loss);
    stats[1] = static_cast<float>(correct);
  }

  void im2col(const float* x, int batch, int h, int w, int c, int k, int pad,
              float* cols) override {
    const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
    const size_t row_len = static_cast<size_t>(k) * k * c;
    for (int b = 0; b < batch; ++b) {
      const float* img = x + static_cast<size_t>(b) * h * w * c;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          float* out = cols + ((static_cast<size_t>(b) * oh + oy) * ow + ox) * row_len;
          for (int ky = 0; ky < k; ++ky) {
            const int iy = oy + ky - pad;
            for (int kx = 0; kx < k; ++kx, out += c) {
              const int ix = ox + kx - pad;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                std::memset(out, 0, sizeof(float) * c);
              } else {
                std::memcpy(out, img + (static_cast<size_t>(iy) * w + ix) * c, sizeof(float) * c);
              }
            }
          }
        }
      }
    }
  }

  void col2im(const float* cols, int batch, int h, int w, int c, int k, int pad,
              float* dx) override {
    const int oh = h + 2 * pad - k + 1, ow = w + 2 * pad - k + 1;
    const size_t row_len = static_cast<size_t>(k) * k * c;
    std::memset(dx, 0, sizeof(float) * static_cast<size_t>(batch) * h * w * c);
    for (int b = 0; b < batch; ++b) {
      float* img = dx + static_cast<size_t>(b) * h * w * c;
      for (int oy = 0; oy < oh; ++oy) {
        for (int ox = 0; ox < ow; ++ox) {
          const float* in = cols + ((static_cast<size_t>(b) * oh + oy) * ow + ox) * row_len;
          for (int ky = 0; ky < k; ++ky) {
            const int iy = oy + ky - pad;
            for (int kx = 0; kx < k; ++kx, in += c) {
              const int ix = ox + kx - pad;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
              float* __restrict dst = img + (static_cast<size_t>(iy) * w + ix) * c;
              const float* __restrict src = in;
              for (int ch = 0; ch < c; ++ch) dst[ch] += src[ch];
            }
          }
        }
      }
    }
  }

  void maxpool2_forward(const float* x, int batch, int h, int w, int c, float* y,
                        int32_t* argmax) override {
    for_each_pool2_window(batch, h, w, c, [&](size_t o, const size_t(&in)[4]) {
      for (int ch = 0; ch < c; ++ch) {
        int best = 0;
        float v = x[in[0] + ch];
        for (int q = 1; q < 4; ++q) {
          if (x[in[q] + ch] > v) {
            v = x[in[q] + ch];
            best = q;
          }
        }
        y[o + ch] = v;
        argmax[o + ch] = best;
      }
    });
  }

  void maxpool2_backward(const float* dy, const int32_t* argmax, int batch, int h, int w, int c,
                         float* dx) override {
    for_each_pool2_window(batch, h, w, c, [&](size_t o, const size_t(&in)[4]) {
      for (int q = 0; q < 4; ++q) {
        float* d = dx + in[q];
        for (int ch = 0; ch < c; ++ch) d[ch] = argmax[o + ch] == q ? dy[o + ch] : 0.0f;
      }
    });
  }

  void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int rows, int context, int c,
                         int vocab, float* y) override {
    cpu::embedding_forward(tokens, wte, wpe, rows, context, c, vocab, y);
  }
  void embedding_backward(const float* dy, const int32_t* tokens, int rows, int context, int c, float* dwte,
                          float* dwpe) override {
    cpu::embedding_backward(dy, tokens, rows, context, c, dwte, dwpe);
  }
  void layernorm_forward(const float* x, const float* gamma, const float* beta, int rows, int c, float* y,
                         float* mean, float* rstd) override {
    cpu::layernorm_forward(x, gamma, beta, rows, c, y, mean, rstd);
  }
  void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                          const float* rstd, int rows, int c, float* dx, float* dgamma, float* dbeta) override {
    cpu::layernorm_backward(dy, x, gamma, mean, rstd, rows, c, dx, dgamma, dbeta);
  }
  void bias_gelu_forward(float* pre, const float* bias, float* out, int rows, int cols) override {
    cpu::bias_gelu_forward(pre, bias, out, rows, cols);
  }
  void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias, int rows,
                               int cols) override {
    cpu::gelu_backward_bias_grad(dout, pre, dpre, dbias, rows, cols);
  }
  void attention_forward(const float* qkv, int batch, int context, int c, int heads, float* out,
                         float* lse) override {
    cpu::attention_forward(qkv, batch, context, c, heads, out, lse, attention_scratch(context));
  }
  void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse, int batch,
                          int context, int c, int heads, float* dqkv) override {
    cpu::attention_backward(dout, qkv, out, lse, batch, context, c, heads, dqkv, attention_scratch(context));
  }
  double sum_squares(const float* x, size_t n) override { return cpu::sum_squares(x, n); }

  void sgd_update(float* __restrict w, const float* __restrict g, float* __restrict v, size_t n,
                  const SgdParams& p) override {
    const float lr = p.lr, m = p.momentum, wd = p.weight_decay, s = p.grad_scale;
    if (m == 0.0f || v == nullptr) {
      for (size_t i = 0; i < n; ++i) w[i] -= lr * (g[i] * s + wd * w[i]);
    } else if (p.nesterov) {
      for (size_t i = 0; i < n; ++i) {
        const float gi = g[i] * s + wd * w[i];
        const float vi = m * v[i] + gi;
        v[i] = vi;
        w[i] -= lr * (gi + m * vi);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const float vi = m * v[i] + g[i] * s + wd * w[i];
        v[i] = vi;
        w[i] -= lr * vi;
      }
    }
  }

  void adamw_update(float* __restrict w, const float* __restrict g, float* __restrict m, float* __restrict v,
                    size_t n, const AdamWParams& p, int64_t t) override {
    HEARSAY_CHECK(t >= 1 && m != nullptr && v != nullptr, "adamw_update: t = " + std::to_string(t));
    const float lr = p.lr, decay = 1.0f - p.lr * p.weight_decay, b1 = p.beta1, b2 = p.beta2, eps = p.eps,
                s = p.grad_scale;
    const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(t)));
    const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(t)));
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * s;
      const float mi = b1 * m[i] + (1.0f - b1) * gi;
      const float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
      m[i] = mi;
      v[i] = vi;
      w[i] = w[i] * decay - lr * (mi / c1) / (std::sqrt(vi / c2) + eps);
    }
  }

 private:
  // One block of one head's scores and their gradient: all the attention kernels keep.
  float* attention_scratch(int context) {
    const size_t need = cpu::attention_scratch_floats(context);
    if (attention_scratch_.size() < need) attention_scratch_.resize(need);
    return attention_scratch_.data();
  }
  std::vector<float> attention_scratch_;
};

}  // namespace

std::unique_ptr<Backend> create_cpu_backend(int threads) {
  if (threads < 1) throw InputError("cpu backend: threads must be >= 1, got " + std::to_string(threads));
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace hearsay
