// Host side of the CUDA codecs: scratch memory, the small serial steps (a top-k sample's
// threshold, PowerSGD's Gram-Schmidt on an r-column factor), payload assembly with the
// CPU codecs' writers, and decode dispatch after the host has checked the payload.
#include "hearsay/device_codec.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "../backend/cuda/common.cuh"
#include "codec_impl.h"
#include "codec_kernels.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay {
namespace {

namespace k = codec::cuda;


// Device memory that grows to the largest request and is reused.
class Scratch {
 public:
  Scratch() = default;
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() {
    if (p_ != nullptr) cudaFree(p_);  // at exit the runtime may be gone already; nothing to do then
  }
  template <typename T>
  T* get(size_t count) {
    const size_t bytes = std::max<size_t>(count * sizeof(T), 4);
    if (bytes > size_) {
      if (p_ != nullptr) CUDA_CHECK(cudaFree(p_));
      p_ = nullptr;
      CUDA_CHECK(cudaMalloc(&p_, bytes));
      size_ = bytes;
    }
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
};

void to_host(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
void to_device(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}

class CublasHandle {
 public:
  CublasHandle() { CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() { cublasDestroy(h_); }
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// --- encoders ------------------------------------------------------------------------

class DenseDevice final : public DeviceCodec {
 public:
  DenseDevice(CodecId id, int block) : id_(id), block_(static_cast<size_t>(block)) {}
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    codec::begin_params(p, id_);
    switch (id_) {
      case CodecId::kNone:
        out.resize(4 * n);
        to_host(out.data(), x, 4 * n);
        return;
      case CodecId::kFp16:
      case CodecId::kBf16: {
        uint16_t* h = buf_.get<uint16_t>(n);
        if (n > 0) (id_ == CodecId::kFp16 ? k::launch_fp16_encode : k::launch_bf16_encode)(0, x, n, h);
        out.resize(2 * n);
        to_host(out.data(), h, 2 * n);
        return;
      }
      default: {  // int8: the scales, then the values, in one buffer as on the wire
        const size_t blocks = (n + block_ - 1) / block_;
        uint8_t* d = buf_.get<uint8_t>(4 * blocks + n);
        k::launch_int8_encode(0, x, n, block_, reinterpret_cast<float*>(d), reinterpret_cast<int8_t*>(d + 4 * blocks));
        out.resize(4 * blocks + n);
        to_host(out.data(), d, out.size());
        p.add_values(static_cast<double>(block_));
      }
    }
  }

 private:
  CodecId id_;
  size_t block_;
  Scratch buf_;
};

class QsgdDevice final : public DeviceCodec {
 public:
  QsgdDevice(int levels, int bucket, uint64_t seed) : s_(levels), bucket_(static_cast<size_t>(bucket)), seed_(seed) {}
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const size_t bits = static_cast<size_t>(codec::qsgd_bits(s_));
    const size_t buckets = (n + bucket_ - 1) / bucket_, words = (n * bits + 31) / 32, packed = (n * bits + 7) / 8;
    const uint64_t seed = codec::qsgd_call_seed(seed_, ++calls_);
    float* norms = norms_.get<float>(buckets);
    uint32_t* w = words_.get<uint32_t>(words);
    CUDA_CHECK(cudaMemset(w, 0, 4 * words));
    k::launch_qsgd_encode(0, x, n, bucket_, s_, seed, norms, w);
    out.resize(4 * buckets + 4 * words);
    to_host(out.data(), norms, 4 * buckets);
    to_host(out.data() + 4 * buckets, w, 4 * words);
    out.resize(4 * buckets + packed);
    codec::qsgd_params(p, seed, s_, bucket_);
  }

 private:
  int s_;
  size_t bucket_;
  uint64_t seed_, calls_ = 0;
  Scratch norms_, words_;
};

class SignDevice final : public DeviceCodec {
 public:
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const size_t words = (n + 31) / 32;
    uint32_t* w = words_.get<uint32_t>(words);
    double* sum = sum_.get<double>(1);
    CUDA_CHECK(cudaMemset(sum, 0, sizeof(double)));
    if (n > 0) k::launch_sign_encode(0, x, n, w, sum);
    out.resize(4 * words);
    to_host(out.data(), w, 4 * words);
    out.resize((n + 7) / 8);
    double total = 0;
    to_host(&total, sum, sizeof total);
    double scale = n > 0 ? total / static_cast<double>(n) : 0.0;
    if (!std::isfinite(scale)) scale = 0;
    codec::begin_params(p, CodecId::kSign);
    p.add_values(static_cast<float>(scale));
  }

 private:
  Scratch words_, sum_;
};

// Keeps the k largest |values| of (idx, values), in increasing index order.
void keep_largest(std::vector<uint32_t>& idx, std::vector<float>& values, size_t k) {
  if (idx.size() <= k) return;
  std::vector<float> mags(values.size());
  std::transform(values.begin(), values.end(), mags.begin(), [](float v) { return std::fabs(v); });
  std::nth_element(mags.begin(), mags.begin() + static_cast<long>(k - 1), mags.end(), std::greater<float>());
  const float t = mags[k - 1];
  size_t above = 0;
  for (float v : values) above += std::fabs(v) > t;
  size_t ties = k - above, out = 0;
  for (size_t j = 0; j < idx.size(); ++j) {
    const float a = std::fabs(values[j]);
    if (a > t || (a == t && ties > 0 && ties--)) {
      idx[out] = idx[j];
      values[out++] = values[j];
    }
  }
  idx.resize(out);
  values.resize(out);
}

class TopkDevice final : public DeviceCodec {
 public:
  TopkDevice(double density, bool exact, int value_bits, uint64_t seed)
      : density_(density), exact_(exact), value_bits_(value_bits), seed_(seed) {}
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const size_t kk = n == 0 ? 0 : std::clamp<size_t>(static_cast<size_t>(std::llround(density_ * n)), 1, n);
    const size_t m = std::max<size_t>(2048, static_cast<size_t>(64.0 / density_));  // as the CPU codec
    std::vector<uint32_t> idx;
    std::vector<float> values;
    if (kk > 0) {
      float t;
      const bool exact = exact_ || 4 * m >= n;
      if (exact) {
        t = k::kth_largest_abs(0, x, n, kk, abs_.get<float>(n));
      } else {
        const uint64_t s = seed_ + 0x51ed27ull * ++calls_;
        float* d = abs_.get<float>(m);
        k::launch_abs_sample(0, x, n, s, m, d);
        std::vector<float> sample(m);
        to_host(sample.data(), d, 4 * m);
        const size_t rank = std::max<size_t>(1, static_cast<size_t>(std::llround(density_ * m)));
        std::nth_element(sample.begin(), sample.begin() + static_cast<long>(rank - 1), sample.end(), std::greater<float>());
        t = sample[rank - 1];
      }
      uint32_t* di = idx_.get<uint32_t>(n);
      const size_t c = k::select_at_least(0, x, n, t, di);
      float* dv = vals_.get<float>(c);
      k::launch_gather(0, x, di, c, dv);
      idx.resize(c);
      values.resize(c);
      to_host(idx.data(), di, 4 * c);
      to_host(values.data(), dv, 4 * c);
      if (exact || c > kk + kk / 2) keep_largest(idx, values, kk);
    }
    codec::write_topk(idx, values.data(), n, density_, value_bits_, out, p);
  }

