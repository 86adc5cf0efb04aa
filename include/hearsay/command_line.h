// The options of a program, declared once and parsed in one pass: hearsay-peer and the
// hearsay-bench suites use it instead of a loop of their own. Options are `--name` or
// `--name VALUE` (the value is the next argument, whatever it looks like); values are
// checked as they are read, and every error names the option and the value.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hearsay/error.h"

namespace hearsay {

// A command line that cannot be parsed. The message says which argument and why, e.g.
// "--measure-step: 'x' is not a number of steps in [1, 100000]", prefixed with the
// parser's context when it has one ("step bench: --repeats needs a count").
class UsageError : public InputError {
 public:
  explicit UsageError(const std::string& what) : InputError(what) {}
};

// Not thread-safe; the pointers given to it must outlive parse().
class CommandLine {
 public:
  // `context`, when not empty, starts every error message ("step bench").
  explicit CommandLine(std::string context = "");

  // Takes the value's text; returns false when the text is not what the option wants.
  using Apply = std::function<bool(const std::string& value)>;

  // An option without a value. `names` are its spellings ("--help", "-h").
  CommandLine& flag(std::vector<std::string> names, std::function<void()> on_seen);
  CommandLine& flag(const std::string& name, bool* set_true);
  // An option that ends parsing where it stands (--help, --version): parse() returns its
  // first name and ignores what follows, as a user asking for help expects.
  CommandLine& stop(std::vector<std::string> names);
  // An option with a value. `value_is` names the value in messages ("a file"); `range`
  // is what a bad value is told it must be beyond that (" in [1, 100000]"), or empty.
  CommandLine& option(const std::string& name, std::string value_is, Apply apply,
                      std::string range = "");

  // Typed options over option(). A repeated option replaces the earlier value, except
  // `texts`, which appends (--set FRAGMENT...). Lists are comma-separated and replace the
  // default as a whole.
  CommandLine& text(const std::string& name, std::string* out, std::string value_is);
  CommandLine& texts(const std::string& name, std::vector<std::string>* out, std::string value_is);
  CommandLine& text_list(const std::string& name, std::vector<std::string>* out,
                         std::string value_is);
  CommandLine& integer(const std::string& name, int* out, int lo, int hi, std::string value_is);
  CommandLine& integer_list(const std::string& name, std::vector<int>* out, int lo, int hi,
                            std::string value_is);
  CommandLine& size_list(const std::string& name, std::vector<size_t>* out, size_t lo, size_t hi,
                         std::string value_is);
  CommandLine& number(const std::string& name, double* out, double lo, double hi,
                      std::string value_is);

  // Parses argv[first, argc). Returns the stop option that ended it, or "" when every
  // argument was read. Throws UsageError: "unknown argument 'ARG'", "NAME needs VALUE_IS",
  // "NAME: 'TEXT' is not VALUE_IS[RANGE]".
  std::string parse(int argc, const char* const* argv, int first = 1) const;

 private:
  struct Option {
    std::vector<std::string> names;
    bool stops = false;
    bool takes_value = false;
    std::string value_is, range;
    Apply apply;                    // takes_value
    std::function<void()> on_seen;  // a flag
  };
  const Option* find(const std::string& arg) const;
  [[noreturn]] void fail(const std::string& message) const;

  std::string context_;
  std::vector<Option> options_;
};

// Strict whole-text conversions (no trailing characters, no overflow, within
// [lo, hi]); false when the text is not such a value.
bool parse_integer(const std::string& text, int64_t lo, int64_t hi, int64_t* out);
bool parse_number(const std::string& text, double lo, double hi, double* out);
// Splits "a,b,c" at commas; an empty text is no items.
std::vector<std::string> split_commas(const std::string& text);

}  // namespace hearsay
