#include "transformer_kernels.h"

#include <cblas.h>

#include <algorithm>

#include <cmath>
#include <cstring>
#include <string>

#include "fast_math.h"
#include "hearsay/backend.h"
#include "hearsay/error.h"

namespace hearsay::cpu {
namespace {

constexpr float kLayerNormEps = 1e-5f;
// GELU's tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
constexpr float kGeluScale = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

inline void sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                  int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
              lda, b, ldb, beta, c, ldc);
}

}  // namespace

void embedding_forward(const int32_t* tokens, const float* wte, const float* wpe, int rows, int context, int c,
                       int vocab, float* y) {
  for (int r = 0; r < rows; ++r) {
    const int32_t tok = tokens[r];
    HEARSAY_CHECK(tok >= 0 && tok < vocab, "embedding: token " + std::to_string(tok) + " at row " +
                                               std::to_string(r) + " outside the vocabulary [0, " +
                                               std::to_string(vocab) + ")");
    const float* __restrict e = wte + static_cast<size_t>(tok) * c;
    const float* __restrict p = wpe + static_cast<size_t>(r % context) * c;
    float* __restrict out = y + static_cast<size_t>(r) * c;
    for (int k = 0; k < c; ++k) out[k] = e[k] + p[k];
  }
}

void embedding_backward(const float* dy, const int32_t* tokens, int rows, int context, int c, float* dwte,
                        float* dwpe) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict d = dy + static_cast<size_t>(r) * c;
    float* __restrict de = dwte + static_cast<size_t>(tokens[r]) * c;
    float* __restrict dp = dwpe + static_cast<size_t>(r % context) * c;
    for (int k = 0; k < c; ++k) {
      de[k] += d[k];
      dp[k] += d[k];
    }
  }
}

void layernorm_forward(const float* x, const float* gamma, const float* beta, int rows, int c, float* y,
                       float* mean, float* rstd) {
  for (int r = 0; r < rows; ++r) {
    const float* __restrict in = x + static_cast<size_t>(r) * c;
    float* __restrict out = y + static_cast<size_t>(r) * c;
    const float m = lane_sum(c, [in](int k) { return in[k]; }) / c;
    const float var = lane_sum(c, [in, m](int k) { return (in[k] - m) * (in[k] - m); }) / c;
    const float s = 1.0f / std::sqrt(var + kLayerNormEps);
    for (int k = 0; k < c; ++k) out[k] = (in[k] - m) * s * gamma[k] + beta[k];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                        const float* rstd, int rows, int c, float* dx, float* dgamma, float* dbeta) {
  std::memset(dgamma, 0, sizeof(float) * c);
  std::memset(dbeta, 0, sizeof(float) * c);
  for (int r = 0; r < rows; ++r) {
    const float* __restrict d = dy + static_cast<size_t>(r) * c;
    const float* __restrict in = x + static_cast<size_t>(r) * c;
    float* __restrict dxr = dx + static_cast<size_t>(r) * c;
    const float m = mean[r], s = rstd[r];
    // dx = s * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * gamma.
    const float g_mean = lane_sum(c, [d, gamma](int k) { return d[k] * gamma[k]; }) / c;
    const float g_xhat_mean = lane_sum(c, [d, gamma, in, m, s](int k) { return d[k] * gamma[k] * (in[k] - m) * s; }) / c;
    for (int k = 0; k < c; ++k) {
      const float xhat = (in[k] - m) * s;
      dgamma[k] += d[k] * xhat;
      dbeta[k] += d[k];
      dxr[k] += s * (d[k] * gamma[k] - g_mean - xhat * g_xhat_mean);
    }
  }
}

void bias_gelu_forward(float* pre, const float* bias, float* out, int rows, int cols) {
  for (int r = 0; r < rows; ++r) {
    float* __restrict p = pre + static_cast<size_t>(r) * cols;
    float* __restrict o = out + static_cast<size_t>(r) * cols;
    for (int k = 0; k < cols; ++k) {
      const float v = p[k] + bias[k];
      p[k] = v;
      o[k] = 0.5f * v * (1.0f + fast_tanh(kGeluScale * (v + kGeluCubic * v * v * v)));
    }
  }
}

void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias, int rows, int cols) {
  std::memset(dbias, 0, sizeof(float) * cols);
  for (int r = 0; r < rows; ++r) {
    const float* d = dout + static_cast<size_t>(r) * cols;
    const float* __restrict p = pre + static_cast<size_t>(r) * cols;
    float* dp = dpre + static_cast<size_t>(r) * cols;
    float* __restrict db = dbias;
    // dp may be d (in place), index for index: no iteration reads what another wrote.
#pragma GCC ivdep
    for (int k = 0; k < cols; ++k) {
      const float v = p[k];
      const float th = fast_tanh(kGeluScale * (v + kGeluCubic * v * v * v));
      const float dth = (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
      const float g = d[k] * (0.5f * (1.0f + th) + 0.5f * v * dth);
      dp[k] = g;
      db[k] += g;
    }
  }
}

// Causal attention a block of query rows at a time: rows [r0, r1) see keys [0, r1) only,
// so the products cost about half of the full t x t ones (5/8 of them at t = 256 with
// blocks of 64), and the scratch holds one block's rows of the scores (and, backward,
// of their gradient), never a whole t x t matrix.
constexpr int kQueryBlock = 64;

size_t attention_scratch_floats(int context) {
  return 2 * static_cast<size_t>(std::min(context, kQueryBlock)) * static_cast<size_t>(context);
}

void attention_forward(const float* qkv, int batch, int context, int c, int heads, float* out, float* lse,
                       float* scratch) {
  const int t = context, d = c / heads, ld = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const float* q = qkv + static_cast<size_t>(b) * t * ld + static_cast<size_t>(h) * d;
      const float* k = q + c;
      const float* v = q + 2 * c;
      float* o = out + static_cast<size_t>(b) * t * c + static_cast<size_t>(h) * d;
      float* l = lse + (static_cast<size_t>(b) * heads + h) * t;
      for (int r0 = 0; r0 < t; r0 += kQueryBlock) {
        const int r1 = std::min(t, r0 + kQueryBlock), rows = r1 - r0;
        float* s = scratch;  // the block's rows of the scores, [rows, r1] with stride t
        // Raw scores q k^T of the block; each row's log-sum-exp over the keys it may see,
        // and its probabilities in place.
        sgemm(false, true, rows, r1, d, 1.0f, q + static_cast<size_t>(r0) * ld, ld, k, ld, 0.0f, s, t);
        for (int i = r0; i < r1; ++i) {
          float* __restrict row = s + static_cast<size_t>(i - r0) * t;
          const float mx = lane_max(row, i + 1);
          for (int j = 0; j <= i; ++j) row[j] = fast_exp(scale * (row[j] - mx));
          const float sum = lane_sum(i + 1, [row](int j) { return row[j]; });
          l[i] = scale * mx + std::log(sum);
          const float inv = 1.0f / sum;
          for (int j = 0; j <= i; ++j) row[j] *= inv;
          for (int j = i + 1; j < r1; ++j) row[j] = 0.0f;
        }
        sgemm(false, false, rows, d, r1, 1.0f, s, t, v, ld, 0.0f, o + static_cast<size_t>(r0) * c, c);
      }
    }
  }
}

