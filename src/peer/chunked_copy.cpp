#include "chunked_copy.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "hearsay/backend.h"
#include "hearsay/clock.h"

namespace hearsay {

ChunkedCopy::ChunkedCopy(const float* from, size_t n, std::shared_ptr<std::vector<float>> into, size_t chunk_floats)
    : from_(from),
      n_(n),
      chunk_(std::max<size_t>(1, chunk_floats)),
      chunks_((n + chunk_ - 1) / chunk_),
      into_(std::move(into)),
      squares_(chunks_, 0.0) {
  if (!into_) into_ = std::make_shared<std::vector<float>>();
}

void ChunkedCopy::size_buffer() {
  std::call_once(sized_, [this] { into_->resize(n_); });
}

void ChunkedCopy::help() {
  if (next_.load() >= chunks_) return;  // all claimed: the buffer may be handed over already
  size_buffer();
  for (size_t c = next_.fetch_add(1); c < chunks_; c = next_.fetch_add(1)) {
    const size_t begin = c * chunk_, len = std::min(chunk_, n_ - begin);
    std::memcpy(into_->data() + begin, from_ + begin, len * sizeof(float));
    squares_[c] = host_sum_squares(into_->data() + begin, len);
    chunk_done();
  }
}

void ChunkedCopy::chunk_done() {
  if (claimed_done_.fetch_add(1) + 1 == chunks_) {
    std::lock_guard<std::mutex> lock(mu_);  // the waiter checks under it: no lost wake-up
    done_cv_.notify_all();
  }
}

void ChunkedCopy::wait_for_all_claimed() {
  std::unique_lock<std::mutex> lock(mu_);
  wall_clock().wait_for(lock, done_cv_, std::numeric_limits<double>::infinity(),
                        [this] { return claimed_done_.load() >= chunks_; });
}

std::shared_ptr<const std::vector<float>> ChunkedCopy::finish(double& sum_squares) {
  size_buffer();  // a copy of nothing (n = 0) is still a buffer of n
  help();
  wait_for_all_claimed();
  sum_squares = 0;
  for (const double s : squares_) sum_squares += s;
  return std::move(into_);
}

void ChunkedCopy::cancel() {
  // Claims what is left (counted done, never copied), then waits for the chunks begun.
  for (size_t c = next_.fetch_add(1); c < chunks_; c = next_.fetch_add(1)) chunk_done();
  wait_for_all_claimed();
}

}  // namespace hearsay
