#include "shared_pipe.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace hearsay {
namespace {

// FNV-1a: shm names are short and may not hold '/' beyond the first character.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

std::string pipe_scope_of_this_run() {
  if (const char* id = std::getenv("HEARSAY_RUN_ID"); id != nullptr && *id != '\0') return std::string("run:") + id;
  return "ppid:" + std::to_string(getppid());
}

std::shared_ptr<SharedPipe> SharedPipe::open(const std::string& scope, const std::string& name) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "/hearsay-pipe-%016llx", static_cast<unsigned long long>(fnv1a(scope + '\0' + name)));
  const std::string shm_name = buf;
  const int fd = ::shm_open(shm_name.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) throw std::runtime_error("emulated link: shared pipe '" + name + "': shm_open " + shm_name + ": " + std::strerror(errno));
  // A new segment is zero-filled: free_at 0 (free), no users.
  if (::ftruncate(fd, sizeof(State)) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::runtime_error("emulated link: shared pipe '" + name + "': ftruncate: " + std::strerror(e));
  }
  void* p = ::mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  ::close(fd);
  if (p == MAP_FAILED) throw std::runtime_error("emulated link: shared pipe '" + name + "': mmap: " + std::strerror(e));
  auto* state = static_cast<State*>(p);
  state->users.fetch_add(1);
  return std::shared_ptr<SharedPipe>(new SharedPipe(name, shm_name, state));
}

SharedPipe::SharedPipe(std::string name, std::string shm_name, State* state)
    : name_(std::move(name)), shm_name_(std::move(shm_name)), state_(state) {}

SharedPipe::~SharedPipe() {
  // The last user removes the name; a user killed on the way leaves a 12-byte segment
  // that the next run of the same scope reuses (a past free_at is free).
  if (state_->users.fetch_sub(1) == 1) ::shm_unlink(shm_name_.c_str());
  ::munmap(state_, sizeof(State));
}

int64_t SharedPipe::reserve(int64_t now_ns, int64_t transmit_ns) {
  int64_t free_at = state_->free_at_ns.load();
  for (;;) {
    const int64_t leave = std::max(now_ns, free_at) + transmit_ns;
    if (state_->free_at_ns.compare_exchange_weak(free_at, leave)) return leave;
  }
}

}  // namespace hearsay
