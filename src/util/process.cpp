#include "hearsay/process.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>

namespace hearsay {

namespace {
std::mutex program_name_mu;
std::string& program_name_held() {
  static std::string name = "hearsay-peer";
  return name;
}
}  // namespace

std::string program_name() {
  std::lock_guard<std::mutex> lock(program_name_mu);
  return program_name_held();
}

void set_program_name(std::string name) {
  std::lock_guard<std::mutex> lock(program_name_mu);
  if (!name.empty()) program_name_held() = std::move(name);
}

void raise_descriptor_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= r.rlim_max) return;
  r.rlim_cur = r.rlim_max;
  setrlimit(RLIMIT_NOFILE, &r);
}

void die_in_thread(const char* what, const char* why) noexcept {
  // Plain writes: the heap may be what ran out.
  for (const char* part : {"hearsay: ", what, " failed: ", why, "; exiting\n"}) {
    const ssize_t ignored = ::write(STDERR_FILENO, part, std::strlen(part));
    (void)ignored;
  }
  std::_Exit(1);
}

}  // namespace hearsay
