// Data: loaders (IDX as used by MNIST and Fashion-MNIST, LIBSVM text, a synthetic
// generator), sharding across peers (IID or Dirichlet over labels) and the minibatch
// sampler. Datasets live in host memory as dense fp32 rows; a peer gathers each minibatch
// and uploads it to its backend.
//
// Loaders throw InputError naming the file and the place: the byte offset (of the
// decompressed stream) for IDX, line:column for LIBSVM.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hearsay {

struct Dataset {
  std::string name;
  int64_t size = 0;     // number of samples
  int height = 1, width = 1, channels = 1;
  int num_classes = 0;
  std::vector<float> features;  // size * dim(), row-major (NHWC per sample)
  std::vector<int32_t> labels;  // size, each in [0, num_classes)

  // Text (format TEXT; features and labels stay empty): one stream of bytes, the tokens.
  // Sample i is the window of context + 1 bytes at offset i * stride: its first context
  // bytes are the input, each one's next byte the target. Training sets use stride 1
  // (windows at every offset), validation sets stride = context (disjoint windows).
  std::vector<uint8_t> text;
  int context = 0;  // > 0 marks a text data set
  int64_t stride = 1;
  // Where each document starts in `text` (ascending, the first 0): what non-IID shards
  // keep whole (Partition::kDocuments).
  std::vector<int64_t> document_starts;

  bool is_text() const { return context > 0; }
  int dim() const { return height * width * channels; }
  const float* row(int64_t i) const { return features.data() + i * dim(); }
};

struct TrainTest {
  Dataset train, test;
};

// Reads an IDX image file (type ubyte, 3 dims) and its IDX label file (1 dim), gzip or
// plain; pixels are scaled to [0, 1]. Never allocates more than the data actually read.
Dataset load_idx(const std::string& images_path, const std::string& labels_path, int num_classes = 10);

// Loads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir` (Fashion-MNIST's
// layout, as Debian's dataset-fashion-mnist installs it in kFashionMnistDir).
TrainTest load_mnist_dir(const std::string& dir, const std::string& name);
inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";

// LIBSVM text: "label index:value ..." with 1-based, increasing indices. Labels: -1 maps
// to class 0, other integer labels k >= 0 to class k. num_features 0 infers it from the
// file; num_classes 0 infers max label + 1.
Dataset load_libsvm(const std::string& path, int num_features = 0, int num_classes = 0);

// Gaussian blobs: one random mean per class (scaled by `separation`) plus unit noise.
// Deterministic in seed; train and test drawn from the same means.
TrainTest make_synthetic(int64_t train_size, int64_t test_size, int dim, int num_classes,
                         float separation, uint64_t seed);

// Any UTF-8 file as one token stream of bytes (format TEXT). The last validation_fraction
// of it is held out as the validation set (disjoint windows of `context`); the rest trains.
// document_regex (ECMAScript; may be empty) is tried on each line: its first group names
// the line's document, and a document starts where that name changes (lines it does not
// match stay in the document before them). A missing file, bytes that are not UTF-8 (with
// their offset), or a text too short for one window of each set is an InputError.
TrainTest load_text(const std::string& path, int context, double validation_fraction,
                    const std::string& document_regex);

// The windows `idx` of a text data set as model inputs x [n, context] and next-byte
// targets y [n, context].
void gather_tokens(const Dataset& data, const int64_t* idx, int n, int32_t* x, int32_t* y);

// kDocuments (text only): each peer trains on a contiguous run of whole documents, the
// runs as near equal in bytes as document boundaries allow (non-IID: peers see different
// books). kIid on text: window offsets dealt at random, as for any data set.
enum class Partition { kIid, kDirichlet, kDocuments };

// Splits the sample indices of `data` among num_shards peers. IID: a seeded permutation
// cut into near-equal parts. Dirichlet: each class's samples split by proportions drawn
// from Dirichlet(alpha) (small alpha: each peer sees few classes). Every shard gets at
// least one sample or InputError is thrown.
std::vector<std::vector<int64_t>> shard_indices(const Dataset& data, int num_shards,
                                                Partition partition, double alpha, uint64_t seed);

// Endless minibatches over a shard, reshuffled (deterministically) each epoch; a batch
// that crosses an epoch boundary continues into the next shuffle.
class BatchSampler {
 public:
  BatchSampler(std::vector<int64_t> indices, uint64_t seed);
  // Fills out[0..batch) with sample indices.
  void next(int batch, int64_t* out);
  int64_t epoch() const { return epoch_; }        // completed passes over the shard
  int64_t shard_size() const { return static_cast<int64_t>(indices_.size()); }
  double epochs_done() const;                      // fractional passes
  // Where the sampler is (for checkpoints): the epoch, the position in it, the epoch's order.
  struct State {
    int64_t epoch = 0;
    size_t pos = 0;
    std::vector<int64_t> order;
  };
  State state() const { return {epoch_, pos_, indices_}; }
  // Throws InputError when the state is not of this shard (another size or other samples).
  void restore(const State& s);

 private:
  void reshuffle();
  std::vector<int64_t> indices_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  size_t pos_ = 0;
};

// Copies the rows and labels of `idx` into x [n, dim] and y [n].
void gather_batch(const Dataset& data, const int64_t* idx, int n, float* x, int32_t* y);

}  // namespace hearsay
