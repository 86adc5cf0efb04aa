// What a hearsay program sets up about its own process.
#pragma once

#include <exception>
#include <string>

namespace hearsay {

// Ends the process at once (no exit handlers, whose locks another thread may hold) with
// "hearsay: WHAT failed: WHY; exiting" on stderr, and exit status 1.
[[noreturn]] void die_in_thread(const char* what, const char* why) noexcept;

// The body of a thread a transport runs: what it throws (std::bad_alloc when the process
// is out of memory) ends the process with a message naming the thread, never a
// std::terminate from a thread nobody joins, and never a process left hanging with its
// ports bound.
template <class Body>
void run_thread(const char* what, Body&& body) noexcept {
  try {
    body();
  } catch (const std::exception& e) {
    die_in_thread(what, e.what());
  } catch (...) {
    die_in_thread(what, "an exception of unknown type");
  }
}

// Every neighbour costs a descriptor or two (and a simulated peer's log one), and so does
// each connection a stranger opens until the tcp transport's caps close it: takes what
// the hard limit allows. Silent where the limit cannot be read or raised.
void raise_descriptor_limit();

// The name messages on stderr begin with ("NAME: ..."): the program the user ran.
// hearsay-peer by default; a torch peer's is its script's (hearsay.torch sets it), so
// what a user's script prints is not said to come from a program they did not run.
std::string program_name();
void set_program_name(std::string name);

}  // namespace hearsay
