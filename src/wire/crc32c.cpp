// CRC32C (Castagnoli). With SSE4.2 the crc32 instruction does 8 bytes at a time, but
// each step waits on the previous one (3 cycles); three independent lanes over
// consecutive 8 KiB blocks keep the unit busy, and their registers are joined with the
// linear "append K zero bytes" operator: crc(s, A|B) = zeros_K(crc(s, A)) ^ crc(0, B).
#include <array>
#include <cstring>

#include "hearsay/wire.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace hearsay {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // Castagnoli, reflected

#if defined(__SSE4_2__)
constexpr size_t kLane = 8192;

// GF(2) 32x32 matrix times vector; matrices as 32 columns (zlib's crc32_combine idea).
uint32_t gf2_times(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (int i = 0; vec != 0; ++i, vec >>= 1) {
    if (vec & 1) sum ^= mat[i];
  }
  return sum;
}

void gf2_square(uint32_t* out, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) out[n] = gf2_times(mat, mat[n]);
}

// Byte tables for the operator that appends kLane zero bytes to a CRC register.
struct ZerosOperator {
  std::array<std::array<uint32_t, 256>, 4> table{};
  ZerosOperator() {
    uint32_t op[32], sq[32];
    op[0] = kPoly;  // one zero bit
    for (int n = 1; n < 32; ++n) op[n] = 1u << (n - 1);
    // One zero bit -> 8 bits (one byte): square three times.
    for (int k = 0; k < 3; ++k) {
      gf2_square(sq, op);
      std::memcpy(op, sq, sizeof(op));
    }
    // One byte -> kLane bytes (a power of two): keep squaring.
    for (size_t bytes = 1; bytes < kLane; bytes *= 2) {
      gf2_square(sq, op);
      std::memcpy(op, sq, sizeof(op));
    }
    for (int j = 0; j < 4; ++j) {
      for (uint32_t b = 0; b < 256; ++b) table[j][b] = gf2_times(op, b << (8 * j));
    }
  }
  uint32_t apply(uint32_t crc) const {
    return table[0][crc & 0xff] ^ table[1][(crc >> 8) & 0xff] ^ table[2][(crc >> 16) & 0xff] ^ table[3][crc >> 24];
  }
};

uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
#else
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
  static const ZerosOperator zeros;
  while (n >= 3 * kLane) {
    uint64_t a = c, b = 0, d = 0;
    for (size_t i = 0; i < kLane; i += 8) {
      a = _mm_crc32_u64(a, load64(p + i));
      b = _mm_crc32_u64(b, load64(p + kLane + i));
      d = _mm_crc32_u64(d, load64(p + 2 * kLane + i));
    }
    c = zeros.apply(zeros.apply(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^ static_cast<uint32_t>(d);
    p += 3 * kLane;
    n -= 3 * kLane;
  }
  uint64_t c64 = c;
  while (n >= 8) {
    c64 = _mm_crc32_u64(c64, load64(p));
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
