#include "hearsay/error.h"

#include <cstdio>
#include <cstdlib>

namespace hearsay {

std::string wire_text(std::string_view s) {
  constexpr size_t kShown = 64;
  std::string out;
  for (const char c : s.substr(0, kShown)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
  if (s.size() > kShown) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

void check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "hearsay: internal error: %s failed at %s:%d%s%s\n", condition, file, line,
               detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

}  // namespace hearsay
