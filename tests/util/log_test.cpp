#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>

#include "hearsay/error.h"
#include "hearsay/log.h"
#include "test_util.h"

using namespace hearsay;

TEST_CASE("json: strings are escaped and non-finite numbers become null") {
  JsonObject o;
  o.add("s", std::string("a\"b\\c\n\x01")).add("nan", std::nan("")).add("i", int64_t{-3}).add("b", true);
  CHECK(o.str() == R"({"s":"a\"b\\c\n\u0001","nan":null,"i":-3,"b":true})");
}

TEST_CASE("event log: each event is one line with t, peer and event") {
  test::TempDir dir;
  const std::string path = dir.file("sub/dir/log.jsonl");
  {
    EventLog log(path, "p0");
    log.write(log.event("step").add("step", 1).add("loss", 0.5));
    log.write(log.event("eval").add("test_acc", 0.75));
  }
  const std::string text = test::read_file(path);
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 2);
  CHECK(text.find(R"("peer":"p0","event":"step","step":1,"loss":0.5})") != std::string::npos);
  CHECK(text.rfind("{\"t\":", 0) == 0);
}

TEST_CASE("event log: an unwritable path is an input error naming it") {
  CHECK_THROWS_WITH_AS(EventLog("/proc/hearsay/nope.jsonl", "p"), doctest::Contains("/proc/hearsay/nope.jsonl"), InputError);
}
