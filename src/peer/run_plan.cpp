#include "run_plan.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "hearsay/error.h"

namespace hearsay {

std::unique_ptr<BatchSampler> make_shard_sampler(const Dataset& train, const PeerSpec& spec) {
  if (spec.num_shards < 1 || spec.shard < 0 || spec.shard >= spec.num_shards) {
    throw InputError("peer " + spec.name + ": shard " + std::to_string(spec.shard) + " of " +
                     std::to_string(spec.num_shards) + " does not exist");
  }
  auto shards = shard_indices(train, spec.num_shards, spec.partition, spec.dirichlet_alpha, spec.seed);
  return std::make_unique<BatchSampler>(std::move(shards[static_cast<size_t>(spec.shard)]),
                                        spec.seed * 1315423911ULL + static_cast<uint64_t>(spec.shard));
}

int64_t planned_steps(const TrainSpec& t, int64_t shard_size) {
  const double epoch_steps = std::ceil(t.epochs * static_cast<double>(shard_size) / t.batch_size);
  if (!(epoch_steps >= 0 && epoch_steps < 1e15)) {
    // The config's bounds keep this far away; a step count that does not fit would train nothing.
    throw InputError("train.epochs: " + std::to_string(t.epochs) + " epochs of " + std::to_string(shard_size) +
                     " samples in batches of " + std::to_string(t.batch_size) + " is too many steps");
  }
  const int64_t steps = static_cast<int64_t>(epoch_steps);
  if (t.max_steps > 0) return t.epochs > 0 ? std::min(steps, t.max_steps) : t.max_steps;
  return steps;
}

}  // namespace hearsay
