#include <algorithm>

#include "codec_impl.h"
#include "hearsay/error.h"

namespace hearsay {

namespace {
constexpr const char* kNames[kCodecCount] = {"none", "fp16", "bf16", "int8", "qsgd", "topk", "randomk", "sign", "powersgd", "int4"};
constexpr codec::Decoder kDecoders[kCodecCount] = {
    codec::decode_none, codec::decode_fp16,    codec::decode_bf16, codec::decode_int8,     codec::decode_qsgd,
    codec::decode_topk, codec::decode_randomk, codec::decode_sign, codec::decode_powersgd, codec::decode_int4,
};

int id_of(const std::string& name) {
  for (uint32_t i = 0; i < kCodecCount; ++i) {
    if (name == kNames[i]) return static_cast<int>(i);
  }
  return -1;
}
}  // namespace

const char* codec_name(uint32_t id) { return id < kCodecCount ? kNames[id] : "unknown"; }

std::vector<std::string> codec_names() { return {std::begin(kNames), std::end(kNames)}; }

void check_codec_spec(const CodecSpec& s) {
  if (id_of(s.name) < 0) {
    throw InputError("codec '" + s.name + "': unknown; use none, fp16, bf16, int8, int4, qsgd, topk, randomk, sign or powersgd");
  }
  const std::string where = "codec " + s.name + ": ";
  if (!(s.density > 0 && s.density <= 1)) throw InputError(where + "density must be in (0, 1], got " + std::to_string(s.density));
  if (s.levels < 1 || s.levels > 32767) throw InputError(where + "levels must be in [1, 32767], got " + std::to_string(s.levels));
  if (s.block < 8 || s.block > (1 << 20)) throw InputError(where + "block must be in [8, 1048576], got " + std::to_string(s.block));
  if (s.value_bits != 16 && s.value_bits != 32) throw InputError(where + "value_bits must be 16 or 32, got " + std::to_string(s.value_bits));
  if (s.rank < 1 || s.rank > 256) throw InputError(where + "rank must be in [1, 256], got " + std::to_string(s.rank));
  if (s.error_feedback != "auto" && s.error_feedback != "on" && s.error_feedback != "off") {
    throw InputError(where + "error_feedback must be auto, on or off, got '" + s.error_feedback + "'");
  }
}

bool uses_error_feedback(const CodecSpec& s) {
  if (s.error_feedback != "auto") return s.error_feedback == "on";
  // QSGD and (scaled) random-k are unbiased: feeding back their error only adds variance.
  // fp16 and bf16 round each value to its nearest (a relative error under 2^-11 and 2^-8):
  // none, as PyTorch DDP's fp16 and bf16 compression hooks and this engine's all-reduce
  // keep none, and a model-sized residual a link is not worth that rounding.
  return s.name != "none" && s.name != "qsgd" && s.name != "randomk" && s.name != "fp16" && s.name != "bf16";
}

std::vector<std::pair<size_t, size_t>> even_segments(size_t n, size_t max_elements) {
  std::vector<std::pair<size_t, size_t>> out;
  const size_t seg = std::max<size_t>(1, max_elements);
  for (size_t b = 0; b < n; b += seg) out.emplace_back(b, std::min(seg, n - b));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

std::vector<std::pair<size_t, size_t>> Codec::segments(size_t n, size_t max_elements) const {
  return even_segments(n, max_elements);
}

std::unique_ptr<Codec> make_codec(const CodecSpec& s, const std::vector<ParamView>& layout, uint64_t seed) {
  check_codec_spec(s);
  switch (static_cast<CodecId>(id_of(s.name))) {
    case CodecId::kNone: return codec::make_none();
    case CodecId::kFp16: return codec::make_fp16();
    case CodecId::kBf16: return codec::make_bf16();
    case CodecId::kInt8: return codec::make_int8(s.block);
    case CodecId::kQsgd: return codec::make_qsgd(s.levels, s.block, seed);
    case CodecId::kTopk: return codec::make_topk(s.density, s.exact_topk, s.value_bits, seed);
    // With error feedback, random-k sends values unscaled: the residual keeps the rest.
    case CodecId::kRandomk: return codec::make_randomk(s.density, !uses_error_feedback(s), seed);
    case CodecId::kSign: return codec::make_sign();
    case CodecId::kPowerSgd: return codec::make_powersgd(s.rank, layout, seed);
    case CodecId::kInt4: return codec::make_int4(s.block);
  }
  throw InputError("codec '" + s.name + "': unknown");
}

std::string decode_accumulate(const CodecParams& p, const uint8_t* payload, size_t bytes, float scale, float* y,
                              size_t n) {
  if (p.codec_id() >= kCodecCount) return "codec id " + std::to_string(p.codec_id()) + ": unknown";
  if (p.codec_version() > 1) {
    return codec::fault(static_cast<CodecId>(p.codec_id()), "version " + std::to_string(p.codec_version()) + " is newer than this peer's 1");
  }
  if (!std::isfinite(scale)) return codec::fault(static_cast<CodecId>(p.codec_id()), "the receiver's scale is not finite");
  return kDecoders[p.codec_id()](p, payload, bytes, scale, y, n);
}

std::string check_payload(const CodecParams& p, const uint8_t* payload, size_t bytes, size_t n) {
  return decode_accumulate(p, payload, bytes, 1.0f, nullptr, n);
}

namespace codec {

std::string fault(CodecId id, const std::string& reason) { return std::string("codec ") + codec_name(static_cast<uint32_t>(id)) + ": " + reason; }

std::string check_values(CodecId id, const CodecParams& p, int count) {
  if (p.values_size() < count) {
    return fault(id, "needs " + std::to_string(count) + " parameter values, got " + std::to_string(p.values_size()));
  }
  for (int i = 0; i < p.values_size(); ++i) {
    if (!std::isfinite(p.values(i))) return fault(id, "parameter value " + std::to_string(i) + " is NaN or Inf");
  }
  return {};
}

}  // namespace codec

// --- LinkEncoder ----------------------------------------------------------------------

LinkEncoder::LinkEncoder(const CodecSpec& spec, std::vector<ParamView> layout, uint64_t seed)
    : layout_(std::move(layout)), seed_(seed) {
  set_spec(spec);
}

void LinkEncoder::set_spec(const CodecSpec& spec) {
  codec_ = make_codec(spec, layout_, seed_);
  spec_ = spec;
  error_feedback_ = uses_error_feedback(spec);
  if (!error_feedback_) residual_.clear();
}

void LinkEncoder::encode(const float* x, size_t n, size_t offset, size_t total, std::vector<uint8_t>& out,
                         CodecParams& params) {
  if (!error_feedback_) {
    codec_->encode(x, n, offset, out, params);
    return;
  }
  HEARSAY_CHECK(offset + n <= total, "segment outside the tensor");
  if (residual_.size() != total) residual_.assign(total, 0.0f);
  float* r = residual_.data() + offset;
  for (size_t i = 0; i < n; ++i) r[i] += x[i];
  codec_->encode(r, n, offset, out, params);
  // What the receiver will add is subtracted, leaving exactly what was not sent.
  const std::string err = decode_accumulate(params, out.data(), out.size(), -1.0f, r, n);
  HEARSAY_CHECK(err.empty(), "a codec could not decode its own payload: " + err);
}

}  // namespace hearsay
