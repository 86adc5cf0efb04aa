// The peer runtime reads time, sleeps and waits only through this interface, so a cluster
// can run on real time (processes, threads) or on the simulator's virtual time
// (src/sim: every peer an actor of one SimGrid simulation, docs/SIMULATION.md).
#pragma once

#include <chrono>
#include <cmath>
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
  // An infinite timeout waits for ready() alone (a duration of infinity would overflow).
  bool wait_for(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, double timeout_s,
                const std::function<bool()>& ready) override {
    if (!std::isfinite(timeout_s)) {
      cv.wait(lock, ready);
      return true;
    }
    return cv.wait_for(lock, std::chrono::duration<double>(timeout_s), ready);
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The process's real clock, for what runs on real time whatever the peers' clock is: the
// in-process cluster's harness, a preflight check, a copy between a framework's steps.
inline RealClock& wall_clock() {
  static RealClock clock;
  return clock;
}

// Seconds on a clock every peer of a cluster shares: Unix time on the real clock (the
// hosts' clocks kept in step by NTP), the virtual time on the simulator.
inline double shared_time_s(const Clock& clock) {
  if (clock.simulated()) return clock.now();
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// train.eval_every_s: an evaluation at the first step after each multiple of eval_every_s
// on the shared clock, the first at least eval_every_s after the peer is ready to train
// (constructed then: after its resume or its join). On it the peers
// evaluate together: a synchronous step waits for every peer, and with each peer's
// evaluations on its own start-relative clock they fell at different moments, so each
// one stalled all the others (4 peers padding evaluations to 0.6 s every second left an
// all-reduce one step a second, where asynchronous peers lost only their own 0.6 s).
class EvalCadence {
 public:
  EvalCadence(double every_s, double shared_start_s)
      : every_(every_s), next_(every_s > 0 ? std::ceil((shared_start_s + every_s) / every_s) * every_s : 0) {}
  // Whether an evaluation is due at shared time `now`; if so, the next one is set.
  bool due(double now) {
    if (every_ <= 0 || now < next_) return false;
    next_ = (std::floor(now / every_) + 1) * every_;
    return true;
  }

 private:
  double every_, next_;
};

}  // namespace hearsay
