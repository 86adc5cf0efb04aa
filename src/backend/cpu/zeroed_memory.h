// Zeroed host memory for the CPU backend's buffers. Large buffers (a model, its gradient,
// an optimizer's moments: hundreds of megabytes at the field's sizes) are mapped from the
// kernel, which hands out zero pages lazily: nothing is written at allocation (the memset
// that zeroed 85M parameters' buffers was 38% of a GPT peer's start-up), and pages never
// touched (activations sized for the largest batch, used for a smaller one) never become
// resident. Small ones come from the heap, zeroed.
#pragma once

#include <cstddef>

namespace hearsay {

// At least `bytes` zeroed bytes, 64-byte aligned; nullptr when the memory is not there.
void* allocate_zeroed(size_t bytes);
// Frees what allocate_zeroed returned (nullptr: nothing).
void free_zeroed(void* p);

}  // namespace hearsay
