// What the codec files share: each codec's encoder factory and decoder, and the helpers
// for writing and checking payloads. The arithmetic shared with CUDA is in codec_math.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>

#include "codec_math.h"
#include "hearsay/codec.h"

namespace hearsay::codec {

// Clears p and names the codec (version 1); encoders then add their values.
inline CodecParams& begin_params(CodecParams& p, CodecId id) {
  p = CodecParams();
  p.set_codec_id(static_cast<uint32_t>(id));
  p.set_codec_version(1);
  return p;
}
// The parameters of qsgd and random-k payloads (CPU and CUDA encoders alike).
inline void qsgd_params(CodecParams& p, uint64_t seed, int levels, size_t bucket) {
  begin_params(p, CodecId::kQsgd).set_seed(seed);
  p.add_values(levels);
  p.add_values(static_cast<double>(bucket));
}
inline void randomk_params(CodecParams& p, uint64_t seed, uint64_t k, bool unbiased) {
  begin_params(p, CodecId::kRandomk).set_seed(seed);
  p.add_values(static_cast<double>(k));
  p.add_values(unbiased ? 1 : 0);
}
// The seed of an encoder's call-th stream (qsgd's rounding, random-k's indices), the same
// on the CPU and the GPU.
inline uint64_t qsgd_call_seed(uint64_t seed, uint64_t call) { return seed + 0x9e37ull * call; }
inline uint64_t randomk_call_seed(uint64_t seed, uint64_t call) {
  return hash32(seed, call) | (static_cast<uint64_t>(hash32(seed ^ 0xabcdefull, call)) << 32);
}

// The error message every decoder returns: "codec NAME: reason".
std::string fault(CodecId id, const std::string& reason);
// Checks that a codec has at least `count` parameter values and that all are finite.
std::string check_values(CodecId id, const CodecParams& p, int count);

template <typename T>
inline T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// --- Encoders -------------------------------------------------------------------------
std::unique_ptr<Codec> make_none();
std::unique_ptr<Codec> make_fp16();
std::unique_ptr<Codec> make_bf16();
std::unique_ptr<Codec> make_int8(int block);
std::unique_ptr<Codec> make_int4(int block);
std::unique_ptr<Codec> make_qsgd(int levels, int bucket, uint64_t seed);
std::unique_ptr<Codec> make_topk(double density, bool exact, int value_bits, uint64_t seed);
std::unique_ptr<Codec> make_randomk(double density, bool unbiased, uint64_t seed);
std::unique_ptr<Codec> make_sign();
std::unique_ptr<Codec> make_powersgd(int rank, std::vector<ParamView> layout, uint64_t seed);

// --- Decoders: y += scale * decoded; empty string or the fault. With y null they only
// check the payload (the CUDA decoders check on the host, then apply on the device).
using Decoder = std::string (*)(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_none(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_fp16(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_bf16(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_int8(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_int4(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_qsgd(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_topk(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_randomk(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_sign(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);
std::string decode_powersgd(const CodecParams&, const uint8_t*, size_t, float, float*, size_t);

// top-k's payload from its increasing indices and their values (CPU and CUDA encoders).
void write_topk(const std::vector<uint32_t>& idx, const float* values, size_t n, double density, int value_bits,
                std::vector<uint8_t>& out, CodecParams& p);
// Checks a top-k payload and, with idx, lists its indices.
std::string topk_indices(const CodecParams& p, const uint8_t* payload, size_t bytes, size_t n, std::vector<uint32_t>* idx);

// PowerSGD's matrices within a segment (start relative to it), the rank each travels at,
// the parameters naming them, and Gram-Schmidt on a row-major rows x r matrix's columns
// (a vanishing column becomes zero rather than amplified noise).
struct Matrix {
  size_t start, rows, cols;
};
inline size_t rank_of(size_t r, const Matrix& m) { return std::min({r, m.rows, m.cols}); }
std::vector<Matrix> powersgd_matrices(const std::vector<ParamView>& layout, size_t offset, size_t n, size_t r);
void powersgd_params(size_t r, const std::vector<Matrix>& mats, CodecParams& p);
// From parameters that check_payload accepted.
std::vector<Matrix> powersgd_matrices_of(const CodecParams& p);
void orthonormalize(float* p, size_t rows, size_t r);

// fp16 <-> fp32, scalar (round to nearest even, saturating to +-inf like the hardware).
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);

}  // namespace hearsay::codec
