// exp and tanh in plain float arithmetic, so that loops calling them vectorise (libm's
// expf and tanhf are calls the compiler cannot widen: they were 40% of a GPT step).
// fast_exp: range reduction to r in [-ln2/2, ln2/2], a degree-6 polynomial, and 2^n by
// the exponent bits; within 2 ulp of expf over [-87, 88] (inputs beyond are clamped:
// below, the result is ~0; above, ~FLT_MAX). fast_tanh: from fast_exp, absolute error
// below 1e-7. lane_sum and lane_max: reductions in 16 independent lanes, which the
// compiler widens (a single running sum makes every addition wait for the one before, and
// may not be reordered without -ffast-math: LayerNorm's and the softmaxes' sums ran scalar).
#pragma once

#include <bit>
#include <cstdint>

namespace hearsay::cpu {

inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  // n = round(x / ln2), by the 1.5 * 2^23 trick (exact for |x / ln2| < 2^22).
  constexpr float kShift = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  // r = x - n ln2, with ln2 split in two so that the product is exact.
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  // e^r: Taylor to degree 6 (Cephes' expf coefficients, tuned on the interval).
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

inline float fast_tanh(float x) {
  // tanh(x) = 1 - 2 / (e^{2x} + 1); |x| > 9 is +-1 to float precision.
  x = x < -9.0f ? -9.0f : (x > 9.0f ? 9.0f : x);
  return 1.0f - 2.0f / (fast_exp(2.0f * x) + 1.0f);
}

// The sum of term(0) + ... + term(n - 1), added in 16 lanes and then pairwise.
template <class Term>
inline float lane_sum(int n, Term term) {
  constexpr int kLanes = 16;
  float lanes[kLanes] = {};
  int k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += term(k + j);
  }
  float tail = 0.0f;
  for (; k < n; ++k) tail += term(k);
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  return lanes[0] + tail;
}

// The largest of x[0 .. n - 1] (n >= 1), in 16 lanes.
inline float lane_max(const float* x, int n) {
  constexpr int kLanes = 16;
  if (n < kLanes) {
    float m = x[0];
    for (int k = 1; k < n; ++k) m = x[k] > m ? x[k] : m;
    return m;
  }
  float lanes[kLanes];
  for (int j = 0; j < kLanes; ++j) lanes[j] = x[j];
  int k = kLanes;
  for (; k + kLanes <= n; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] = x[k + j] > lanes[j] ? x[k + j] : lanes[j];
  }
  for (; k < n; ++k) lanes[0] = x[k] > lanes[0] ? x[k] : lanes[0];
  float m = lanes[0];
  for (int j = 1; j < kLanes; ++j) m = lanes[j] > m ? lanes[j] : m;
  return m;
}

}  // namespace hearsay::cpu
