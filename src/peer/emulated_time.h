// Emulated compute time, one rule for every peer loop (the native peer, the torch peer,
// a simulated peer): work that took `took` seconds is padded on the peer's clock to the
// time it is meant to take, so a peer's pace does not depend on the cores it shares. On
// the simulator's clock the work took no time and the whole emulated time passes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "hearsay/clock.h"

namespace hearsay {

// Pads work that took `took` s to `want` s; counts it in `overruns` when it took longer.
inline void pad_to(Clock& clock, double took, double want, int64_t& overruns) {
  if (took > want) ++overruns;
  clock.sleep_for(std::max(0.0, want - took));
}

// A training step's work (waits on neighbours excluded): with an emulated step base_s > 0
// it takes slowdown x base_s; without one, a slowdown stretches it to slowdown x took.
inline void stretch_step(Clock& clock, double took, double slowdown, double base_s, int64_t& overruns) {
  if (base_s > 0) return pad_to(clock, took, slowdown * base_s, overruns);
  if (slowdown > 1.0) clock.sleep_for((slowdown - 1.0) * took);
}

// A step's own computation (its forward, backward and optimizer passes) as the peer's
// clock saw it, from what they measured: with an emulated step, the time it was padded to
// (the emulated GPU's), or what they took where that was longer; without one, what they
// took stretched by the slowdown as stretch_step stretches it. Compute utilisation
// (docs/LOGS.md) is the sum of this over a peer's training time.
inline double step_compute_s(double measured, double slowdown, double base_s) {
  if (base_s > 0) return std::max(measured, slowdown * base_s);
  return measured * std::max(1.0, slowdown);
}

}  // namespace hearsay
