#include "update_guard.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "hearsay/metrics.h"

namespace hearsay {

std::string find_non_finite(const float* x, size_t n) {
  // One branch-free pass (the common case: everything finite), then the place. A float
  // is NaN or infinite when its exponent bits are all ones: an OR over integers, which the
  // compiler vectorises as it is (a float sum it may not reorder).
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any == 0) return {};
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return "element " + std::to_string(i) + " is " + (std::isnan(x[i]) ? "NaN" : "infinite");
  }
  return {};
}

namespace {

// Eight lanes as the compiler's vector types: GCC does not vectorise the scalar form of
// this pass (its bit test beside a double sum), and it is on every arrival's path.
typedef float Floats8 __attribute__((vector_size(32)));
typedef uint32_t Bits8 __attribute__((vector_size(32)));
typedef double Doubles8 __attribute__((vector_size(64)));

}  // namespace

std::string find_non_finite(const float* x, size_t n, double* sum_squares) {
  // The same check with the sum of squares in its pass (eight double lanes, summed as
  // host_sum_squares sums them: a float's square is exact in a double, so each lane's
  // additions are the scalar loop's, bit for bit): the norm check then reads no value again.
  Bits8 hit = {};
  Doubles8 lanes = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    Floats8 f;
    Bits8 bits;
    std::memcpy(&f, x + i, sizeof f);
    std::memcpy(&bits, x + i, sizeof bits);
    hit |= reinterpret_cast<Bits8>((bits & 0x7f800000u) == 0x7f800000u);
    const Doubles8 d = __builtin_convertvector(f, Doubles8);
    lanes += d * d;
  }
  uint32_t any = 0;
  for (int j = 0; j < 8; ++j) any |= hit[j];
  double total = 0.0;
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
    total += static_cast<double>(x[i]) * x[i];
  }
  for (int j = 0; j < 8; ++j) total += lanes[j];
  *sum_squares = total;
  return any == 0 ? std::string() : find_non_finite(x, n);
}

std::string check_update_norm(const UpdateGuardSpec& spec, MessageKind kind, double norm, uint64_t parts,
                              double model_norm, double grad_norm) {
  if (spec.max_norm_ratio <= 0) return {};
  // A model, a model delta or push-sum mass is measured against the receiver's model (at
  // least 1, so a model that starts at zero does not refuse everything); a gradient
  // against the receiver's own recent gradient, times the number of gradients summed in it.
  double reference, bound;
  const char* against;
  if (kind == MessageKind::kGradient) {
    if (grad_norm <= 0) return {};  // no gradient of our own yet: nothing to compare with
    reference = grad_norm;
    bound = spec.max_norm_ratio * static_cast<double>(parts) * grad_norm;
    against = "this peer's gradient";
  } else {
    reference = std::max(model_norm, 1.0);
    bound = spec.max_norm_ratio * static_cast<double>(parts) * reference;
    against = "this peer's model";
  }
  if (norm <= bound) return {};
  char buf[200];
  std::snprintf(buf, sizeof buf, "norm: %.3g is %.3g times %s (%.3g); the bound is %g times", norm, norm / reference, against,
                reference, spec.max_norm_ratio * static_cast<double>(parts));
  return buf;
}

std::string check_site_rate(float rate, float own_lr) {
  if (std::isfinite(rate) && rate >= 0 && rate <= own_lr) return {};
  char buf[200];
  std::snprintf(buf, sizeof buf, "synchronous: its rate %.6g is outside 0 .. %.6g, this step's rate on this peer's schedule", rate,
                own_lr);
  return buf;
}

std::string check_site_model_norm(const UpdateGuardSpec& spec, double norm, double own_norm) {
  if (spec.max_norm_ratio <= 0) return {};
  const double reference = std::max(own_norm, 1e-12);
  if (norm <= spec.max_norm_ratio * reference && norm * spec.max_norm_ratio >= own_norm) return {};
  char buf[200];
  std::snprintf(buf, sizeof buf, "norm: its model's norm %.3g is %.3g times this peer's (%.3g); a replica's is within %g times, both ways",
                norm, norm / reference, own_norm, spec.max_norm_ratio);
  return buf;
}

bool UpdateGuard::admits(int peer, double now) {
  std::lock_guard<std::mutex> lock(mu_);
  PeerState& p = peers_.at(static_cast<size_t>(peer));
  if (p.until < 0) return true;
  if (now < p.until) return false;
  p.until = -1;
  p.failures = 0;
  events_.push_back({peer, false, "cool-down over", now});
  return true;
}

bool UpdateGuard::refuse(int peer, double now, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  // By kind, a fixed set: the details come off the wire, and a key each would grow without end.
  const std::string_view kind = refusal_reason(reason);
  ++refused_[std::string(kind)];
  // A full backlog is this peer's own pace (descheduled, or slower than an honest sender),
  // not evidence against the sender, whose share of memory the bound already caps: were
  // it a strike, a slow peer would shut out every fast neighbour for the cool-down.
  if (kind == "backlog") return false;
  PeerState& p = peers_.at(static_cast<size_t>(peer));
  if (p.until >= 0 || spec_.strikes <= 0) return false;
  if (++p.failures < spec_.strikes) return false;
  p.until = now + spec_.quarantine_s;
  events_.push_back({peer, true, reason, p.until});
  return true;
}

void UpdateGuard::pass(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_.at(static_cast<size_t>(peer)).failures = 0;
}

std::vector<UpdateGuard::Event> UpdateGuard::take_events() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

std::vector<int> UpdateGuard::quarantined() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].until >= 0) out.push_back(static_cast<int>(i));
  }
  return out;
}

std::map<std::string, uint64_t> UpdateGuard::refused() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refused_;
}

}  // namespace hearsay
