// A task queue run by one thread, with tasks that may wait for a time: the inproc
// transport's mailboxes and the link emulator's clock both use it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace hearsay {

class TimedExecutor {
 public:
  using Clock = std::chrono::steady_clock;

  // Queues a task to run now (at = {}) or at a time; ignored once stopped.
  void post(std::function<void()> task, Clock::time_point at = Clock::time_point{}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      if (at == Clock::time_point{}) {
        now_.push_back(std::move(task));
      } else {
        timed_.emplace(at, std::move(task));
      }
    }
    cv_.notify_one();
  }

  // Runs tasks on the calling thread until stop(). Timed tasks run in time order, those
  // due at the same time in the order they were posted.
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      std::function<void()> task;
      if (!now_.empty()) {
        task = std::move(now_.front());
        now_.pop_front();
      } else if (!timed_.empty() && timed_.begin()->first <= Clock::now()) {
        task = std::move(timed_.begin()->second);
        timed_.erase(timed_.begin());
      } else {
        if (timed_.empty()) {
          cv_.wait(lock);
        } else {
          // A copy: the map may change (or be cleared by stop()) while we wait.
          const Clock::time_point next = timed_.begin()->first;
          cv_.wait_until(lock, next);
        }
        continue;
      }
      lock.unlock();
      task();
      lock.lock();
    }
  }

  // Drops what is queued and makes run() return.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
      now_.clear();
      timed_.clear();
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;                                          // GUARDED_BY(mu_)
  std::deque<std::function<void()>> now_;                         // GUARDED_BY(mu_)
  std::multimap<Clock::time_point, std::function<void()>> timed_;  // GUARDED_BY(mu_)
};

inline TimedExecutor::Clock::duration seconds_to_duration(double s) {
  return std::chrono::duration_cast<TimedExecutor::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace hearsay
