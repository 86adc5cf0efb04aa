// All-reduce for the synchronous baselines, as a user would run it across sites:
// - flat (one site): reduce-scatter around a ring, each hop's partial sum encoded with the
//   comparison's codec and summed in fp32 on arrival; then each chunk's owner encodes its
//   finished chunk once and sends the same bytes to every other peer (the bytes of a ring
//   all-gather, one hop instead of n-1), so every peer holds bit-identical results;
// - hierarchical (peers in two or more sites): every peer sends its vector (encoded) to
//   its site's leader (the site's first peer), the leaders all-reduce as above among
//   themselves (the only traffic that crosses the WAN), and each leader sends the result
//   to its site as fp32 (exact, so every site ends with the leaders' bits).
// Codecs: none (fp32), fp16, bf16 and int8, without error feedback (as PyTorch DDP's
// fp16/bf16 compression hooks); PowerSGD has its own rule (powersgd_allreduce.cpp).
#include <algorithm>
#include <map>

#include "../algorithm.h"

namespace hearsay {
namespace {

struct Collective {
  GossipEngine& e;
  uint64_t round;
  uint64_t total;  // the whole vector's length (offsets are within it)
  bool raw;        // fp32 as it is; else gossip.codec (encode_once)
  MessageKind kind;  // what the vector is: gradients (allreduce, PowerSGD's factors) or models

  // Sends v[offset, offset + len) to each of `to` as (round, phase): encoded once, the
  // same bytes to all, and the decoded values replace v's, so the sender holds what the
  // receivers will; as fp32 when raw, or `exact`.
  void post(const std::vector<int>& to, std::vector<float>& v, size_t offset, size_t len, uint32_t phase, bool exact = false) {
    std::vector<float> part(v.begin() + static_cast<long>(offset), v.begin() + static_cast<long>(offset + len));
    if (raw || exact) {
      for (int j : to) e.send(j, header(offset, phase), part);
      return;
    }
    auto enc = e.encode_once(part, offset);
    for (int j : to) e.send_encoded(j, header(offset, phase), enc);
    std::copy(enc->decoded.begin(), enc->decoded.end(), v.begin() + static_cast<long>(offset));
  }
  GossipEngine::Message header(size_t offset, uint32_t phase) const {
    return {.kind = kind, .synchronous = true, .round = round, .phase = phase, .offset = offset, .total = total};
  }
  // Waits for (round, phase) from `from`; adds (or, with assign, copies) it into v.
  void take(int from, std::vector<float>& v, uint32_t phase, bool assign) {
    const auto m = e.wait_sync(from, round, phase);
    const size_t b = m.offset;
    for (size_t i = 0; i < m.data.size() && b + i < v.size(); ++i) v[b + i] = assign ? m.data[i] : v[b + i] + m.data[i];
  }

  // Sum over `ring` (peer indices; this peer among them) of every member's v; phases
  // phase0 .. phase0 + ring.size() - 1.
  void ring_sum(std::vector<float>& v, const std::vector<int>& ring, uint32_t phase0) {
    const int n = static_cast<int>(ring.size());
    if (n < 2) return;
    const int me = static_cast<int>(std::find(ring.begin(), ring.end(), e.me()) - ring.begin());
    const int right = ring[(me + 1) % n], left = ring[(me + n - 1) % n];
    const size_t len = v.size();
    auto begin = [&](int c) { return len * static_cast<size_t>(((c % n) + n) % n) / n; };
    auto size = [&](int c) {
      const int k = ((c % n) + n) % n;
      return len * static_cast<size_t>(k + 1) / n - len * static_cast<size_t>(k) / n;
    };
    // Reduce-scatter: after n-1 phases this peer holds the whole sum of chunk me+1. (A
    // chunk sent here is overwritten by the all-gather, so post's rounding of it is moot.)
    for (int s = 0; s < n - 1; ++s) {
      post({right}, v, begin(me - s), size(me - s), phase0 + static_cast<uint32_t>(s));
      take(left, v, phase0 + static_cast<uint32_t>(s), false);
    }
    // All-gather: the owner of each finished chunk sends it, encoded once, to everyone.
    const int mine = me + 1;
    std::vector<int> others;
    for (int j : ring) {
      if (j != e.me()) others.push_back(j);
    }
    const uint32_t gather = phase0 + static_cast<uint32_t>(n - 1);
    post(others, v, begin(mine), size(mine), gather);
    for (int k = 0; k < n; ++k) {
      if (k != me) take(ring[k], v, gather, true);
    }
  }
};

}  // namespace

std::vector<float> allreduce_sum(GossipEngine& e, MessageKind kind, std::vector<float> v, uint64_t round, uint32_t phase0,
                                 bool compressed) {
  Collective c{e, round, v.size(), !compressed || e.spec().codec.name == "none", kind};
  const int n = static_cast<int>(e.peers().size());
  const auto& site_of = e.spec().topology.site_of;
  std::map<int, std::vector<int>> sites;  // site index -> its peers, in cluster order
  for (int i = 0; i < n; ++i) sites[site_of.empty() ? 0 : site_of[static_cast<size_t>(i)]].push_back(i);
  std::vector<int> everyone(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) everyone[static_cast<size_t>(i)] = i;
  if (sites.size() < 2 || sites.size() == static_cast<size_t>(n)) {
    c.ring_sum(v, everyone, phase0);
    return v;
  }
  const std::vector<int>& site = sites[site_of[static_cast<size_t>(e.me())]];
  const int leader = site.front();
  std::vector<int> leaders;
  for (const auto& [s, members] : sites) leaders.push_back(members.front());
  const uint32_t up = phase0, across = phase0 + 1, down = phase0 + 1 + static_cast<uint32_t>(leaders.size());
  if (e.me() != leader) {
    c.post({leader}, v, 0, v.size(), up);  // v is then replaced by the site's result
    c.take(leader, v, down, true);
    return v;
  }
  for (size_t k = 1; k < site.size(); ++k) c.take(site[k], v, up, false);
  c.ring_sum(v, leaders, across);
  const std::vector<int> members(site.begin() + 1, site.end());
  // Down inside the site as fp32: a re-encoding would differ between sites (codecs with
  // random rounding), and the site's own links are not the WAN.
  if (!members.empty()) c.post(members, v, 0, v.size(), down, true);
  return v;
}

std::vector<float> average_models(GossipEngine& e, uint64_t round) {
  auto avg = allreduce_sum(e, MessageKind::kModel, e.params_host(), round, 0, false);
  const float inv = 1.0f / static_cast<float>(e.peers().size());
  for (auto& v : avg) v *= inv;
  return avg;
}

}  // namespace hearsay
