// A checkpoint written from the live state, with no copy of it taken in the step.
//
// A host peer's snapshot used to be a copy of its parameters and optimizer buffers made
// in the step that takes it: at 1B parameters 8 GB, 0.8-1.4 s of a 9.4 s step on this
// machine. Those buffers do not change between the end of one optimizer step and the
// next one: the forward and backward pass in between only read the parameters. So the
// writer reads them where they are, a chunk at a time, and the step loop calls freeze()
// before it next writes to them (the fence). freeze() waits for the chunk the writer is
// reading, copies only the chunks the writer has not reached into the snapshot's own
// buffers, and lets the writer take those from there. The file is the state as it was at
// the checkpoint's step, bit for bit, whichever way each chunk came.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace hearsay {

class LiveSnapshot {
 public:
  // A buffer of the state: `live` (where the step loop keeps it, held still until
  // freeze()) and `copy` (the snapshot's buffer of the same length, the blob's data as
  // write_checkpoint sees it). Before the write starts.
  void add(const float* live, std::vector<float>& copy);

  // The writer's side. Where to read `n` bytes at byte `at` of the blob whose buffer is
  // `copy`: the live state while it is held still, else the copy (waiting until freeze()
  // has made it). A buffer not added is read from `copy`. Every begin_chunk is followed
  // by end_chunk once its bytes are read.
  const char* begin_chunk(const void* copy, uint64_t at, size_t n);
  void end_chunk();

  // The step loop's side, before it writes to the state: from here on the live buffers
  // are its own again. Idempotent. Returns the bytes it copied.
  uint64_t freeze();

  // The writer's, when it is done with the snapshot (written, or failed): the live state is
  // not read again and a later freeze() copies nothing; a freeze() copying now finishes
  // first (the copies may be freed after).
  void detach();

  // What freeze() cost: the bytes copied (0 when the writer had read everything first,
  // or before freeze()) and the step loop's seconds in it.
  uint64_t copied_bytes() const;
  double freeze_s() const;

 private:
  struct Buffer {
    const char* live;
    char* copy;
    uint64_t bytes;
    uint64_t read_to = 0;  // the writer has read [0, read_to) from live (or is reading it)
  };
  Buffer* find(const void* copy);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Buffer> buffers_;
  bool frozen_ = false;   // the step loop has the live buffers back
  bool copied_ = false;   // the chunks the writer had not read are in the copies
  bool reading_ = false;  // the writer is reading a chunk from the live state
  uint64_t copied_bytes_ = 0;
  double freeze_s_ = 0;
};

}  // namespace hearsay
