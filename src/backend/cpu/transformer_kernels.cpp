#include "transformer_kernels.h"

#include <cblas.h>

#include <cmath>
#include <cstring>
#include <string>

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

// P[i, j] = exp(scale * S[i, j] - lse[i]) for keys j <= i, 0 after: the attention
// probabilities of one head, from its raw scores S (in place) and each row's log-sum-exp.
void probabilities_from_scores(float* s, const float* lse, int t, float scale) {
  for (int i = 0; i < t; ++i) {
    float* __restrict row = s + static_cast<size_t>(i) * t;
    const float l = lse[i];
    for (int j = 0; j <= i; ++j) row[j] = std::exp(scale * row[j] - l);
    for (int j = i + 1; j < t; ++j) row[j] = 0.0f;
  }
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
    float sum = 0.0f;
    for (int k = 0; k < c; ++k) sum += in[k];
    const float m = sum / c;
    float var = 0.0f;
    for (int k = 0; k < c; ++k) var += (in[k] - m) * (in[k] - m);
    const float s = 1.0f / std::sqrt(var / c + kLayerNormEps);
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
    float g_mean = 0.0f, g_xhat_mean = 0.0f;
    for (int k = 0; k < c; ++k) {
      const float g = d[k] * gamma[k];
      g_mean += g;
      g_xhat_mean += g * (in[k] - m) * s;
    }
    g_mean /= c;
    g_xhat_mean /= c;
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
      o[k] = 0.5f * v * (1.0f + std::tanh(kGeluScale * (v + kGeluCubic * v * v * v)));
    }
  }
}

void gelu_backward_bias_grad(const float* dout, const float* pre, float* dpre, float* dbias, int rows, int cols) {
  std::memset(dbias, 0, sizeof(float) * cols);
  for (int r = 0; r < rows; ++r) {
    const float* d = dout + static_cast<size_t>(r) * cols;
    const float* __restrict p = pre + static_cast<size_t>(r) * cols;
    float* dp = dpre + static_cast<size_t>(r) * cols;
    for (int k = 0; k < cols; ++k) {
      const float v = p[k];
      const float th = std::tanh(kGeluScale * (v + kGeluCubic * v * v * v));
      const float dth = (1.0f - th * th) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
      const float g = d[k] * (0.5f * (1.0f + th) + 0.5f * v * dth);
      dp[k] = g;
      dbias[k] += g;
    }
  }
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
      float* s = scratch;
      float* l = lse + (static_cast<size_t>(b) * heads + h) * t;
      // Raw scores q k^T; each row's log-sum-exp over the keys it may see.
      sgemm(false, true, t, t, d, 1.0f, q, ld, k, ld, 0.0f, s, t);
      for (int i = 0; i < t; ++i) {
        const float* row = s + static_cast<size_t>(i) * t;
        float mx = row[0];
        for (int j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0.0f;
        for (int j = 0; j <= i; ++j) sum += std::exp(scale * (row[j] - mx));
        l[i] = scale * mx + std::log(sum);
      }
      probabilities_from_scores(s, l, t, scale);
      sgemm(false, false, t, d, t, 1.0f, s, t, v, ld, 0.0f, out + static_cast<size_t>(b) * t * c + h * d, c);
    }
  }
}

void attention_backward(const float* dout, const float* qkv, const float* out, const float* lse, int batch,
                        int context, int c, int heads, float* dqkv, float* scratch) {
  const int t = context, d = c / heads, ld = 3 * c;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  float* p = scratch;
  float* dp = scratch + static_cast<size_t>(t) * t;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h) {
      const size_t qkv_at = static_cast<size_t>(b) * t * ld + static_cast<size_t>(h) * d;
      const size_t out_at = static_cast<size_t>(b) * t * c + static_cast<size_t>(h) * d;
      const float* q = qkv + qkv_at;
      const float* k = q + c;
      const float* v = q + 2 * c;
      const float* o = out + out_at;
      const float* dO = dout + out_at;
      float* dq = dqkv + qkv_at;
      float* dk = dq + c;
      float* dv = dq + 2 * c;
      // The probabilities again, from the scores and the kept log-sum-exp.
      sgemm(false, true, t, t, d, 1.0f, q, ld, k, ld, 0.0f, p, t);
      probabilities_from_scores(p, lse + (static_cast<size_t>(b) * heads + h) * t, t, scale);
      // dV = P^T dO; dP = dO V^T; dS = P (dP - rowsum(dO o)); dQ = scale dS K; dK = scale dS^T Q.
      sgemm(true, false, t, d, t, 1.0f, p, t, dO, c, 0.0f, dv, ld);
      sgemm(false, true, t, t, d, 1.0f, dO, c, v, ld, 0.0f, dp, t);
      for (int i = 0; i < t; ++i) {
        const float* __restrict oi = o + static_cast<size_t>(i) * c;
        const float* __restrict doi = dO + static_cast<size_t>(i) * c;
        float di = 0.0f;
        for (int j = 0; j < d; ++j) di += oi[j] * doi[j];
        float* __restrict dpi = dp + static_cast<size_t>(i) * t;
        const float* __restrict pi = p + static_cast<size_t>(i) * t;
        for (int j = 0; j < t; ++j) dpi[j] = pi[j] * (dpi[j] - di);
      }
      sgemm(false, false, t, d, t, scale, dp, t, k, ld, 0.0f, dq, ld);
      sgemm(true, false, t, d, t, scale, dp, t, q, ld, 0.0f, dk, ld);
    }
  }
}

double sum_squares(const float* x, size_t n) {
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += static_cast<double>(x[i]) * x[i];
  return total;
}

}  // namespace hearsay::cpu
