// The event log's schema: every kind of event a peer writes, its fields, their types and
// what they mean. The one list is the data file event_schema.json, which the build embeds
// and this reads; EventLog::write checks each event against it and
// tests/log/logs_doc_test.cpp checks that docs/LOGS.md documents exactly it. A new event
// or field is added there first (and then to docs/LOGS.md, which the test tells you).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hearsay {

class JsonObject;

namespace log_schema {

enum class Type {
  kInteger,  // a JSON integer: counts, steps, bytes
  kNumber,   // any JSON number, or null where the value was not finite
  kString,
  kBoolean,
  kStringArray,  // an array of strings
  kIntegerArray,
  kNumberArray,
  kMap,          // an object keyed by names known only at run time (neighbours, reasons)
};

struct Field {
  std::string name;
  Type type = Type::kNumber;
  bool required = true;  // false: only in some events of its kind; `meaning` says when
  std::string meaning;   // Markdown, as docs/LOGS.md shows it
  // kMap only: what the keys name, and the type of each value: a scalar type, or an
  // object with `members` when `members` is not empty.
  std::string key_is;
  Type value_type = Type::kNumber;
  std::vector<Field> members;
};

struct Event {
  std::string name;
  std::vector<Field> fields;  // beyond the common ones
};

// `t`, `peer` and `event`: in every event, first.
const std::vector<Field>& common_fields();
// Every event, in the order docs/LOGS.md gives them.
const std::vector<Event>& events();
// Null when no event has that name.
const Event* find_event(std::string_view name);

// How docs/LOGS.md writes a field's type: "integer", "number, optional",
// "object: neighbour → integer", "object: neighbour → object" (members listed as
// `name.*.member`).
std::string type_text(const Field& field);

// Why `event` does not follow the schema (which field, what was expected, what it is), or
// empty when it does.
std::string problem(const JsonObject& event);

}  // namespace log_schema
}  // namespace hearsay
