// The event log (JSON Lines, one object per event; schema in docs/LOGS.md) and the live
// progress display. Every event carries `t` (seconds since the log was opened), `peer`
// and `event`; the rest depends on the event.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace hearsay {

// Builds one JSON object. Non-finite numbers become null (JSON has no NaN).
class JsonObject {
 public:
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, bool value);
  JsonObject& add_null(const std::string& key);
  // Adds pre-rendered JSON (an object or array) verbatim.
  JsonObject& add_raw(const std::string& key, const std::string& json);
  std::string str() const { return body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_ = "{";
};

std::string json_escape(const std::string& s);

// Appends events to a JSON Lines file. Thread-safe; each event is one write and flushed,
// so a crashed peer's log is complete up to its last event.
class EventLog {
 public:
  // path empty: events are only counted, not written. Throws InputError if the file
  // cannot be created (parent directories are created).
  EventLog(const std::string& path, std::string peer);
  ~EventLog();
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;

  // Seconds since construction.
  double elapsed() const;
  // Starts an event with t, peer and event filled in.
  JsonObject event(const std::string& name) const;
  void write(const JsonObject& event);
  const std::string& peer() const { return peer_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string peer_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;
  std::chrono::steady_clock::time_point start_;
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
};

}  // namespace hearsay
