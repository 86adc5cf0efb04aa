// All-reduce for the synchronous baselines, as a user would run it across sites:
// - flat (one site): reduce-scatter around a ring, each hop's partial sum encoded with the
//   comparison's codec and summed in fp32 on arrival; then each chunk's owner encodes its
//   finished chunk once and sends the same bytes to every other peer (the bytes of a ring
//   all-gather, one hop instead of n-1), so every peer holds bit-identical results;
// - hierarchical (peers in two or more sites): every peer sends its vector (encoded) to
//   its site's leader (the site's first peer), the leaders all-reduce among themselves
//   (the only traffic that crosses the WAN), and each leader sends the result to its
//   site as fp32 (exact, so every site ends with the leaders' bits);
// - across sites (the leaders, or every peer when each is a site of its own) the
//   reduce-scatter is direct: each member sends each other member that member's chunk
//   at once, and sums the chunks it receives in the members' order. The same bytes as
//   the ring's (n-1 chunks out, n-1 in), but two WAN latencies an all-reduce instead of
//   n: around 16 sites 50-120 ms apart, a ring's 15 hops in turn cost a second and more
//   an all-reduce, which would make the baseline slow by construction. Inside a site the
//   ring stays (a LAN's latency is not what limits it, and one flow a peer is kinder);
// - inside a site (site_step's per-step sum) the all-gather goes around the ring too: one
//   flow a peer at any time instead of n-1 (a site of 64 would otherwise start 64 x 63
//   flows at once every step, which the LAN carries no faster and a flow-level network
//   simulation pays for quadratically), at the cost of n-2 more LAN latencies a step.
// Codecs: none (fp32), fp16, bf16, int8 and int4, without error feedback (as PyTorch DDP's
// fp16/bf16 compression hooks); PowerSGD has its own rule (powersgd_allreduce.cpp).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "../algorithm.h"

