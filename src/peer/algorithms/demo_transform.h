// DeMo's transform (Peng, Quesnelle, Kingma 2024): an orthonormal DCT-II over fixed-size
// blocks of every parameter tensor, and the top-k components of each block. A weight
// [R, C] is cut into a x b blocks (a the largest divisor of R at most `chunk`, b of C); a
// vector or any other tensor into pieces of the largest divisor of its length at most
// `chunk`. A block's coefficients are stored where its elements are, so the transformed
// vector has the model's layout and length. Kept apart from demo.cpp so that it is tested
// against a float64 reference (tests/peer/demo_test.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "hearsay/trainable.h"

namespace hearsay {

class BlockDct {
 public:
  // `layout`: the model's tensors (their offsets and shapes); `n`: the flat length.
  // Elements no tensor covers are transformed as vectors of their own.
  BlockDct(const std::vector<ParamView>& layout, size_t n, int chunk);
  size_t size() const { return n_; }
  // y = DCT(x), and x = DCT^-1(y) (the transpose: the transform is orthonormal). In place
  // too (x == y): each tensor is read whole before its result is written.
  void forward(const float* x, float* y) const;
  void inverse(const float* y, float* x) const;
  // The k largest |y| of every block (all of a block smaller than k; zeros never),
  // as increasing indices into y.
  std::vector<uint32_t> top_per_block(const float* y, int k) const;
  // The largest divisor of n at most `at_most` (1 when none larger).
  static size_t block_edge(size_t n, size_t at_most);

 private:
  struct Piece {
    size_t offset, rows, cols;  // a matrix rows x cols at offset (a vector: rows 1)
    size_t a, b;                // block edges: a | rows, b | cols
  };
  // One orthonormal DCT-II matrix per edge length (row k: the k-th basis vector).
  const std::vector<float>& basis(size_t edge);
  void apply(const float* in, float* out, bool inverse) const;

  size_t n_;
  std::vector<Piece> pieces_;
  std::vector<std::pair<size_t, std::vector<float>>> bases_;
};

// A DeMo peer's momentum and the arithmetic of one step around the exchange, kept apart
// from the engine so that it is tested against a float64 reference. Two model-sized
// buffers: the momentum (the paper's) and one of coefficients, which holds in turn the
// DCT of the momentum, what was sent of it, the sum of what every peer sent, and the
// step's direction (each transform is done in place, block by block).
class DemoMemory {
 public:
  DemoMemory(const std::vector<ParamView>& layout, size_t n, int chunk, float momentum);
  // m <- beta m + g; the coefficients become the DCT of m (the coefficients to pick from).
  const std::vector<float>& accumulate(const float* g);
  // The k largest coefficients of each block of the last accumulate's DCT.
  std::vector<uint32_t> fast_components(int k) const { return dct_.top_per_block(y_.data(), k); }
  // The coefficients buffer, for the exchange to write into: what was sent (as the
  // receivers decode it) before sent_in_place, the sum of every peer's before
  // direction_in_place.
  float* coefficients_mut() { return y_.data(); }
  // The coefficients hold what was sent, as the receivers decode it (zero elsewhere): m
  // loses their inverse transform, m <- m - IDCT(sent).
  void sent_in_place();
  // The coefficients hold the sum of every peer's decoded coefficients: they become the
  // step's direction, IDCT(sum / n), or its sign.
  const std::vector<float>& direction_in_place(int peers, bool sign);
  // The same from vectors given (the tests' way in): a copy into the coefficients first.
  void sent(const std::vector<float>& sent);
  std::vector<float> direction(std::vector<float> sum, int peers, bool sign);
  const std::vector<float>& momentum() const { return m_; }
  // Its momentum and coefficients.
  uint64_t held_bytes() const { return (m_.capacity() + y_.capacity()) * sizeof(float); }
  std::vector<float>& momentum_mut() { return m_; }
  const std::vector<float>& coefficients() const { return y_; }

 private:
  BlockDct dct_;
  float beta_;
  std::vector<float> m_, y_;
};

}  // namespace hearsay
