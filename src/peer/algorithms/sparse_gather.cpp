// The sparse all-gather of dgc, demo and diloco's outer gradient under a codec that cannot
// be summed, as DGC's and DeMo's papers synchronise: every peer's
// compressed update to every other peer directly (one hop; a sparse payload cannot be
// summed on the way, so a ring would forward n-1 of them), summed in peer order on
// arrival; and the learning-rate scaling every synchronous mean shares.
#include <algorithm>
#include <cmath>

#include "../algorithm.h"
#include "../algorithm_registry.h"

namespace hearsay {

std::vector<float> gather_sum(GossipEngine& e, MessageKind kind, const std::shared_ptr<const GossipEngine::Encoded>& mine,
                              uint64_t round, uint32_t phase) {
  size_t len = 0;
  for (const auto& seg : mine->segments) len = std::max<size_t>(len, seg.offset + seg.length);
  std::vector<float> sum(len);
  gather_sum_into(e, kind, mine, round, phase, sum.data(), len);
  return sum;
}

void gather_sum_into(GossipEngine& e, MessageKind kind, const std::shared_ptr<const GossipEngine::Encoded>& mine,
                     uint64_t round, uint32_t phase, float* sum, size_t n_out) {
  const int n = static_cast<int>(e.peers().size());
  size_t len = 0;
  for (const auto& seg : mine->segments) len = std::max<size_t>(len, seg.offset + seg.length);
  HEARSAY_CHECK(len == n_out, "gather_sum_into: an update of " + std::to_string(len) + " values into " + std::to_string(n_out));
  for (int j = 0; j < n; ++j) {
    if (j != e.me()) e.send_encoded(j, {.kind = kind, .synchronous = true, .round = round, .phase = phase, .total = len}, mine);
  }
  std::fill(sum, sum + len, 0.0f);
  std::vector<float> scratch;  // a segment of this peer's own part, decoded (mine need keep no dense copy)
  // Each peer's part is measured before it is added: one part of finite 3e38s would
  // otherwise take the model to chance at once.
  double own_sq = 0;
  for_each_decoded(*mine, scratch, [&](size_t, const float* y, size_t count) {
    for (size_t i = 0; i < count; ++i) own_sq += static_cast<double>(y[i]) * y[i];
  });
  const double reference = std::max(std::sqrt(own_sq), e.model_norm());
  // Summed in peer order, a segment at a time (each added as a whole decoded vector was:
  // the same sum, bit for bit, on every peer).
  auto add = [&](size_t at, const float* y, size_t count) {
    float* out = sum + std::min(at, len);
    const size_t k = std::min(count, len - std::min(at, len));
    for (size_t i = 0; i < k; ++i) out[i] += y[i];
  };
  for (int j = 0; j < n; ++j) {
    if (j == e.me()) {
      for_each_decoded(*mine, scratch, add);
      continue;
    }
    const GossipEngine::Message m = e.wait_sync_kept(j, round, phase);
    if (m.offset != 0 || m.elements() != len) {
      throw InputError("gather_sum: peer " + e.peers()[static_cast<size_t>(j)] + " sent " + std::to_string(m.elements()) +
                       " values at offset " + std::to_string(m.offset) + " for round " + std::to_string(round) + "; expected " +
                       std::to_string(len) + " at 0");
    }
    e.check_sync_part(m, round, reference, 1);
    e.for_each_part(m, add);
  }
}

void CompressedSum::start(GossipEngine& e) {
  if (encoder_) return;
  CodecSpec spec = e.spec().codec;
  spec.name = codec_;
  spec.error_feedback = "on";  // random-k unscaled too: the residual keeps what it left
  encoder_ = std::make_unique<LinkEncoder>(spec, e.model().param_views(), e.rng().next_u64());
}

const std::vector<float>& CompressedSum::residual() const {
  static const std::vector<float> none;
  return encoder_ ? encoder_->residual() : none;
}

std::vector<float>& CompressedSum::residual(GossipEngine& e) {
  start(e);
  return encoder_->residual();
}

std::vector<float> CompressedSum::sum(GossipEngine& e, MessageKind kind, const std::vector<float>& v, uint64_t round,
                                      uint32_t phase) {
  start(e);
  const auto mine = build_encoded(
      v.size(), encoder_->codec().segments(v.size(), e.spec().segment_elements),
      [&](size_t begin, size_t len, std::vector<uint8_t>& payload, CodecParams& params) {
        encoder_->encode(v.data() + begin, len, begin, v.size(), payload, params);
      },
      nullptr, false);
  return gather_sum(e, kind, mine, round, phase);
}

float sync_lr_scale(int peers, uint64_t step, bool linear, int warmup_steps) {
  if (!linear) return 1.0f;
  const double n = static_cast<double>(peers);
  const double ramp = warmup_steps > 0 ? std::min(1.0, static_cast<double>(step) / warmup_steps) : 1.0;
  return static_cast<float>(1.0 + (n - 1.0) * ramp);
}

void check_sync_lr_options(const std::string& scaling, int warmup_steps) {
  if (scaling != "linear" && scaling != "none") throw OptionError("sync_lr_scaling", "'" + scaling + "': use linear or none");
  if (warmup_steps < 0) throw OptionError("sync_lr_warmup_steps", "must be >= 0, got " + std::to_string(warmup_steps));
}

}  // namespace hearsay
