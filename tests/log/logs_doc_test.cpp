// docs/LOGS.md against the event schema (src/log/event_schema.json): its tables list
// exactly the schema's events and fields, with their types and meanings, and its example
// lines are events the schema accepts. On a difference the test prints the table the
// schema gives, to paste into LOGS.md.
//
// How LOGS.md is read: the table before the first `##` heading holds the fields every
// event has; a heading "## `NAME`" starts event NAME's section, and the rows of the form
// "| `FIELD` | TYPE | MEANING |" in it are that event's fields; any other `##` heading ends
// the events (a field row there is an error). Code lines starting with '{' under
// "## Example" are example events.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "../../src/log/event_schema.h"
#include "hearsay/log.h"
#include "test_util.h"

using namespace hearsay;

namespace {

struct Row {
  std::string name, type, meaning;
  bool operator==(const Row&) const = default;
};

// The rows the schema gives for `fields`: a map of objects is followed by its members,
// named `MAP.*.MEMBER`.
std::vector<Row> schema_rows(const std::vector<log_schema::Field>& fields) {
  std::vector<Row> rows;
  for (const auto& f : fields) {
    rows.push_back({f.name, log_schema::type_text(f), f.meaning});
    for (const auto& m : f.members)
      rows.push_back({f.name + ".*." + m.name, log_schema::type_text(m), m.meaning});
  }
  return rows;
}

std::string render(const std::vector<Row>& rows) {
  std::string out = "| field | type | meaning |\n|---|---|---|\n";
  for (const auto& r : rows) out += "| `" + r.name + "` | " + r.type + " | " + r.meaning + " |\n";
  return out;
}

struct Doc {
  std::vector<Row> common;
  std::map<std::string, std::vector<Row>> events;
  std::vector<std::string> examples;
  std::vector<std::string> problems;  // "LOGS.md:LINE: what"
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(' ');
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(' ') - b + 1);
}

Doc read_doc(const std::string& path) {
  Doc doc;
  std::ifstream in(path);
  REQUIRE_MESSAGE(in.good(), "cannot read " << path);
  enum class In { kCommon, kEvent, kExample, kOther } in_section = In::kCommon;
  std::vector<Row>* table = &doc.common;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string at = "LOGS.md:" + std::to_string(number) + ": ";
    if (line.rfind("## ", 0) == 0) {
      const std::string title = line.substr(3);
      const auto close = title.find('`', 1);
      if (title.size() > 2 && title[0] == '`' && close != std::string::npos) {
        const std::string name = title.substr(1, close - 1);
        if (doc.events.count(name) != 0)
          doc.problems.push_back(at + "event '" + name + "' has a second section");
        in_section = In::kEvent;
        table = &doc.events[name];
      } else {
        in_section = title == "Example" ? In::kExample : In::kOther;
        table = nullptr;
      }
      continue;
    }
    if (in_section == In::kExample && line.rfind("{", 0) == 0) {
      doc.examples.push_back(line);
      continue;
    }
    if (line.rfind("| `", 0) != 0) continue;
    // A field row: | `NAME` | TYPE | MEANING |
    std::vector<std::string> cells;
    std::string body = line.substr(1);
    if (!body.empty() && body.back() == '|') body.pop_back();
    for (size_t from = 0;;) {
      const size_t bar = body.find('|', from);
      cells.push_back(
          trim(body.substr(from, bar == std::string::npos ? std::string::npos : bar - from)));
      if (bar == std::string::npos) break;
      from = bar + 1;
    }
    if (table == nullptr) {
      doc.problems.push_back(at + "a field row outside an event's section");
      continue;
    }
    const std::string& name = cells[0];
    if (cells.size() != 3 || name.size() < 3 || name.back() != '`' ||
        name.find('`', 1) != name.size() - 1) {
      doc.problems.push_back(
          at + "a field row is | `NAME` | TYPE | MEANING |, one field per row: " + line);
      continue;
    }
    table->push_back({name.substr(1, name.size() - 2), cells[1], cells[2]});
  }
  return doc;
}

