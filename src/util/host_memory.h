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
// `out` emptied, with fresh room for n floats advised onto huge pages before it is
// touched (unless it holds n floats already: then it is left as it is).
void reserve_for_copy(std::vector<float>& out, size_t n);
// The same, then resized to n floats (zeroed where fresh).
void resize_for_copy(std::vector<float>& out, size_t n);
// memcpy, split over the machine's cores when it is large enough to gain from them.
void copy_on_all_cores(void* dst, const void* src, size_t bytes);

}  // namespace hearsay
