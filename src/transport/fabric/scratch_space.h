// Memory the fabric transport receives into and throws away: anonymous pages mapped
// without reserving swap, so a mapping as large as the largest payload costs address space
// and only the pages actually written cost memory.
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace hearsay::fabric {

class ScratchSpace {
 public:
  ScratchSpace() = default;
  // Throws std::runtime_error when the mapping fails (out of address space).
  explicit ScratchSpace(size_t bytes) : size_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
  }
  ScratchSpace(ScratchSpace&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ScratchSpace& operator=(ScratchSpace&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~ScratchSpace() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace hearsay::fabric