 private:
  double density_;
  bool exact_;
  int value_bits_;
  uint64_t seed_, calls_ = 0;
  Scratch abs_, idx_, vals_;
};

class RandomkDevice final : public DeviceCodec {
 public:
  RandomkDevice(double density, bool unbiased, uint64_t seed) : density_(density), unbiased_(unbiased), seed_(seed) {}
  void encode(const float* x, size_t n, size_t, std::vector<uint8_t>& out, CodecParams& p) override {
    const uint64_t kk = n == 0 ? 0 : std::clamp<uint64_t>(static_cast<uint64_t>(std::llround(density_ * n)), 1, n);
    const uint64_t s = codec::randomk_call_seed(seed_, ++calls_);
    float* d = vals_.get<float>(kk);
    k::launch_randomk_gather(0, x, n, kk, s, unbiased_, d);
    out.resize(4 * kk);
    to_host(out.data(), d, 4 * kk);
    codec::randomk_params(p, s, kk, unbiased_);
  }

 private:
  double density_;
  bool unbiased_;
  uint64_t seed_, calls_ = 0;
  Scratch vals_;
};

// Row-major M (rows x cols) is column-major M^T with leading dimension cols; the gemms
// below are written in those column-major terms.
class PowerSgdDevice final : public DeviceCodec {
 public:
  PowerSgdDevice(int rank, std::vector<ParamView> layout, uint64_t seed)
      : r_(static_cast<size_t>(rank)), layout_(std::move(layout)), rng_(seed, 0x9047) {}
  void encode(const float* x, size_t n, size_t offset, std::vector<uint8_t>& out, CodecParams& p) override {
    const auto mats = codec::powersgd_matrices(layout_, offset, n, r_);
    size_t factors = 0, covered = 0;
    for (const auto& m : mats) {
      factors += (m.rows + m.cols) * codec::rank_of(r_, m);
      covered += m.rows * m.cols;
    }
    out.resize(4 * (factors + n - covered));
    float* w = reinterpret_cast<float*>(out.data());
    float* raw = w + factors;
    size_t from = 0;
    for (const auto& m : mats) {
      to_host(raw, x + from, 4 * (m.start - from));
      raw += m.start - from;
      from = m.start + m.rows * m.cols;
      const size_t r = codec::rank_of(r_, m);
      const int rows = static_cast<int>(m.rows), cols = static_cast<int>(m.cols), ri = static_cast<int>(r);
      float* P = w;
      float* Q = w + m.rows * r;
      auto& warm = warm_[{offset + m.start, r}];
      float* dq = warm.get<float>(m.cols * r);
      if (fresh_.insert({offset + m.start, r}).second) {
        std::vector<float> q0(m.cols * r);
        for (auto& q : q0) q = static_cast<float>(rng_.normal());
        to_device(dq, q0.data(), 4 * q0.size());
      }
      float* dp = p_.get<float>(m.rows * r);
      const float one = 1.0f, zero = 0.0f;
      // P^T (r x rows) = Q^T (r x cols) * M^T (cols x rows)
      CUBLAS_CHECK(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, ri, rows, cols, &one, dq, ri, x + m.start, cols, &zero, dp, ri));
      to_host(P, dp, 4 * m.rows * r);
      codec::orthonormalize(P, m.rows, r);
      to_device(dp, P, 4 * m.rows * r);
      // Q^T (r x cols) = P^T (r x rows) * M (rows x cols)
      CUBLAS_CHECK(cublasSgemm(blas_.get(), CUBLAS_OP_N, CUBLAS_OP_T, ri, cols, rows, &one, dp, ri, x + m.start, cols, &zero, dq, ri));
      to_host(Q, dq, 4 * m.cols * r);
      // A non-finite M leaves NaN in Q; the next warm start begins afresh.
      if (!std::all_of(Q, Q + m.cols * r, [](float v) { return std::isfinite(v); })) fresh_.erase({offset + m.start, r});
      w += (m.rows + m.cols) * r;
    }
    to_host(raw, x + from, 4 * (n - from));
    codec::powersgd_params(r_, mats, p);
  }

