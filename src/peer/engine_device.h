// What the engine's device path (engine_device.cpp) shares with its checkpoints
// (engine_state.cpp); built only with CUDA.
#pragma once
#include <vector>

#include "hearsay/build_config.h"

#if HEARSAY_HAVE_CUDA
#include "hearsay/codec.h"
#include "hearsay/device_codec.h"

namespace hearsay {

// What a link still owes for one payload kind: its host encoder's residual plus its device
// twin's (a link that fell back to the host for a while holds parts in both).
std::vector<float> owed_residual(const LinkEncoder& enc, const DeviceLinkEncoder& twin);

}  // namespace hearsay
#endif
