#include <cerrno>
#include <cstring>
#include <filesystem>

#include "event_schema.h"
#include "hearsay/error.h"
#include "hearsay/log.h"

namespace hearsay {

EventLog::EventLog(const std::string& path, std::string peer, const Clock* clock)
    : path_(path), peer_(std::move(peer)), start_(std::chrono::steady_clock::now()), clock_(clock),
      clock_start_(clock != nullptr ? clock->now() : 0.0) {
  if (path_.empty()) return;
  const auto parent = std::filesystem::path(path_).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr)
    throw InputError(path_ + ": cannot open log for writing: " + std::strerror(errno));
}

EventLog::~EventLog() {
  if (file_ != nullptr) std::fclose(file_);
}

double EventLog::elapsed() const {
  if (clock_ != nullptr) return clock_->now() - clock_start_;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

JsonObject EventLog::event(const std::string& name) const {
  JsonObject o;
  o.add("t", elapsed()).add("peer", peer_).add("event", name);
  return o;
}

void EventLog::write(const JsonObject& event) {
  // Checked before the early return: tests mostly log nowhere, and must still catch an
  // event that readers of real logs would not understand.
  const std::string problem = log_schema::problem(event);
  HEARSAY_CHECK(problem.empty(), problem);
  if (file_ == nullptr) return;
  const std::string line = event.str() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace hearsay
