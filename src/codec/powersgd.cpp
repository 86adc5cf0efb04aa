// PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): each weight matrix M (rows x cols)
// travels as a rank-r product P Q^T, found by one step of subspace iteration warm-started
// from the previous call's Q:  P = M Q;  P <- orthonormal(P);  Q = M^T P.
// Peers gossip point to point, so both factors travel (the all-reduce variant sums P and
// Q across workers instead). Vectors (biases) and matrices too small to gain travel raw.
//
// Parameters: values = [r, m, then (start, rows, cols) for each of the m matrices, start
// relative to the segment]. Payload: P (rows x r) and Q (cols x r) of each matrix, row
// major fp32, then the elements outside every matrix, in order, as fp32.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "codec_impl.h"
#include "hearsay/rng.h"

namespace hearsay::codec {
namespace {

class PowerSgdCodec final : public Codec {
 public:
  PowerSgdCodec(int rank, std::vector<ParamView> layout, uint64_t seed)
      : r_(static_cast<size_t>(rank)), layout_(std::move(layout)), rng_(seed, 0x9047) {}
  CodecId id() const override { return CodecId::kPowerSgd; }

  // Segments end on layer boundaries so no matrix is split.
  std::vector<std::pair<size_t, size_t>> segments(size_t n, size_t max_elements) const override {
    std::vector<std::pair<size_t, size_t>> out;
    size_t begin = 0;
    for (const auto& v : layout_) {
      const size_t end = v.offset + v.size;
      if (end > n) break;
      if (end - begin > max_elements && v.offset > begin) {
        out.emplace_back(begin, v.offset - begin);
        begin = v.offset;
      }
    }
    if (n > begin || out.empty()) out.emplace_back(begin, n - begin);
    return out;
  }

  void encode(const float* x, size_t n, size_t offset, std::vector<uint8_t>& out, CodecParams& p) override {
    const std::vector<Matrix> mats = powersgd_matrices(layout_, offset, n, r_);
    size_t bytes = 0, covered = 0;
    for (const auto& m : mats) {
      bytes += (m.rows + m.cols) * rank_of(r_, m) * 4;
      covered += m.rows * m.cols;
    }
    out.resize(bytes + (n - covered) * 4);
    float* w = reinterpret_cast<float*>(out.data());
    size_t raw_from = 0;
    std::vector<float> raw;
    raw.reserve(n - covered);
    for (const auto& m : mats) {
      raw.insert(raw.end(), x + raw_from, x + m.start);
      raw_from = m.start + m.rows * m.cols;
      const size_t r = rank_of(r_, m);
      float* P = w;
      float* Q = w + m.rows * r;
      std::vector<float>& warm = warm_[{offset + m.start, r}];
      if (warm.size() != m.cols * r) {
        warm.resize(m.cols * r);
        for (auto& q : warm) q = static_cast<float>(rng_.normal());
      }
      const float* M = x + m.start;
      const int rows = static_cast<int>(m.rows), cols = static_cast<int>(m.cols), ri = static_cast<int>(r);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, ri, cols, 1.0f, M, cols, warm.data(), ri, 0.0f, P, ri);
      orthonormalize(P, m.rows, r);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, ri, rows, 1.0f, M, cols, P, ri, 0.0f, Q, ri);
      // A non-finite M (a diverged model) leaves NaN in Q; the next warm start begins afresh.
      bool finite_q = true;
      for (size_t i = 0; i < m.cols * r; ++i) finite_q = finite_q && std::isfinite(Q[i]);
      if (finite_q) {
        std::copy(Q, Q + m.cols * r, warm.begin());
      } else {
        warm.clear();
      }
      w += (m.rows + m.cols) * r;
    }
    raw.insert(raw.end(), x + raw_from, x + n);
    std::copy(raw.begin(), raw.end(), w);
    powersgd_params(r_, mats, p);
  }

 private:
  size_t r_;
  std::vector<ParamView> layout_;
  Rng rng_;
  std::map<std::pair<size_t, size_t>, std::vector<float>> warm_;  // (tensor offset, rank) -> Q
};

bool whole(double v, double lo, double hi) { return v >= lo && v <= hi && v == std::floor(v); }

}  // namespace

std::vector<Matrix> powersgd_matrices(const std::vector<ParamView>& layout, size_t offset, size_t n, size_t r) {
  std::vector<Matrix> mats;
  for (const auto& v : layout) {
    if (v.shape.size() != 2 || v.offset < offset || v.offset + v.size > offset + n) continue;
    const Matrix m{v.offset - offset, static_cast<size_t>(v.shape[0]), static_cast<size_t>(v.shape[1])};
    if (m.rows * m.cols != v.size) continue;
    const size_t k = rank_of(r, m);
    if ((m.rows + m.cols) * k < m.rows * m.cols) mats.push_back(m);
  }
  return mats;
}

void powersgd_params(size_t r, const std::vector<Matrix>& mats, CodecParams& p) {
  begin_params(p, CodecId::kPowerSgd).add_values(static_cast<double>(r));
  p.add_values(static_cast<double>(mats.size()));
  for (const auto& m : mats) {
    p.add_values(static_cast<double>(m.start));
    p.add_values(static_cast<double>(m.rows));
    p.add_values(static_cast<double>(m.cols));
  }
}

std::vector<Matrix> powersgd_matrices_of(const CodecParams& p) {
  std::vector<Matrix> mats;
  for (int i = 2; i + 2 < p.values_size(); i += 3) {
    mats.push_back({static_cast<size_t>(p.values(i)), static_cast<size_t>(p.values(i + 1)), static_cast<size_t>(p.values(i + 2))});
  }
  return mats;
}

