// The reconnect back-off every transport uses.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>

#include "hearsay/transport.h"

namespace hearsay {

// Seconds to wait before the attempt-th reconnect: exponential from reconnect_initial_s,
// capped at reconnect_max_s, jittered into [1/2, 1] of that so peers do not redial in step.
inline double backoff_delay(const TransportOptions& o, int attempt, std::mt19937_64& rng) {
  const double base = std::min(o.reconnect_max_s, o.reconnect_initial_s * std::pow(2.0, std::min(attempt, 30)));
  return base * std::uniform_real_distribution<double>(0.5, 1.0)(rng);
}

}  // namespace hearsay
