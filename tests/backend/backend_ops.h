// Runs each backend op on host inputs through any backend and returns host outputs, so
// the CPU reference and every other backend can be compared op by op.
#pragma once

#include <cstring>
#include <vector>

#include "hearsay/backend.h"
#include "hearsay/rng.h"

namespace hearsay::test {

inline std::vector<float> random_vector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = rng.uniform(lo, hi);
  return v;
}

// Holds device copies of host vectors and reads them back.
class OnDevice {
 public:
  explicit OnDevice(Backend& b) : b_(b) {}
  float* put(const std::vector<float>& host) {
    bufs_.emplace_back(b_, sizeof(float) * host.size());
    b_.upload(bufs_.back().data(), host.data(), sizeof(float) * host.size());
    return bufs_.back().f32();
  }
  int32_t* put(const std::vector<int32_t>& host) {
    bufs_.emplace_back(b_, sizeof(int32_t) * host.size());
    b_.upload(bufs_.back().data(), host.data(), sizeof(int32_t) * host.size());
    return bufs_.back().i32();
  }
  float* zeros(size_t n) { return put(std::vector<float>(n, 0.0f)); }
  int32_t* zeros_i32(size_t n) { return put(std::vector<int32_t>(n, 0)); }
  std::vector<float> get(const float* p, size_t n) {
    std::vector<float> host(n);
    b_.download(host.data(), p, sizeof(float) * n);
    return host;
  }

 private:
  Backend& b_;
  std::vector<DeviceBuffer> bufs_;
};

}  // namespace hearsay::test
