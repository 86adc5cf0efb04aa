// An external peer's collectives beyond its algorithm's: the final consensus that
// finish() runs (cluster.final_consensus), so that a cluster ends on one model as DDP's
// ranks do, and the script's own all_reduce and barrier (hearsay.torch's peer.all_reduce,
// peer.barrier). All of them use the phases of kEndPhases, apart from the algorithm's, the
// site's and the buffers', over the links every peer already holds to every other.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "hearsay/error.h"
#include "hearsay/external_peer.h"
#include "hearsay/gossip.h"
#include "hearsay/process.h"
#include "hearsay/transport.h"
#include "algorithm.h"
#include "message.h"
#include "phases.h"

namespace hearsay {

namespace {

// The final consensus's round: no step's, no collective's of the script (those count from
// 1), and not the join's (the largest).
constexpr uint64_t kFinalRound = std::numeric_limits<uint64_t>::max() - 1;
// Phases of kEndPhases: the finish barrier's word, the final average's all-reduce (which
// takes phases from its first on), and the script's collectives.
constexpr uint32_t kFinishedPhase = kEndPhases.at(0);
constexpr uint32_t kScriptPhase = kEndPhases.at(1);
constexpr uint32_t kGoPhase = kEndPhases.at(2);
constexpr uint32_t kAveragePhase = kEndPhases.at(16);

// What a peer says when it reaches finish(): it waits for the consensus, or it leaves
// without it (a signal stopped it). Then, once it has every peer's word: it goes on to
// the average, or it gave up waiting (finish_timeout_s) and leaves. The second word is
// what a peer that finished after the timeout needs: the first one said "finished".
constexpr float kFinished = 1.0f, kLeaving = 0.0f;
constexpr float kGo = 1.0f, kGaveUp = 0.0f;

const char* mode_name(int mode) { return mode == 0 ? "average" : mode == 1 ? "measure" : "off"; }

}  // namespace

void ExternalPeer::final_consensus() {
  if (!in_cluster_ || !engine_ || finished_ || !consensus_outcome_.empty()) return;
  if (final_consensus_mode_ == 2) {
    consensus_outcome_ = "off";
    return;
  }
  const double t0 = clock_.now();
  const auto seconds_since = [this](double t) { return clock_.now() - t; };
  const int n = static_cast<int>(peers_.size());
  const auto fail = [&](const std::string& why) {
    consensus_outcome_ = "failed";
    consensus_s_ = seconds_since(t0);
    std::fprintf(stderr, "%s: peer %s: no final %s (cluster.final_consensus): %s; it ends with its own parameters\n",
                 program_name().c_str(), spec_.name.c_str(), mode_name(final_consensus_mode_), why.c_str());
  };
  // A peer this one never had a link with (min_neighbours 0, and it never came) will not
  // come to the average either: waiting finish_timeout_s for it would help no one.
  std::string never;
  for (int j = 0; j < n; ++j) {
    if (j == me_) continue;
    const LinkStats link = transport_->link_stats(peers_[j]);
    if (!link.connected && link.frames_received == 0) never += (never.empty() ? "" : ", ") + peers_[j];
  }
  // Everyone's word first: a peer that leaves (stopped, or missing a peer) says so, and
  // those that wait learn it at once instead of at the timeout.
  const bool leaving = stop_.load() || !never.empty();
  for (int j = 0; j < n; ++j) {
    if (j == me_) continue;
    engine_->send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kFinalRound, .phase = kFinishedPhase},
                  {leaving ? kLeaving : kFinished});
  }
  if (leaving) {
    fail(stop_ ? "it was stopped, and the others were told it leaves"
               : "it never had a link with " + never + " this run, so not every peer can take part");
    return;
  }
  const auto second_word = [&](float word) {
    for (int j = 0; j < n; ++j) {
      if (j != me_) {
        engine_->send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kFinalRound, .phase = kGoPhase}, {word});
      }
    }
  };
  try {
    for (int j = 0; j < n; ++j) {
      if (j == me_) continue;
      const double left = finish_timeout_s_ - seconds_since(t0);
      auto word = engine_->wait_sync_for(j, kFinalRound, kFinishedPhase, std::max(left, 0.0));
      if (!word) {
        second_word(kGaveUp);
        fail("peer " + peers_[j] + " did not finish its training within cluster.finish_timeout_s (" +
             std::to_string(static_cast<int>(finish_timeout_s_)) + " s)");
        return;
      }
      if (word->data.size() != 1 || word->data[0] != kFinished) {
        second_word(kGaveUp);
        fail("peer " + peers_[j] + " left without it (stopped)");
        return;
      }
    }
    second_word(kGo);
    for (int j = 0; j < n; ++j) {
      if (j == me_) continue;
      const GossipEngine::Message word = engine_->wait_sync(j, kFinalRound, kGoPhase);
      if (word.data.size() != 1 || word.data[0] != kGo) {
        fail("peer " + peers_[j] + " gave up waiting for the others (its cluster.finish_timeout_s) and left");
        return;
      }
    }
    // On a copy: a sum that fails part-way leaves the parameters as they were.
    std::vector<float> own = model_->get_params();
    std::vector<float> mean = allreduce_sum(*engine_, MessageKind::kModel, own, kFinalRound, kAveragePhase, false);
    const float inv = 1.0f / static_cast<float>(n);
    double d2 = 0;
    for (size_t i = 0; i < mean.size(); ++i) {
      mean[i] *= inv;
      const double d = static_cast<double>(own[i]) - static_cast<double>(mean[i]);
      d2 += d * d;
    }
    consensus_distance_ = std::sqrt(d2);
    if (final_consensus_mode_ == 0) {
      engine_->params_written();  // the helper's copy between steps ends before the write
      model_->set_params(mean);
      synchronize();
    }
    consensus_outcome_ = mode_name(final_consensus_mode_);
    consensus_s_ = seconds_since(t0);
  } catch (const StopRequested&) {
    fail("a signal stopped it while it waited");
  } catch (const PeerTimeout& e) {
    fail(std::string("a peer sent no part of the average within gossip.sync_timeout_s: ") + e.what());
  }
}

