#include "callback_gate.h"

namespace hearsay {
namespace {

// The gate this thread is inside now (the innermost), if any.
thread_local const CallbackGate* inside_here = nullptr;

}  // namespace

CallbackGate::Pass::Pass(CallbackGate& gate) : gate_(gate), outer_(inside_here) {
  std::lock_guard<std::mutex> lock(gate_.mu_);
  if (gate_.closed_) return;
  ++gate_.inside_;
  inside_ = true;
  inside_here = &gate_;
}

CallbackGate::Pass::~Pass() {
  if (!inside_) return;
  inside_here = outer_;
  std::lock_guard<std::mutex> lock(gate_.mu_);
  --gate_.inside_;
  gate_.left_.notify_all();
}

void CallbackGate::close() {
  std::unique_lock<std::mutex> lock(mu_);
  closed_ = true;
  // A call on this thread (its owner destroyed from inside a callback) cannot be waited for.
  const int own = inside_here == this ? 1 : 0;
  left_.wait(lock, [&] { return inside_ <= own; });
}

}  // namespace hearsay