void orthonormalize(float* p, size_t rows, size_t r) {
  for (size_t c = 0; c < r; ++c) {
    for (size_t prev = 0; prev < c; ++prev) {
      double dot = 0;
      for (size_t i = 0; i < rows; ++i) dot += static_cast<double>(p[i * r + c]) * p[i * r + prev];
      for (size_t i = 0; i < rows; ++i) p[i * r + c] -= static_cast<float>(dot) * p[i * r + prev];
    }
    double norm = 0;
    for (size_t i = 0; i < rows; ++i) norm += static_cast<double>(p[i * r + c]) * p[i * r + c];
    norm = std::sqrt(norm);
    const float inv = norm > 1e-20 && std::isfinite(norm) ? static_cast<float>(1.0 / norm) : 0.0f;
    for (size_t i = 0; i < rows; ++i) p[i * r + c] *= inv;
  }
}

std::unique_ptr<Codec> make_powersgd(int rank, std::vector<ParamView> layout, uint64_t seed) {
  return std::make_unique<PowerSgdCodec>(rank, std::move(layout), seed);
}

std::string decode_powersgd(const CodecParams& prm, const uint8_t* p, size_t bytes, float scale, float* y, size_t n) {
  constexpr CodecId id = CodecId::kPowerSgd;
  if (auto e = check_values(id, prm, 2); !e.empty()) return e;
  if (!whole(prm.values(0), 1, 256)) return fault(id, "rank " + std::to_string(prm.values(0)) + " is not an integer in [1, 256]");
  const size_t r = static_cast<size_t>(prm.values(0));
  const double count = prm.values(1);
  if (!whole(count, 0, 1e9) || prm.values_size() != 2 + 3 * static_cast<int64_t>(count)) {
    return fault(id, "matrix count " + std::to_string(count) + " does not match the " + std::to_string(prm.values_size()) + " parameter values");
  }
  const double dn = static_cast<double>(n);
  std::vector<Matrix> mats;
  size_t end = 0, want = 0;
  for (int i = 0; i < static_cast<int>(count); ++i) {
    const double s = prm.values(2 + 3 * i), rows = prm.values(3 + 3 * i), cols = prm.values(4 + 3 * i);
    if (!whole(s, 0, dn) || !whole(rows, 1, dn) || !whole(cols, 1, dn) || rows * cols > dn - s) {
      return fault(id, "matrix " + std::to_string(i) + " does not fit the segment of " + std::to_string(n) + " elements");
    }
    const Matrix m{static_cast<size_t>(s), static_cast<size_t>(rows), static_cast<size_t>(cols)};
    if (m.start < end) return fault(id, "matrix " + std::to_string(i) + " overlaps the one before it");
    // Its factors, and the raw elements between the previous matrix and this one.
    want += ((m.rows + m.cols) * rank_of(r, m) + (m.start - end)) * 4;
    end = m.start + m.rows * m.cols;
    mats.push_back(m);
  }
  want += (n - end) * 4;
  if (bytes != want || y == nullptr) return bytes != want ? fault(id, "payload of " + std::to_string(bytes) + " bytes; its matrices need " + std::to_string(want)) : std::string();
  const float* w = reinterpret_cast<const float*>(p);
  const float* raw = w;
  for (const auto& m : mats) raw += (m.rows + m.cols) * rank_of(r, m);
  size_t from = 0;
  for (const auto& m : mats) {
    for (size_t i = from; i < m.start; ++i) y[i] += scale * *raw++;
    from = m.start + m.rows * m.cols;
    const size_t k = rank_of(r, m);
    const int rows = static_cast<int>(m.rows), cols = static_cast<int>(m.cols), ki = static_cast<int>(k);
    // y_M += scale * P Q^T, straight into the destination.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, ki, scale, w, ki, w + m.rows * k, ki, 1.0f, y + m.start, cols);
    w += (m.rows + m.cols) * k;
  }
  for (size_t i = from; i < n; ++i) y[i] += scale * *raw++;
  return {};
}

}  // namespace hearsay::codec

namespace hearsay {

std::vector<PowerSgdMatrix> powersgd_layout(const std::vector<ParamView>& layout, size_t n, size_t r) {
  std::vector<PowerSgdMatrix> out;
  for (const auto& m : codec::powersgd_matrices(layout, 0, n, r)) out.push_back({m.start, m.rows, m.cols, codec::rank_of(r, m)});
  return out;
}

void powersgd_project(const float* m, const PowerSgdMatrix& s, const float* q, float* p) {
  const int rows = static_cast<int>(s.rows), cols = static_cast<int>(s.cols), r = static_cast<int>(s.rank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, cols, 1.0f, m, cols, q, r, 0.0f, p, r);
}

void powersgd_back_project(const float* m, const PowerSgdMatrix& s, const float* p, float* q) {
  const int rows = static_cast<int>(s.rows), cols = static_cast<int>(s.cols), r = static_cast<int>(s.rank);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols, r, rows, 1.0f, m, cols, p, r, 0.0f, q, r);
}

void powersgd_orthonormalize(float* p, const PowerSgdMatrix& s) { codec::orthonormalize(p, s.rows, s.rank); }

void powersgd_product(const float* p, const float* q, const PowerSgdMatrix& s, float alpha, float beta, float* out) {
  const int rows = static_cast<int>(s.rows), cols = static_cast<int>(s.cols), r = static_cast<int>(s.rank);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, r, alpha, p, r, q, r, beta, out, cols);
}

}  // namespace hearsay