namespace hearsay {

// The collective as a plan of posts and takes (posts never wait; a take waits for one
// message), run in order: at once (allreduce_sum), or as far as the messages that have
// arrived allow, a piece between training steps (AllReduce::progress).
struct AllReduce::Op {
  enum Type { kPost, kTake } type;
  std::vector<int> peers;  // post: to whom; take: from whom (one)
  size_t offset = 0, len = 0;
  uint32_t phase = 0;
  bool exact = false;   // post: as fp32 whatever the codec
  bool forward = false; // post: passes on values that arrived, leaving v as it is
  bool assign = false;  // take: copy into v instead of adding
};

namespace {

// All-gather: group[me] owns the finished chunk [offset, offset + len) and sends it, encoded
// once, to every other member; each member's chunk is copied in as it arrives.
void plan_all_gather(std::vector<AllReduce::Op>& plan, const std::vector<int>& group, int me, size_t offset, size_t len,
                     uint32_t phase) {
  using Op = AllReduce::Op;
  std::vector<int> others;
  for (int k = 0; k < static_cast<int>(group.size()); ++k) {
    if (k != me) others.push_back(group[k]);
  }
  plan.push_back(Op{.type = Op::kPost, .peers = others, .offset = offset, .len = len, .phase = phase});
  for (int k = 0; k < static_cast<int>(group.size()); ++k) {
    if (k != me) plan.push_back(Op{.type = Op::kTake, .peers = {group[k]}, .phase = phase, .assign = true});
  }
}

// A group's n chunks of a vector of len floats (chunk k is [begin(k), begin(k + 1)), k taken
// modulo n) and this peer's place in the group.
struct Chunks {
  size_t len;
  int n, me;
  Chunks(size_t len_, int me_peer, const std::vector<int>& group)
      : len(len_), n(static_cast<int>(group.size())),
        me(static_cast<int>(std::find(group.begin(), group.end(), me_peer) - group.begin())) {}
  size_t begin(int k) const { return len * static_cast<size_t>(((k % n) + n) % n) / static_cast<size_t>(n); }
  size_t size(int k) const {
    const size_t c = static_cast<size_t>(((k % n) + n) % n);
    return len * (c + 1) / static_cast<size_t>(n) - len * c / static_cast<size_t>(n);
  }
};

// All-gather around the ring: after the reduce-scatter this peer (ring[me]) holds the
// finished chunk me+1. Phase s (0 .. n-2) sends chunk me+1-s right and takes chunk me-s
// from the left: first its own finished chunk, encoded once (as every all-gather's owner
// does), then each chunk as it came in, passed on unchanged.
void plan_ring_gather(std::vector<AllReduce::Op>& plan, const Chunks& c, const std::vector<int>& ring, uint32_t phase0) {
  using Op = AllReduce::Op;
  const int me = c.me, n = c.n;
  const int right = ring[(me + 1) % n], left = ring[(me + n - 1) % n];
  for (int s = 0; s < n - 1; ++s) {
    const uint32_t phase = phase0 + static_cast<uint32_t>(s);
    plan.push_back(Op{.type = Op::kPost, .peers = {right}, .offset = c.begin(me + 1 - s), .len = c.size(me + 1 - s), .phase = phase,
                      .forward = s > 0});
    plan.push_back(Op{.type = Op::kTake, .peers = {left}, .phase = phase, .assign = true});
  }
}

// Sum over `ring` (peer indices; this peer among them) of every member's v; phases
// phase0 .. phase0 + ring.size() - 1 (phase0 + 2 ring.size() - 3 with ring_gather).
void plan_ring_sum(std::vector<AllReduce::Op>& plan, size_t len, int me_peer, const std::vector<int>& ring,
                   uint32_t phase0, bool ring_gather) {
  using Op = AllReduce::Op;
  const Chunks c(len, me_peer, ring);
  if (c.n < 2) return;
  const int me = c.me, n = c.n;
  const int right = ring[(me + 1) % n], left = ring[(me + n - 1) % n];
  // Reduce-scatter: after n-1 phases this peer holds the whole sum of chunk me+1. (A
  // chunk sent here is overwritten by the all-gather, so post's rounding of it is moot.)
  for (int s = 0; s < n - 1; ++s) {
    const uint32_t phase = phase0 + static_cast<uint32_t>(s);
    plan.push_back(Op{.type = Op::kPost, .peers = {right}, .offset = c.begin(me - s), .len = c.size(me - s), .phase = phase});
    plan.push_back(Op{.type = Op::kTake, .peers = {left}, .phase = phase});
  }
  if (ring_gather) {
    plan_ring_gather(plan, c, ring, phase0 + static_cast<uint32_t>(n - 1));
  } else {
    plan_all_gather(plan, ring, me, c.begin(me + 1), c.size(me + 1), phase0 + static_cast<uint32_t>(n - 1));
  }
}

// Sum over `group` of every member's v, the reduce-scatter direct: phase phase0 carries
// every chunk to its owner (chunk k is owned by group[k]), phase0 + 1 the all-gather.
void plan_direct_sum(std::vector<AllReduce::Op>& plan, size_t len, int me_peer, const std::vector<int>& group,
                     uint32_t phase0) {
  using Op = AllReduce::Op;
  const Chunks c(len, me_peer, group);
  if (c.n < 2) return;
  for (int k = 0; k < c.n; ++k) {
    if (k != c.me) plan.push_back(Op{.type = Op::kPost, .peers = {group[k]}, .offset = c.begin(k), .len = c.size(k), .phase = phase0});
  }
  // Summed in the members' order, the same on every owner whatever order they arrive in.
  for (int k = 0; k < c.n; ++k) {
    if (k != c.me) plan.push_back(Op{.type = Op::kTake, .peers = {group[k]}, .phase = phase0});
  }
  plan_all_gather(plan, group, c.me, c.begin(c.me), c.size(c.me), phase0 + 1);
}

}  // namespace

AllReduce::AllReduce(GossipEngine& e, MessageKind kind, std::vector<float> v, uint64_t round, uint32_t phase0,
                     bool compressed, ReduceScope scope, const std::string& codec)
    : e_(e), kind_(kind), owned_(std::move(v)), v_(owned_.data()), n_(owned_.size()), round_(round), codec_(codec),
      raw_(!compressed || (codec.empty() ? e.spec().codec.name : codec) == "none") {
  plan(phase0, scope);
}

AllReduce::AllReduce(GossipEngine& e, MessageKind kind, float* v, size_t n, uint64_t round, uint32_t phase0, bool compressed,
                     ReduceScope scope, const std::string& codec)
    : e_(e), kind_(kind), v_(v), n_(n), round_(round), codec_(codec),
      raw_(!compressed || (codec.empty() ? e.spec().codec.name : codec) == "none") {
  plan(phase0, scope);
}

void AllReduce::plan(uint32_t phase0, ReduceScope scope) {
  GossipEngine& e = e_;
  const int n = static_cast<int>(e.peers().size());
  reference_norm_ = e.sync_reference_norm(v_, n_);
  // A collective's phases run phase0 .. phase0 + n + 1 (a site's, with its ring all-gather,
  // up to phase0 + 2 n - 3); those of the per-step site sums (site_step) start at
  // kAlgorithmPhases.end() (phases.h), so the two never share a (round, phase) key.
  HEARSAY_CHECK(phase0 >= kAlgorithmPhases.end() || phase0 + 2 * static_cast<uint32_t>(n) + 2 < kAlgorithmPhases.end(),
                "all-reduce: phase " + std::to_string(phase0) + " would reach the site sums' phases");
  const std::vector<int> site = my_site(e);
  if (scope == ReduceScope::kSite) {
    plan_ring_sum(plan_, n_, e.me(), site, phase0, true);
    return;
  }
  const std::map<int, std::vector<int>> sites = peers_by_site(e);
  std::vector<int> everyone(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) everyone[static_cast<size_t>(i)] = i;
  if (sites.size() < 2) {
    plan_ring_sum(plan_, n_, e.me(), everyone, phase0, false);
    return;
  }
  if (sites.size() == static_cast<size_t>(n)) {
    plan_direct_sum(plan_, n_, e.me(), everyone, phase0);  // every peer a site
    return;
  }
  const int leader = site.front();
  std::vector<int> leaders;
  for (const auto& [s, members] : sites) leaders.push_back(members.front());
  const uint32_t up = phase0, across = phase0 + 1, down = phase0 + 1 + static_cast<uint32_t>(leaders.size());
  if (e.me() != leader) {
    // v is replaced by the site's result.
    plan_.push_back(Op{.type = Op::kPost, .peers = {leader}, .offset = 0, .len = n_, .phase = up});
    plan_.push_back(Op{.type = Op::kTake, .peers = {leader}, .phase = down, .assign = true});
    return;
  }
  for (size_t k = 1; k < site.size(); ++k) plan_.push_back(Op{.type = Op::kTake, .peers = {site[k]}, .phase = up});
  plan_direct_sum(plan_, n_, e.me(), leaders, across);
  // Down inside the site as fp32: a re-encoding would differ between sites (codecs with
  // random rounding), and the site's own links are not the WAN.
  const std::vector<int> members(site.begin() + 1, site.end());
  if (!members.empty()) {
    plan_.push_back(Op{.type = Op::kPost, .peers = members, .offset = 0, .len = n_, .phase = down, .exact = true});
  }
}

AllReduce::~AllReduce() = default;

GossipEngine::Message AllReduce::header(size_t offset, uint32_t phase) const {
  return {.kind = kind_, .synchronous = true, .round = round_, .phase = phase, .offset = offset, .total = n_};
}

// Sends v[offset, offset + len) to each of op.peers as (round, phase): encoded once, the
// same bytes to all, and the decoded values replace v's, so the sender holds what the
// receivers will; as fp32 when raw, or exact. A forward passes on values that are already
// final (decoded on arrival) and must reach the next peer bit for bit: encoded when the
// codec gives them back unchanged (fp16 and bf16 by construction; int8 and int4 as a rule,
// their scale recomputed from decoded values coming back the same), else as fp32, a guard
// for the chunk or the codec that would re-round.
void AllReduce::post(const Op& op) {
  float* part = v_ + op.offset;
  if (raw_ || op.exact) {
    // One copy for every receiver (each link reads it).
    const auto shared = std::make_shared<const std::vector<float>>(part, part + op.len);
    for (int j : op.peers) e_.send_shared(j, header(op.offset, op.phase), shared);
    return;
  }
  if (op.forward) {
    const std::vector<float> values(part, part + op.len);
    auto enc = e_.encode_once(values, op.offset, codec_);
    const bool unchanged = enc->decoded.size() == values.size() &&
                           std::memcmp(enc->decoded.data(), values.data(), sizeof(float) * values.size()) == 0;
    for (int j : op.peers) {
      if (unchanged) {
        e_.send_encoded(j, header(op.offset, op.phase), enc);
      } else {
        e_.send(j, header(op.offset, op.phase), values);
      }
    }
    return;
  }
  // Encoded once, the same bytes to all; v's part becomes what they decode (no copy of
  // the part, no decoded copy beside it).
  const auto enc = e_.encode_in_place(part, op.len, op.offset, codec_);
  for (int j : op.peers) e_.send_encoded(j, header(op.offset, op.phase), enc);
}

// Adds (or, with assign, copies) an arrived message into v, once the guard has measured
// it: a part of a sum over at most every peer, so within the ratio of n times this peer's
// own vector. A message kept as its payloads is decoded a segment at a time into v.
void AllReduce::take(const Op& op, const GossipEngine::Message& m) {
  e_.check_sync_part(m, round_, reference_norm_, static_cast<double>(e_.peers().size()));
  e_.for_each_part(m, [&](size_t at, const float* in, size_t count) {
    const size_t b = std::min(static_cast<size_t>(at), n_);
    const size_t n = std::min(count, n_ - b);
    float* out = v_ + b;
    // One loop without branches, so that it is vectorised (every hop of every all-reduce).
    if (op.assign) {
      std::copy(in, in + n, out);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] += in[i];
    }
  });
}

