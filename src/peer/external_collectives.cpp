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

// Phases of kEndPhases beside the first word's (phases.h): the script's collectives, the
// second word, and the final average's all-reduce (which takes phases from its first on).
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

void ExternalPeer::say_to_all(uint32_t phase, float word, bool only_linked) {
  for (int j = 0; j < static_cast<int>(peers_.size()); ++j) {
    if (j == me_ || (only_linked && !engine_->link_up(j))) continue;
    engine_->send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = kFinalRound, .phase = phase}, {word});
  }
}

std::optional<std::vector<float>> ExternalPeer::await_word(int from, uint64_t round, uint32_t phase, double timeout_s,
                                                           const std::function<void()>& repeat) {
  // In short waits, so that meanwhile this peer answers the peers that join or restart
  // (it is still their neighbour: a restarted peer's quorum counts on its answer) and,
  // each second, repeats its own word (a peer restarted since heard nothing of it).
  const double deadline = clock_.now() + timeout_s;
  double said = clock_.now();
  for (;;) {
    engine_->serve_join_requests();
    const double left = deadline - clock_.now();
    auto m = engine_->wait_sync_for(from, round, phase, std::clamp(left, 0.0, 0.2));
    if (m) return std::move(m->data);
    if (clock_.now() >= deadline) return std::nullopt;
    if (repeat && clock_.now() - said >= 1.0) {
      repeat();
      said = clock_.now();
    }
  }
}

void ExternalPeer::final_consensus() {
  if (!in_cluster_ || !engine_ || finished_ || !consensus_outcome_.empty()) return;
  if (final_consensus_mode_ == 2) {
    consensus_outcome_ = "off";
    return;
  }
  const double t0 = clock_.now();
  const int n = static_cast<int>(peers_.size());
  const auto fail = [&](const std::string& why) {
    consensus_outcome_ = "failed";
    consensus_s_ = clock_.now() - t0;
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
  const float first = leaving ? kLeaving : kFinished;
  say_to_all(kFinishedPhase, first);
  if (leaving) {
    say_to_all(kGoPhase, kGaveUp);
    fail(stop_ ? "it was stopped, and the others were told it leaves"
               : "it never had a link with " + never + " this run, so not every peer can take part");
    return;
  }
  // Repeated over the links that are up only: a peer that is down would otherwise find a
  // word a second queued for it when it comes back.
  const auto repeat_first = [&] { say_to_all(kFinishedPhase, first, true); };
  bool said_go = false;
  // Whatever ends the consensus early, the others hear that this peer is gone.
  const auto give_up = [&](const std::string& why) {
    if (!said_go) say_to_all(kGoPhase, kGaveUp);
    fail(why);
  };
  try {
    for (int j = 0; j < n; ++j) {
      if (j == me_) continue;
      auto word = await_word(j, kFinalRound, kFinishedPhase, std::max(finish_timeout_s_ - (clock_.now() - t0), 0.0), repeat_first);
      if (!word) {
        char waited[32];
        std::snprintf(waited, sizeof waited, "%g", finish_timeout_s_);
        give_up("peer " + peers_[j] + " did not finish its training within cluster.finish_timeout_s (" + waited + " s)");
        return;
      }
      if (word->size() != 1 || (*word)[0] != kFinished) {
        give_up("peer " + peers_[j] + " left without it (stopped, or it never had a link with every peer)");
        return;
      }
    }
    say_to_all(kGoPhase, kGo);
    said_go = true;
    for (int j = 0; j < n; ++j) {
      if (j == me_) continue;
      auto word = await_word(j, kFinalRound, kGoPhase, network_.gossip.sync_timeout_s, repeat_first);
      if (!word) {
        give_up("peer " + peers_[j] + " said nothing more within gossip.sync_timeout_s after it had finished");
        return;
      }
      if (word->size() != 1 || (*word)[0] != kGo) {
        give_up("peer " + peers_[j] + " gave up the consensus and left (stopped, or its cluster.finish_timeout_s passed)");
        return;
      }
    }
    // Summed on one host copy, where it lies: a sum that fails part-way leaves the
    // parameters as they were, and the parameters themselves are the distance's other side
    // (on a device, a second copy of them is read for it).
    std::vector<float> mean = model_->get_params();
    allreduce_sum_in_place(*engine_, MessageKind::kModel, mean.data(), mean.size(), kFinalRound, kAveragePhase, false);
    std::vector<float> device_copy;
    const float* own = backend_->is_host() ? model_->params() : (device_copy = model_->get_params()).data();
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
    consensus_s_ = clock_.now() - t0;
  } catch (const StopRequested&) {
    give_up("a signal stopped it while it waited; the others were told");
  } catch (const PeerTimeout& e) {
    give_up(std::string("a peer sent no part of the average within gossip.sync_timeout_s: ") + e.what());
  } catch (const InputError& e) {
    // A part the update guard refused (non-finite, or over its norm bound): no average.
    give_up(e.what());
  }
}

void ExternalPeer::leave_without_consensus() {
  // A peer closed before its finish() (an uncaught exception, close() alone) tells the
  // others, who would otherwise wait finish_timeout_s for it.
  if (!in_cluster_ || !engine_ || !consensus_outcome_.empty() || final_consensus_mode_ == 2) return;
  consensus_outcome_ = "failed";
  say_to_all(kFinishedPhase, kLeaving);
  say_to_all(kGoPhase, kGaveUp);
}

void ExternalPeer::all_reduce(float* values, size_t n, ReduceOp op) {
  check_attached("all_reduce()");
  const size_t most = std::min(kMaxCollectiveFloats, model_->num_params());
  if (n > most) {
    throw InputError("peer " + spec_.name + ": all_reduce() of " + std::to_string(n) + " values; at most " +
                     std::to_string(most) + " (the model's size, and at most " + std::to_string(kMaxCollectiveFloats) +
                     ": it is for the script's metrics and small tensors; the model's average is finish()'s)");
  }
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      throw InputError("peer " + spec_.name + ": all_reduce(): value " + std::to_string(i) + " is " +
                       std::to_string(values[i]) + "; every peer refuses a value that is not finite");
    }
  }
  if (!in_cluster_ || !engine_) return;  // alone: its own values are the result
  const uint64_t round = ++collectives_;
  const int peers = static_cast<int>(peers_.size());
  const auto own = std::make_shared<const std::vector<float>>(values, values + n);  // one copy every link reads
  for (int j = 0; j < peers; ++j) {
    if (j != me_) {
      engine_->send_shared(j, {.kind = MessageKind::kModel, .synchronous = true, .round = round, .phase = kScriptPhase}, own);
    }
  }
  // Every peer's values, combined in peer order: the same operations in the same order on
  // every peer, so every peer holds the same bits.
  std::vector<float> acc;
  for (int j = 0; j < peers; ++j) {
    std::vector<float> got;
    if (j == me_) {
      got = *own;
    } else {
      auto m = await_word(j, round, kScriptPhase, network_.gossip.sync_timeout_s, {});
      if (!m) {
        throw PeerTimeout("peer " + spec_.name + ": all_reduce() #" + std::to_string(round) + " waited " +
                              std::to_string(network_.gossip.sync_timeout_s) + " s (gossip.sync_timeout_s) for peer " +
                              peers_[j] + "; every peer must call the same collectives, in the same order",
                          j);
      }
      got = std::move(*m);
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
