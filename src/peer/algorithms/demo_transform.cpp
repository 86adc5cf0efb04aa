// The block DCT as two passes of small matrix products (OpenBLAS): each a-row band of a
// matrix is multiplied by the a x a basis from the left, then each b-column band by the
// b x b basis from the right. Per element that is a + b multiply-adds, so a 64 x 64
// block costs the model's size times 128 flops a pass.
#include "demo_transform.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace hearsay {

size_t BlockDct::block_edge(size_t n, size_t at_most) {
  for (size_t d = std::min(n, at_most); d > 1; --d) {
    if (n % d == 0) return d;
  }
  return 1;
}

const std::vector<float>& BlockDct::basis(size_t edge) {
  for (const auto& [e, m] : bases_) {
    if (e == edge) return m;
  }
  std::vector<float> m(edge * edge);
  const double pi = std::acos(-1.0);
  for (size_t k = 0; k < edge; ++k) {
    const double s = k == 0 ? std::sqrt(1.0 / static_cast<double>(edge)) : std::sqrt(2.0 / static_cast<double>(edge));
    for (size_t i = 0; i < edge; ++i) {
      m[k * edge + i] = static_cast<float>(s * std::cos(pi * (2.0 * static_cast<double>(i) + 1.0) * static_cast<double>(k) /
                                                        (2.0 * static_cast<double>(edge))));
    }
  }
  bases_.emplace_back(edge, std::move(m));
  return bases_.back().second;
}

BlockDct::BlockDct(const std::vector<ParamView>& layout, size_t n, int chunk) : n_(n) {
  if (chunk < 1) throw std::invalid_argument("BlockDct: chunk must be >= 1, got " + std::to_string(chunk));
  const size_t c = static_cast<size_t>(chunk);
  std::vector<ParamView> views = layout;
  std::sort(views.begin(), views.end(), [](const ParamView& x, const ParamView& y) { return x.offset < y.offset; });
  size_t at = 0;
  auto vector_piece = [&](size_t offset, size_t len) {
    if (len > 0) pieces_.push_back({offset, 1, len, 1, block_edge(len, c)});
  };
  for (const ParamView& v : views) {
    if (v.offset < at || v.offset + v.size > n) throw std::invalid_argument("BlockDct: tensor '" + v.name + "' overlaps or lies past the model");
    vector_piece(at, v.offset - at);
    if (v.shape.size() == 2 && static_cast<size_t>(v.shape[0]) * static_cast<size_t>(v.shape[1]) == v.size) {
      const size_t r = static_cast<size_t>(v.shape[0]), cols = static_cast<size_t>(v.shape[1]);
      pieces_.push_back({v.offset, r, cols, block_edge(r, c), block_edge(cols, c)});
    } else {
      vector_piece(v.offset, v.size);
    }
    at = v.offset + v.size;
  }
  vector_piece(at, n - at);
  for (const Piece& p : pieces_) {
    basis(p.a);
    basis(p.b);
  }
}

void BlockDct::apply(const float* in, float* out, bool inverse) const {
  std::vector<float> tmp;
  auto find = [this](size_t edge) -> const float* {
    for (const auto& [e, m] : bases_) {
      if (e == edge) return m.data();
    }
    throw std::logic_error("BlockDct: no basis of edge " + std::to_string(edge));
  };
  // Forward: Y = B_a X B_b^T per block; inverse: X = B_a^T Y B_b.
  const CBLAS_TRANSPOSE left = inverse ? CblasTrans : CblasNoTrans, right = inverse ? CblasNoTrans : CblasTrans;
  for (const Piece& p : pieces_) {
    const float* x = in + p.offset;
    float* y = out + p.offset;
    tmp.assign(p.rows * p.cols, 0.0f);
    const float* ba = find(p.a);
    const float* bb = find(p.b);
    // Rows: each band of a rows, tmp_band = B_a (or B_a^T) x_band (a x cols).
    for (size_t r = 0; r < p.rows; r += p.a) {
      cblas_sgemm(CblasRowMajor, left, CblasNoTrans, static_cast<int>(p.a), static_cast<int>(p.cols), static_cast<int>(p.a), 1.0f,
                  ba, static_cast<int>(p.a), x + r * p.cols, static_cast<int>(p.cols), 0.0f, tmp.data() + r * p.cols,
                  static_cast<int>(p.cols));
    }
    // Columns: each band of b columns, y_band = tmp_band B_b^T (or B_b) (rows x b).
    for (size_t col = 0; col < p.cols; col += p.b) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, right, static_cast<int>(p.rows), static_cast<int>(p.b), static_cast<int>(p.b), 1.0f,
                  tmp.data() + col, static_cast<int>(p.cols), bb, static_cast<int>(p.b), 0.0f, y + col, static_cast<int>(p.cols));
    }
  }
}

void BlockDct::forward(const float* x, float* y) const { apply(x, y, false); }
void BlockDct::inverse(const float* y, float* x) const { apply(y, x, true); }

std::vector<uint32_t> BlockDct::top_per_block(const float* y, int k) const {
  std::vector<uint32_t> idx, block;
  const size_t want = static_cast<size_t>(std::max(0, k));
  for (const Piece& p : pieces_) {
    for (size_t r0 = 0; r0 < p.rows; r0 += p.a) {
      for (size_t c0 = 0; c0 < p.cols; c0 += p.b) {
        block.clear();
        for (size_t r = r0; r < r0 + p.a; ++r) {
          for (size_t c = c0; c < c0 + p.b; ++c) {
            const size_t i = p.offset + r * p.cols + c;
            if (y[i] != 0.0f) block.push_back(static_cast<uint32_t>(i));
          }
        }
        if (block.size() > want) {
          // Largest magnitude first; ties by index, so every run picks the same.
          std::nth_element(block.begin(), block.begin() + static_cast<long>(want), block.end(), [y](uint32_t i, uint32_t j) {
            const float a = std::fabs(y[i]), b = std::fabs(y[j]);
            return a > b || (a == b && i < j);
          });
          block.resize(want);
        }
        idx.insert(idx.end(), block.begin(), block.end());
      }
    }
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

DemoMemory::DemoMemory(const std::vector<ParamView>& layout, size_t n, int chunk, float momentum)
    : dct_(layout, n, chunk), beta_(momentum), m_(n, 0.0f), y_(n, 0.0f) {}

const std::vector<float>& DemoMemory::accumulate(const float* g) {
  for (size_t i = 0; i < m_.size(); ++i) m_[i] = beta_ * m_[i] + g[i];
  dct_.forward(m_.data(), y_.data());
  return y_;
}

void DemoMemory::sent_in_place() {
  dct_.inverse(y_.data(), y_.data());
  for (size_t i = 0; i < m_.size(); ++i) m_[i] -= y_[i];
}

const std::vector<float>& DemoMemory::direction_in_place(int peers, bool sign) {
  const float inv = 1.0f / static_cast<float>(peers);
  for (float& v : y_) v *= inv;
  dct_.inverse(y_.data(), y_.data());
  if (sign) {
    for (float& v : y_) v = static_cast<float>((v > 0.0f) - (v < 0.0f));
  }
  return y_;
}

void DemoMemory::sent(const std::vector<float>& sent) {
  std::copy(sent.begin(), sent.end(), y_.begin());
  sent_in_place();
}

std::vector<float> DemoMemory::direction(std::vector<float> sum, int peers, bool sign) {
  std::copy(sum.begin(), sum.end(), y_.begin());
  return direction_in_place(peers, sign);
}

}  // namespace hearsay
