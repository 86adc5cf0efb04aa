// Text as a byte-level token stream: the reader (UTF-8 checked), the held-out validation
// slice, document boundaries, and the windows a language model trains on.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <regex>
#include <string>

#include "hearsay/data.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

// The offset of the first byte that does not belong to a well-formed UTF-8 sequence
// (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF), or -1.
int64_t first_invalid_utf8(const std::vector<uint8_t>& b) {
  const size_t n = b.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t c = b[i];
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return static_cast<int64_t>(i);
    }
    if (i + len > n) return static_cast<int64_t>(i);
    if (b[i + 1] < lo || b[i + 1] > hi) return static_cast<int64_t>(i + 1);
    for (size_t k = 2; k < len; ++k) {
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return static_cast<int64_t>(i + k);
    }
    i += len;
  }
  return -1;
}

std::vector<int64_t> document_starts(const std::vector<uint8_t>& text, const std::string& pattern,
                                     const std::string& path) {
  std::vector<int64_t> starts{0};
  if (pattern.empty()) return starts;
  std::regex re;
  try {
    re = std::regex(pattern, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    throw InputError("data.document_regex '" + pattern + "': " + e.what());
  }
  if (re.mark_count() < 1) throw InputError("data.document_regex '" + pattern + "' has no group to name a document");
  std::string current;
  bool first = true;
  size_t line_start = 0;
  while (line_start < text.size()) {
    size_t end = line_start;
    while (end < text.size() && text[end] != '\n') ++end;
    std::smatch m;
    const std::string line(text.begin() + static_cast<int64_t>(line_start), text.begin() + static_cast<int64_t>(end));
    if (std::regex_search(line, m, re) && m[1].matched) {
      const std::string name = m[1].str();
      if (!first && name != current) starts.push_back(static_cast<int64_t>(line_start));
      current = name;
      first = false;
    }
    line_start = end + 1;
  }
  if (first) throw InputError(path + ": data.document_regex '" + pattern + "' matches no line");
  return starts;
}

Dataset text_set(std::string name, std::vector<uint8_t> bytes, int context, int64_t stride) {
  Dataset d;
  d.name = std::move(name);
  d.context = context;
  d.stride = stride;
  d.num_classes = 256;
  d.size = (static_cast<int64_t>(bytes.size()) - 1 - context) / stride + 1;
  d.text = std::move(bytes);
  return d;
}

}  // namespace

TrainTest load_text(const std::string& path, int context, double validation_fraction,
                    const std::string& document_regex) {
  if (context < 1) throw InputError(path + ": the model's context must be >= 1 to read text");
  if (!(validation_fraction > 0.0 && validation_fraction < 1.0)) {
    throw InputError("data.validation_fraction must be in (0, 1), got " + std::to_string(validation_fraction));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the text file (data.text_path)");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw InputError(path + ": read error");
  const int64_t bad = first_invalid_utf8(bytes);
  if (bad >= 0) throw InputError(path + ": not UTF-8: byte " + std::to_string(bad) + " (0x" +
                                 [&] {
                                   char hex[3];
                                   std::snprintf(hex, sizeof(hex), "%02x", bytes[bad]);
                                   return std::string(hex);
                                 }() + ") does not belong to a valid sequence");
  const int64_t total = static_cast<int64_t>(bytes.size());
  const int64_t held_out = static_cast<int64_t>(static_cast<double>(total) * validation_fraction);
  const int64_t train_bytes = total - held_out;
  if (held_out < context + 1 || train_bytes < context + 1) {
    throw InputError(path + ": " + std::to_string(total) + " bytes is too short for one window of " +
                     std::to_string(context + 1) + " bytes in both the training part and the validation slice (" +
                     std::to_string(validation_fraction) + " of it)");
  }
  TrainTest tt;
  std::vector<uint8_t> val(bytes.begin() + train_bytes, bytes.end());
  bytes.resize(static_cast<size_t>(train_bytes));
  std::vector<int64_t> starts = document_starts(bytes, document_regex, path);
  tt.train = text_set(path, std::move(bytes), context, 1);
  tt.train.document_starts = std::move(starts);
  tt.test = text_set(path + " (validation)", std::move(val), context, context);
  tt.test.document_starts = {0};
  return tt;
}

void gather_tokens(const Dataset& data, const int64_t* idx, int n, int32_t* x, int32_t* y) {
  const size_t t = static_cast<size_t>(data.context);
  for (int i = 0; i < n; ++i) {
    HEARSAY_CHECK(idx[i] >= 0 && idx[i] < data.size, "text window " + std::to_string(idx[i]) + " outside the set");
    const uint8_t* w = data.text.data() + idx[i] * data.stride;
    for (size_t k = 0; k < t; ++k) {
      x[i * t + k] = w[k];
      y[i * t + k] = w[k + 1];
    }
  }
}

}  // namespace hearsay
