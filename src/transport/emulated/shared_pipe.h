// One emulated WAN pipe, shared by every flow that names it: the links between two sites
// are one pipe per direction, as a real WAN is, so an algorithm that uses more
// cross-site pairs does not get more cross-site bandwidth.
//
// The pipe is one number, the time its last reserved bit leaves, kept in POSIX shared
// memory so that peer processes on one machine (hearsay-run) share it as well as
// transports in one process. A frame of S bytes reserves [max(now, free), +8S/B).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "hearsay/emulated.h"

namespace hearsay {

class SharedPipe {
 public:
  // Opens (or creates) the pipe `name` within `scope` (a run: peers of one run share a
  // scope, runs never do). Throws std::runtime_error when shared memory is unavailable.
  static std::shared_ptr<SharedPipe> open(const std::string& scope, const std::string& name);
  ~SharedPipe();
  SharedPipe(const SharedPipe&) = delete;
  SharedPipe& operator=(const SharedPipe&) = delete;

  // Reserves `transmit_ns` of the pipe from `now_ns` (steady clock, nanoseconds) on;
  // returns when the frame's last bit leaves.
  int64_t reserve(int64_t now_ns, int64_t transmit_ns);
  const std::string& name() const { return name_; }

 private:
  struct State {
    std::atomic<int64_t> free_at_ns;
    std::atomic<int32_t> users;
  };
  static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
                "the pipe's state is shared between processes");
  SharedPipe(std::string name, std::string shm_name, State* state);

  std::string name_, shm_name_;
  State* state_;
};

}  // namespace hearsay
