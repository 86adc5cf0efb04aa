// Shared pieces of the benchmark programs: JSON Lines output and robust timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hearsay/log.h"

namespace hearsay::bench {

// {"suite":..,"case":..,"metric":..,"value":..,"unit":..} plus optional extra fields.
inline void emit(const std::string& suite, const std::string& case_name, const std::string& metric, double value,
                 const std::string& unit, const JsonObject* extra = nullptr) {
  JsonObject o;
  o.add("suite", suite).add("case", case_name).add("metric", metric).add("value", value).add("unit", unit);
  std::string line = o.str();
  if (extra != nullptr) {
    const std::string more = extra->str();
    if (more.size() > 2) line = line.substr(0, line.size() - 1) + "," + more.substr(1);
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Runs `body` (one iteration) in `repeats` timed rounds of about `round_s` seconds each,
// after a warm-up; returns the seconds per iteration of each round.
inline std::vector<double> time_rounds(const std::function<void()>& body, int repeats, double round_s) {
  using clock = std::chrono::steady_clock;
  auto seconds = [](clock::duration d) { return std::chrono::duration<double>(d).count(); };
  int iters = 1;
  for (;;) {  // warm up and size a round
    const auto t0 = clock::now();
    for (int i = 0; i < iters; ++i) body();
    const double s = seconds(clock::now() - t0);
    if (s >= round_s / 4 || iters >= (1 << 24)) {
      iters = std::max(1, static_cast<int>(iters * round_s / std::max(s, 1e-9)));
      break;
    }
    iters *= 2;
  }
  std::vector<double> per_iter;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = clock::now();
    for (int i = 0; i < iters; ++i) body();
    per_iter.push_back(seconds(clock::now() - t0) / iters);
  }
  return per_iter;
}

}  // namespace hearsay::bench
