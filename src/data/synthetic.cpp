#include "hearsay/data.h"
#include "hearsay/error.h"
#include "hearsay/rng.h"

namespace hearsay {
namespace {

void fill(Dataset& d, int64_t n, const std::vector<float>& means, Rng& rng) {
  const int dim = d.channels;
  d.size = n;
  d.features.resize(static_cast<size_t>(n) * dim);
  d.labels.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const int label = static_cast<int>(rng.below(d.num_classes));
    d.labels[i] = label;
    for (int j = 0; j < dim; ++j) {
      d.features[i * dim + j] = means[static_cast<size_t>(label) * dim + j] + static_cast<float>(rng.normal());
    }
  }
}

}  // namespace

TrainTest make_synthetic(int64_t train_size, int64_t test_size, int dim, int num_classes,
                         float separation, uint64_t seed) {
  if (train_size < 1 || test_size < 1 || dim < 1 || num_classes < 2 || train_size * dim > (int64_t{1} << 31)) {
    throw InputError("synthetic data: need train_size, test_size, dim >= 1, num_classes >= 2 and at most 2^31 cells");
  }
  Rng rng(seed, 7);
  std::vector<float> means(static_cast<size_t>(num_classes) * dim);
  for (auto& m : means) m = separation * static_cast<float>(rng.normal());
  TrainTest tt;
  for (Dataset* d : {&tt.train, &tt.test}) {
    d->channels = dim;
    d->num_classes = num_classes;
  }
  tt.train.name = "synthetic/train";
  tt.test.name = "synthetic/test";
  fill(tt.train, train_size, means, rng);
  fill(tt.test, test_size, means, rng);
  return tt;
}

}  // namespace hearsay
