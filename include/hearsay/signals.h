// Signals are hearsay's own from the first line of a program's main (docs/OPERATIONS.md,
// "Stopping a peer"), whatever the libraries it loads did before main ran:
//  - SIGTERM and SIGINT end the process at once with the exit status a shell gives them
//    (128 + the signal: 143, 130), saying so on stderr; while a StopOnSignal lives (a
//    loop that polls stop_requested() at its step boundaries), they only ask for a stop,
//    and the program ends its run with its stop checkpoint and then that same status.
//  - Crash signals (SEGV, BUS, ILL, ABRT, FPE) take their default action: a core where the
//    system allows, and the signal's own exit status. No library's handler (libinfinipath
//    calls exit(1) from its own, and writes *.btr files into the working directory) stays.
#pragma once

#include <atomic>

namespace hearsay {

// Installs the handlers; `program` prefixes the line said when a signal ends the process.
void own_signals(const char* program);

// Whether SIGTERM or SIGINT arrived while a StopOnSignal lived (or was set by hand).
bool stop_requested();
// The flag itself, for code that takes a `const std::atomic<bool>*`.
const std::atomic<bool>* stop_flag();
// The signal that asked for the stop: SIGTERM, SIGINT, or 0 when none did.
int stop_signal();
// "SIGTERM", "SIGINT", or "signal N".
const char* stop_signal_name();
// The exit status a stop by that signal ends with: 128 + the signal (0 when none).
int stop_exit_status();

// While one lives, SIGTERM and SIGINT ask for a stop instead of ending the process. One
// at a time; not nested.
class StopOnSignal {
 public:
  StopOnSignal();
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;
};

}  // namespace hearsay
