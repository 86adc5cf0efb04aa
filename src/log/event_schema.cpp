// The events a peer logs, read from event_schema.json, and the check of an event against
// them. The schema is data so that it is written once, in the notation docs/LOGS.md uses
// (tests/log/logs_doc_test.cpp compares the two), rather than as a call per field.
#include "event_schema.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "hearsay/error.h"
#include "hearsay/log.h"

namespace hearsay::log_schema {
namespace {

using Json = nlohmann::ordered_json;

// The text of event_schema.json. src/CMakeLists.txt writes it into this string literal
// when it configures, so the schema travels inside every program and an edit to the file
// rebuilds this one.
constexpr std::string_view kSchemaText =
#include "log/event_schema_json.inc"
    ;

// Each type with the name docs/LOGS.md gives it: type_name() writes it, and type_named()
// reads it back from event_schema.json.
constexpr std::pair<Type, const char*> kTypeNames[] = {
    {Type::kInteger, "integer"},
    {Type::kNumber, "number"},
    {Type::kString, "string"},
    {Type::kBoolean, "boolean"},
    {Type::kStringArray, "array of strings"},
    {Type::kIntegerArray, "array of integers"},
    {Type::kNumberArray, "array of numbers"},
    {Type::kMap, "object"},
};

const char* type_name(Type t) {
  for (const auto& [type, name] : kTypeNames) {
    if (type == t) return name;
  }
  return "?";
}

// The type named `name`. The file is part of the program, so a name it does not know is
// a bug (HEARSAY_CHECK), which the first event a test logs runs into.
Type type_named(const std::string& name, const std::string& field) {
  for (const auto& [type, known] : kTypeNames) {
    if (name == known) return type;
  }
  check_failed("a known type", __FILE__, __LINE__,
               "event_schema.json: field '" + field + "' has the unknown type '" + name + "'");
}

std::vector<Field> read_fields(const Json& object, const std::string& where);

// One field from its row, [TYPE, MEANING] or, for an object of objects, [TYPE, MEANING,
// {MEMBERS}]. TYPE is the text type_text() gives, read back: "integer", "number, optional",
// "object: neighbour → integer", so the file says a type the way docs/LOGS.md does.
Field read_field(const std::string& name, const Json& row) {
  HEARSAY_CHECK(row.is_array() && (row.size() == 2 || row.size() == 3) && row[0].is_string() &&
                    row[1].is_string(),
                "event_schema.json: field '" + name +
                    "' is not [TYPE, MEANING] or [TYPE, MEANING, {MEMBERS}]");
  Field f;
  f.name = name;
  f.meaning = row[1].get<std::string>();
  std::string type = row[0].get<std::string>();
  constexpr std::string_view kOptional = ", optional";
  if (type.ends_with(kOptional)) {
    f.required = false;
    type.resize(type.size() - kOptional.size());
  }
  constexpr std::string_view kMapPrefix = "object: ";
  constexpr std::string_view kArrow = " → ";
  if (type.starts_with(kMapPrefix)) {
    const auto arrow = type.find(kArrow);
    HEARSAY_CHECK(arrow != std::string::npos,
                  "event_schema.json: field '" + name + "' is not 'object: KEY → TYPE'");
    f.type = Type::kMap;
    f.key_is = type.substr(kMapPrefix.size(), arrow - kMapPrefix.size());
    f.value_type = type_named(type.substr(arrow + kArrow.size()), name);
  } else {
    f.type = type_named(type, name);
  }
  if (row.size() == 3) {
    // type_text() shows members only as "→ object", so they go with that type alone.
    HEARSAY_CHECK(
        f.type == Type::kMap && f.value_type == Type::kMap,
        "event_schema.json: field '" + name + "' has members but is not 'object: KEY → object'");
    f.members = read_fields(row[2], name);
  }
  return f;
}

// The fields of `object` in the file's order, which is the order docs/LOGS.md gives them.
std::vector<Field> read_fields(const Json& object, const std::string& where) {
  HEARSAY_CHECK(object.is_object(), "event_schema.json: '" + where + "' is not an object");
  std::vector<Field> fields;
  for (const auto& [name, row] : object.items()) fields.push_back(read_field(name, row));
  return fields;
}

// The parsed file; ordered_json keeps its order of events and fields.
const Json& schema_json() {
  static const Json json = [] {
    Json parsed;
    try {
      parsed = Json::parse(kSchemaText.begin(), kSchemaText.end());
    } catch (const Json::parse_error& e) {
      check_failed("event_schema.json parses", __FILE__, __LINE__, e.what());
    }
    HEARSAY_CHECK(parsed.contains("every event") && parsed.contains("events"),
                  "event_schema.json lacks 'every event' or 'events'");
    return parsed;
  }();
  return json;
}

// What a value is, for messages: "a string", "null", "an integer".
std::string what_it_is(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

bool scalar_fits(Type type, const Json& v) {
  switch (type) {
    case Type::kInteger:
      return v.is_number_integer();
    case Type::kNumber:
      return v.is_number() || v.is_null();  // null: not finite
    case Type::kString:
      return v.is_string();
    case Type::kBoolean:
      return v.is_boolean();
    case Type::kStringArray:
      if (!v.is_array()) return false;
      for (const auto& item : v) {
        if (!item.is_string()) return false;
      }
      return true;
    case Type::kIntegerArray:
    case Type::kNumberArray:
      if (!v.is_array()) return false;
      for (const auto& item : v) {
        if (!(type == Type::kIntegerArray ? item.is_number_integer() : item.is_number())) return false;
      }
      return true;
    case Type::kMap:
      return v.is_object();
  }
  return false;
}

std::string check_object(const Json& object, const std::vector<const std::vector<Field>*>& schemas,
                         const std::string& where, const std::string& prefix);

// `value` against `field`; `path` names it in messages ("links.b.queue").
std::string check_value(const Field& field, const Json& value, const std::string& where,
                        const std::string& path) {
  if (!scalar_fits(field.type, value)) {
    return where + ": field '" + path + "' is " + what_it_is(value) + ", the schema says " +
           type_text(field);
  }
  if (field.type != Type::kMap) return "";
  for (const auto& [key, item] : value.items()) {
    const std::string item_path = path + "." + key;
    if (!field.members.empty()) {
      if (!item.is_object())
        return where + ": field '" + item_path + "' is " + what_it_is(item) +
               ", the schema says object";
      const std::string p = check_object(item, {&field.members}, where, item_path + ".");
      if (!p.empty()) return p;
    } else if (!scalar_fits(field.value_type, item)) {
      return where + ": field '" + item_path + "' is " + what_it_is(item) + ", the schema says " +
             type_name(field.value_type);
    }
  }
  return "";
}

// Every key of `object` must be one of the fields of `schemas`, with the right type, and
// every required field must be there.
std::string check_object(const Json& object, const std::vector<const std::vector<Field>*>& schemas,
                         const std::string& where, const std::string& prefix) {
  for (const auto* fields : schemas) {
    for (const Field& f : *fields) {
      if (f.required && !object.contains(f.name))
        return where + ": required field '" + prefix + f.name + "' is missing";
    }
  }
  for (const auto& [key, value] : object.items()) {
    const Field* field = nullptr;
    for (const auto* fields : schemas) {
      for (const Field& f : *fields) {
        if (f.name == key) field = &f;
      }
    }
    if (field == nullptr) {
      return where + ": field '" + prefix + key +
             "' is not in the schema (src/log/event_schema.json)";
    }
    const std::string p = check_value(*field, value, where, prefix + key);
    if (!p.empty()) return p;
  }
  return "";
}

}  // namespace

const std::vector<Field>& common_fields() {
  static const std::vector<Field> fields =
      read_fields(schema_json().at("every event"), "every event");
  return fields;
}

const std::vector<Event>& events() {
  static const std::vector<Event> all = [] {
    const Json& events = schema_json().at("events");
    HEARSAY_CHECK(events.is_object(), "event_schema.json: 'events' is not an object");
    std::vector<Event> read;
    for (const auto& [name, fields] : events.items())
      read.push_back({name, read_fields(fields, name)});
    return read;
  }();
  return all;
}

const Event* find_event(std::string_view name) {
  for (const Event& e : events()) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string type_text(const Field& field) {
  std::string text = type_name(field.type);
  if (field.type == Type::kMap) {
    text += ": ";
    text += field.key_is;
    text += " → ";
    text += field.members.empty() ? type_name(field.value_type) : "object";
  }
  if (!field.required) text += ", optional";
  return text;
}

std::string problem(const JsonObject& event) {
  const Json& e = event.json();
  const auto name = e.find("event");
  if (name == e.end() || !name->is_string())
    return "an event without a string 'event' field: " + event.str().substr(0, 200);
  const Event* spec = find_event(name->get<std::string>());
  const std::string where = "event '" + name->get<std::string>() + "'";
  if (spec == nullptr) return where + " is not in the schema (src/log/event_schema.json)";
  return check_object(e, {&common_fields(), &spec->fields}, where, "");
}

}  // namespace hearsay::log_schema
