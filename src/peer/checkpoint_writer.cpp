#include "checkpoint_writer.h"

#include <sys/resource.h>
#include <unistd.h>

#include <limits>
#include <new>

#include "hearsay/clock.h"
#include "hearsay/error.h"
#include "../util/host_memory.h"

namespace hearsay {

// The writer works on real time whatever the peer's clock (a simulated peer writes in its
// own step, background_ false): its waits and its timing are the wall clock's.
namespace {
constexpr double kForever = std::numeric_limits<double>::infinity();
}  // namespace

CheckpointWriter::CheckpointWriter(bool background, std::function<void(const Written&)> done)
    : background_(background), done_(std::move(done)) {
  if (background_) thread_ = std::thread([this] { loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!background_) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_idle(lock);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CheckpointWriter::wait_idle(std::unique_lock<std::mutex>& lock) {
  wall_clock().wait_for(lock, cv_, kForever, [&] { return !job_.has_value(); });
}

void CheckpointWriter::submit(std::string path, int64_t step, CheckpointData data, double snapshot_s, double waited_s) {
  Job job{{std::move(path), step, 0, snapshot_s, waited_s, 0}, std::move(data)};
  if (!background_) {
    write(job);
    finish();
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_idle(lock);
    held_ = job.data.bytes();
    live_ = job.data.live;
    job_ = std::move(job);
  }
  cv_.notify_all();
}

double CheckpointWriter::finish() {
  const double t0 = wall_clock().now();
  std::unique_lock<std::mutex> lock(mu_);
  if (background_) wait_idle(lock);
  if (failed_) std::rethrow_exception(std::exchange(failed_, nullptr));
  return wall_clock().now() - t0;
}

void CheckpointWriter::prepare(size_t params, const std::vector<std::string>& optimizer_buffers) {
  if (!background_ || params == 0) return;  // a simulated peer: the first snapshot makes them
  Job job;
  job.prepare_floats = params;
  job.prepare_names = optimizer_buffers;
  {
    std::unique_lock<std::mutex> lock(mu_);
    wait_idle(lock);
    job_ = std::move(job);
  }
  cv_.notify_all();
}

LiveSnapshot::Fenced CheckpointWriter::fence() {
  std::shared_ptr<LiveSnapshot> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live = live_;
  }
  if (!live) return {};
  // Outside the lock: the writer may need it to finish a chunk (end_chunk) meanwhile.
  const LiveSnapshot::Fenced f = live->freeze();
  if (f.waited_bytes > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    keep_copies_ = true;
  }
  return f;
}

bool CheckpointWriter::keeps_copies() const {
  std::lock_guard<std::mutex> lock(mu_);
  return keep_copies_;
}

bool CheckpointWriter::make_spare(CheckpointData& d, size_t floats, const std::vector<std::string>& names) {
  try {
    resize_for_copy(d.params, floats);
    for (const auto& name : names) resize_for_copy(d.optimizer.buffers[name], floats);
  } catch (const std::bad_alloc&) {
    d = CheckpointData{};
    return false;
  }
  return true;
}

uint64_t CheckpointWriter::held_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return held_ + spare_.bytes();
}

CheckpointData CheckpointWriter::take_spare() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(spare_, CheckpointData{});
}

void CheckpointWriter::loop() {
  // The lowest priority: the steps' threads keep the cores, this one takes what they
  // leave (a write is due only by the next checkpoint). Not fatal where it is refused.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wall_clock().wait_for(lock, cv_, kForever, [&] { return stopping_ || job_.has_value(); });
    if (!job_) return;  // stopping, nothing left
    lock.unlock();
    write(*job_);  // job_ is this thread's until it is reset below
    lock.lock();
    job_.reset();
    live_.reset();
    held_ = 0;
    cv_.notify_all();
  }
}

void CheckpointWriter::write(Job& job) {
  if (job.prepare_floats > 0) {
    // Made here, on huge pages, every page touched (zeroed): resident before they are needed.
    CheckpointData d;
    if (!make_spare(d, job.prepare_floats, job.prepare_names)) return;  // no room now: the first snapshot tries again
    std::lock_guard<std::mutex> lock(mu_);
    spare_ = std::move(d);
    return;
  }
  const double t0 = wall_clock().now();
  try {
    job.what.file_bytes = write_checkpoint(job.what.path, std::move(job.data));
  } catch (...) {
    // The live state is not read again, and the buffers go: a fence under way finishes first.
    if (job.data.live) job.data.live->detach();
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = std::current_exception();
    return;
  }
  if (job.data.live) {
    job.data.live->detach();
    const LiveSnapshot::Fenced f = job.data.live->fenced();
    job.what.copied_bytes = f.copied_bytes;
    job.what.fence_waited_bytes = f.waited_bytes;
    job.what.fence_s = f.seconds;
    bool make = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      make = keep_copies_ && job.data.params.empty();
    }
    if (make) {
      // A fence waited for this write: copies from the next checkpoint on, made now, here.
      std::vector<std::string> names;
      size_t floats = 0;
      for (const auto& v : job.data.live->views()) {
        if (v.name == "params") floats = v.n;
        else names.push_back(v.name);
      }
      make_spare(job.data, floats, names);
    }
    job.data.live.reset();
  }
  // Its buffers stay for the next snapshot to copy into; the message goes.
  job.data.message.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    spare_ = std::move(job.data);
  }
  job.what.write_s = wall_clock().now() - t0;
  if (done_) done_(job.what);
}

}  // namespace hearsay
