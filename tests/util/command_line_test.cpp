#include "hearsay/command_line.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace hearsay;

namespace {

// Parses `args` (no program name) with `cli`; returns what parse() returned.
std::string parse(const CommandLine& cli, std::vector<std::string> args) {
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  return cli.parse(static_cast<int>(argv.size()), argv.data(), 0);
}

}  // namespace

TEST_CASE("command line: options, flags and repeated options land where they were declared") {
  std::string config;
  std::vector<std::string> sets;
  bool quiet = false;
  int steps = 0;
  double seconds = 1;
  std::vector<int> batches{64};
  std::vector<size_t> sizes;
  std::vector<std::string> codecs{"none"};
  CommandLine cli;
  cli.text("--config", &config, "a file")
      .texts("--set", &sets, "a fragment")
      .flag("--quiet", &quiet)
      .integer("--steps", &steps, 1, 100, "a number of steps")
      .number("--seconds", &seconds, 0.5, 10, "a number of seconds")
      .integer_list("--batches", &batches, 1, 1024, "a list of batch sizes")
      .size_list("--sizes", &sizes, 1, size_t{1} << 40, "a list of sizes")
      .text_list("--codecs", &codecs, "a list of codecs");
  CHECK(parse(cli, {"--config", "c.textproto", "--set", "a { }", "--quiet", "--set", "--b",
                    "--steps", "7", "--seconds", "2.5", "--batches", "8,16", "--sizes",
                    "1099511627776", "--codecs", "topk:0.01,int8"}) == "");
  CHECK(config == "c.textproto");
  CHECK(sets == std::vector<std::string>{
                    "a { }", "--b"});  // a value is the next argument, whatever it looks like
  CHECK(quiet);
  CHECK(steps == 7);
  CHECK(seconds == 2.5);
  CHECK(batches == std::vector<int>{8, 16});
  CHECK(sizes == std::vector<size_t>{size_t{1} << 40});
  CHECK(codecs == std::vector<std::string>{"topk:0.01", "int8"});
  // Nothing given: the defaults stay.
  std::vector<int> untouched{64};
  CommandLine other;
  other.integer_list("--batches", &untouched, 1, 1024, "a list of batch sizes");
  CHECK(parse(other, {}) == "");
  CHECK(untouched == std::vector<int>{64});
}

TEST_CASE("command line: errors name the argument, the value and what it should be") {
  int steps = 0;
  double seconds = 1;
  std::string file;
  std::vector<int> batches;
  std::vector<std::string> codecs;
  CommandLine cli("step bench");
  cli.integer("--steps", &steps, 1, 100000, "a number of steps")
      .number("--seconds", &seconds, 0.5, 10, "a number of seconds")
      .text("--config", &file, "a file")
      .integer_list("--batches", &batches, 1, 1024, "a list of batch sizes")
      .text_list("--codecs", &codecs, "a list of codecs");
  auto error = [&](std::vector<std::string> args) {
    try {
      parse(cli, std::move(args));
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error({"--frobnicate"}) == "step bench: unknown argument '--frobnicate'");
  CHECK(error({"stray"}) == "step bench: unknown argument 'stray'");
  CHECK(error({"--config"}) == "step bench: --config needs a file");
  CHECK(error({"--steps", "0"}) ==
        "step bench: --steps: '0' is not a number of steps in [1, 100000]");
  CHECK(error({"--steps", "12x"}) ==
        "step bench: --steps: '12x' is not a number of steps in [1, 100000]");
  CHECK(error({"--steps", " 5"}) ==
        "step bench: --steps: ' 5' is not a number of steps in [1, 100000]");
  CHECK(error({"--steps", "99999999999999999999"}).find("is not a number of steps") !=
        std::string::npos);
  CHECK(error({"--seconds", "nan"}) ==
        "step bench: --seconds: 'nan' is not a number of seconds in [0.5, 10]");
  CHECK(error({"--seconds", "11"}) ==
        "step bench: --seconds: '11' is not a number of seconds in [0.5, 10]");
  CHECK(error({"--batches", "8,,16"}) ==
        "step bench: --batches: '8,,16' is not a list of batch sizes in [1, 1024]");
  CHECK(error({"--codecs", ""}) == "step bench: --codecs: '' is not a list of codecs");
  CHECK(error({"--codecs", "a,"}) == "step bench: --codecs: 'a,' is not a list of codecs");
  // A usage error is bad input: programs report it and exit 2 like any other.
  CHECK_THROWS_AS(parse(cli, {"--frobnicate"}), InputError);
}

TEST_CASE("command line: a stop option ends parsing where it stands") {
  bool quiet = false;
  CommandLine cli;
  cli.stop({"--help", "-h"}).stop({"--version"}).flag("--quiet", &quiet);
  CHECK(parse(cli, {"--quiet", "-h", "--frobnicate"}) == "--help");
  CHECK(quiet);
  CHECK(parse(cli, {"--version"}) == "--version");
  // An error before the stop option is still an error.
  CHECK_THROWS_WITH_AS(parse(cli, {"--frobnicate", "--help"}), "unknown argument '--frobnicate'",
                       UsageError);
}

TEST_CASE("command line: whole-text number conversions") {
  int64_t i = 0;
  double d = 0;
  CHECK(parse_integer("-3", -5, 5, &i));
  CHECK(i == -3);
  CHECK_FALSE(parse_integer("", 0, 5, &i));
  CHECK_FALSE(parse_integer("6", 0, 5, &i));
  CHECK_FALSE(parse_integer("1.0", 0, 5, &i));
  CHECK(parse_number("1e-3", 0, 1, &d));
  CHECK(d == 1e-3);
  CHECK_FALSE(parse_number("inf", 0, 1e300, &d));
  CHECK_FALSE(parse_number("0.5s", 0, 1, &d));
  CHECK(split_commas("a,b") == std::vector<std::string>{"a", "b"});
  CHECK(split_commas("") == std::vector<std::string>{});
  CHECK(split_commas("a,") == std::vector<std::string>{"a", ""});
}
