// Large host buffers at the field's model sizes (gigabytes): faulted in by huge pages
// rather than one 4 KiB page at a time, and copied on every core. In a virtual machine a
// page fault costs more than copying the page: a checkpoint's first 8 GB snapshot of a
// 1B-parameter model took 34 s in faults, the next ones (into the same, resident pages)
// 1.7 s.
#pragma once

#include <cstddef>
#include <vector>

namespace hearsay {

// Asks the kernel to back [p, p + bytes) with transparent huge pages where it allows them
// (madvise mode); a hint, ignored where refused. Call before the memory is first touched.
void advise_huge_pages(void* p, size_t bytes);
// `out` resized to n floats, its fresh memory advised onto huge pages before it is
// touched; memory it already holds (n floats) is kept as it is.
void resize_for_copy(std::vector<float>& out, size_t n);
// memcpy, split over the machine's cores when it is large enough to gain from them.
void copy_on_all_cores(void* dst, const void* src, size_t bytes);

}  // namespace hearsay
