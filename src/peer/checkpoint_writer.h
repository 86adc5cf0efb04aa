// Checkpoints written by a thread of their own, so a step does not wait on the disk: the
// step loop hands over a snapshot of the state (CheckpointData, its own copy) and goes on;
// the writer writes it (checkpoint_file.cpp) while the next steps run, on a thread of the
// lowest priority (it leaves the cores to the steps: a write is due only by the next
// checkpoint). One write at a time:
// a checkpoint asked for while the last is still being written waits for it first (the
// memory held is one snapshot, never a queue of them). A write that failed is reported at
// the next submit() or finish(), as the InputError a write in the step loop would throw.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hearsay/checkpoint.h"
#include "live_snapshot.h"

namespace hearsay {

class CheckpointWriter {
 public:
  struct Written {
    std::string path;
    int64_t step = 0;
    uint64_t file_bytes = 0;
    double snapshot_s = 0;  // the step loop's share: copying the state (what a live snapshot did not leave to the fence)
    double waited_s = 0;    // the step loop's wait for the write before this one
    double write_s = 0;     // the write itself, on the writer's thread
    uint64_t copied_bytes = 0;        // a live snapshot's: the bytes the fence copied (the rest were read live)
    uint64_t fence_waited_bytes = 0;  // a live snapshot's without copies: the bytes the fence waited for the writer to read
    double fence_s = 0;               // a live snapshot's: the step loop's seconds in the fence
  };
  // `done` runs on the writer's thread after each write that succeeded (the log event).
  // Without `background` (a simulated peer: its clock is virtual and no other thread may
  // touch it), submit() writes at once on the caller's thread.
  CheckpointWriter(bool background, std::function<void(const Written&)> done);
  ~CheckpointWriter();  // waits for a write under way
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Before the step loop writes to its parameters or optimizer state: a write reading them
  // live (CheckpointData::live) takes what it has not read from a copy made now, or, with
  // no copies, is waited for until it has read it (LiveSnapshot::freeze). A fence that
  // waited makes the writer keep copies from then on (keeps_copies): made on its thread
  // after this write, so that the next checkpoints' fences copy instead of waiting.
  LiveSnapshot::Fenced fence();
  // Whether the snapshots should have copies (a fence had to wait for the disk).
  bool keeps_copies() const;
  // Waits for the write under way, if any, and rethrows its error. Returns the seconds it
  // waited. Called before a snapshot is taken, so that two are never held at once.
  double finish();
  // Hands a snapshot over (after finish(): it waits for a write under way otherwise);
  // `snapshot_s` and `waited_s` are what it cost the step loop, for the log.
  void submit(std::string path, int64_t step, CheckpointData data, double snapshot_s, double waited_s);
  // The buffers of the last snapshot written (empty before the first, or after a failed
  // write), for the next to copy into: pages already resident, so a snapshot is a copy,
  // not a fault per page (in a virtual machine those cost more than the copy: at 85M
  // parameters 2.1 s a snapshot, fresh). After finish().
  CheckpointData take_spare();
  // Makes the spare snapshot's buffers now, on the writer's thread at its low priority
  // (a GPU peer's, whose snapshot is a download; a CPU peer's once keeps_copies()):
  // `params` floats for the parameters and as many for each of the optimizer's buffers.
  // Their pages are faulted in beside the first steps instead of in the step that takes
  // the first snapshot (at 1B parameters 8-15 s: a fresh 8 GB in this virtual machine).
  void prepare(size_t params, const std::vector<std::string>& optimizer_buffers);
  // The bytes of the snapshot being written and the spare one: an owner in the memory
  // event. From the first checkpoint on a peer holds one copy of its state.
  uint64_t held_bytes() const;

 private:
  struct Job {
    Written what;
    CheckpointData data;
    // Not a write: make buffers of this many floats (the parameters, then one per name)
    // and keep them as the spare.
    size_t prepare_floats = 0;
    std::vector<std::string> prepare_names;
  };
  void loop();
  void write(Job& job);
  // The spare's buffers: `floats` for the parameters and as many for each name, on huge
  // pages, every page touched. False where there is no room now.
  static bool make_spare(CheckpointData& d, size_t floats, const std::vector<std::string>& names);
  // With mu_ held: waits until no job is pending or being written.
  void wait_idle(std::unique_lock<std::mutex>& lock);

  const bool background_;
  std::function<void(const Written&)> done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Job> job_;      // GUARDED_BY(mu_): handed over, or being written
  bool stopping_ = false;       // GUARDED_BY(mu_)
  std::exception_ptr failed_;   // GUARDED_BY(mu_)
  uint64_t held_ = 0;           // GUARDED_BY(mu_): the job's bytes
  CheckpointData spare_;        // GUARDED_BY(mu_)
  std::shared_ptr<LiveSnapshot> live_;  // GUARDED_BY(mu_): the job's, while it is written
  bool keep_copies_ = false;            // GUARDED_BY(mu_): a fence waited; copies are made after the write
  std::thread thread_;
};

}  // namespace hearsay
