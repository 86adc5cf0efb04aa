// Text as byte tokens (format TEXT): windows and their next-byte targets, the held-out
// validation slice, UTF-8 errors with their offset, documents by regex and the DOCUMENTS
// partition that keeps them whole.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>

#include "hearsay/data.h"
#include "hearsay/error.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::TempDir;

TEST_CASE("text: windows hold context bytes and their next bytes, and the validation slice is the held-out end") {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  test::write_file(dir.file("t.txt"), text);
  const TrainTest tt = load_text(dir.file("t.txt"), 8, 0.1, "");
  REQUIRE(tt.train.is_text());
  CHECK(tt.train.text.size() == 900);
  CHECK(tt.test.text.size() == 100);
  CHECK(tt.train.size == 900 - 8);  // a window at every offset with a next byte for its last
  CHECK(tt.test.size == (100 - 1) / 8);  // disjoint windows
  std::vector<int32_t> x(16), y(16);
  const int64_t idx[2] = {0, 891};
  gather_tokens(tt.train, idx, 2, x.data(), y.data());
  CHECK(x[0] == 'a');
  CHECK(y[0] == 'b');
  CHECK(x[7] == 'h');
  CHECK(y[7] == 'i');
  CHECK(x[8] == text[891]);
  CHECK(y[15] == text[899]);
  const int64_t v[1] = {1};
  gather_tokens(tt.test, v, 1, x.data(), y.data());
  CHECK(x[0] == text[908]);
  CHECK(y[7] == text[916]);
}

TEST_CASE("text: bytes that are not UTF-8 are an input error with their offset, as is a missing or too short file") {
  TempDir dir;
  std::string text(500, 'x');
  text[300] = static_cast<char>(0xC3);  // a lead byte without its continuation
  test::write_file(dir.file("bad.txt"), text);
  CHECK_THROWS_WITH_AS(load_text(dir.file("bad.txt"), 8, 0.1, ""), doctest::Contains("not UTF-8: byte 301"), InputError);
  text[300] = static_cast<char>(0xC0);  // an overlong form's lead byte
  test::write_file(dir.file("bad.txt"), text);
  CHECK_THROWS_WITH_AS(load_text(dir.file("bad.txt"), 8, 0.1, ""), doctest::Contains("byte 300 (0xc0)"), InputError);
  test::write_file(dir.file("ok.txt"), std::string(200, 'y') + "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80" + std::string(200, 'z'));
  CHECK(load_text(dir.file("ok.txt"), 8, 0.1, "").train.is_text());
  CHECK_THROWS_WITH_AS(load_text(dir.file("none.txt"), 8, 0.1, ""), doctest::Contains("none.txt: cannot open"), InputError);
  test::write_file(dir.file("short.txt"), std::string(50, 'x'));
  CHECK_THROWS_WITH_AS(load_text(dir.file("short.txt"), 8, 0.1, ""), doctest::Contains("too short"), InputError);
}

TEST_CASE("text: a document regex splits books, and partition DOCUMENTS gives each peer whole contiguous books") {
  TempDir dir;
  std::string text;
  const char* books[] = {"Ge", "Exo", "Lev", "Num", "Deu", "1Sm"};
  for (const char* book : books) {
    for (int v = 1; v <= 20; ++v) text += std::string(book) + "1:" + std::to_string(v) + " and it was so, verse text here\n";
  }
  test::write_file(dir.file("b.txt"), text);
  const TrainTest tt = load_text(dir.file("b.txt"), 16, 0.05, "^([0-9]?[A-Za-z]+)[0-9]+:");
  // The held-out 5% lies inside the last book; the first six starts are in the training part.
  REQUIRE(tt.train.document_starts.size() == 6);
  CHECK(tt.train.document_starts[0] == 0);
  CHECK(text.compare(tt.train.document_starts[1], 4, "Exo1") == 0);
  CHECK(text.compare(tt.train.document_starts[5], 4, "1Sm1") == 0);
  const auto shards = shard_indices(tt.train, 3, Partition::kDocuments, 0.5, 1);
  REQUIRE(shards.size() == 3);
  std::set<int64_t> seen;
  for (const auto& s : shards) {
    REQUIRE(!s.empty());
    CHECK(std::is_sorted(s.begin(), s.end()));
    CHECK(s.back() - s.front() + 1 == static_cast<int64_t>(s.size()));  // contiguous
    for (int64_t i : s) CHECK(seen.insert(i).second);                    // disjoint
  }
  // Each run starts where a book does: two books a peer.
  CHECK(shards[1].front() == tt.train.document_starts[2]);
  CHECK(shards[2].front() == tt.train.document_starts[4]);
  CHECK_THROWS_WITH_AS(shard_indices(tt.train, 7, Partition::kDocuments, 0.5, 1), doctest::Contains("6 documents"), InputError);
  CHECK_THROWS_WITH_AS(shard_indices(tt.train, 2, Partition::kDirichlet, 0.5, 1), doctest::Contains("use partition DOCUMENTS"),
                       InputError);
  CHECK_THROWS_WITH_AS(load_text(dir.file("b.txt"), 16, 0.05, "^[A-Z]"), doctest::Contains("no group"), InputError);
}
