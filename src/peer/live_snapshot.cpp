#include "live_snapshot.h"

#include <limits>

#include "hearsay/clock.h"
#include "hearsay/error.h"
#include "../util/host_memory.h"

namespace hearsay {

namespace {
constexpr double kForever = std::numeric_limits<double>::infinity();
}  // namespace

void LiveSnapshot::add(const float* live, std::vector<float>& copy) {
  std::lock_guard<std::mutex> lock(mu_);
  HEARSAY_CHECK(!frozen_, "a live snapshot's buffer added after its freeze");
  buffers_.push_back({reinterpret_cast<const char*>(live), reinterpret_cast<char*>(copy.data()), copy.size() * sizeof(float)});
}

LiveSnapshot::Buffer* LiveSnapshot::find(const void* copy) {
  for (auto& b : buffers_) {
    if (b.copy == copy) return &b;
  }
  return nullptr;
}

const char* LiveSnapshot::begin_chunk(const void* copy, uint64_t at, size_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  Buffer* b = find(copy);
  if (b == nullptr) return static_cast<const char*>(copy) + at;
  HEARSAY_CHECK(at + n <= b->bytes, "a live snapshot's chunk past its buffer");
  if (!frozen_) {
    // Marked read before it is: a freeze() from now on waits for this chunk, then copies
    // only what lies past it.
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

uint64_t LiveSnapshot::freeze() {
  const double t0 = wall_clock().now();
  std::unique_lock<std::mutex> lock(mu_);
  if (frozen_) return 0;
  frozen_ = true;
  // The chunk under way is read from the live state to its end (a few milliseconds).
  wall_clock().wait_for(lock, cv_, kForever, [&] { return !reading_; });
  lock.unlock();
  // No lock while copying: the writer waits for copied_, and nothing else changes read_to.
  uint64_t bytes = 0;
  for (auto& b : buffers_) {
    if (b.read_to >= b.bytes) continue;
    copy_on_all_cores(b.copy + b.read_to, b.live + b.read_to, b.bytes - b.read_to);
    bytes += b.bytes - b.read_to;
  }
  lock.lock();
  copied_ = true;
  copied_bytes_ = bytes;
  freeze_s_ = wall_clock().now() - t0;
  lock.unlock();
  cv_.notify_all();
  return bytes;
}

void LiveSnapshot::detach() {
  std::unique_lock<std::mutex> lock(mu_);
  if (frozen_) wall_clock().wait_for(lock, cv_, kForever, [&] { return copied_; });
  frozen_ = copied_ = true;
}

uint64_t LiveSnapshot::copied_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return copied_bytes_;
}

double LiveSnapshot::freeze_s() const {
  std::lock_guard<std::mutex> lock(mu_);
  return freeze_s_;
}

}  // namespace hearsay