// What differs between `doc` and the schema, each with the table to put in LOGS.md.
std::vector<std::string> differences(const Doc& doc) {
  std::vector<std::string> out = doc.problems;
  const std::vector<Row> common = schema_rows(log_schema::common_fields());
  if (doc.common != common)
    out.push_back("the fields of every event: LOGS.md's first table should be\n" + render(common));
  for (const auto& e : log_schema::events()) {
    const std::vector<Row> want = schema_rows(e.fields);
    const auto found = doc.events.find(e.name);
    if (found == doc.events.end() || found->second != want) {
      out.push_back("event '" + e.name + "': LOGS.md should have a section \"## `" + e.name +
                    "`\" with the table\n" + render(want));
    }
  }
  for (const auto& [name, rows] : doc.events) {
    if (log_schema::find_event(name) == nullptr) {
      out.push_back("LOGS.md documents an event '" + name +
                    "' that src/log/event_schema.json does not have");
    }
  }
  return out;
}

// A LOGS.md written from the schema itself, for testing the check.
std::string doc_from_schema() {
  std::string text = "# Logs\n\n" + render(schema_rows(log_schema::common_fields()));
  for (const auto& e : log_schema::events())
    text += "\n## `" + e.name + "`\nWhen.\n\n" + render(schema_rows(e.fields));
  return text + "\n## Example\n```\n{\"t\":1}\n```\n";
}

Doc read_text(const std::string& text) {
  test::TempDir dir;
  test::write_file(dir.file("LOGS.md"), text);
  return read_doc(dir.file("LOGS.md"));
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE_MESSAGE(at != std::string::npos, from);
  return text.replace(at, from.size(), to);
}

const Doc& logs_md() {
  static const Doc doc = read_doc(std::string(HEARSAY_SOURCE_DIR) + "/docs/LOGS.md");
  return doc;
}

}  // namespace

TEST_CASE("docs: LOGS.md lists exactly the events and fields of the event schema") {
  for (const auto& d : differences(logs_md())) FAIL_CHECK(d);
}

TEST_CASE("docs: the example lines of LOGS.md are events the schema accepts") {
  const Doc& doc = logs_md();
  REQUIRE(!doc.examples.empty());
  for (const auto& line : doc.examples) {
    INFO(line);
    const auto event = JsonObject::parse(line);
    REQUIRE(event.has_value());
    CHECK(log_schema::problem(*event) == "");
  }
}

TEST_CASE(
    "docs: the LOGS.md check finds a missing field, an extra event, a changed type and a stray "
    "row") {
  const std::string exact = doc_from_schema();
  CHECK(differences(read_text(exact)).empty());
  CHECK(read_text(exact).examples == std::vector<std::string>{"{\"t\":1}"});

  const std::string lr_row = "| `lr` | number | learning rate of the last step |\n";
  auto only = [](const std::vector<std::string>& found, const std::string& what) {
    INFO(what);
    REQUIRE(found.size() == 1);
    CHECK(found[0].find(what) != std::string::npos);
  };
  only(differences(read_text(replaced(exact, lr_row, ""))),
       "event 'step': LOGS.md should have a section");
  only(differences(read_text(
           replaced(exact, lr_row, "| `lr` | integer | learning rate of the last step |\n"))),
       "event 'step'");
  only(differences(read_text(exact + "\n## `restart`\n| `why` | string | made up |\n")),
       "an event 'restart' that src/log/event_schema.json does not have");
  auto among = [](const std::vector<std::string>& found, const std::string& what) {
    for (const auto& f : found) {
      if (f.find(what) != std::string::npos) return true;
    }
    return false;
  };
  const auto renamed = differences(read_text(replaced(exact, "## `join`\n", "## Joining\n")));
  CHECK(among(renamed, "a field row outside an event's section"));
  CHECK(among(renamed, "event 'join': LOGS.md should have a section"));
  CHECK(among(
      differences(read_text(replaced(exact, lr_row, "| `lr`, `loss` | number | two at once |\n"))),
      "one field per row"));
  only(differences(read_text(replaced(exact, "| `t` | number", "| `t` | integer"))),
       "the fields of every event");
}
