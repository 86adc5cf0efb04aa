#include "zeroed_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "../../util/host_memory.h"

namespace hearsay {
namespace {

// From this size on, a buffer is mapped: below it a page's rounding would waste more
// than the heap does.
constexpr size_t kMapFrom = size_t{1} << 20;
// Before each buffer, in the 64 bytes that keep its alignment: how it was allocated and,
// when mapped, the whole mapping's size (for munmap).
constexpr size_t kHeader = 64;
constexpr uint64_t kHeap = 0x6865617073617968ull;    // "hyasspeh"
constexpr uint64_t kMapped = 0x6d61707065646879ull;  // "yhdeppam"

struct Header {
  uint64_t kind;
  uint64_t mapped_bytes;
};

}  // namespace

void* allocate_zeroed(size_t bytes) {
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  if (rounded > SIZE_MAX - 2 * 4096) return nullptr;
  if (rounded >= kMapFrom) {
    // The header takes the first page's last 64 bytes, so the buffer starts page-aligned.
    const size_t total = rounded + 4096;
    void* m = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    // Faulted in 2 MiB at a time, not 4 KiB: the first touch of a 1B model's buffers was
    // millions of faults (its first step 62 s, the next ones 9 s).
    advise_huge_pages(m, total);
    char* p = static_cast<char*>(m) + 4096;
    auto* h = reinterpret_cast<Header*>(p - kHeader);
    h->kind = kMapped;
    h->mapped_bytes = total;
    return p;
  }
  void* m = std::aligned_alloc(64, rounded + kHeader);
  if (m == nullptr) return nullptr;
  std::memset(m, 0, rounded + kHeader);
  char* p = static_cast<char*>(m) + kHeader;
  reinterpret_cast<Header*>(p - kHeader)->kind = kHeap;
  return p;
}

void free_zeroed(void* ptr) {
  if (ptr == nullptr) return;
  char* p = static_cast<char*>(ptr);
  const auto* h = reinterpret_cast<const Header*>(p - kHeader);
  if (h->kind == kMapped) {
    ::munmap(p - 4096, h->mapped_bytes);
    return;
  }
  std::free(p - kHeader);
}

}  // namespace hearsay
