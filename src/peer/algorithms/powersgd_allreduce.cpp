// PowerSGD all-reduce (Vogels, Karimireddy, Jaggi, NeurIPS 2019, Algorithm 1; PyTorch
// DDP's powerSGD_hook): per weight matrix M = g + e (error feedback),
//   P = M Q;  P <- all-reduce(P);  P <- orthonormal(P);  Q = M^T P;  e = M - P Q^T;
//   Q <- all-reduce(Q) / n;  the averaged gradient is P Q^T,
// with Q warm-started from the previous step's averaged Q (the same on every peer, so
// every peer orthonormalizes the same P and ends with the same product). Vectors
// (biases) and matrices too small to gain are all-reduced as they are, with the P sums.
#include "../algorithm.h"
#include "hearsay/codec.h"
#include "hearsay/rng.h"

namespace hearsay {

PowerSgdAllReduce::PowerSgdAllReduce(int rank) : rank_(static_cast<size_t>(rank)) {}

void PowerSgdAllReduce::plan(GossipEngine& e) {
  const size_t n = e.model().num_params();
  if (!mats_.empty() || !raw_.empty()) return;
  mats_ = powersgd_layout(e.model().param_views(), n, rank_);
  size_t from = 0;  // the matrices come in the layout's order, so the gaps are what is raw
  for (const auto& m : mats_) {
    if (m.start > from) raw_.emplace_back(from, m.start - from);
    from = m.start + m.rows * m.cols;
  }
  if (n > from) raw_.emplace_back(from, n - from);
}

std::vector<float> PowerSgdAllReduce::average(GossipEngine& e, std::vector<float> g, uint64_t round) {
  plan(e);
  const size_t n = g.size();
  const auto& mats = mats_;
  if (error_.size() != n) error_.assign(n, 0.0f);
  if (warm_.size() != mats.size()) {
    // The first Q: the same Gaussian on every peer (a fixed seed, not the peer's).
    warm_.clear();
    Rng rng(0x9047, 1);
    for (const auto& m : mats) {
      std::vector<float> q(m.cols * m.rank);
      for (auto& x : q) x = static_cast<float>(rng.normal());
      warm_.push_back(std::move(q));
    }
  }
  for (size_t i = 0; i < n; ++i) g[i] += error_[i];  // M = g + e, everywhere
  // First all-reduce: every P, then every element outside the matrices.
  std::vector<float> first;
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    const size_t at = first.size();
    first.resize(at + m.rows * m.rank);
    powersgd_project(g.data() + m.start, m, warm_[k].data(), first.data() + at);
  }
  const size_t p_total = first.size();
  for (const auto& [from, len] : raw_) first.insert(first.end(), g.begin() + static_cast<long>(from), g.begin() + static_cast<long>(from + len));
  first = allreduce_sum(e, MessageKind::kGradient, std::move(first), round, 0, false);
  const float inv = 1.0f / static_cast<float>(e.peers().size());
  std::vector<float> out(n);
  size_t at = p_total;
  for (const auto& [from, len] : raw_) {
    for (size_t i = from; i < from + len; ++i) out[i] = first[at++] * inv;
    std::fill(error_.begin() + static_cast<long>(from), error_.begin() + static_cast<long>(from + len), 0.0f);  // sent exactly
  }
  // Q = M^T P per matrix (P orthonormalized), the local error, then the second all-reduce.
  std::vector<float> second;
  size_t p_at = 0;
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    float* p = first.data() + p_at;
    powersgd_orthonormalize(p, m);
    std::vector<float>& q = warm_[k];
    const float* M = g.data() + m.start;
    powersgd_back_project(M, m, p, q.data());
    // e = M - P Q^T (this peer's own approximation).
    float* err = error_.data() + m.start;
    std::copy(M, M + m.rows * m.cols, err);
    powersgd_product(p, q.data(), m, -1.0f, 1.0f, err);
    second.insert(second.end(), q.begin(), q.end());
    p_at += m.rows * m.rank;
  }
  second = allreduce_sum(e, MessageKind::kGradient, std::move(second), round, kSecondPhase, false);
  p_at = 0;
  size_t q_at = 0;
  for (size_t k = 0; k < mats.size(); ++k) {
    const auto& m = mats[k];
    std::vector<float>& q = warm_[k];
    for (size_t i = 0; i < q.size(); ++i) q[i] = second[q_at + i] * inv;  // the mean Q: next step's start
    powersgd_product(first.data() + p_at, q.data(), m, 1.0f, 0.0f, out.data() + m.start);
    p_at += m.rows * m.rank;
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
  plan(e);
  const auto& mats = mats_;
  error_ = r.get_floats(e.model().num_params());
  const double count = r.get();
  if (count != static_cast<double>(mats.size())) {
    throw InputError("checkpoint: allreduce PowerSGD state holds " + std::to_string(count) + " matrices, this model and rank have " +
                     std::to_string(mats.size()));
  }
  warm_.clear();
  for (const auto& m : mats) warm_.push_back(r.get_floats(m.cols * m.rank));
}

}  // namespace hearsay
