// IDX: a 4-byte magic (0, 0, type, dims), then dims big-endian uint32 sizes, then the
// data. zlib's gzread reads gzip and plain files alike.
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "hearsay/data.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

constexpr uint32_t kMaxItems = 100'000'000;
constexpr uint32_t kMaxDim = 1u << 14;
constexpr size_t kChunk = 1 << 20;

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      throw InputError(path + ": cannot open: " + std::strerror(errno));
    }
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) throw InputError(path + ": cannot open: " + std::strerror(errno));
    gzbuffer(file_, 1 << 17);
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to n bytes; returns how many. Corrupt compressed data is an error.
  size_t read_some(void* buf, size_t n) {
    const int got = gzread(file_, buf, static_cast<unsigned>(n));
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(file_, &code);
      throw InputError(path_ + ": corrupt data near byte offset " + std::to_string(offset_) + " (uncompressed): " + msg);
    }
    offset_ += static_cast<uint64_t>(got);
    return static_cast<size_t>(got);
  }

  void read_exact(void* buf, size_t n, const char* what) {
    const uint64_t start = offset_;
    const size_t got = read_some(buf, n);
    if (got != n) {
      throw InputError(path_ + ": truncated at byte offset " + std::to_string(start + got) + ": expected " +
                       std::to_string(n) + " bytes of " + what + ", file ended after " + std::to_string(got));
    }
  }

  uint32_t read_be32(const char* what) {
    unsigned char b[4];
    read_exact(b, 4, what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
  }

  uint64_t offset() const { return offset_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  gzFile file_ = nullptr;
  uint64_t offset_ = 0;
};

// Reads the header; returns the sizes of the expected number of dimensions.
std::vector<uint32_t> read_header(GzFile& f, int expected_dims) {
  unsigned char magic[4];
  f.read_exact(magic, 4, "IDX magic");
  if (magic[0] != 0 || magic[1] != 0) {
    throw InputError(f.path() + ": byte offset 0: wrong magic (not an IDX file: first two bytes must be zero)");
  }
  if (magic[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", magic[2]);
    throw InputError(f.path() + ": byte offset 2: IDX element type " + hex + " unsupported (only unsigned byte, 0x08)");
  }
  if (magic[3] != expected_dims) {
    throw InputError(f.path() + ": byte offset 3: IDX has " + std::to_string(magic[3]) + " dimensions, expected " +
                     std::to_string(expected_dims));
  }
  std::vector<uint32_t> dims;
  for (int i = 0; i < expected_dims; ++i) {
    const uint64_t at = f.offset();
    const uint32_t d = f.read_be32("IDX dimension");
    const uint32_t limit = i == 0 ? kMaxItems : kMaxDim;
    if (d == 0 || d > limit) {
      throw InputError(f.path() + ": byte offset " + std::to_string(at) + ": dimension " + std::to_string(i) + " = " +
                       std::to_string(d) + " outside [1, " + std::to_string(limit) + "]");
    }
    dims.push_back(d);
  }
  return dims;
}

// Reads exactly `total` payload bytes, growing the buffer only as data arrives, so a
// header that claims a huge size cannot make us allocate it up front.
std::vector<uint8_t> read_payload(GzFile& f, uint64_t total, const char* what) {
  std::vector<uint8_t> data;
  const uint64_t start = f.offset();
  while (data.size() < total) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, total - data.size()));
    const size_t old = data.size();
    data.resize(old + want);
    const size_t got = f.read_some(data.data() + old, want);
    data.resize(old + got);
    if (got < want) {
      throw InputError(f.path() + ": truncated at byte offset " + std::to_string(f.offset()) + ": header promises " +
                       std::to_string(total) + " bytes of " + what + " from offset " + std::to_string(start) +
                       ", file ended after " + std::to_string(data.size()));
    }
  }
  unsigned char extra;
  if (f.read_some(&extra, 1) != 0) {
    throw InputError(f.path() + ": byte offset " + std::to_string(f.offset() - 1) + ": unexpected trailing data after " +
                     std::to_string(total) + " bytes of " + what);
  }
  return data;
}

}  // namespace

Dataset load_idx(const std::string& images_path, const std::string& labels_path, int num_classes) {
  GzFile images(images_path);
  const auto idims = read_header(images, 3);
  GzFile labels(labels_path);
  const auto ldims = read_header(labels, 1);
  if (idims[0] != ldims[0]) {
    throw InputError(labels_path + ": byte offset 4: " + std::to_string(ldims[0]) + " labels but " + images_path +
                     " holds " + std::to_string(idims[0]) + " images");
  }
  const uint64_t n = idims[0];
  const uint64_t pixels = uint64_t{idims[1]} * idims[2];
  const auto raw_labels = read_payload(labels, n, "labels");
  Dataset d;
  d.size = static_cast<int64_t>(n);
  d.height = static_cast<int>(idims[1]);
  d.width = static_cast<int>(idims[2]);
  d.channels = 1;
  d.num_classes = num_classes;
  d.labels.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    if (raw_labels[i] >= num_classes) {
      throw InputError(labels_path + ": byte offset " + std::to_string(8 + i) + ": label " +
                       std::to_string(raw_labels[i]) + " outside [0, " + std::to_string(num_classes) + ")");
    }
    d.labels[i] = raw_labels[i];
  }
  const auto raw = read_payload(images, n * pixels, "pixels");
  d.features.resize(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) d.features[i] = raw[i] * (1.0f / 255.0f);
  return d;
}

TrainTest load_mnist_dir(const std::string& dir, const std::string& name) {
  auto pick = [&](const std::string& stem) {
    struct stat st;
    const std::string gz = dir + "/" + stem + ".gz";
    if (::stat(gz.c_str(), &st) == 0) return gz;
    const std::string plain = dir + "/" + stem;
    if (::stat(plain.c_str(), &st) == 0) return plain;
    throw InputError(name + ": missing dataset file " + gz + " (nor " + stem + " uncompressed)" +
                     (dir == kFashionMnistDir ? "; install it with: apt-get install dataset-fashion-mnist" : ""));
  };
  TrainTest tt;
  // Named one by one so a missing file is reported in a fixed order.
  const std::string train_images = pick("train-images-idx3-ubyte");
  const std::string train_labels = pick("train-labels-idx1-ubyte");
  const std::string test_images = pick("t10k-images-idx3-ubyte");
  const std::string test_labels = pick("t10k-labels-idx1-ubyte");
  tt.train = load_idx(train_images, train_labels);
  tt.test = load_idx(test_images, test_labels);
  // The model is shaped by the training images; test images of another shape would be
  // read as rows of the wrong layout (or past their end).
  if (tt.test.height != tt.train.height || tt.test.width != tt.train.width || tt.test.channels != tt.train.channels) {
    auto shape = [](const Dataset& d) {
      return std::to_string(d.height) + "x" + std::to_string(d.width) + (d.channels > 1 ? "x" + std::to_string(d.channels) : "");
    };
    throw InputError(test_images + ": images are " + shape(tt.test) + " but the training images of " + train_images +
                     " are " + shape(tt.train) + "; both must have one shape");
  }
  tt.train.name = name + "/train";
  tt.test.name = name + "/test";
  return tt;
}

}  // namespace hearsay