 private:
  size_t r_;
  std::vector<ParamView> layout_;
  Rng rng_;
  CublasHandle blas_;
  std::map<std::pair<size_t, size_t>, Scratch> warm_;
  std::set<std::pair<size_t, size_t>> fresh_;  // warm starts that hold a Q
  Scratch p_;
};

}  // namespace

std::unique_ptr<DeviceCodec> make_device_codec(const CodecSpec& s, const std::vector<ParamView>& layout, uint64_t seed) {
  check_codec_spec(s);
  if (s.name == "none") return std::make_unique<DenseDevice>(CodecId::kNone, s.block);
  if (s.name == "fp16") return std::make_unique<DenseDevice>(CodecId::kFp16, s.block);
  if (s.name == "bf16") return std::make_unique<DenseDevice>(CodecId::kBf16, s.block);
  if (s.name == "int8") return std::make_unique<DenseDevice>(CodecId::kInt8, s.block);
  if (s.name == "qsgd") return std::make_unique<QsgdDevice>(s.levels, s.block, seed);
  if (s.name == "topk") return std::make_unique<TopkDevice>(s.density, s.exact_topk, s.value_bits, seed);
  if (s.name == "randomk") return std::make_unique<RandomkDevice>(s.density, !uses_error_feedback(s), seed);
  if (s.name == "sign") return std::make_unique<SignDevice>();
  if (s.name == "powersgd") return std::make_unique<PowerSgdDevice>(s.rank, layout, seed);
  // The engine catches this and encodes that link's messages on the host (say_once).
  throw InputError("codec " + s.name + ": no CUDA encoder");
}

