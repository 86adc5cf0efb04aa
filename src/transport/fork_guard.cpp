#include "fork_guard.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace hearsay {
namespace {

// A fixed table, no lock: the child-side handler runs in a process where only the forking
// thread survives, so it must not wait on anything another thread may have held. A slot
// names a socket by descriptor and inode; the handler closes a descriptor only if it is
// still that socket and still listening (the parent may have closed it and reused the
// number since), so a slot needs no removal. The newest listeners overwrite the oldest.
constexpr int kSlots = 64;
std::array<std::atomic<int>, kSlots> slot_fd_plus_one{};  // 0: empty
std::array<std::atomic<uint64_t>, kSlots> slot_inode{};
std::atomic<unsigned> next_slot{0};

void close_listeners_in_child() {
  for (int i = 0; i < kSlots; ++i) {
    const int fd = slot_fd_plus_one[i].load(std::memory_order_acquire) - 1;
    if (fd < 0) continue;
    struct stat st {};
    int listening = 0;
    socklen_t len = sizeof listening;
    if (::fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_ino) == slot_inode[i].load(std::memory_order_relaxed) &&
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0) {
      ::close(fd);
    }
  }
}

}  // namespace

void keep_listener_from_children(int fd) {
  static const int registered = ::pthread_atfork(nullptr, nullptr, close_listeners_in_child);
  (void)registered;
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) return;
  const unsigned i = next_slot.fetch_add(1) % kSlots;
  slot_fd_plus_one[i].store(0, std::memory_order_release);  // no half-written slot is read
  slot_inode[i].store(static_cast<uint64_t>(st.st_ino), std::memory_order_relaxed);
  slot_fd_plus_one[i].store(fd + 1, std::memory_order_release);
}

}  // namespace hearsay
