// GossipEngine's copy of the parameters between a framework's steps (copy_between_steps): a
// helper thread copies them while the framework computes the next gradient.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <limits>
#include <cmath>
#include <thread>

#include "hearsay/clock.h"
#include "algorithm.h"
#include "hearsay/build_config.h"
#include "hearsay/error.h"
#include "chunked_copy.h"
#include "mailboxes.h"

namespace hearsay {

std::shared_ptr<const std::vector<float>> GossipEngine::snapshot_params() {
  return std::make_shared<const std::vector<float>>(model_.get_params());
}

void GossipEngine::copy_between_steps(bool on) {
  if (!on || copy_between_steps_ || !model_.backend().is_host() || clock_.simulated()) return;
  copy_between_steps_ = true;
  copier_ = std::thread([this] {
#ifdef __linux__
    // Throughput work, not latency: as a batch thread it never preempts the framework's
    // thread when it wakes (SCHED_BATCH needs no privilege; where refused, it stays as it is).
    sched_param none{};
    pthread_setschedparam(pthread_self(), SCHED_BATCH, &none);
#endif
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(copy_mu_);
    for (;;) {
      // The copier runs only on real time (copy_between_steps), where clock_ is real.
      clock_.wait_for(lock, copy_cv_, std::numeric_limits<double>::infinity(),
                      [&] { return copy_quit_ || copy_jobs_ != seen; });
      if (copy_quit_) return;
      seen = copy_jobs_;
      std::shared_ptr<ChunkedCopy> job = copy_job_;
      lock.unlock();
      if (job) job->help();
      lock.lock();
    }
  });
}

std::shared_ptr<std::vector<float>> GossipEngine::copy_buffer() {
  for (const auto& b : copy_buffers_) {
    if (b.use_count() == 1) return b;  // held by this list alone: no send, no snapshot reads it
  }
  // Three: when the next copy begins, this step's snapshot is still held, and so may be
  // the one before it (an adpsgd request's model, kept until the answer comes).
  if (copy_buffers_.size() >= 3) copy_buffers_.erase(copy_buffers_.begin());
  copy_buffers_.push_back(std::make_shared<std::vector<float>>());
  return copy_buffers_.back();
}

std::shared_ptr<const std::vector<float>> GossipEngine::take_copy() {
  std::shared_ptr<ChunkedCopy> job;
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    job = std::move(copy_job_);
  }
  if (!job) return nullptr;
  // The helper may not have had a core since the step ended (the framework's threads
  // held them all): waiting for it could last a whole step (bench/torch_overhead.py, 2
  // torch peers on 2 cores), so this thread copies every chunk not yet begun.
  return job->finish(copy_sq_);
}

void GossipEngine::cancel_copy() {
  std::shared_ptr<ChunkedCopy> job;
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    job = std::move(copy_job_);
  }
  if (job) job->cancel();
}

std::shared_ptr<const std::vector<float>> GossipEngine::start_snapshot() {
  if (!start_snapshot_) start_snapshot_ = snapshot_params();
  return start_snapshot_;
}

void GossipEngine::stop_copying() {
  if (!copier_.joinable()) return;
  cancel_copy();  // the chunks under way finish first: they read the parameters
  {
    std::lock_guard<std::mutex> lock(copy_mu_);
    copy_quit_ = true;
  }
  copy_cv_.notify_all();
  copier_.join();
  copy_between_steps_ = false;
}

void GossipEngine::params_written() {
  if (copy_between_steps_) cancel_copy();  // a copy of what the parameters were is not wanted
  params_sq_ = -1;
}

}  // namespace hearsay