std::string device_decode_accumulate(const CodecParams& p, const uint8_t* payload, size_t bytes, float scale, float* y,
                                     size_t n) {
  if (std::string err = check_payload(p, payload, bytes, n); !err.empty()) return err;
  if (!std::isfinite(scale)) return "codec: the receiver's scale is not finite";
  thread_local Scratch in, extra, values;
  const auto id = static_cast<CodecId>(p.codec_id());
  if (id == CodecId::kInt4) return "codec int4: no CUDA decoder (the host decodes it)";
  uint8_t* d = in.get<uint8_t>(bytes);
  to_device(d, payload, bytes);
  switch (id) {
    case CodecId::kNone:
      k::launch_fp32_decode(0, reinterpret_cast<const float*>(d), n, scale, y);
      break;
    case CodecId::kFp16:
      k::launch_fp16_decode(0, reinterpret_cast<const uint16_t*>(d), n, scale, y);
      break;
    case CodecId::kBf16:
      k::launch_bf16_decode(0, reinterpret_cast<const uint16_t*>(d), n, scale, y);
      break;
    case CodecId::kInt8: {
      const size_t block = static_cast<size_t>(p.values(0)), blocks = (n + block - 1) / block;
      k::launch_int8_decode(0, reinterpret_cast<const float*>(d), reinterpret_cast<const int8_t*>(d + 4 * blocks), n, block, scale, y);
      break;
    }
    case CodecId::kQsgd: {
      const size_t bucket = static_cast<size_t>(p.values(1)), buckets = (n + bucket - 1) / bucket;
      k::launch_qsgd_decode(0, reinterpret_cast<const float*>(d), d + 4 * buckets, n, bucket, static_cast<int>(p.values(0)), scale, y);
      break;
    }
    case CodecId::kTopk: {
      std::vector<uint32_t> idx;
      codec::topk_indices(p, payload, bytes, n, &idx);
      uint32_t* di = extra.get<uint32_t>(idx.size());
      to_device(di, idx.data(), 4 * idx.size());
      // bf16 values widen on the host: k of them, never the dense tensor.
      std::vector<float> v(idx.size());
      if (p.values(3) == 32) {
        std::memcpy(v.data(), payload, 4 * v.size());
      } else {
        for (size_t j = 0; j < v.size(); ++j) {
          const uint32_t bits = static_cast<uint32_t>(codec::load<uint16_t>(payload + 2 * j)) << 16;
          std::memcpy(&v[j], &bits, 4);
        }
      }
      float* dv = values.get<float>(v.size());
      to_device(dv, v.data(), 4 * v.size());
      k::launch_scatter_add(0, di, dv, idx.size(), scale, y);
      break;
    }
    case CodecId::kRandomk:
      k::launch_randomk_scatter_add(0, reinterpret_cast<const float*>(d), n, static_cast<size_t>(p.values(0)), p.seed(), scale, y);
      break;
    case CodecId::kSign:
      k::launch_sign_decode(0, d, n, scale * static_cast<float>(p.values(0)), y);
      break;
    case CodecId::kPowerSgd: {
      thread_local CublasHandle blas;
      const size_t r = static_cast<size_t>(p.values(0));
      const auto mats = codec::powersgd_matrices_of(p);
      const float* w = reinterpret_cast<const float*>(d);
      const float* raw = w;
      for (const auto& m : mats) raw += (m.rows + m.cols) * codec::rank_of(r, m);
      size_t from = 0;
      for (const auto& m : mats) {
        k::launch_fp32_decode(0, raw, m.start - from, scale, y + from);
        raw += m.start - from;
        from = m.start + m.rows * m.cols;
        const size_t kr = codec::rank_of(r, m);
        const int rows = static_cast<int>(m.rows), cols = static_cast<int>(m.cols), ki = static_cast<int>(kr);
        const float one = 1.0f;
        // y_M^T (cols x rows) += scale * Q (cols x r) * P^T (r x rows)
        CUBLAS_CHECK(cublasSgemm(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, cols, rows, ki, &scale, w + m.rows * kr, ki, w, ki, &one,
                                 y + m.start, cols));
        w += (m.rows + m.cols) * kr;
      }
      k::launch_fp32_decode(0, raw, n - from, scale, y + from);
      break;
    }
    case CodecId::kInt4:
      break;  // refused above: the host decodes it
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return {};
}

void use_cuda_device(int device) { CUDA_CHECK(cudaSetDevice(device)); }

void device_to_host(void* host_dst, const void* src_dev, size_t bytes) { to_host(host_dst, src_dev, bytes); }

double device_sum_squares(const float* x, size_t n) {
  if (n == 0) return 0;
  thread_local Scratch sum;
  double* d = sum.get<double>(1);
  CUDA_CHECK(cudaMemset(d, 0, sizeof(double)));
  k::launch_sum_squares(0, x, n, d);
  double total = 0;
  to_host(&total, d, sizeof total);
  return total;
}

// --- DeviceLinkEncoder -----------------------------------------------------------------

DeviceLinkEncoder::DeviceLinkEncoder(int device, const CodecSpec& spec, std::vector<ParamView> layout, uint64_t seed)
    : device_(device), layout_(std::move(layout)), seed_(seed) {
  set_spec(spec);
}

DeviceLinkEncoder::~DeviceLinkEncoder() {
  if (residual_ != nullptr) cudaFree(residual_);  // at exit the runtime may be gone already; nothing to do then
}

void DeviceLinkEncoder::set_spec(const CodecSpec& spec) {
  use_cuda_device(device_);
  codec_ = make_device_codec(spec, layout_, seed_);
  spec_ = spec;
  error_feedback_ = uses_error_feedback(spec);
  if (!error_feedback_ && residual_ != nullptr) {
    CUDA_CHECK(cudaFree(residual_));
    residual_ = nullptr;
    residual_n_ = 0;
  }
}

// A zero residual of `total` elements, unless one of that length is kept already.
void DeviceLinkEncoder::ensure_residual(size_t total) {
  if (residual_n_ == total && residual_ != nullptr) return;
  if (residual_ != nullptr) CUDA_CHECK(cudaFree(residual_));
  residual_ = nullptr;
  residual_n_ = 0;
  CUDA_CHECK(cudaMalloc(&residual_, 4 * std::max<size_t>(total, 1)));
  CUDA_CHECK(cudaMemset(residual_, 0, 4 * total));
  residual_n_ = total;
}

void DeviceLinkEncoder::add_to_residual(const std::vector<float>& host, size_t total) {
  if (!error_feedback_ || host.empty()) return;
  HEARSAY_CHECK(host.size() == total, "a residual of another tensor's length");
  use_cuda_device(device_);
  ensure_residual(total);
  thread_local Scratch staged;
  float* d = staged.get<float>(total);
  to_device(d, host.data(), 4 * total);
  k::launch_fp32_decode(0, d, total, 1.0f, residual_);  // r += host, exact as on the CPU
  CUDA_CHECK(cudaDeviceSynchronize());
}

std::vector<float> DeviceLinkEncoder::residual_host() const {
  std::vector<float> out(residual_n_);
  if (residual_n_ == 0) return out;
  use_cuda_device(device_);
  to_host(out.data(), residual_, 4 * residual_n_);
  return out;
}

void DeviceLinkEncoder::encode(const float* x, size_t n, size_t offset, size_t total, std::vector<uint8_t>& out,
                               CodecParams& params) {
  use_cuda_device(device_);
  if (!error_feedback_) {
    codec_->encode(x, n, offset, out, params);
    return;
  }
  HEARSAY_CHECK(offset + n <= total, "segment outside the tensor");
  ensure_residual(total);
  float* r = residual_ + offset;
  // r += x: fma(1, x, r) rounds once, as the CPU's r += x does.
  if (n > 0) k::launch_fp32_decode(0, x, n, 1.0f, r);
  codec_->encode(r, n, offset, out, params);
  // What the receiver will add is subtracted, leaving exactly what was not sent.
  const std::string err = device_decode_accumulate(params, out.data(), out.size(), -1.0f, r, n);
  HEARSAY_CHECK(err.empty(), "a device codec could not decode its own payload: " + err);
}

}  // namespace hearsay
