// The peer runtime reads time only through this interface, so a cluster can run on real
// time (processes, threads) or, later, on simulated virtual time.
#pragma once

#include <chrono>
#include <thread>

namespace hearsay {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary fixed start.
  virtual double now() const = 0;
  virtual void sleep_for(double seconds) = 0;
};

class RealClock final : public Clock {
 public:
  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void sleep_for(double seconds) override {
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace hearsay
