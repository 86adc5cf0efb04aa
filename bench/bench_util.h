// Shared pieces of the benchmark programs: JSON Lines output and robust timing.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "hearsay/backend.h"
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

// Times several bodies side by side: each round runs every body once for its own
// iteration count (sized to about round_s by a warm-up), so all of them see the same
// machine noise. `bodies[i](iters)` runs iters iterations and returns the seconds they
// took. Returns per-body lists of seconds per iteration, one entry per round.
inline std::vector<std::vector<double>> time_interleaved(const std::vector<std::function<double(int)>>& bodies,
                                                         int repeats, double round_s) {
  std::vector<int> iters(bodies.size(), 1);
  for (size_t b = 0; b < bodies.size(); ++b) {
    for (;;) {
      const double s = bodies[b](iters[b]);
      if (s >= round_s / 4 || iters[b] >= (1 << 24)) {
        iters[b] = std::max(1, static_cast<int>(iters[b] * round_s / std::max(s, 1e-9)));
        break;
      }
      iters[b] *= 2;
    }
  }
  std::vector<std::vector<double>> per_iter(bodies.size());
  for (int r = 0; r < repeats; ++r) {
    for (size_t b = 0; b < bodies.size(); ++b) per_iter[b].push_back(bodies[b](iters[b]) / iters[b]);
  }
  return per_iter;
}

// Wraps a one-iteration body as a timed multi-iteration body for time_interleaved.
inline std::function<double(int)> timed(std::function<void()> body) {
  return [body = std::move(body)](int iters) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) body();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
}

// Like timed(), for work on a backend whose operations may still be running when body()
// returns (a GPU's stream): the clock stops only once the device has finished them.
inline std::function<double(int)> timed_on(Backend& backend, std::function<void()> body) {
  return [&backend, body = std::move(body)](int iters) {
    backend.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) body();
    backend.synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
}

// A buffer of floats 0.01 * (i % 97), written through the backend (any device): the
// roofline GEMMs' operands.
inline void fill_pattern(Backend& backend, const DeviceBuffer& buffer) {
  std::vector<float> host(buffer.bytes() / sizeof(float));
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * static_cast<float>(i % 97);
  backend.upload(buffer.data(), host.data(), sizeof(float) * host.size());
}

// The device a step bench runs on ("cpu" or "cuda:N"); non-CPU cases carry it in their
// case names so that both can sit in one results file.
struct StepDevice {
  std::string name = "cpu";
  std::string case_suffix() const { return name == "cpu" ? "" : "@" + name; }
  // PyTorch's spelling of the same device.
  std::string torch_name() const { return name; }
};

}  // namespace hearsay::bench
