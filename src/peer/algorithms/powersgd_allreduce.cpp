// PowerSGD all-reduce (Vogels, Karimireddy, Jaggi, NeurIPS 2019, Algorithm 1; PyTorch
// DDP's powerSGD_hook): per weight matrix M = g + e (error feedback),
//   P = M Q;  P <- all-reduce(P);  P <- orthonormal(P);  Q = M^T P;  e = M - P Q^T;
//   Q <- all-reduce(Q) / n;  the averaged gradient is P Q^T,
// with Q warm-started from the previous step's averaged Q (the same on every peer, so
// every peer orthonormalizes the same P and ends with the same product). Vectors
// (biases) and matrices too small to gain are all-reduced as they are, with the P sums.
#include <cblas.h>

#include "../../codec/codec_impl.h"
#include "../algorithm.h"
#include "hearsay/rng.h"

namespace hearsay {

PowerSgdAllReduce::PowerSgdAllReduce(int rank) : rank_(static_cast<size_t>(rank)) {}

std::vector<float> PowerSgdAllReduce::average(GossipEngine& e, std::vector<float> g, uint64_t round) {
  const size_t n = g.size();
  const auto mats = codec::powersgd_matrices(e.model().param_views(), 0, n, rank_);
  if (error_.size() != n) error_.assign(n, 0.0f);
  if (warm_.size() != mats.size()) {
    // The first Q: the same Gaussian on every peer (a fixed seed, not the peer's).
    warm_.clear();
    Rng rng(0x9047, 1);
    for (const auto& m : mats) {
      std::vector<float> q(m.cols * codec::rank_of(rank_, m));
      for (auto& x : q) x = static_cast<float>(rng.normal());
      warm_.push_back(std::move(q));
    }
  }
  for (size_t i = 0; i < n; ++i) g[i] += error_[i];  // M = g + e, everywhere
  // First all-reduce: every P, then every element outside the matrices.
  std::vector<float> first;
  std::vector<bool> in_matrix(n, false);
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    const size_t r = codec::rank_of(rank_, m);
    std::vector<float> p(m.rows * r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m.rows), static_cast<int>(r), static_cast<int>(m.cols),
                1.0f, g.data() + m.start, static_cast<int>(m.cols), warm_[k].data(), static_cast<int>(r), 0.0f, p.data(),
                static_cast<int>(r));
    first.insert(first.end(), p.begin(), p.end());
    std::fill(in_matrix.begin() + static_cast<long>(m.start), in_matrix.begin() + static_cast<long>(m.start + m.rows * m.cols), true);
  }
  const size_t p_total = first.size();
  for (size_t i = 0; i < n; ++i) {
    if (!in_matrix[i]) first.push_back(g[i]);
  }
  first = allreduce_sum(e, std::move(first), round, 0, false);
  const float inv = 1.0f / static_cast<float>(e.peers().size());
  std::vector<float> out(n);
  size_t at = p_total;
  for (size_t i = 0; i < n; ++i) {
    if (!in_matrix[i]) {
      out[i] = first[at++] * inv;
      error_[i] = 0.0f;  // sent exactly
    }
  }
  // Q = M^T P per matrix (P orthonormalized), the local error, then the second all-reduce.
  std::vector<float> second;
  size_t p_at = 0;
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    const size_t r = codec::rank_of(rank_, m);
    float* p = first.data() + p_at;
    codec::orthonormalize(p, m.rows, r);
    std::vector<float>& q = warm_[k];
    const float* M = g.data() + m.start;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(m.cols), static_cast<int>(r), static_cast<int>(m.rows), 1.0f,
                M, static_cast<int>(m.cols), p, static_cast<int>(r), 0.0f, q.data(), static_cast<int>(r));
    // e = M - P Q^T (this peer's own approximation).
    float* err = error_.data() + m.start;
    std::copy(M, M + m.rows * m.cols, err);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m.rows), static_cast<int>(m.cols), static_cast<int>(r), -1.0f, p,
                static_cast<int>(r), q.data(), static_cast<int>(r), 1.0f, err, static_cast<int>(m.cols));
    second.insert(second.end(), q.begin(), q.end());
    p_at += m.rows * r;
  }
  second = allreduce_sum(e, std::move(second), round, kSecondPhase, false);
  p_at = 0;
  size_t q_at = 0;
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    const size_t r = codec::rank_of(rank_, m);
    std::vector<float>& q = warm_[k];
    for (size_t i = 0; i < q.size(); ++i) q[i] = second[q_at + i] * inv;  // the mean Q: next step's start
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m.rows), static_cast<int>(m.cols), static_cast<int>(r), 1.0f,
                first.data() + p_at, static_cast<int>(r), q.data(), static_cast<int>(r), 0.0f, out.data() + m.start,
                static_cast<int>(m.cols));
    p_at += m.rows * r;
    q_at += q.size();
  }
  return out;
}

std::string PowerSgdAllReduce::save() const {
  StateWriter w;
  w.put(error_);
  w.put(static_cast<double>(warm_.size()));
  for (const auto& q : warm_) w.put(q);
  return w.str();
}

void PowerSgdAllReduce::load(StateReader& r, GossipEngine& e) {
  const size_t n = e.model().num_params();
  error_ = r.get_floats(n);
  const auto mats = codec::powersgd_matrices(e.model().param_views(), 0, n, rank_);
  const double count = r.get();
  if (count != static_cast<double>(mats.size())) {
    throw InputError("checkpoint: allreduce PowerSGD state holds " + std::to_string(count) + " matrices, this model and rank have " +
                     std::to_string(mats.size()));
  }
  warm_.clear();
  for (const auto& m : mats) warm_.push_back(r.get_floats(m.cols * codec::rank_of(rank_, m)));
}

}  // namespace hearsay
