// Compression codecs over flat fp32 tensors (docs/ALGORITHMS.md, "Compression";
// payload layouts in docs/WIRE.md, "Codecs").
//
// A Codec encodes a slice of a flat tensor into payload bytes and names its parameters in
// the Update's CodecParams. Decoding is stateless and fused: decode_accumulate() adds
// scale * decoded straight into the destination (a sparse payload touches only its own
// elements; no dense temporary). Everything a decoder needs travels in the payload and the
// parameters, so any peer decodes any sender's updates.
//
// A LinkEncoder is what a peer keeps per outgoing link and payload kind: the codec plus
// its error-feedback residual (the part of past inputs not yet sent), so over time the
// receiver gets everything the sender meant to send.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/model.h"

namespace hearsay {

// Wire ids (CodecParams.codec_id); never renumbered.
enum class CodecId : uint32_t {
  kNone = 0,
  kFp16 = 1,
  kBf16 = 2,
  kInt8 = 3,
  kQsgd = 4,
  kTopk = 5,
  kRandomk = 6,
  kSign = 7,
  kPowerSgd = 8,
  kInt4 = 9,
};
inline constexpr uint32_t kCodecCount = 10;
// "none", "fp16", ...; "unknown" for an id no codec has.
const char* codec_name(uint32_t id);
std::vector<std::string> codec_names();

struct CodecSpec {
  std::string name = "none";
  double density = 0.01;       // topk, randomk: fraction of elements sent
  bool exact_topk = false;     // topk: exact selection instead of a sampled threshold (DGC)
  int value_bits = 16;         // topk: values as bf16 (16) or fp32 (32)
  int levels = 16;             // qsgd: s
  int block = 256;             // int8, int4: elements per absmax scale; qsgd: elements per norm
  int rank = 4;                // powersgd: r
  // Error feedback: "auto" (on for the biased codecs: fp16, bf16, int8, topk, sign,
  // powersgd, and randomk without its unbiasing scale), "on" or "off".
  std::string error_feedback = "auto";
};
// Throws InputError naming the field.
void check_codec_spec(const CodecSpec& spec);
// Whether error feedback is on for this spec.
bool uses_error_feedback(const CodecSpec& spec);

// How a payload encodes its tensor segment: the codec's wire id and version, its numbers
// (scale, density, levels, rank...: by the codec's own order) and the seed sender and
// receiver share (docs/WIRE.md, CodecParams). A runtime type with the accessors of the
// wire message of the same name; the engine converts at the frame (src/peer/mailboxes.cpp).
class CodecParams {
 public:
  uint32_t codec_id() const { return codec_id_; }
  void set_codec_id(uint32_t v) { codec_id_ = v; }
  uint32_t codec_version() const { return codec_version_; }
  void set_codec_version(uint32_t v) { codec_version_ = v; }
  int values_size() const { return static_cast<int>(values_.size()); }
  double values(int i) const { return values_[static_cast<size_t>(i)]; }
  void set_values(int i, double v) { values_[static_cast<size_t>(i)] = v; }
  void add_values(double v) { values_.push_back(v); }
  const std::vector<double>& all_values() const { return values_; }
  uint64_t seed() const { return seed_; }
  void set_seed(uint64_t v) { seed_ = v; }
  bool operator==(const CodecParams&) const = default;

