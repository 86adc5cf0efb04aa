#include "live_snapshot.h"

#include <algorithm>
#include <limits>

#include "hearsay/clock.h"
#include "hearsay/error.h"
#include "../util/host_memory.h"

namespace hearsay {

namespace {
constexpr double kForever = std::numeric_limits<double>::infinity();
}  // namespace

void LiveSnapshot::add(const std::string& name, const float* live, size_t n, std::vector<float>* copy) {
  std::lock_guard<std::mutex> lock(mu_);
  HEARSAY_CHECK(!frozen_, "a live snapshot's buffer added after its freeze");
  HEARSAY_CHECK(copy == nullptr || copy->size() == n, "a live snapshot's copy of another length");
  // Mixed, a writer waiting for a copy could hold up a fence waiting for the writer.
  HEARSAY_CHECK(buffers_.empty() || (buffers_.front().copy != nullptr) == (copy != nullptr),
                "a live snapshot with copies for some buffers only");
  buffers_.push_back({name, reinterpret_cast<const char*>(live), copy != nullptr ? reinterpret_cast<char*>(copy->data()) : nullptr,
                      n * sizeof(float)});
}

std::vector<LiveSnapshot::View> LiveSnapshot::views() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<View> out;
  for (const auto& b : buffers_) out.push_back({b.name, reinterpret_cast<const float*>(b.live), b.bytes / sizeof(float)});
  return out;
}

LiveSnapshot::Buffer* LiveSnapshot::find(const void* live) {
  for (auto& b : buffers_) {
    if (b.live == live) return &b;
  }
  return nullptr;
}

bool LiveSnapshot::all_read() const {
  return std::all_of(buffers_.begin(), buffers_.end(), [](const Buffer& b) { return b.read_to >= b.bytes; });
}

const char* LiveSnapshot::begin_chunk(const void* live, uint64_t at, size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  Buffer* b = find(live);
  if (b == nullptr) return static_cast<const char*>(live) + at;
  HEARSAY_CHECK(at + n <= b->bytes, "a live snapshot's chunk past its buffer");
  if (!frozen_ || b->copy == nullptr) {
    // Marked read before it is: a freeze() from now on waits for this chunk, then copies
    // only what lies past it. (Without copies a freeze() waits for every chunk, so the
    // live state is still held still here.)
    reading_ = true;
    b->read_to = std::max(b->read_to, at + n);
    return b->live + at;
  }
  wall_clock().wait_for(lock, cv_, kForever, [&] { return copied_; });
  return b->copy + at;
}

void LiveSnapshot::end_chunk() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reading_ = false;
  }
  cv_.notify_all();
}

LiveSnapshot::Fenced LiveSnapshot::freeze() {
  const double t0 = wall_clock().now();
  std::unique_lock<std::mutex> lock(mu_);
  if (frozen_) return {};
  frozen_ = true;
  const bool with_copies = !buffers_.empty() && buffers_.front().copy != nullptr;
  Fenced f;
  if (!with_copies) {
    for (const auto& b : buffers_) f.waited_bytes += b.bytes - std::min(b.bytes, b.read_to);
  }
  // The chunk under way is read to its end (a few milliseconds); without copies, every
  // chunk is (the writer has the cores while this thread waits).
  wall_clock().wait_for(lock, cv_, kForever, [&] { return detached_ || (!reading_ && (with_copies || all_read())); });
  if (with_copies && !detached_) {
    lock.unlock();
    // No lock while copying: the writer waits for copied_, and nothing else changes read_to.
    for (auto& b : buffers_) {
      if (b.read_to >= b.bytes) continue;
      copy_on_all_cores(b.copy + b.read_to, b.live + b.read_to, b.bytes - b.read_to);
      f.copied_bytes += b.bytes - b.read_to;
    }
    lock.lock();
  }
  copied_ = true;
  f.seconds = wall_clock().now() - t0;
  fenced_ = f;
  lock.unlock();
  cv_.notify_all();
  return f;
}

LiveSnapshot::Fenced LiveSnapshot::fenced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fenced_;
}

void LiveSnapshot::detach() {
  std::unique_lock<std::mutex> lock(mu_);
  detached_ = true;
  cv_.notify_all();
  wall_clock().wait_for(lock, cv_, kForever, [&] { return !frozen_ || copied_; });
  frozen_ = copied_ = true;
}

}  // namespace hearsay
