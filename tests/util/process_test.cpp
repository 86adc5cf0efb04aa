// What a hearsay program sets up about its own process: a transport thread that throws
// (out of memory) ends the process with a message, and the signals are hearsay's.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <new>
#include <string>

#include "hearsay/process.h"
#include "hearsay/signals.h"

using namespace hearsay;

namespace {

// Runs `body` in a forked child with its stderr into a pipe; the child's exit status (or
// minus the signal that ended it) and what it said.
template <class Body>
std::pair<int, std::string> in_child(Body body) {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDERR_FILENO);
    ::close(fds[0]);
    body();
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string said;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) said.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int st = 0;
  ::waitpid(pid, &st, 0);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), said};
}

}  // namespace

TEST_CASE("process: a transport thread that runs out of memory ends the process with a message and status 1, never a hang") {
  const auto [status, said] = in_child([] { run_thread("the tcp transport's io thread", [] { throw std::bad_alloc(); }); });
  CHECK(status == 1);
  CHECK(said == "hearsay: the tcp transport's io thread failed: std::bad_alloc; exiting\n");
}

TEST_CASE("signals: SIGTERM ends a process that polls nothing at once with 143, saying so, while a stop is polled it only "
          "asks, and the crash signals keep their default") {
  const auto [at_once, said] = in_child([] {
    own_signals("prog");
    ::raise(SIGTERM);
    ::_exit(0);  // not reached
  });
  CHECK(at_once == 143);
  CHECK(said == "prog: stopped by SIGTERM\n");
  const auto [polled, said_polled] = in_child([] {
    own_signals("prog");
    const StopOnSignal polling;
    ::raise(SIGINT);
    ::_exit(stop_requested() && stop_signal() == SIGINT && stop_exit_status() == 130 ? 0 : 3);
  });
  CHECK(polled == 0);
  CHECK(said_polled.empty());
  const auto [crashed, said_crashed] = in_child([] {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // the default action without a core file here
    // A library's handler for SIGSEGV (libinfinipath's called exit(1)) is undone.
    std::signal(SIGSEGV, [](int) { ::_exit(1); });
    own_signals("prog");
    ::raise(SIGSEGV);
  });
  CHECK(crashed == -SIGSEGV);
  CHECK(said_crashed.empty());
}
