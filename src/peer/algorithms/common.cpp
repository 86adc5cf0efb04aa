#include <chrono>

#include "../algorithm.h"

namespace hearsay {

BatchStats gradient_only(GossipEngine& e, const float* x, const int32_t* labels, int batch) {
  const auto t0 = std::chrono::steady_clock::now();
  const BatchStats s = e.model().forward_backward(x, labels, batch);
  e.add_compute_time(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return s;
}

BatchStats local_step(GossipEngine& e, const float* x, const int32_t* labels, int batch, float lr) {
  const BatchStats s = gradient_only(e, x, labels, batch);
  e.sgd().step(e.model().params(), e.model().grads(), lr);
  return s;
}

std::vector<float> ring_allreduce(GossipEngine& e, std::vector<float> v, uint64_t round) {
  const int n = static_cast<int>(e.peers().size());
  const int me = e.me();
  const int right = (me + 1) % n, left = (me + n - 1) % n;
  const size_t len = v.size();
  auto chunk_begin = [&](int c) { return len * static_cast<size_t>(c) / n; };
  auto chunk = [&](int c) {
    return std::vector<float>(v.begin() + static_cast<long>(chunk_begin(c)), v.begin() + static_cast<long>(chunk_begin(c + 1)));
  };
  // Reduce-scatter: after n-1 phases this peer holds the full sum of chunk me+1.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = ((me - s) % n + n) % n;
    const int recv_c = ((me - s - 1) % n + n) % n;
    e.send(right, wire::GRADIENT, chunk(send_c), 0, true, round, static_cast<uint32_t>(s), false, chunk_begin(send_c), len);
    const auto m = e.wait_sync(left, round, static_cast<uint32_t>(s));
    const size_t b = chunk_begin(recv_c);
    for (size_t i = 0; i < m.data.size() && b + i < len; ++i) v[b + i] += m.data[i];
  }
  // All-gather: pass the finished chunks around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = ((me + 1 - s) % n + n) % n;
    const int recv_c = ((me - s) % n + n) % n;
    const uint32_t phase = static_cast<uint32_t>(n - 1 + s);
    e.send(right, wire::GRADIENT, chunk(send_c), 0, true, round, phase, false, chunk_begin(send_c), len);
    const auto m = e.wait_sync(left, round, phase);
    const size_t b = chunk_begin(recv_c);
    for (size_t i = 0; i < m.data.size() && b + i < len; ++i) v[b + i] = m.data[i];
  }
  return v;
}

}  // namespace hearsay
