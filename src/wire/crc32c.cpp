#include <array>
#include <cstring>

#include "hearsay/wire.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace hearsay {
namespace {

#if !defined(__SSE4_2__)
constexpr uint32_t kPoly = 0x82f63b78;  // Castagnoli, reflected

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
    t[i] = c;
  }
  return t;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__SSE4_2__)
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
#else
  static const std::array<uint32_t, 256> table = make_table();
  while (n-- > 0) c = table[(c ^ *p++) & 0xff] ^ (c >> 8);
#endif
  return ~c;
}

}  // namespace hearsay
