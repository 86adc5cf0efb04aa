// The event log (JSON Lines, one object per event) and the live progress display. Every
// event carries `t` (seconds since the log was opened), `peer` and `event`; what else it
// carries is fixed by the event schema (src/log/event_schema.json, documented in
// docs/LOGS.md), which EventLog::write enforces.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "hearsay/clock.h"

namespace hearsay {

// One JSON object, built field by field in the order the fields are added and rendered by
// nlohmann::json. Non-finite numbers become null (JSON has no NaN). Adding a key again
// replaces its value, which is what a JSON reader would keep of a repeated key. Strings
// are UTF-8; bytes that are not valid UTF-8 are written as U+FFFD, so a line always parses.
class JsonObject {
 public:
  JsonObject();
  ~JsonObject();
  JsonObject(const JsonObject& other);
  JsonObject& operator=(const JsonObject& other);
  JsonObject(JsonObject&& other) noexcept;
  JsonObject& operator=(JsonObject&& other) noexcept;

  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, bool value);
  // A nested object, and arrays of strings or of objects.
  JsonObject& add(const std::string& key, const JsonObject& value);
  JsonObject& add(const std::string& key, const std::vector<std::string>& values);
  JsonObject& add(const std::string& key, const std::vector<int64_t>& values);
  JsonObject& add(const std::string& key, const std::vector<double>& values);  // a value not finite: null
  JsonObject& add(const std::string& key, const std::vector<JsonObject>& values);
  JsonObject& add_null(const std::string& key);
  // Adds JSON text (an object or array rendered elsewhere). It is parsed, so the line stays
  // valid JSON; text that does not parse is a bug in the caller (HEARSAY_CHECK). Prefer
  // add(key, JsonObject) and the array overloads.
  JsonObject& add_raw(const std::string& key, const std::string& json);
  // The object on one line, without a line break.
  std::string str() const;
  // Reads one JSON object (a log line); nullopt when the text is not one.
  static std::optional<JsonObject> parse(const std::string& text);
  // The value itself, for code that reads it (the event schema's check).
  const nlohmann::ordered_json& json() const { return *value_; }

 private:
  std::unique_ptr<nlohmann::ordered_json> value_;  // never null, always an object
};

// `s` as the inside of a JSON string literal (quotes not included).
std::string json_escape(const std::string& s);

// Appends events to a JSON Lines file. Thread-safe; each event is one write and flushed,
// so a crashed peer's log is complete up to its last event.
class EventLog {
 public:
  // path empty: events are checked against the schema, not written. Throws InputError if
  // the file cannot be created (parent directories are created).
  // `clock` (null: real time) is what `t` counts on: the simulator's virtual clock for a
  // simulated peer. It must outlive the log.
  EventLog(const std::string& path, std::string peer, const Clock* clock = nullptr);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Seconds since construction.
  double elapsed() const;
  // Starts an event with t, peer and event filled in.
  JsonObject event(const std::string& name) const;
  // Appends the event as one line. An event that does not follow the schema (unknown
  // event, a field the schema lacks or of another type, a required field missing) is a
  // bug (HEARSAY_CHECK), also when the log writes nowhere, so that tests catch it.
  void write(const JsonObject& event);
  const std::string& peer() const { return peer_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string peer_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
  const Clock* clock_ = nullptr;
  double clock_start_ = 0;
};

// What the progress display shows.
struct ProgressState {
  int64_t step = 0;
  double epoch = 0;
  double loss = 0;
  double test_acc = -1;  // < 0: not evaluated yet
  double samples_per_s = 0;
  double eta_s = -1;     // < 0: unknown
};

// A live one-line display on a terminal ('\r' rewrites), or plain lines every
// `plain_every_s` seconds when the output is not a terminal.
class Progress {
 public:
  Progress(std::FILE* out, const std::string& label, double plain_every_s = 10.0);
  void update(const ProgressState& s, bool force = false);
  // Ends the live line.
  void finish(const ProgressState& s);
  bool is_tty() const { return tty_; }

 private:
  std::string render(const ProgressState& s) const;
  std::FILE* out_;
  std::string label_;
  bool tty_;
  double plain_every_s_;
  std::chrono::steady_clock::time_point last_;
  bool printed_ = false;
  std::string last_line_;  // the line printed last (plain output skips a repeat of it)
};

}  // namespace hearsay
