// A checkpoint written from the live state, with no copy of it taken in the step.
//
// A host peer's snapshot used to be a copy of its parameters and optimizer buffers made
// in the step that takes it: at 1B parameters 8 GB, 0.8-1.4 s of a 9.4 s step on this
// machine, and 8 GB held from one checkpoint to the next. Those buffers do not change
// between the end of one optimizer step and the next one: the forward and backward pass
// in between only read the parameters. So the writer reads them where they are, a chunk
// at a time, and the step loop calls freeze() before it next writes to them (the fence).
// freeze() waits for the chunk the writer is reading, then either
// - copies the chunks the writer has not reached into the snapshot's own buffers, where
//   it has them (`copy` given to add), and lets the writer take those from there; or
// - without them, waits until the writer has read the rest from the live state: the
//   step waits for the disk, but no model-sized copy is held (the peer keeps copies from
//   the next checkpoint on once a fence had to wait: CheckpointWriter).
// The file is the state as it was at the checkpoint's step, bit for bit, whichever way
// each chunk came.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hearsay {

class LiveSnapshot {
 public:
  // A buffer of the state: `name` (the blob's: "params", or an optimizer buffer's name),
  // `live` (n floats where the step loop keeps it, held still until freeze()) and `copy`
  // (null, or the snapshot's buffer of n floats). Either every buffer has a copy or none
  // does. Before the write starts.
  void add(const std::string& name, const float* live, size_t n, std::vector<float>* copy);
  struct View {
    std::string name;
    const float* live;
    size_t n;
  };
  // The buffers added, in order: what write_checkpoint writes for them.
  std::vector<View> views() const;

  // The writer's side. Where to read `n` bytes at byte `at` of the buffer whose live
  // memory is `live`: the live state while it is held still, else the copy (waiting until
  // freeze() has made it). Memory not added is read where it is. Chunks of a buffer are
  // read in order; every begin_chunk is followed by end_chunk once its bytes are read.
  const char* begin_chunk(const void* live, uint64_t at, size_t n);
  void end_chunk();
  // When the writer is done with the snapshot (written, or failed): the live state is not
  // read again, a freeze() waiting for the writer returns, and a freeze() copying now
  // finishes first (the copies may be freed after).
  void detach();

  // The step loop's side, before it writes to the state: from here on the live buffers
  // are its own again. Idempotent.
  struct Fenced {
    uint64_t copied_bytes = 0;  // copied into the snapshot's buffers
    uint64_t waited_bytes = 0;  // left for the writer to read while the step loop waited
    double seconds = 0;
  };
  Fenced freeze();
  // What freeze() did (all zero before it, or when the writer had read everything first).
  Fenced fenced() const;

 private:
  struct Buffer {
    std::string name;
    const char* live;
    char* copy;  // null: none
    uint64_t bytes;
    uint64_t read_to = 0;  // the writer has read [0, read_to) from live (or is reading it)
  };
  Buffer* find(const void* live);
  bool all_read() const;  // with mu_ held

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Buffer> buffers_;
  bool frozen_ = false;    // the step loop has the live buffers back
  bool copied_ = false;    // the chunks the writer had not read are in the copies
  bool reading_ = false;   // the writer is reading a chunk from the live state
  bool detached_ = false;  // the writer reads no more
  Fenced fenced_;
};

}  // namespace hearsay
