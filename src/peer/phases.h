// The phases of synchronous messages, divided once among their users. A synchronous message
// is keyed by (round, phase); each user below owns a range of phases, the ranges are
// disjoint (checked here, at compile time), and no other file carves phases of its own: a
// user asks for its range's phases by offset (PhaseRange::at).
#pragma once
#include <cstdint>
#include <limits>

namespace hearsay {

struct PhaseRange {
  uint32_t first = 0, size = 0;
  constexpr uint32_t at(uint32_t offset) const { return first + offset; }
  constexpr uint32_t end() const { return first + size; }
  constexpr bool holds(uint32_t phase) const { return phase - first < size; }
};
constexpr bool disjoint(PhaseRange a, PhaseRange b) { return a.end() <= b.first || b.end() <= a.first; }

// An algorithm's collectives: each all-reduce from its phase0 on (a ring of n peers takes
// phase0 .. phase0 + 2 n + 1 at most; collectives.cpp checks it stays inside).
inline constexpr PhaseRange kAlgorithmPhases{0, 1u << 20};
// Site replicas (site_replicas.cpp), one range each: the site's gradient ring, a view
// change's decision and its alive messages, the speed split's sums, the leader's update in
// parts. A view change's epoch e moves every one of them by e x kSiteEpochStride, so that
// what an attempt given up left in flight never meets the next one's messages.
inline constexpr PhaseRange kSiteRingPhases{1u << 20, 1u << 16};
inline constexpr PhaseRange kSiteDecisionPhases{kSiteRingPhases.end(), 1u << 16};
inline constexpr PhaseRange kSiteAlivePhases{kSiteDecisionPhases.end(), 1u << 17};
inline constexpr PhaseRange kSiteSplitPhases{kSiteAlivePhases.end(), 1u << 18};
inline constexpr PhaseRange kSiteModelPhases{kSiteSplitPhases.end(), 1u << 19};
// Every site phase of every epoch, and only those: bit 20 set.
constexpr bool is_site_phase(uint32_t phase) { return (phase & kSiteRingPhases.first) != 0; }
inline constexpr uint32_t kSiteEpochStride = 1u << 22;
inline constexpr uint32_t kMaxSiteEpoch = std::numeric_limits<uint32_t>::max() / kSiteEpochStride;
// An external peer's shared buffers (external_peer.cpp): their all-reduce of a step's round.
inline constexpr PhaseRange kBufferPhases{1u << 21, 1u << 20};

// An external peer's collectives (external_collectives.cpp): the final consensus at
// finish() and the script's own all_reduce and barrier.
inline constexpr PhaseRange kEndPhases{1u << 22, 1u << 20};
// The final consensus's round (no step's, no collective's of a script: those count from 1;
// below the join's, the largest) and its first word: "this peer has finished" (or leaves).
// The engine reads a neighbour whose word is held as gone from training.
inline constexpr uint64_t kFinalRound = std::numeric_limits<uint64_t>::max() - 1;
inline constexpr uint32_t kFinishedPhase = kEndPhases.at(0);
// Bit parity (engine_parity.cpp): a step's digests, and the model a repaired peer takes.
inline constexpr PhaseRange kParityPhases{(1u << 22) + (1u << 21), 8};

static_assert(disjoint(kAlgorithmPhases, kSiteRingPhases) && disjoint(kAlgorithmPhases, kBufferPhases));
static_assert(disjoint(kParityPhases, kEndPhases) && disjoint(kParityPhases, kBufferPhases) &&
              disjoint(kParityPhases, kAlgorithmPhases) && !is_site_phase(kParityPhases.first) &&
              !is_site_phase(kParityPhases.end() - 1));
static_assert(disjoint(kEndPhases, kBufferPhases) && disjoint(kEndPhases, kAlgorithmPhases) &&
              !is_site_phase(kEndPhases.first) && !is_site_phase(kEndPhases.end() - 1),
              "bit 20 clear throughout: never a site's phase of any epoch");
static_assert(kSiteModelPhases.end() == kBufferPhases.first, "the site's ranges fill bit 20's half, below the buffers'");
static_assert(disjoint(kSiteRingPhases, kBufferPhases) && disjoint(kSiteModelPhases, kBufferPhases));
// Moved by an epoch, a site phase keeps bit 20 and stays clear of bit 21: never a buffer's
// phase, never an algorithm's.
static_assert(kSiteEpochStride > kBufferPhases.end() - 1 && (kSiteEpochStride & (kBufferPhases.first | kSiteRingPhases.first)) == 0);
static_assert(!is_site_phase(kBufferPhases.first) && !is_site_phase(kBufferPhases.end() - 1) &&
              !is_site_phase(kAlgorithmPhases.end() - 1));

}  // namespace hearsay
