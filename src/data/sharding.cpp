#include <algorithm>
#include <cmath>
#include <numeric>

#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay {
namespace {

template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

// Contiguous runs of whole documents, cut where the running byte count first reaches
// each shard's equal share; a shard's windows are those that start inside its run.
std::vector<std::vector<int64_t>> document_shards(const Dataset& data, int num_shards) {
  if (!data.is_text()) throw InputError("sharding: partition DOCUMENTS needs text data (format TEXT)");
  const std::vector<int64_t>& starts = data.document_starts;
  const int64_t bytes = static_cast<int64_t>(data.text.size());
  if (static_cast<int64_t>(starts.size()) < num_shards) {
    throw InputError("sharding: " + std::to_string(num_shards) + " shards but the text has " +
                     std::to_string(starts.size()) + " documents (data.document_regex)");
  }
  std::vector<std::vector<int64_t>> shards(num_shards);
  size_t doc = 0;
  for (int s = 0; s < num_shards; ++s) {
    const int64_t begin = starts[doc];
    // Leave at least one document for each shard after this one.
    const size_t last_allowed = starts.size() - static_cast<size_t>(num_shards - s);
    const int64_t share = bytes * (s + 1) / num_shards;
    size_t next = doc + 1;
    while (next <= last_allowed && starts[next] < share) ++next;
    if (s + 1 == num_shards) next = starts.size();
    const int64_t end = next < starts.size() ? starts[next] : bytes;
    for (int64_t i = begin; i < std::min(end, data.size); ++i) shards[s].push_back(i);
    if (shards[s].empty()) {
      throw InputError("sharding: documents " + std::to_string(doc) + ".." + std::to_string(next - 1) +
                       " hold no whole window of the model's context");
    }
    doc = next;
  }
  return shards;
}

}  // namespace

std::vector<std::vector<int64_t>> shard_indices(const Dataset& data, int num_shards,
                                                Partition partition, double alpha, uint64_t seed) {
  if (num_shards < 1) throw InputError("sharding: num_shards must be >= 1, got " + std::to_string(num_shards));
  if (num_shards > data.size) {
    throw InputError("sharding: " + std::to_string(num_shards) + " shards but only " + std::to_string(data.size) + " samples");
  }
  Rng rng(seed, 11);
  std::vector<std::vector<int64_t>> shards(num_shards);
  if (partition == Partition::kDocuments) return document_shards(data, num_shards);
  if (data.is_text() && partition == Partition::kDirichlet) {
    throw InputError("sharding: text has no labels to skew with Dirichlet; use partition DOCUMENTS for non-IID text");
  }
  if (partition == Partition::kIid) {
    std::vector<int64_t> all(data.size);
    std::iota(all.begin(), all.end(), 0);
    shuffle(all, rng);
    for (int s = 0; s < num_shards; ++s) {
      const int64_t begin = data.size * s / num_shards, end = data.size * (s + 1) / num_shards;
      shards[s].assign(all.begin() + begin, all.begin() + end);
    }
    return shards;
  }
  if (!(alpha > 0.0) || !std::isfinite(alpha)) {
    throw InputError("sharding: dirichlet alpha must be a positive number, got " + std::to_string(alpha));
  }
  std::vector<std::vector<int64_t>> by_class(data.num_classes);
  for (int64_t i = 0; i < data.size; ++i) by_class[data.labels[i]].push_back(i);
  // Redraw (deterministically) until every peer has a sample; tiny alpha with many peers
  // can make that impossible, which is reported rather than looped on forever.
  for (int attempt = 0; attempt < 100; ++attempt) {
    for (auto& s : shards) s.clear();
    for (auto& members : by_class) {
      shuffle(members, rng);
      std::vector<double> p(num_shards);
      double total = 0;
      for (auto& x : p) total += (x = rng.gamma(alpha));
      size_t start = 0;
      double cum = 0;
      for (int s = 0; s < num_shards; ++s) {
        cum += p[s] / total;
        const size_t end = s + 1 == num_shards ? members.size() : std::min(members.size(), static_cast<size_t>(std::llround(cum * members.size())));
        shards[s].insert(shards[s].end(), members.begin() + start, members.begin() + std::max(start, end));
        start = std::max(start, end);
      }
    }
    if (std::all_of(shards.begin(), shards.end(), [](const auto& s) { return !s.empty(); })) {
      for (auto& s : shards) shuffle(s, rng);
      return shards;
    }
  }
  throw InputError("sharding: Dirichlet(alpha=" + std::to_string(alpha) + ") left a peer without data after 100 draws; raise alpha or use fewer peers");
}

BatchSampler::BatchSampler(std::vector<int64_t> indices, uint64_t seed) : indices_(std::move(indices)), seed_(seed) {
  if (indices_.empty()) throw InputError("sampler: empty shard");
  reshuffle();
}

void BatchSampler::reshuffle() {
  Rng rng(seed_, 100 + static_cast<uint64_t>(epoch_));
  shuffle(indices_, rng);
  pos_ = 0;
}

void BatchSampler::next(int batch, int64_t* out) {
  for (int i = 0; i < batch; ++i) {
    out[i] = indices_[pos_++];
    if (pos_ == indices_.size()) {
      ++epoch_;
      reshuffle();
    }
  }
}

void BatchSampler::restore(const State& s) {
  std::vector<int64_t> a = s.order, b = indices_;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  if (a != b) throw InputError("sampler state: its order is not a permutation of this peer's shard (another config or data?)");
  if (s.pos >= s.order.size() || s.epoch < 0) throw InputError("sampler state: position out of range");
  indices_ = s.order;
  epoch_ = s.epoch;
  pos_ = s.pos;
}

double BatchSampler::epochs_done() const {
  return static_cast<double>(epoch_) + static_cast<double>(pos_) / static_cast<double>(indices_.size());
}

void gather_batch(const Dataset& data, const int64_t* idx, int n, float* x, int32_t* y) {
  const size_t dim = static_cast<size_t>(data.dim());
  for (int i = 0; i < n; ++i) {
    std::copy_n(data.row(idx[i]), dim, x + i * dim);
    y[i] = data.labels[idx[i]];
  }
}

}  // namespace hearsay
