// CallbackGate (src/util/callback_gate.h): what lets a gossip engine be freed while its
// transport may still finish sends.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../../src/util/callback_gate.h"

using hearsay::CallbackGate;

TEST_CASE("callback gate: close() waits for a call inside to leave, then turns every later call away") {
  CallbackGate gate;
  std::atomic<bool> entered{false}, left{false};
  std::thread call([&] {
    const CallbackGate::Pass pass(gate);
    REQUIRE(static_cast<bool>(pass));
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    left = true;
  });
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  gate.close();
  CHECK(left);  // without the wait, close() returns while the call still runs
  call.join();
  const CallbackGate::Pass late(gate);
  CHECK_FALSE(static_cast<bool>(late));
}

TEST_CASE("callback gate: closed from inside one of its own calls, it does not wait for itself") {
  CallbackGate gate;
  const CallbackGate::Pass pass(gate);
  REQUIRE(static_cast<bool>(pass));
  gate.close();  // returns: the only call inside is this thread's
  CHECK_FALSE(static_cast<bool>(CallbackGate::Pass(gate)));
}
