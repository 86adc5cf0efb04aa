#include "hearsay/error.h"

#include <cstdio>
#include <cstdlib>

namespace hearsay {

void check_failed(const char* condition, const char* file, int line, const std::string& detail) {
  std::fprintf(stderr, "hearsay: internal error: %s failed at %s:%d%s%s\n", condition, file, line,
               detail.empty() ? "" : ": ", detail.c_str());
  std::abort();
}

}  // namespace hearsay