 private:
  uint32_t codec_id_ = 0, codec_version_ = 0;
  std::vector<double> values_;
  uint64_t seed_ = 0;
};

// [0, n) cut into consecutive (offset, length) pieces of at most max_elements; one empty
// piece for n = 0 (an empty message still travels as one segment).
std::vector<std::pair<size_t, size_t>> even_segments(size_t n, size_t max_elements);

class Codec {
 public:
  virtual ~Codec() = default;
  virtual CodecId id() const = 0;
  // Where a tensor of n elements is cut into segments of at most about max_elements
  // (powersgd keeps layers whole). Pairs of (offset, length).
  virtual std::vector<std::pair<size_t, size_t>> segments(size_t n, size_t max_elements) const;
  // Encodes x[0..n), which sits at element `offset` of the whole tensor, into `out`
  // (replaced) and fills `params` (codec id, version, values, seed).
  virtual void encode(const float* x, size_t n, size_t offset, std::vector<uint8_t>& out,
                      CodecParams& params) = 0;
};

// `layout` gives the tensor's layers (powersgd needs their shapes; others ignore it).
// `seed` makes stochastic codecs deterministic. Throws InputError for a bad spec.
std::unique_ptr<Codec> make_codec(const CodecSpec& spec, const std::vector<ParamView>& layout, uint64_t seed);

// y[0..n) += scale * decode(payload). Checks the whole payload first: on any fault
// (unknown codec, length that does not match, index out of range or not increasing,
// NaN or Inf scale, ...) returns the reason, naming the codec, and leaves y untouched.
// Returns an empty string on success.
std::string decode_accumulate(const CodecParams& params, const uint8_t* payload, size_t bytes, float scale,
                              float* y, size_t n);

// A top-k payload of the given increasing indices (each < n) and their values, as the
// topk codec writes one (values bf16 or fp32 by value_bits, indices delta varints or a
// bitmap, whichever is smaller): for an algorithm that picks its own components (DeMo's
// per-block top-k of a DCT), so they travel under the codecs' framing and checks.
void encode_sparse(const std::vector<uint32_t>& indices, const float* values, size_t n, int value_bits,
                   std::vector<uint8_t>& out, CodecParams& params);

// Checks a payload exactly as decode_accumulate does, writing nothing.
std::string check_payload(const CodecParams& params, const uint8_t* payload, size_t bytes, size_t n);

class LinkEncoder {
 public:
  LinkEncoder(const CodecSpec& spec, std::vector<ParamView> layout, uint64_t seed);
  // Replaces the codec (adaptive compression); the residual carries over.
  void set_spec(const CodecSpec& spec);
  const CodecSpec& spec() const { return spec_; }
  Codec& codec() { return *codec_; }
  bool error_feedback() const { return error_feedback_; }
  // Encodes x[0..n) at `offset` of a tensor of `total` elements. With error feedback,
  // what is encoded is x plus the residual, and the residual keeps what the payload
  // did not carry.
  void encode(const float* x, size_t n, size_t offset, size_t total, std::vector<uint8_t>& out,
              CodecParams& params);
  const std::vector<float>& residual() const { return residual_; }
  std::vector<float>& residual() { return residual_; }

 private:
  CodecSpec spec_;
  std::vector<ParamView> layout_;
  uint64_t seed_;
  std::unique_ptr<Codec> codec_;
  bool error_feedback_ = false;
  std::vector<float> residual_;
};

// Per-link adaptive compression: picks the lightest codec whose update fits the budget
// of one link, `step_fraction` of a step's time at the link's bandwidth.
struct AdaptiveSpec {
  bool enabled = false;
  double step_fraction = 0.5;  // sending one update may take this fraction of a step
  double min_density = 0.001;  // top-k never goes sparser than this
  double max_density = 0.25;   // denser than this, int8 is smaller
};
struct CodecChoice {
  CodecSpec spec;
  double budget_bytes = 0;     // what one update may take on this link
  double expected_bytes = 0;   // what the chosen codec sends
  std::string reason;
};
// `base` supplies the parameters that are not chosen (block, error feedback...). With
// `dense_only` (whole models, which are never sparsified) the choice stops at int8.
CodecChoice choose_codec(const AdaptiveSpec& adaptive, const CodecSpec& base, size_t elements, double bandwidth_Bps,
                         double step_s, bool dense_only = false);

// PowerSGD's factor math, for an all-reduce that sums the factors across peers instead of
// sending them (src/peer/algorithms/powersgd_allreduce.cpp). Matrices are row major.
struct PowerSgdMatrix {
  size_t start = 0, rows = 0, cols = 0;  // where in the flat tensor, and its shape
  size_t rank = 0;                       // min(r, rows, cols)
};
// The weight matrices of `layout` (within a tensor of n elements) that a rank-r product
// makes smaller; everything else travels as it is.
std::vector<PowerSgdMatrix> powersgd_layout(const std::vector<ParamView>& layout, size_t n, size_t r);
// p (rows x rank) = M q, q (cols x rank).
void powersgd_project(const float* m, const PowerSgdMatrix& shape, const float* q, float* p);
// q (cols x rank) = M^T p.
void powersgd_back_project(const float* m, const PowerSgdMatrix& shape, const float* p, float* q);
// Gram-Schmidt on p's columns, in place.
void powersgd_orthonormalize(float* p, const PowerSgdMatrix& shape);
// out (rows x cols) = alpha p q^T + beta out.
void powersgd_product(const float* p, const float* q, const PowerSgdMatrix& shape, float alpha, float beta, float* out);

}  // namespace hearsay
