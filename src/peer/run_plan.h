// What a peer's run is made of, from its spec: its shard's sampler and how many steps it
// takes. One definition for the native peer (peer.cpp) and for a peer whose loop belongs
// to another framework (external_peer.cpp), so that both deal the same batches in the
// same order and stop at the same step.
#pragma once

#include <cstdint>
#include <memory>

#include "hearsay/data.h"
#include "hearsay/peer.h"

namespace hearsay {

// The sampler over this peer's shard of `train` (spec.num_shards, spec.shard, the
// partition), seeded from spec.seed and the shard. Throws InputError when the shard does
// not exist.
std::unique_ptr<BatchSampler> make_shard_sampler(const Dataset& train, const PeerSpec& spec);

// Steps of a run over a shard of `shard_size` samples: train.epochs of it in batches, or
// train.max_steps, whichever comes first. Throws InputError when the count does not fit.
int64_t planned_steps(const TrainSpec& train, int64_t shard_size);

}  // namespace hearsay
