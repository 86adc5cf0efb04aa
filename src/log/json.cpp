// JsonObject over nlohmann::ordered_json: insertion order keeps `t`, `peer` and `event`
// first on every line, as people reading a log expect.
#include <cmath>
#include <nlohmann/json.hpp>

#include "hearsay/error.h"
#include "hearsay/log.h"

namespace hearsay {
namespace {

using Json = nlohmann::ordered_json;

// Invalid UTF-8 (a remote address or an error text carrying stray bytes) is written as
// U+FFFD rather than thrown: a log line must never take the peer down.
std::string render(const Json& value) {
  return value.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

}  // namespace

JsonObject::JsonObject() : value_(std::make_unique<Json>(Json::object())) {}
JsonObject::~JsonObject() = default;
JsonObject::JsonObject(const JsonObject& other) : value_(std::make_unique<Json>(*other.value_)) {}
JsonObject& JsonObject::operator=(const JsonObject& other) {
  if (this != &other) *value_ = *other.value_;
  return *this;
}
// A moved-from object is never null: it can still be used.
JsonObject::JsonObject(JsonObject&& other) noexcept
    : value_(std::make_unique<Json>(Json::object())) {
  value_.swap(other.value_);
}
JsonObject& JsonObject::operator=(JsonObject&& other) noexcept {
  value_.swap(other.value_);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, double value) {
  (*value_)[key] = std::isfinite(value) ? Json(value) : Json(nullptr);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, int64_t value) {
  (*value_)[key] = value;
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const std::string& value) {
  (*value_)[key] = value;
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, bool value) {
  (*value_)[key] = value;
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const JsonObject& value) {
  (*value_)[key] = *value.value_;
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const std::vector<std::string>& values) {
  Json array = Json::array();
  for (const auto& v : values) array.push_back(v);
  (*value_)[key] = std::move(array);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const std::vector<int64_t>& values) {
  (*value_)[key] = Json(values);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const std::vector<double>& values) {
  Json array = Json::array();
  for (double v : values) array.push_back(std::isfinite(v) ? Json(v) : Json(nullptr));
  (*value_)[key] = std::move(array);
  return *this;
}

JsonObject& JsonObject::add(const std::string& key, const std::vector<JsonObject>& values) {
  Json array = Json::array();
  for (const auto& v : values) array.push_back(*v.value_);
  (*value_)[key] = std::move(array);
  return *this;
}

JsonObject& JsonObject::add_null(const std::string& key) {
  (*value_)[key] = nullptr;
  return *this;
}

JsonObject& JsonObject::add_raw(const std::string& key, const std::string& json) {
  Json parsed = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  HEARSAY_CHECK(!parsed.is_discarded(),
                "JSON for key '" + key + "' does not parse: " + json.substr(0, 200));
  (*value_)[key] = std::move(parsed);
  return *this;
}

std::string JsonObject::str() const { return render(*value_); }

std::optional<JsonObject> JsonObject::parse(const std::string& text) {
  Json parsed = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) return std::nullopt;
  JsonObject o;
  *o.value_ = std::move(parsed);
  return o;
}

std::string json_escape(const std::string& s) {
  const std::string quoted = render(Json(s));
  return quoted.substr(1, quoted.size() - 2);
}

}  // namespace hearsay
