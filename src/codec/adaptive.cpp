// Per-link adaptive compression: given what one link carries per second and how long this
// peer's step takes, pick the lightest codec whose update fits `step_fraction` of a step.
// Lighter means less information lost: fp32, then fp16, then int8, then top-k at the
// density that fills the budget.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "hearsay/codec.h"

namespace hearsay {
namespace {

// Bytes per sent element of top-k at density d: a value and its index (a delta varint, or
// the bitmap's share when that is smaller).
double topk_bytes_per_element(double d, int value_bits) {
  const double gap = 1.0 / d;
  const double varint = gap < 128 ? 1 : gap < 16384 ? 2 : 3;
  return value_bits / 8.0 + std::min(varint, 1.0 / (8 * d));
}

std::string fmt(const char* f, double a, double b, double c) {
  char buf[200];
  std::snprintf(buf, sizeof buf, f, a, b, c);
  return buf;
}

}  // namespace

CodecChoice choose_codec(const AdaptiveSpec& a, const CodecSpec& base, size_t elements, double bandwidth_Bps, double step_s,
                         bool dense_only) {
  CodecChoice c;
  c.spec = base;
  const double n = static_cast<double>(elements);
  if (!(bandwidth_Bps > 0) || !(step_s > 0) || elements == 0) {
    c.reason = "no throughput or step time measured yet: keeping " + base.name;
    return c;
  }
  c.budget_bytes = a.step_fraction * step_s * bandwidth_Bps;
  const std::string link = fmt("budget %.0f B (%.3g of a %.3g s step", c.budget_bytes, a.step_fraction, step_s) +
                           fmt(" at %.3g MB/s)", bandwidth_Bps / 1e6, 0, 0);
  const double int8_bytes = n + 4 * std::ceil(n / std::max(1, base.block));
  const struct { const char* name; double bytes; } dense[] = {{"none", 4 * n}, {"fp16", 2 * n}, {"int8", int8_bytes}};
  for (const auto& d : dense) {
    if (d.bytes <= c.budget_bytes) {
      c.spec.name = d.name;
      c.expected_bytes = d.bytes;
      c.reason = std::string(d.name) + fmt(" fits: %.0f B of the ", d.bytes, 0, 0) + link;
      return c;
    }
  }
  if (dense_only) {
    c.spec.name = "int8";
    c.expected_bytes = int8_bytes;
    c.reason = fmt("int8, the lightest dense codec, sends %.0f B, over the ", int8_bytes, 0, 0) + link;
    return c;
  }
  // Densest top-k that fits: bytes(d) = n d (4 + index bytes) is increasing in d.
  double density = a.max_density;
  for (int i = 0; i < 4; ++i) density = c.budget_bytes / (n * topk_bytes_per_element(density, base.value_bits));
  density = std::clamp(std::min(density, a.max_density), a.min_density, 1.0);
  c.spec.name = "topk";
  c.spec.density = density;
  c.expected_bytes = n * density * topk_bytes_per_element(density, base.value_bits);
  c.reason = fmt("int8 needs %.0f B; topk at density %.4g sends %.0f B of the ", int8_bytes, density, c.expected_bytes) + link;
  if (c.expected_bytes > c.budget_bytes) c.reason += "; the link cannot carry even the sparsest allowed update in budget";
  return c;
}

}  // namespace hearsay
