// The doctest main of every suite. It notes whether one test case was asked for by name
// (as ctest runs each case, --test-case=NAME), so that a case that cannot run here can
// exit with the code ctest reports as skipped (tests/test_skip.h).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <string>

#include "test_skip.h"

namespace hearsay::test {
bool g_one_case = false;
}  // namespace hearsay::test

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--test-case=", 0) == 0 || a.rfind("-tc=", 0) == 0) hearsay::test::g_one_case = true;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