bool AllReduce::progress() {
  while (next_ < plan_.size()) {
    const Op& op = plan_[next_];
    if (op.type == Op::kPost) {
      post(op);
    } else {
      auto m = e_.poll_sync_kept(op.peers.front(), round_, op.phase);
      if (!m) return false;
      take(op, *m);
    }
    ++next_;
  }
  return true;
}

std::vector<float> AllReduce::finish() {
  for (; next_ < plan_.size(); ++next_) {
    const Op& op = plan_[next_];
    if (op.type == Op::kPost) {
      post(op);
    } else {
      take(op, e_.wait_sync_kept(op.peers.front(), round_, op.phase));
    }
  }
  return std::move(owned_);
}

std::vector<float> allreduce_sum(GossipEngine& e, MessageKind kind, std::vector<float> v, uint64_t round, uint32_t phase0,
                                 bool compressed, ReduceScope scope, const std::string& codec) {
  return AllReduce(e, kind, std::move(v), round, phase0, compressed, scope, codec).finish();
}

void allreduce_sum_in_place(GossipEngine& e, MessageKind kind, float* v, size_t n, uint64_t round, uint32_t phase0,
                            bool compressed, ReduceScope scope, const std::string& codec) {
  AllReduce(e, kind, v, n, round, phase0, compressed, scope, codec).finish();
}

std::vector<float> average_models(GossipEngine& e, uint64_t round) {
  auto avg = allreduce_sum(e, MessageKind::kModel, e.params_host(), round, 0, false);
  const float inv = 1.0f / static_cast<float>(e.peers().size());
  for (auto& v : avg) v *= inv;
  return avg;
}

}  // namespace hearsay
