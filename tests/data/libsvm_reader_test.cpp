#include <doctest/doctest.h>

#include "hearsay/data.h"
#include "hearsay/error.h"
#include "test_util.h"

using namespace hearsay;

TEST_CASE("libsvm: parses labels, sparse features, comments and blank lines") {
  test::TempDir dir;
  test::write_file(dir.file("a.txt"), "# header comment\n+1 1:0.5 3:2\n\n-1 2:-1.5e0  # trailing\n");
  const Dataset d = load_libsvm(dir.file("a.txt"));
  CHECK(d.size == 2);
  CHECK(d.dim() == 3);
  CHECK(d.num_classes == 2);
  CHECK(d.labels == std::vector<int32_t>{1, 0});
  CHECK(d.features == std::vector<float>{0.5f, 0, 2, 0, -1.5f, 0});
}

TEST_CASE("libsvm: a bad token names the file, line and column") {
  test::TempDir dir;
  test::write_file(dir.file("b.txt"), "1 1:0.5\n0 2:abc\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("b.txt")), doctest::Contains("b.txt:2:3: bad token '2:abc'"), InputError);
  test::write_file(dir.file("c.txt"), "x 1:1\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("c.txt")), doctest::Contains("c.txt:1:1: bad label 'x'"), InputError);
  test::write_file(dir.file("d.txt"), "1 3:1 2:1\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("d.txt")), doctest::Contains("d.txt:1:7: feature index 2 not greater"), InputError);
  test::write_file(dir.file("e.txt"), "1 0:1\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("e.txt")), doctest::Contains("must be >= 1"), InputError);
  test::write_file(dir.file("f.txt"), "1 1:nan\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("f.txt")), doctest::Contains("bad token"), InputError);
}

TEST_CASE("libsvm: features beyond the declared count, empty and missing files are rejected") {
  test::TempDir dir;
  test::write_file(dir.file("g.txt"), "1 5:1\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("g.txt"), 4), doctest::Contains("exceeds 4 features"), InputError);
  test::write_file(dir.file("empty.txt"), "\n# nothing\n");
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("empty.txt")), doctest::Contains("no samples"), InputError);
  CHECK_THROWS_WITH_AS(load_libsvm(dir.file("missing.txt")), doctest::Contains("missing.txt: cannot open"), InputError);
}
