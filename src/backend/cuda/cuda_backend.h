// The CUDA backend: cuBLAS for the matrix products, kernels of our own (one .cu per
// family: elementwise.cu, loss.cu, conv.cu) for the rest. All work runs on one stream
// per backend, so operations are ordered without host synchronisation.
#pragma once

#include <memory>

#include "hearsay/backend.h"

namespace hearsay {

// Number of usable CUDA devices; 0 when there is no driver or no GPU.
int cuda_device_count();
// Throws InputError when the device does not exist, BackendError when CUDA fails.
std::unique_ptr<Backend> create_cuda_backend(int device);

}  // namespace hearsay
