#include "hearsay/command_line.h"

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace hearsay {
namespace {

std::string range_text(int64_t lo, int64_t hi) {
  return " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string range_text(double lo, double hi) {
  char buf[64];
  std::snprintf(buf, sizeof buf, " in [%g, %g]", lo, hi);
  return buf;
}

// strtoll and strtod skip leading blanks; a value on the command line has none.
bool starts_clean(const std::string& text) {
  return !text.empty() && !std::isspace(static_cast<unsigned char>(text[0]));
}

// Reads a comma-separated list of integers, each in [lo, hi], into `out` as T; a list
// with a bad or empty item leaves `out` as it was. integer_list and size_list differ only
// in T.
template <typename T>
CommandLine::Apply apply_integer_list(std::vector<T>* out, int64_t lo, int64_t hi) {
  return [out, lo, hi](const std::string& v) {
    std::vector<T> values;
    for (const auto& item : split_commas(v)) {
      int64_t n = 0;
      if (!parse_integer(item, lo, hi, &n)) return false;
      values.push_back(static_cast<T>(n));
    }
    if (values.empty()) return false;
    *out = std::move(values);
    return true;
  };
}

}  // namespace

bool parse_integer(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  if (!starts_clean(text)) return false;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_number(const std::string& text, double lo, double hi, double* out) {
  if (!starts_clean(text)) return false;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  // !(v >= lo): NaN is never in range.
  if (errno != 0 || end != text.c_str() + text.size() || !(v >= lo) || v > hi) return false;
  *out = v;
  return true;
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> items;
  if (text.empty()) return items;
  size_t from = 0;
  for (;;) {
    const size_t comma = text.find(',', from);
    items.push_back(
        text.substr(from, comma == std::string::npos ? std::string::npos : comma - from));
    if (comma == std::string::npos) return items;
    from = comma + 1;
  }
}

CommandLine::CommandLine(std::string context) : context_(std::move(context)) {}

CommandLine& CommandLine::flag(std::vector<std::string> names, std::function<void()> on_seen) {
  Option o;
  o.names = std::move(names);
  o.on_seen = std::move(on_seen);
  options_.push_back(std::move(o));
  return *this;
}

CommandLine& CommandLine::flag(const std::string& name, bool* set_true) {
  return flag(std::vector<std::string>{name}, [set_true] { *set_true = true; });
}

CommandLine& CommandLine::stop(std::vector<std::string> names) {
  Option o;
  o.names = std::move(names);
  o.stops = true;
  options_.push_back(std::move(o));
  return *this;
}

CommandLine& CommandLine::option(const std::string& name, std::string value_is, Apply apply,
                                 std::string range) {
  Option o;
  o.names = {name};
  o.takes_value = true;
  o.value_is = std::move(value_is);
  o.range = std::move(range);
  o.apply = std::move(apply);
  options_.push_back(std::move(o));
  return *this;
}

CommandLine& CommandLine::text(const std::string& name, std::string* out, std::string value_is) {
  return option(name, std::move(value_is), [out](const std::string& v) {
    *out = v;
    return true;
  });
}

CommandLine& CommandLine::texts(const std::string& name, std::vector<std::string>* out,
                                std::string value_is) {
  return option(name, std::move(value_is), [out](const std::string& v) {
    out->push_back(v);
    return true;
  });
}

CommandLine& CommandLine::text_list(const std::string& name, std::vector<std::string>* out,
                                    std::string value_is) {
  return option(name, std::move(value_is), [out](const std::string& v) {
    std::vector<std::string> items = split_commas(v);
    for (const auto& item : items) {
      if (item.empty()) return false;
    }
    if (items.empty()) return false;
    *out = std::move(items);
    return true;
  });
}

CommandLine& CommandLine::integer(const std::string& name, int* out, int lo, int hi,
                                  std::string value_is) {
  return option(
      name, std::move(value_is),
      [out, lo, hi](const std::string& v) {
        int64_t n = 0;
        if (!parse_integer(v, lo, hi, &n)) return false;
        *out = static_cast<int>(n);
        return true;
      },
      range_text(int64_t{lo}, int64_t{hi}));
}

CommandLine& CommandLine::integer_list(const std::string& name, std::vector<int>* out, int lo,
                                       int hi, std::string value_is) {
  return option(name, std::move(value_is), apply_integer_list(out, lo, hi),
                range_text(int64_t{lo}, int64_t{hi}));
}

CommandLine& CommandLine::size_list(const std::string& name, std::vector<size_t>* out, size_t lo,
                                    size_t hi, std::string value_is) {
  const auto lo64 = static_cast<int64_t>(lo), hi64 = static_cast<int64_t>(hi);
  return option(name, std::move(value_is), apply_integer_list(out, lo64, hi64),
                range_text(lo64, hi64));
}

CommandLine& CommandLine::number(const std::string& name, double* out, double lo, double hi,
                                 std::string value_is) {
  return option(
      name, std::move(value_is),
      [out, lo, hi](const std::string& v) { return parse_number(v, lo, hi, out); },
      range_text(lo, hi));
}

const CommandLine::Option* CommandLine::find(const std::string& arg) const {
  for (const Option& o : options_) {
    for (const auto& n : o.names) {
      if (n == arg) return &o;
    }
  }
  return nullptr;
}

void CommandLine::fail(const std::string& message) const {
  throw UsageError(context_.empty() ? message : context_ + ": " + message);
}

std::string CommandLine::parse(int argc, const char* const* argv, int first) const {
  for (int i = first; i < argc; ++i) {
    const std::string arg = argv[i];
    const Option* o = find(arg);
    if (o == nullptr) fail("unknown argument '" + arg + "'");
    if (o->stops) return o->names.front();
    if (!o->takes_value) {
      o->on_seen();
      continue;
    }
    if (i + 1 >= argc) fail(arg + " needs " + o->value_is);
    const std::string value = argv[++i];
    if (!o->apply(value)) fail(arg + ": '" + value + "' is not " + o->value_is + o->range);
  }
  return "";
}

}  // namespace hearsay
