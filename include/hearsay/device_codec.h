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

}  // namespace hearsay

#endif
