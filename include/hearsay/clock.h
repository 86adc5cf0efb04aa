// The peer runtime reads time, sleeps and waits only through this interface, so a cluster
// can run on real time (processes, threads) or on the simulator's virtual time
// (src/sim: every peer an actor of one SimGrid simulation, docs/SIMULATION.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace hearsay {

class Clock {
 public:
  virtual ~Clock() = default;
  // Seconds since an arbitrary fixed start.
  virtual double now() const = 0;
  virtual void sleep_for(double seconds) = 0;
  // Whether this is the simulator's virtual time (docs/SIMULATION.md).
  virtual bool simulated() const { return false; }
  // Waits until `ready()` holds or `timeout_s` has passed; `lock` holds the mutex that
  // guards what ready() reads, and `cv` is notified when that changes. Returns ready().
  // A simulated clock releases the lock while virtual time passes and is woken by the
  // simulation when something reached this peer; ready() is checked again each time.
  virtual bool wait_for(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout_s,
                        const std::function<bool()>& ready) = 0;
};

class RealClock final : public Clock {
 public:
  double now() const override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  void sleep_for(double seconds) override {
    if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  }
  bool wait_for(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout_s,
                const std::function<bool()>& ready) override {
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

}  // namespace hearsay
