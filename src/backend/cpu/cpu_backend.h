// The CPU backend: OpenBLAS sgemm for the matrix products and single-pass loops, written
// so the compiler vectorises them, for everything else. It is the oracle the other
// backends are tested against.
#pragma once

#include <memory>

#include "hearsay/backend.h"

namespace hearsay {

// threads: OpenBLAS threads for this process (>= 1).
std::unique_ptr<Backend> create_cpu_backend(int threads);

}  // namespace hearsay
