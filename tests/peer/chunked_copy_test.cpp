// The copy a step and the helper thread make together (src/peer/chunked_copy.h).
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "hearsay/backend.h"
#include "../../src/peer/chunked_copy.h"

using namespace hearsay;

namespace {

std::vector<float> ramp(size_t n) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  return x;
}

// The sum of squares as the copy adds it up: chunk by chunk, in order.
double chunked_squares(const std::vector<float>& x, size_t chunk) {
  double s = 0;
  for (size_t b = 0; b < x.size(); b += chunk) s += host_sum_squares(x.data() + b, std::min(chunk, x.size() - b));
  return s;
}

}  // namespace

TEST_CASE("chunked copy: the step alone copies every chunk, the last one short, with the chunks' sum of squares") {
  const auto x = ramp(1000);
  ChunkedCopy job(x.data(), x.size(), nullptr, 64);
  double sq = -1;
  const auto copy = job.finish(sq);
  REQUIRE(copy->size() == x.size());
  CHECK(std::memcmp(copy->data(), x.data(), 4 * x.size()) == 0);
  CHECK(sq == chunked_squares(x, 64));
}

TEST_CASE("chunked copy: a helper and the step copying at once give the same bytes and the same sum, bit for bit") {
  const auto x = ramp(size_t{3} << 20);
  ChunkedCopy alone(x.data(), x.size(), nullptr, 4096);
  double sq_alone = 0;
  const auto a = alone.finish(sq_alone);
  for (int trial = 0; trial < 4; ++trial) {
    auto job = std::make_shared<ChunkedCopy>(x.data(), x.size(), nullptr, 4096);
    std::thread helper([job] { job->help(); });
    double sq = 0;
    const auto b = job->finish(sq);  // returns only once the helper's chunks are in too
    helper.join();
    CHECK(std::memcmp(b->data(), x.data(), 4 * x.size()) == 0);
    CHECK(sq == sq_alone);
  }
}

TEST_CASE("chunked copy: a buffer given is filled in place, so its pages are not faulted in again") {
  const auto x = ramp(5000);
  auto buffer = std::make_shared<std::vector<float>>(5000, 7.0f);
  const float* before = buffer->data();
  ChunkedCopy job(x.data(), x.size(), buffer, 512);
  double sq = 0;
  const auto copy = job.finish(sq);
  CHECK(copy->data() == before);
  CHECK((*copy)[4999] == x[4999]);
}

TEST_CASE("chunked copy: cancel leaves the chunks not begun uncopied and returns once none is under way") {
  const auto x = ramp(size_t{1} << 20);
  auto buffer = std::make_shared<std::vector<float>>(x.size(), 7.0f);
  auto job = std::make_shared<ChunkedCopy>(x.data(), x.size(), buffer, 1024);
  job->cancel();
  job->help();  // a helper coming late finds nothing to claim
  CHECK((*buffer)[0] == 7.0f);
  CHECK((*buffer)[x.size() - 1] == 7.0f);
}
