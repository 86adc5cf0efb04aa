// Errors in hearsay come in two kinds (see docs/ARCHITECTURE.md, "Errors"):
//  - InputError: bad input or setup (a config field, a data file, a model shape). The
//    message says what is wrong and where (file and line:column, byte offset, or field).
//    Programs report it and exit with status 2.
//  - Broken invariants: HEARSAY_CHECK stops the process with the condition, file and line.
//    They are bugs, never the user's fault.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace hearsay {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& what) : std::runtime_error(what) {}
};

// A backend (device, driver, library) failed at run time; carries the call that failed.
class BackendError : public std::runtime_error {
 public:
  explicit BackendError(const std::string& what) : std::runtime_error(what) {}
};

// Text read off the network (a peer's name, a cluster id, a Bye's reason), made fit to put
// in a message or a log: at most 64 bytes, every byte outside printable ASCII as '?', and
// a longer one cut, saying how long it was. A stranger must not fill an operator's logs or
// write escape sequences to their terminal.
std::string wire_text(std::string_view s);

[[noreturn]] void check_failed(const char* condition, const char* file, int line,
                               const std::string& detail);

}  // namespace hearsay

#define HEARSAY_CHECK(cond, detail)                                         \
  do {                                                                      \
    if (!(cond)) ::hearsay::check_failed(#cond, __FILE__, __LINE__, detail); \
  } while (0)