void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse, int batch,
                        int context, int c, int heads, float* dqkv, float* scratch) {
  const int t = context, d = c / heads, ld = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One block's rows of the probabilities and of their gradient.
  float* pb = scratch;
  float* dpb = scratch + static_cast<size_t>(std::min(t, kQueryBlock)) * t;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const size_t qkv_at = static_cast<size_t>(b) * t * ld + static_cast<size_t>(h) * d;
      const size_t out_at = static_cast<size_t>(b) * t * c + static_cast<size_t>(h) * d;
      const float* q = qkv + qkv_at;
      const float* k = q + c;
      const float* v = q + 2 * c;
      const float* o = out + out_at;
      const float* dO = dout + out_at;
      const float* l = lse + (static_cast<size_t>(b) * heads + h) * t;
      float* dq = dqkv + qkv_at;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      // The last block of queries sees every key, so it writes all of dK and dV (beta 0);
      // the blocks before it add into the keys they see.
      const int last = (t - 1) / kQueryBlock * kQueryBlock;
      for (int r0 = last; r0 >= 0; r0 -= kQueryBlock) {
        const int r1 = std::min(t, r0 + kQueryBlock), rows = r1 - r0;
        const float beta = r0 == last ? 0.0f : 1.0f;
        // The probabilities again, from the scores and the kept log-sum-exp.
        sgemm(false, true, rows, r1, d, 1.0f, q + static_cast<size_t>(r0) * ld, ld, k, ld, 0.0f, pb, t);
        for (int i = r0; i < r1; ++i) {
          float* __restrict row = pb + static_cast<size_t>(i - r0) * t;
          const float li = l[i];
          for (int j = 0; j <= i; ++j) row[j] = fast_exp(scale * row[j] - li);
          for (int j = i + 1; j < r1; ++j) row[j] = 0.0f;
        }
        // dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(dO o)); dQ = scale dS K; dK = scale dS^T Q.
        sgemm(true, false, r1, d, rows, 1.0f, pb, t, dO + static_cast<size_t>(r0) * c, c, beta, dv, ld);
        sgemm(false, true, rows, r1, d, 1.0f, dO + static_cast<size_t>(r0) * c, c, v, ld, 0.0f, dpb, t);
        for (int i = r0; i < r1; ++i) {
          const float* __restrict oi = o + static_cast<size_t>(i) * c;
          const float* __restrict doi = dO + static_cast<size_t>(i) * c;
          const float di = lane_sum(d, [oi, doi](int j) { return oi[j] * doi[j]; });
          float* __restrict dpi = dpb + static_cast<size_t>(i - r0) * t;
          const float* __restrict pi = pb + static_cast<size_t>(i - r0) * t;
          for (int j = 0; j < r1; ++j) dpi[j] = pi[j] * (dpi[j] - di);
        }
        sgemm(false, false, rows, d, r1, scale, dpb, t, k, ld, 0.0f, dq + static_cast<size_t>(r0) * ld, ld);
        sgemm(true, false, r1, d, rows, scale, dpb, t, q + static_cast<size_t>(r0) * ld, ld, beta, dk, ld);
      }
    }
  }
}

double sum_squares(const float* x, size_t n) { return ::hearsay::host_sum_squares(x, n); }

}  // namespace hearsay::cpu

namespace hearsay {

double host_sum_squares(const float* x, size_t n) {
  // Eight independent partial sums, which the compiler turns into vector lanes (one running
  // sum would make every addition wait for the one before: 4x slower on a model of tens
  // of megabytes, measured on every arrival). Double, so that 1e8 terms keep their digits.
  double lanes[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lanes[j] += static_cast<double>(x[i + j]) * x[i + j];
  }
  double total = 0.0;
  for (; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  for (double l : lanes) total += l;
  return total;
}

}  // namespace hearsay
