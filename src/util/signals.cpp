#include "hearsay/signals.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace hearsay {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_polled{false};  // a StopOnSignal lives
const char* g_program = "hearsay";

// Async-signal-safe: write(2) of fixed text only.
void say(const char* text) {
  const ssize_t ignored = ::write(STDERR_FILENO, text, std::strlen(text));
  (void)ignored;
}

void on_stop_signal(int sig) {
  if (g_polled.load()) {
    int none = 0;
    g_signal.compare_exchange_strong(none, sig);
    g_stop.store(true);
    return;
  }
  // Nothing polls: nothing is learnt yet that a checkpoint would keep (a config being
  // read, a summary being printed), so end as the signal's default would, but say so.
  say(g_program);
  say(sig == SIGINT ? ": stopped by SIGINT\n" : ": stopped by SIGTERM\n");
  ::_exit(128 + sig);
}

}  // namespace

void own_signals(const char* program) {
  g_program = program;
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  sigemptyset(&stop.sa_mask);
  stop.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
  struct sigaction crash {};
  crash.sa_handler = SIG_DFL;
  sigemptyset(&crash.sa_mask);
  for (const int sig : {SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGFPE}) sigaction(sig, &crash, nullptr);
}

bool stop_requested() { return g_stop.load(); }
const std::atomic<bool>* stop_flag() { return &g_stop; }
int stop_signal() { return g_signal.load(); }

const char* stop_signal_name() {
  switch (g_signal.load()) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case 0: return "no signal";
    default: return "a signal";
  }
}

int stop_exit_status() {
  const int sig = g_signal.load();
  return sig == 0 ? 0 : 128 + sig;
}

StopOnSignal::StopOnSignal() { g_polled.store(true); }
StopOnSignal::~StopOnSignal() { g_polled.store(false); }

}  // namespace hearsay
