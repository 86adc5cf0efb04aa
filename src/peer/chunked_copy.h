// A copy of a float buffer that several threads make together, chunk by chunk.
//
// An external peer's parameters are copied between steps by a helper thread
// (GossipEngine::copy_between_steps) while the framework computes the next gradient. When
// the next step needs the copy and the helper has not finished, the step does not wait for
// the helper to get a core back (a batch thread on a machine the framework fills may wait
// a whole step): it copies the chunks no one has begun itself and waits only for the ones
// under way, each a fraction of a millisecond of copying.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

namespace hearsay {

class ChunkedCopy {
 public:
  // Copies `n` floats from `from` (which must not change until finish() or cancel()
  // returns) into `into` (null: a new buffer), resized to n by the first thread to copy:
  // a buffer of that size already is filled in place, with no page faults; a new one is
  // zeroed and faulted in by the helper, off the step, when the helper comes first. Each
  // chunk also gets its sum of squares.
  ChunkedCopy(const float* from, size_t n, std::shared_ptr<std::vector<float>> into, size_t chunk_floats = kChunkFloats);

  // Copies chunks until every one is claimed. Any thread, any number at once.
  void help();
  // Copies what is left, waits for chunks other threads are copying, and gives the copy
  // and its sum of squares (summed chunk by chunk in order: the same whoever copied). Once.
  std::shared_ptr<const std::vector<float>> finish(double& sum_squares);
  // Claims every chunk not begun and waits for those under way: `from` is free after it.
  void cancel();

  static constexpr size_t kChunkFloats = size_t{1} << 18;  // 1 MiB

 private:
  void wait_for_all_claimed();
  void size_buffer();
  void chunk_done();  // one more chunk copied or given up; the last one wakes the waiter

  const float* from_;
  const size_t n_, chunk_, chunks_;
  std::shared_ptr<std::vector<float>> into_;
  std::once_flag sized_;
  std::vector<double> squares_;         // per chunk, written by whoever copies it
  std::atomic<size_t> next_{0};         // the next chunk to claim
  std::atomic<size_t> claimed_done_{0}; // chunks copied (or given up by cancel)
  std::mutex mu_;
  std::condition_variable done_cv_;
};

}  // namespace hearsay
