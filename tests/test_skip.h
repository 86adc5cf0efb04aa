// A test that cannot run on this machine (no GPU) must be reported as skipped, never as
// passed. ctest runs every doctest case as its own process (--test-case=NAME) and takes
// exit code kSkipCode as "skipped" (SKIP_RETURN_CODE, tests/CMakeLists.txt); a case run
// that way exits with it. Run among others, the case says why and returns, so the rest
// of the binary still runs.
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace hearsay::test {

inline constexpr int kSkipCode = 77;
extern bool g_one_case;  // set by tests/test_main.cpp

inline void skip(const std::string& why) {
  MESSAGE("skipped: " << why);
  std::printf("skipped: %s\n", why.c_str());
  if (g_one_case) {
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(kSkipCode);
  }
}

}  // namespace hearsay::test

#define HEARSAY_SKIP(why)          \
  do {                             \
    ::hearsay::test::skip(why);    \
    return;                        \
  } while (0)
