#include "hearsay/backend.h"

#include <utility>
#include <vector>

#include "../util/host_memory.h"

namespace hearsay {

DeviceBuffer::DeviceBuffer(Backend& backend, size_t bytes)
    : backend_(&backend), ptr_(backend.allocate(bytes)), bytes_(bytes) {
  backend_->buffer_bytes_ += bytes_;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ == nullptr) return;
  backend_->buffer_bytes_ -= bytes_;
  backend_->deallocate(ptr_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) {
      backend_->buffer_bytes_ -= bytes_;
      backend_->deallocate(ptr_);
    }
    backend_ = std::exchange(other.backend_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

std::vector<float> download_floats(Backend& backend, const float* src, size_t n) {
  std::vector<float> host;
  download_floats_into(backend, src, n, host);
  return host;
}

void download_floats_into(Backend& backend, const float* src, size_t n, std::vector<float>& out) {
  if (src == nullptr) {
    out.clear();
    return;
  }
  if (backend.is_host()) {
    // Memory it holds already is copied into on every core (a checkpoint's snapshot);
    // fresh memory is written once by the copy, not zeroed first (a gradient's host copy,
    // every step).
    if (out.size() == n) return copy_on_all_cores(out.data(), src, sizeof(float) * n);
    reserve_for_copy(out, n);
    out.assign(src, src + n);
    return;
  }
  resize_for_copy(out, n);
  backend.download(out.data(), src, sizeof(float) * n);
}

}  // namespace hearsay
