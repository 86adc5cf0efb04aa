#include "host_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>

namespace hearsay {

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
// Below this a copy is not worth a thread: a helper's start costs tens of microseconds.
constexpr size_t kSplitFrom = size_t{64} << 20;
}  // namespace

void advise_huge_pages(void* p, size_t bytes) {
  const auto begin = (reinterpret_cast<uintptr_t>(p) + kHugePage - 1) / kHugePage * kHugePage;
  const auto end = (reinterpret_cast<uintptr_t>(p) + bytes) / kHugePage * kHugePage;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
}

void reserve_for_copy(std::vector<float>& out, size_t n) {
  if (out.size() == n) return;
  out.clear();
  out.shrink_to_fit();
  out.reserve(n);  // a fresh mapping at this size, not yet touched
  advise_huge_pages(out.data(), n * sizeof(float));
}

void resize_for_copy(std::vector<float>& out, size_t n) {
  reserve_for_copy(out, n);
  out.resize(n);
}

void copy_on_all_cores(void* dst, const void* src, size_t bytes) {
  const size_t cores = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  if (bytes < kSplitFrom || cores == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t part = (bytes / cores + 4095) / 4096 * 4096;
  std::vector<std::thread> helpers;
  for (size_t at = part; at < bytes; at += part) {
    const size_t n = std::min(part, bytes - at);
    helpers.emplace_back([=] { std::memcpy(static_cast<char*>(dst) + at, static_cast<const char*>(src) + at, n); });
  }
  std::memcpy(dst, src, std::min(part, bytes));
  for (auto& t : helpers) t.join();
}

}  // namespace hearsay
