#include <algorithm>
#include <cmath>

#include "hearsay/optim.h"

namespace hearsay {

float LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) {
    return base_lr * static_cast<float>(step + 1) / static_cast<float>(warmup_steps);
  }
  const int64_t t = step - warmup_steps;
  switch (kind) {
    case Kind::kConstant:
      return base_lr;
    case Kind::kStep:
      return step_size > 0 ? base_lr * std::pow(gamma, static_cast<float>(t / step_size)) : base_lr;
    case Kind::kCosine: {
      const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps);
      const double progress = std::min(1.0, static_cast<double>(t) / span);
      return min_lr + (base_lr - min_lr) * 0.5f * static_cast<float>(1.0 + std::cos(M_PI * progress));
    }
  }
  return base_lr;
}

}  // namespace hearsay
