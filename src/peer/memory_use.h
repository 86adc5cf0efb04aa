// What a peer holds in memory, by owner (docs/LOGS.md, the `memory` event): one
// measurement for both peer loops. The backend's buffers (every one goes through a
// DeviceBuffer, which counts them) are split into the model's parameters and gradient, the
// optimizer's state and the rest (activations, batches, the engine's scratch), on the host
// or the device where the backend computes; the gossip engine adds its own owners.
#pragma once

#include "hearsay/metrics.h"
#include "hearsay/optim.h"
#include "hearsay/trainable.h"

namespace hearsay {

class GossipEngine;

// `framework_model`: the parameters and gradient are a framework's (a torch peer's), not
// the backend's buffers; they are still this process's memory and are reported as the
// model's. `engine` may be null (a peer alone).
MemoryUse measure_memory(const Trainable& model, const Optimizer& optimizer, bool framework_model, GossipEngine* engine);

}  // namespace hearsay
