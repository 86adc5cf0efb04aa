// Bit parity (gossip.parity_check): where an algorithm leaves every peer with the same model
// (allreduce's every step, local_sgd's averages, diloco's outer steps), the peers compare a
// 4-byte digest of it before their next step uses it. A silent corruption (a bit flipped in
// memory, a bad write) would otherwise spread: the next gradient or outer delta computed
// on it enters every peer's sum. The peers that differ from the majority are named, and
// each takes the model from the first peer that holds the majority's digest.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <cstdio>

#include "algorithm.h"
#include "hearsay/process.h"
#include "hearsay/wire.h"
#include "phases.h"

namespace hearsay {

namespace {

// A digest travels as two 16-bit halves, each exact in a float (a message carries floats,
// and a raw bit pattern could be a NaN, which every peer refuses).
std::vector<float> halves(uint32_t digest) {
  return {static_cast<float>(digest >> 16), static_cast<float>(digest & 0xffffu)};
}

bool from_halves(const std::vector<float>& v, uint32_t* digest) {
  if (v.size() != 2) return false;
  for (float x : v) {
    if (!(x >= 0 && x <= 65535 && std::floor(x) == x)) return false;
  }
  *digest = (static_cast<uint32_t>(v[0]) << 16) | static_cast<uint32_t>(v[1]);
  return true;
}

}  // namespace

void GossipEngine::copies_equal() {
  // Named by the steps taken once this one is done (its log's step count).
  if (spec_.parity_check) parity_due_ = static_cast<int64_t>(steps_) + 1;
}

uint32_t GossipEngine::parity_digest() {
  // CRC-32C continued over each part in turn: the model (where it is one of the copies),
  // then the algorithm's equal state, as one stream of bytes (what a repair sends).
  uint32_t crc = 0;
  if (algorithm_->model_equal_at_copies()) {
    if (model_.backend().is_host()) {
      crc = crc32c(model_.params(), sizeof(float) * model_.num_params());
    } else {
      const std::vector<float> p = params_host();
      crc = crc32c(p.data(), sizeof(float) * p.size());
    }
  }
  for (const std::vector<float>* v : algorithm_->equal_state()) crc = crc32c(v->data(), sizeof(float) * v->size(), crc);
  return crc;
}

std::vector<std::vector<float>> GossipEngine::parity_parts() {
  std::vector<std::vector<float>> parts;
  if (algorithm_->model_equal_at_copies()) parts.push_back(params_host());
  for (const std::vector<float>* v : algorithm_->equal_state()) parts.push_back(*v);
  return parts;
}

std::vector<size_t> GossipEngine::parity_part_sizes() {
  std::vector<size_t> sizes;
  if (algorithm_->model_equal_at_copies()) sizes.push_back(model_.num_params());
  for (const std::vector<float>* v : algorithm_->equal_state()) sizes.push_back(v->size());
  return sizes;
}

void GossipEngine::take_parity_parts(const std::vector<std::vector<float>>& parts) {
  size_t k = 0;
  if (algorithm_->model_equal_at_copies()) {
    params_written();  // a helper's copy between steps is of the model being replaced
    set_params_host(parts[k++]);
  }
  for (std::vector<float>* v : algorithm_->equal_state()) *v = parts[k++];
}

void GossipEngine::inject_bit_flip() {
  // The top bit of the mantissa of the middle value of what parity checks first: a change
  // large enough to matter.
  const auto flip = [](float& x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    bits ^= 1u << 22;
    std::memcpy(&x, &bits, sizeof bits);
  };
  const auto state = algorithm_->equal_state();
  if (!algorithm_->model_equal_at_copies() && !state.empty() && !state.front()->empty()) {
    flip((*state.front())[state.front()->size() / 2]);
    return;
  }
  std::vector<float> p = params_host();
  flip(p[p.size() / 2]);
  set_params_host(p);
}

void GossipEngine::check_parity() {
  if (parity_due_ < 0) return;
  const auto round = static_cast<uint64_t>(parity_due_);
  parity_due_ = -1;
  const int n = static_cast<int>(peers_.size());
  const uint32_t phase = kParityPhases.at(0);
  std::vector<uint32_t> digests(static_cast<size_t>(n));
  digests[me_] = parity_digest();
  for (int j = 0; j < n; ++j) {
    // total: the digest's own length, not the model's (a receiver sizes what it holds by it).
    if (j != me_) {
      send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = round, .phase = phase, .total = 2},
           halves(digests[me_]));
    }
  }
  for (int j = 0; j < n; ++j) {
    if (j == me_) continue;
    if (!from_halves(wait_sync(j, round, phase).data, &digests[j])) {
      refuse_sync(j, round, "a parity digest that is not two 16-bit halves");
    }
  }
  // The digest most peers hold (between groups of one size, the group of the lowest index).
  std::map<uint32_t, int> count;
  for (uint32_t d : digests) ++count[d];
  uint32_t majority = digests[0];
  for (int j = 0; j < n; ++j) {
    if (count[digests[j]] > count[majority]) majority = digests[j];
  }
  if (count[majority] == n) return;
  std::vector<std::string> differ;
  for (int j = 0; j < n; ++j) {
    if (digests[j] != majority) differ.push_back(peers_[j]);
  }
  const auto log_parity = [&](const std::string& from, bool repaired) {
    log_.write(log_.event("parity")
                   .add("step", static_cast<int64_t>(round))
                   .add("digest", static_cast<int64_t>(majority))
                   .add("differ", differ)
                   .add("from", from)
                   .add("repaired", repaired));
  };
  if (2 * count[majority] <= n) {
    // No majority (two peers, or an even split): which copy is the altered one cannot be
    // told, and taking either could spread the fault. Said, not repaired; the run goes on.
    log_parity("", false);
    if (!said_no_majority_) {
      said_no_majority_ = true;
      std::fprintf(stderr, "%s: peer %s: the peers' models differ after step %llu and no digest has a majority of the %d "
                           "peers: not repaired (bit parity needs 3 peers or more; each check's parity event says it)\n",
                   program_name().c_str(), peers_[me_].c_str(), static_cast<unsigned long long>(round), n);
    }
    return;
  }
  const int donor = static_cast<int>(std::find(digests.begin(), digests.end(), majority) - digests.begin());
  const bool mine_differs = digests[me_] != majority;
  log_parity(peers_[donor], mine_differs);
  // The repair travels as its parts (the model, each buffer of the algorithm's), one
  // message each: none is longer than the model, which bounds what a receiver takes.
  const std::vector<size_t> sizes = parity_part_sizes();
  HEARSAY_CHECK(sizes.size() < kParityPhases.size, "bit parity: more parts than its phases");
  if (me_ == donor) {
    std::vector<std::vector<float>> parts = parity_parts();
    for (size_t k = 0; k < parts.size(); ++k) {
      const auto part = std::make_shared<const std::vector<float>>(std::move(parts[k]));  // one copy every link reads
      for (int j = 0; j < n; ++j) {
        if (digests[j] == majority) continue;
        send_shared(j, {.kind = MessageKind::kModel, .synchronous = true, .round = round,
                        .phase = kParityPhases.at(1 + static_cast<uint32_t>(k)), .total = part->size()},
                    part);
      }
    }
  }
  if (!mine_differs) return;
  std::vector<std::vector<float>> parts;
  uint32_t crc = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    Message m = wait_sync(donor, round, kParityPhases.at(1 + static_cast<uint32_t>(k)));
    if (m.data.size() != sizes[k]) refuse_sync(donor, round, "a repair part of another size than this peer's");
    // Held to the update guard's bound, as every synchronous part is: at most
    // max_norm_ratio times this peer's own model's norm.
    check_sync_part(m, round, model_norm(), 1.0);
    crc = crc32c(m.data.data(), sizeof(float) * m.data.size(), crc);
    parts.push_back(std::move(m.data));
  }
  if (crc != majority) refuse_sync(donor, round, "a repair whose digest is not the majority's");
  take_parity_parts(parts);
}

}  // namespace hearsay
