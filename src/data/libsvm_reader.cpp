#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>

#include "hearsay/data.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

constexpr int64_t kMaxFeatures = 1 << 20;
constexpr int64_t kMaxCells = int64_t{1} << 31;  // dense storage limit (8 GiB of floats)

struct Entry {
  int64_t index;
  float value;
};

}  // namespace

Dataset load_libsvm(const std::string& path, int num_features, int num_classes) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": cannot open: " + std::strerror(errno));
  std::vector<std::vector<Entry>> rows;
  std::vector<int32_t> labels;
  int64_t max_index = 0;
  int max_label = -1;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    auto where = [&](size_t col) { return path + ":" + std::to_string(line_no) + ":" + std::to_string(col + 1) + ": "; };
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    size_t pos = line.find_first_not_of(" \t\r");
    if (pos == std::string::npos) continue;  // blank or comment line

    auto next_token = [&](size_t& start) {
      start = line.find_first_not_of(" \t\r", pos);
      if (start == std::string::npos) return std::string_view{};
      size_t end = line.find_first_of(" \t\r", start);
      if (end == std::string::npos) end = line.size();
      pos = end;
      return std::string_view(line).substr(start, end - start);
    };

    size_t col = 0;
    std::string_view tok = next_token(col);
    double label_value = 0;
    const std::string_view number = tok.size() > 1 && tok[0] == '+' ? tok.substr(1) : tok;
    auto [lp, lec] = std::from_chars(number.data(), number.data() + number.size(), label_value);
    if (tok.empty() || lec != std::errc() || lp != number.data() + number.size() || label_value != std::floor(label_value) ||
        label_value < -1 || label_value > 65535) {
      throw InputError(where(col) + "bad label '" + std::string(tok) + "' (expected an integer: -1 or a class >= 0)");
    }
    const int label = label_value == -1 ? 0 : static_cast<int>(label_value);
    max_label = std::max(max_label, label);

    std::vector<Entry> row;
    int64_t prev = 0;
    for (tok = next_token(col); !tok.empty(); tok = next_token(col)) {
      const size_t colon = tok.find(':');
      int64_t index = 0;
      float value = 0;
      bool ok = colon != std::string_view::npos;
      if (ok) {
        auto [ip, iec] = std::from_chars(tok.data(), tok.data() + colon, index);
        auto [vp, vec] = std::from_chars(tok.data() + colon + 1, tok.data() + tok.size(), value);
        ok = iec == std::errc() && ip == tok.data() + colon && vec == std::errc() &&
             vp == tok.data() + tok.size() && std::isfinite(value);
      }
      if (!ok) throw InputError(where(col) + "bad token '" + std::string(tok) + "' (expected index:value)");
      if (index <= prev) {
        throw InputError(where(col) + "feature index " + std::to_string(index) +
                         (index < 1 ? " must be >= 1" : " not greater than the previous " + std::to_string(prev)));
      }
      if (index > kMaxFeatures || (num_features > 0 && index > num_features)) {
        throw InputError(where(col) + "feature index " + std::to_string(index) + " exceeds " +
                         std::to_string(num_features > 0 ? num_features : kMaxFeatures) + " features");
      }
      prev = index;
      max_index = std::max(max_index, index);
      row.push_back({index, value});
    }
    labels.push_back(label);
    rows.push_back(std::move(row));
  }
  if (in.bad()) throw InputError(path + ": read error after line " + std::to_string(line_no));
  if (rows.empty()) throw InputError(path + ": no samples");

  Dataset d;
  d.name = path;
  d.size = static_cast<int64_t>(rows.size());
  d.channels = num_features > 0 ? num_features : static_cast<int>(max_index);
  if (d.channels < 1) throw InputError(path + ": no features in any sample");
  if (d.size * d.channels > kMaxCells) throw InputError(path + ": too large for dense storage");
  d.num_classes = num_classes > 0 ? num_classes : std::max(2, max_label + 1);
  if (max_label >= d.num_classes) {
    throw InputError(path + ": label " + std::to_string(max_label) + " outside [0, " + std::to_string(d.num_classes) + ")");
  }
  d.features.assign(static_cast<size_t>(d.size) * d.channels, 0.0f);
  for (int64_t i = 0; i < d.size; ++i) {
    for (const Entry& e : rows[i]) d.features[i * d.channels + (e.index - 1)] = e.value;
  }
  d.labels = std::move(labels);
  return d;
}

}  // namespace hearsay
