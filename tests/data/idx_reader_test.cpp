#include <doctest/doctest.h>
#include <zlib.h>

#include "hearsay/data.h"
#include "hearsay/error.h"
#include "test_util.h"

using namespace hearsay;

namespace {

std::string be32(uint32_t v) {
  return {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
}

std::string idx_images(uint32_t n, uint32_t rows, uint32_t cols, size_t payload) {
  std::string s = std::string("\0\0\x08\x03", 4) + be32(n) + be32(rows) + be32(cols);
  for (size_t i = 0; i < payload; ++i) s += char(i % 256);
  return s;
}

std::string idx_labels(uint32_t n, const std::string& labels) {
  return std::string("\0\0\x08\x01", 4) + be32(n) + labels;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

}  // namespace

TEST_CASE("idx: reads gzip and plain files, scaling pixels to [0, 1]") {
  test::TempDir dir;
  write_gz(dir.file("img.gz"), idx_images(3, 2, 2, 12));
  test::write_file(dir.file("lab"), idx_labels(3, std::string("\x01\x00\x09", 3)));
  const Dataset d = load_idx(dir.file("img.gz"), dir.file("lab"));
  CHECK(d.size == 3);
  CHECK(d.height == 2);
  CHECK(d.width == 2);
  CHECK(d.labels == std::vector<int32_t>{1, 0, 9});
  CHECK(d.row(1)[0] == doctest::Approx(4 / 255.0));
  CHECK(d.row(2)[3] == doctest::Approx(11 / 255.0));
}

TEST_CASE("idx: the Fashion-MNIST files from Debian load with their documented sizes") {
  const TrainTest tt = load_mnist_dir(kFashionMnistDir, "fashion-mnist");
  CHECK(tt.train.size == 60000);
  CHECK(tt.test.size == 10000);
  CHECK(tt.train.dim() == 784);
  CHECK(tt.train.num_classes == 10);
}

TEST_CASE("idx: wrong magic is rejected at byte offset 0") {
  test::TempDir dir;
  test::write_file(dir.file("img"), "GIF89a....................");
  test::write_file(dir.file("lab"), idx_labels(1, "\x01"));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img"), dir.file("lab")), doctest::Contains("byte offset 0: wrong magic"), InputError);
}

TEST_CASE("idx: a truncated file names the offset where it ended") {
  test::TempDir dir;
  write_gz(dir.file("img.gz"), idx_images(3, 2, 2, 10));  // 12 bytes promised, 10 present
  test::write_file(dir.file("lab"), idx_labels(3, std::string("\x01\x00\x02", 3)));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img.gz"), dir.file("lab")), doctest::Contains("truncated at byte offset 26"), InputError);
}

TEST_CASE("idx: a header claiming a huge size fails on the short data without allocating it") {
  test::TempDir dir;
  // 100M images of 16384 x 16384 would be 2.6e16 bytes; the file has 4.
  test::write_file(dir.file("img"), idx_images(100'000'000, 16384, 16384, 4));
  std::string labels(16, '\0');
  test::write_file(dir.file("lab"), idx_labels(100'000'000, labels));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img"), dir.file("lab")), doctest::Contains("truncated"), InputError);
}

TEST_CASE("idx: dimensions out of range, mismatched counts and bad labels are rejected") {
  test::TempDir dir;
  test::write_file(dir.file("zero"), idx_images(0, 2, 2, 0));
  test::write_file(dir.file("lab1"), idx_labels(1, "\x01"));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("zero"), dir.file("lab1")), doctest::Contains("byte offset 4: dimension 0"), InputError);
  test::write_file(dir.file("img2"), idx_images(2, 1, 1, 2));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img2"), dir.file("lab1")), doctest::Contains("1 labels but"), InputError);
  test::write_file(dir.file("lab2"), idx_labels(2, std::string("\x01\x0c", 2)));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img2"), dir.file("lab2")), doctest::Contains("byte offset 9: label 12"), InputError);
  test::write_file(dir.file("lab3"), idx_labels(2, std::string("\x01\x02\x03", 3)));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("img2"), dir.file("lab3")), doctest::Contains("trailing data"), InputError);
}

TEST_CASE("idx: test images of another shape than the training images are refused, naming both files and shapes") {
  // 28x28 training images and 14x56 test images have as many pixels each: a CNN once took them.
  test::TempDir dir;
  write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_images(2, 28, 28, 2 * 28 * 28));
  write_gz(dir.file("train-labels-idx1-ubyte.gz"), idx_labels(2, std::string("\x01\x02", 2)));
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_images(1, 14, 56, 14 * 56));
  write_gz(dir.file("t10k-labels-idx1-ubyte.gz"), idx_labels(1, std::string("\x03", 1)));
  const std::string expect = dir.file("t10k-images-idx3-ubyte.gz") + ": images are 14x56 but the training images of " +
                             dir.file("train-images-idx3-ubyte.gz") + " are 28x28";
  CHECK_THROWS_WITH_AS(load_mnist_dir(dir.path(), "shapes"), doctest::Contains(expect.c_str()), InputError);
  write_gz(dir.file("t10k-images-idx3-ubyte.gz"), idx_images(1, 28, 28, 28 * 28));
  CHECK(load_mnist_dir(dir.path(), "shapes").test.height == 28);
}

TEST_CASE("idx: corrupt gzip data and missing files are input errors naming the file") {
  test::TempDir dir;
  std::string gz;
  write_gz(dir.file("ok.gz"), idx_images(50, 8, 8, 50 * 64));
  gz = test::read_file(dir.file("ok.gz"));
  for (size_t i = 20; i < gz.size() - 10; ++i) gz[i] = char(gz[i] ^ 0x5a);
  test::write_file(dir.file("bad.gz"), gz);
  test::write_file(dir.file("lab"), idx_labels(50, std::string(50, '\x01')));
  CHECK_THROWS_WITH_AS(load_idx(dir.file("bad.gz"), dir.file("lab")), doctest::Contains("bad.gz"), InputError);
  CHECK_THROWS_WITH_AS(load_idx(dir.file("none"), dir.file("lab")), doctest::Contains("none: cannot open"), InputError);
  CHECK_THROWS_WITH_AS(load_mnist_dir(dir.path(), "fmnist"), doctest::Contains("missing dataset file"), InputError);
}
