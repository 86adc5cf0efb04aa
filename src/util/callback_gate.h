// A gate for calls other threads make into an object that may be destroyed meanwhile (a
// transport's send completions into a gossip engine). Each call passes through it; close()
// turns later calls away and returns once none is inside (but a call on the closing
// thread itself, which cannot be waited for), so the owner may then be freed. The gate
// lives in a shared_ptr that every callback holds, so it outlives its owner.
#pragma once

#include <condition_variable>
#include <mutex>

namespace hearsay {

class CallbackGate {
 public:
  // Inside the gate for its lifetime, or turned away (false) once the gate is closed.
  class Pass {
   public:
    explicit Pass(CallbackGate& gate);
    ~Pass();
    Pass(const Pass&) = delete;
    Pass& operator=(const Pass&) = delete;
    explicit operator bool() const { return inside_; }

   private:
    CallbackGate& gate_;
    bool inside_ = false;
    const CallbackGate* outer_ = nullptr;  // the gate this thread was inside before
  };

  void close();

 private:
  std::mutex mu_;
  std::condition_variable left_;
  int inside_ = 0;       // GUARDED_BY(mu_)
  bool closed_ = false;  // GUARDED_BY(mu_)
};

}  // namespace hearsay
