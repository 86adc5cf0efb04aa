// The JSON objects the log is made of, the event log's file, and its check of every event
// against the schema (src/log/event_schema.json).
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <string>
#include <vector>

#include "../../src/log/event_schema.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "test_util.h"

using namespace hearsay;

namespace {

// A step event with every required field, as the peer writes it.
JsonObject step_event(const EventLog& log) {
  JsonObject e = log.event("step");
  e.add("step", 10).add("epoch", 0.5).add("loss", 0.25).add("lr", 0.1).add("samples_per_s", 1000.0).add("compute_utilisation", 0.75);
  return e;
}

}  // namespace

TEST_CASE("json: strings are escaped and non-finite numbers become null") {
  JsonObject o;
  o.add("s", std::string("a\"b\\c\n\x01"))
      .add("nan", std::nan(""))
      .add("inf", HUGE_VAL)
      .add("i", int64_t{-3})
      .add("b", true);
  CHECK(o.str() == R"({"s":"a\"b\\c\n\u0001","nan":null,"inf":null,"i":-3,"b":true})");
  CHECK(json_escape("tab\there \"q\"") == R"(tab\there \"q\")");
}

TEST_CASE("json: numbers read back as the values written, wall-clock seconds to the microsecond") {
  const double unix_time = 1712345678.123456;
  JsonObject o;
  o.add("unix_time", unix_time)
      .add("tiny", 1e-300)
      .add("lr", static_cast<double>(0.1f))
      .add("big", int64_t{1} << 53);
  const auto back = JsonObject::parse(o.str());
  REQUIRE(back.has_value());
  // A reader gets the very doubles the peer had: the old printf("%.9g") writer rounded
  // unix_time to 10 s, which misplaced peers' logs against each other.
  JsonObject again;
  again.add("unix_time", unix_time)
      .add("tiny", 1e-300)
      .add("lr", static_cast<double>(0.1f))
      .add("big", int64_t{1} << 53);
  CHECK(back->str() == again.str());
  CHECK(o.str().find("1712345678.123456") != std::string::npos);
  CHECK(o.str().find("\"big\":9007199254740992") != std::string::npos);
}

TEST_CASE("json: bytes that are not UTF-8 become U+FFFD and the line still parses") {
  JsonObject o;
  o.add("reason", std::string("frame error from \xff\xfe peer"));
  const std::string line = o.str();
  CHECK(line.find("\xef\xbf\xbd") != std::string::npos);  // U+FFFD in UTF-8
  CHECK(JsonObject::parse(line).has_value());
}

TEST_CASE("json: nested objects, arrays and parsed raw JSON keep their structure and order") {
  JsonObject link;
  link.add("connected", true).add("queue", 2);
  JsonObject o;
  o.add("z", 1).add("a", 2).add("link", link).add("names", std::vector<std::string>{"x", "y\""});
  o.add("objects", std::vector<JsonObject>{link, link}).add_raw("raw", R"({"k":[1,2.5,null]})");
  CHECK(
      o.str() ==
      R"({"z":1,"a":2,"link":{"connected":true,"queue":2},"names":["x","y\""],)"
      R"("objects":[{"connected":true,"queue":2},{"connected":true,"queue":2}],"raw":{"k":[1,2.5,null]}})");
  // A key added again keeps its place and takes the new value, as a reader keeps the last.
  o.add("z", "again");
  CHECK(o.str().rfind(R"({"z":"again","a":2,)", 0) == 0);
}

TEST_CASE("json: parse accepts one object and nothing else") {
  CHECK(JsonObject::parse(R"({"t":1})").has_value());
  CHECK_FALSE(JsonObject::parse("[1,2]").has_value());
  CHECK_FALSE(JsonObject::parse(R"({"t":1)").has_value());
  CHECK_FALSE(JsonObject::parse("").has_value());
}

TEST_CASE("event log: each event is one line with t, peer and event first") {
  test::TempDir dir;
  const std::string path = dir.file("sub/dir/log.jsonl");
  {
    EventLog log(path, "p0");
    log.write(step_event(log));
    log.write(log.event("join").add("from", "p1").add("their_step", 7));
  }
  const std::string text = test::read_file(path);
  REQUIRE(std::count(text.begin(), text.end(), '\n') == 2);
  CHECK(text.rfind("{\"t\":", 0) == 0);
  CHECK(
      text.find(
          R"("peer":"p0","event":"step","step":10,"epoch":0.5,"loss":0.25,"lr":0.1,"samples_per_s":1000.0,"compute_utilisation":0.75})") !=
      std::string::npos);
  CHECK(text.find(R"("peer":"p0","event":"join","from":"p1","their_step":7})") !=
        std::string::npos);
}

TEST_CASE("event log: an unwritable path is an input error naming it") {
  CHECK_THROWS_WITH_AS(EventLog("/proc/hearsay/nope.jsonl", "p"),
                       doctest::Contains("/proc/hearsay/nope.jsonl"), InputError);
}

TEST_CASE("event schema: an event that breaks it is named with the field and what was expected") {
  EventLog log("", "p0");
  CHECK(log_schema::problem(step_event(log)).empty());

  CHECK(log_schema::problem(log.event("stepp")) ==
        "event 'stepp' is not in the schema (src/log/event_schema.json)");
  CHECK(log_schema::problem(step_event(log).add("los", 1.0)) ==
        "event 'step': field 'los' is not in the schema (src/log/event_schema.json)");
  CHECK(log_schema::problem(log.event("step").add("step", 1)) ==
        "event 'step': required field 'epoch' is missing");
  CHECK(log_schema::problem(step_event(log).add("step", 1.5)) ==
        "event 'step': field 'step' is a number, the schema says integer");
  CHECK(log_schema::problem(step_event(log).add("loss", "low")) ==
        "event 'step': field 'loss' is a string, the schema says number");
  JsonObject no_event;
  no_event.add("t", 1.0);
  CHECK(log_schema::problem(no_event).find("without a string 'event'") != std::string::npos);
  // A number that was not finite is written as null, which every number field allows.
  CHECK(log_schema::problem(step_event(log).add("loss", std::nan(""))).empty());
}