void ExternalPeer::all_reduce(float* values, size_t n, ReduceOp op) {
  check_attached("all_reduce()");
  if (n > kMaxCollectiveFloats) {
    throw InputError("peer " + spec_.name + ": all_reduce() of " + std::to_string(n) + " values; at most " +
                     std::to_string(kMaxCollectiveFloats) + " (it is for the script's metrics and small tensors; the "
                     "model's average is finish()'s)");
  }
  if (!in_cluster_ || !engine_) return;  // alone: its own values are the result
  const uint64_t round = ++collectives_;
  const int peers = static_cast<int>(peers_.size());
  std::vector<float> own(values, values + n);
  for (int j = 0; j < peers; ++j) {
    if (j != me_) {
      engine_->send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = round, .phase = kScriptPhase}, own);
    }
  }
  // Every peer's values, combined in peer order: the same operations in the same order on
  // every peer, so every peer holds the same bits.
  std::vector<float> acc;
  for (int j = 0; j < peers; ++j) {
    std::vector<float> got;
    if (j == me_) {
      got = own;
    } else {
      got = engine_->wait_sync(j, round, kScriptPhase).data;
      if (got.size() != n) {
        throw InputError("peer " + spec_.name + ": all_reduce() #" + std::to_string(round) + ": peer " + peers_[j] +
                         " gave " + std::to_string(got.size()) + " values, this peer " + std::to_string(n) +
                         "; every peer must call the same collectives, in the same order, with tensors of one size");
      }
    }
    if (j == 0) {
      acc = std::move(got);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMean: acc[i] += got[i]; break;
        case ReduceOp::kMax: acc[i] = std::max(acc[i], got[i]); break;
        case ReduceOp::kMin: acc[i] = std::min(acc[i], got[i]); break;
      }
    }
  }
  if (op == ReduceOp::kMean) {
    const float inv = 1.0f / static_cast<float>(peers);
    for (float& x : acc) x *= inv;
  }
  std::copy(acc.begin(), acc.end(), values);
}

void ExternalPeer::barrier() {
  float word = 0;
  all_reduce(&word, 1, ReduceOp::kSum);
}

}  // namespace hearsay
