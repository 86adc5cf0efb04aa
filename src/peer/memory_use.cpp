#include "memory_use.h"

#include "hearsay/backend.h"
#include "hearsay/gossip.h"

namespace hearsay {

MemoryUse measure_memory(const Trainable& model, const Optimizer& optimizer, bool framework_model, GossipEngine* engine) {
  MemoryUse m;
  const Backend& backend = model.backend();
  auto& side = backend.is_host() ? m.host : m.device;
  const uint64_t model_bytes = 2 * sizeof(float) * static_cast<uint64_t>(model.num_params());
  const uint64_t optimizer_bytes = optimizer.state_bytes();
  const uint64_t buffers = backend.buffer_bytes();
  const uint64_t owned_model = framework_model ? 0 : model_bytes;
  side["model"] = model_bytes;
  side["optimizer"] = optimizer_bytes;
  side["activations"] = buffers > owned_model + optimizer_bytes ? buffers - owned_model - optimizer_bytes : 0;
  if (engine != nullptr) engine->add_memory(m);
  return m;
}

}  // namespace hearsay
