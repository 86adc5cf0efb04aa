// The codecs on a CUDA device (src/codec/*.cu beside their CPU twins): encode straight
// from device memory into a host payload laid out exactly as the CPU codec's, and
// decode-accumulate a host payload into device memory, so a GPU peer never copies a dense
// tensor across PCIe to compress it. Payloads are checked on the host (check_payload)
// before anything is written. Calls run synchronously on the calling thread's current
// device. Declared only in builds with CUDA (hearsay/build_config.h).
#pragma once

#include "hearsay/build_config.h"
#include "hearsay/codec.h"

#if HEARSAY_HAVE_CUDA

namespace hearsay {

class DeviceCodec {
 public:
  virtual ~DeviceCodec() = default;
  // As Codec::encode, with x in device memory.
  virtual void encode(const float* x_dev, size_t n, size_t offset, std::vector<uint8_t>& out, CodecParams& params) = 0;
};

// The same spec and seed give the same payloads as make_codec's codec, bit for bit for
// none, fp16, bf16, int8, topk and randomk (qsgd, sign and powersgd sum in another order).
std::unique_ptr<DeviceCodec> make_device_codec(const CodecSpec& spec, const std::vector<ParamView>& layout, uint64_t seed);

// As decode_accumulate, with y in device memory.
std::string device_decode_accumulate(const CodecParams& params, const uint8_t* payload, size_t bytes, float scale,
                                     float* y_dev, size_t n);

// Makes `device` the calling thread's current CUDA device. A peer's transport threads
// encode for it, and a thread's current device is device 0 until it says otherwise.
void use_cuda_device(int device);

// Copies `bytes` of device memory (written by work that has completed) to the host.
void device_to_host(void* host_dst, const void* src_dev, size_t bytes);

// The sum of x_dev[0..n)^2, accumulated in double (on the device, in its own order).
double device_sum_squares(const float* x_dev, size_t n);

// LinkEncoder's twin for a sender whose tensors live on the device: the same codec choice
// (make_device_codec of the same spec and seed) and the error-feedback residual kept in
// device memory, so only the payload crosses PCIe. For the codecs whose device twin is
// bit-identical (none, fp16, bf16, int8, topk, randomk), the same inputs give the same
// payloads as a LinkEncoder's, and the residual evolves alike: the residual's update
// r += x, r -= decode(C(r)) is exact addition in both. Calls run on `device`, on whichever
// thread makes them, one at a time (the engine holds the link's lock).
class DeviceLinkEncoder {
 public:
  // Throws InputError for a bad spec.
  DeviceLinkEncoder(int device, const CodecSpec& spec, std::vector<ParamView> layout, uint64_t seed);
  ~DeviceLinkEncoder();
  DeviceLinkEncoder(const DeviceLinkEncoder&) = delete;
  DeviceLinkEncoder& operator=(const DeviceLinkEncoder&) = delete;

  // Replaces the codec (adaptive compression); the residual carries over, as LinkEncoder's.
  void set_spec(const CodecSpec& spec);
  const CodecSpec& spec() const { return spec_; }
  bool error_feedback() const { return error_feedback_; }
  // As LinkEncoder::encode, with x_dev in device memory.
  void encode(const float* x_dev, size_t n, size_t offset, size_t total, std::vector<uint8_t>& out, CodecParams& params);
  // Adds a host residual of `total` elements (what a host encoder of the same link still
  // owes, or a checkpoint's) into the device one.
  void add_to_residual(const std::vector<float>& host, size_t total);
  // The residual, downloaded; empty when none is kept.
  std::vector<float> residual_host() const;

 private:
  void ensure_residual(size_t total);

  int device_;
  CodecSpec spec_;
  std::vector<ParamView> layout_;
  uint64_t seed_;
  std::unique_ptr<DeviceCodec> codec_;
  bool error_feedback_ = false;
  float* residual_ = nullptr;  // device memory, residual_n_ floats
  size_t residual_n_ = 0;
};

}  // namespace hearsay

#endif