TEST_CASE("event schema: optional fields may be left out, and nested fields are checked too") {
  EventLog log("", "p0");
  auto end = [&] {
    JsonObject e = log.event("end");
    e.add("steps", 40)
        .add("epoch", 1.0)
        .add("final_test_acc", 0.9)
        .add("final_test_loss", 0.3)
        .add("train_s", 2.0);
    e.add("samples_per_s", 500.0).add("bytes_sent", 0).add("compute_s", 1.5).add("compute_utilisation", 0.75);
    e.add_null("time_to_target_s");
    return e;
  };
  CHECK(log_schema::problem(end()).empty());
  CHECK(log_schema::problem(end().add("compute_overruns", 3).add("emulated_step_s", 0.02)).empty());

  auto gossip = [&](const JsonObject& link) {
    JsonObject links;
    links.add("b", link);
    JsonObject refused;
    refused.add("norm", 2);
    JsonObject e = log.event("gossip");
    for (const char* count : {"step", "clock", "bytes_sent", "bytes_received", "applied", "dropped",
                              "coalesced", "rejected", "buffered_bytes"}) {
      e.add(count, 0);
    }
    for (const char* number : {"tau_p50", "tau_p90", "tau_p99", "tau_max", "weight_mean"})
      e.add(number, 0.0);
    e.add("links", links).add("refused", refused).add("quarantined", std::vector<std::string>{"c"});
    return e;
  };
  JsonObject link;
  link.add("connected", true).add("bytes_sent", 1).add("bytes_received", 2).add("queue", 0);
  link.add("codec", "none").add("model_codec", "none");
  CHECK(log_schema::problem(gossip(link)).empty());
  JsonObject bad_link = link;
  bad_link.add("queue", "deep");
  CHECK(log_schema::problem(gossip(bad_link)) ==
        "event 'gossip': field 'links.b.queue' is a string, the schema says integer");
  JsonObject odd_link = link;
  odd_link.add("colour", "red");
  CHECK(log_schema::problem(gossip(odd_link)) ==
        "event 'gossip': field 'links.b.colour' is not in the schema (src/log/event_schema.json)");
  JsonObject short_link;
  short_link.add("connected", false);
  CHECK(log_schema::problem(gossip(short_link)) ==
        "event 'gossip': required field 'links.b.bytes_sent' is missing");
  CHECK(log_schema::problem(gossip(link).add("quarantined", std::vector<std::string>{})).empty());
  CHECK(log_schema::problem(gossip(link).add_raw("quarantined", "[1]")) ==
        "event 'gossip': field 'quarantined' is an array, the schema says array of strings");
  CHECK(log_schema::problem(gossip(link).add_raw("refused", R"({"norm":"two"})")) ==
        "event 'gossip': field 'refused.norm' is a string, the schema says integer");
}

TEST_CASE(
    "event log: writing an event that breaks the schema stops the process, naming the field") {
  int err[2];
  REQUIRE(::pipe(err) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child dies by the check's abort(), not by doctest's crash report of it.
    std::signal(SIGABRT, SIG_DFL);
    ::dup2(err[1], STDERR_FILENO);
    ::close(err[0]);
    EventLog log("", "p0");
    log.write(step_event(log).add("los", 1.0));
    ::_exit(0);  // not reached when the check works
  }
  ::close(err[1]);
  std::string text;
  char buf[512];
  for (ssize_t n; (n = ::read(err[0], buf, sizeof buf)) > 0;)
    text.append(buf, static_cast<size_t>(n));
  ::close(err[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
  CHECK(text.find("event 'step': field 'los' is not in the schema") != std::string::npos);
}

TEST_CASE("event schema: names are unique and every meaning fits a Markdown table cell") {
  std::vector<std::string> events;
  auto check_fields = [](const std::string& where, const std::vector<log_schema::Field>& fields,
                         auto& self) -> void {
    std::vector<std::string> names;
    for (const auto& f : fields) {
      INFO(where << "." << f.name);
      CHECK(!f.name.empty());
      CHECK(!f.meaning.empty());
      CHECK(f.meaning.find('|') == std::string::npos);
      CHECK(f.meaning.find('\n') == std::string::npos);
      CHECK(std::find(names.begin(), names.end(), f.name) == names.end());
      names.push_back(f.name);
      if (f.type == log_schema::Type::kMap) CHECK(!f.key_is.empty());
      if (!f.members.empty()) self(where + "." + f.name, f.members, self);
    }
  };
  check_fields("common", log_schema::common_fields(), check_fields);
  for (const auto& e : log_schema::events()) {
    CHECK(std::find(events.begin(), events.end(), e.name) == events.end());
    events.push_back(e.name);
    CHECK(log_schema::find_event(e.name) == &e);
    check_fields(e.name, e.fields, check_fields);
    for (const auto& f : e.fields) {
      for (const auto& c : log_schema::common_fields())
        CHECK_MESSAGE(f.name != c.name, e.name << " repeats " << c.name);
    }
  }
  CHECK(log_schema::find_event("no-such-event") == nullptr);
}
