// What hearsay's programs do alike around their own work: --help, --version and usage
// errors (exit 2, with the usage), and the exit status of what they ran (0 done, 2 bad
// input with "PROGRAM: error: ...", 1 anything else with "PROGRAM: failed: ...").
#pragma once

#include <cstdio>
#include <exception>
#include <string>

#include "hearsay/build_config.h"
#include "hearsay/command_line.h"
#include "hearsay/error.h"

namespace hearsay {

// Prints why and the usage to stderr; returns the exit status for it, 2.
inline int usage_error(const char* program, const char* usage, const std::string& why) {
  std::fprintf(stderr, "%s: %s\n%s", program, why.c_str(), usage);
  return 2;
}

// Parses argv with `cli` (which has --help and --version as stop options). Returns the
// exit status when the program is done already (help, version, a usage error), else -1.
inline int parse_program_args(const char* program, const char* usage, const CommandLine& cli, int argc, char** argv) {
  try {
    const std::string stopped_at = cli.parse(argc, argv);
    if (stopped_at == "--help") {
      std::fputs(usage, stdout);
      return 0;
    }
    if (stopped_at == "--version") {
      std::printf("%s %s\n", program, HEARSAY_VERSION);
      return 0;
    }
  } catch (const UsageError& e) {
    return usage_error(program, usage, e.what());
  }
  return -1;
}

// Runs `body` (returning its exit status) and turns what it throws into one.
template <class Body>
int run_reporting_errors(const char* program, Body&& body) {
  try {
    return body();
  } catch (const InputError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: failed: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace hearsay
