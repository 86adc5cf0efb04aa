// GossipEngine's checkpoint state (the clock, what each link's codec still owes, the
// algorithm's own), its periodic statistics in the event log and what it holds in memory.

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "hearsay/checkpoint.pb.h"
#include "algorithm.h"
#include "hearsay/build_config.h"
#include "hearsay/checkpoint.h"
#include "message_stream.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "engine_device.h"
#include "mailboxes.h"
#include "update_guard.h"

namespace hearsay {

void GossipEngine::save_state(ckpt::Checkpoint& c) const {
  c.set_logical_clock(logical_clock_.load());
  c.set_samples_seen(samples_seen_);
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_ || !link_codecs_[i]) continue;  // never used: nothing owed
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    for (const auto& [kind, enc] : {std::pair{"update", link_codecs_[i]->update.get()}, std::pair{"model", link_codecs_[i]->model.get()}}) {
      auto* l = c.add_links();
      l->set_peer(peers_[i]);
      l->set_kind(kind);
      l->set_codec(enc->spec().name);
      l->set_density(enc->spec().density);
#if HEARSAY_HAVE_CUDA
      const auto& twin = std::string(kind) == "update" ? link_codecs_[i]->device_update : link_codecs_[i]->device_model;
      if (twin) {
        const std::vector<float> owed = owed_residual(*enc, *twin);
        l->set_residual(floats_to_bytes(owed.data(), owed.size()));
        continue;
      }
#endif
      l->set_residual(floats_to_bytes(enc->residual().data(), enc->residual().size()));
    }
  }
  c.set_algorithm_state(algorithm_->save());
}

std::string GossipEngine::algorithm_state() const { return algorithm_->save(); }

void GossipEngine::load_state(const ckpt::Checkpoint& c) {
  params_written();
  logical_clock_ = c.logical_clock();
  steps_ = static_cast<uint64_t>(c.step());
  samples_seen_ = c.samples_seen();
  for (const auto& l : c.links()) {
    const int i = index_of(l.peer());
    if (i < 0 || i == me_) throw InputError("checkpoint: link state for '" + l.peer() + "', not a neighbour in this cluster");
    if (l.kind() != "update" && l.kind() != "model") throw InputError("checkpoint: link state of unknown kind '" + l.kind() + "'");
    outgoing_link(i);
    std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
    LinkEncoder& enc = l.kind() == "update" ? *link_codecs_[i]->update : *link_codecs_[i]->model;
    // A device twin starts again from the host encoder, which now holds the checkpoint's
    // residual (it moves to the device at the twin's first send).
    (l.kind() == "update" ? link_codecs_[i]->device_update : link_codecs_[i]->device_model).reset();
    if (spec_.adaptive.enabled && l.codec() != enc.spec().name) {
      CodecSpec chosen = enc.spec();
      chosen.name = l.codec();
      chosen.density = l.density();
      check_codec_spec(chosen);
      enc.set_spec(chosen);  // where adaptation had got to
    }
    if (!l.residual().empty()) {
      if (!enc.error_feedback()) continue;  // error feedback is off now: nothing is owed
      enc.residual().resize(model_.num_params());
      bytes_to_floats(l.residual(), enc.residual().data(), model_.num_params(), "checkpoint: residual of link " + l.peer());
    }
  }
  algorithm_->load(c.algorithm_state(), *this);
}

void GossipEngine::add_memory(MemoryUse& m) {
  std::unordered_set<const void*> seen;  // a snapshot in several outboxes is one buffer
  uint64_t out = 0, residuals = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (outboxes_[i]) out += outboxes_[i]->held_memory(seen);
    if (link_codecs_[i]) {
      std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
      residuals += (link_codecs_[i]->update->residual().capacity() + link_codecs_[i]->model->residual().capacity()) *
                   sizeof(float);
    }
  }
  uint64_t snapshots = 0;
  for (const auto& b : copy_buffers_) {
    if (seen.insert(b.get()).second) snapshots += b->capacity() * sizeof(float);
  }
  if (start_snapshot_ && seen.insert(start_snapshot_.get()).second) snapshots += start_snapshot_->capacity() * sizeof(float);
  {
    // A large message's segments made and kept for a resend: a window at most per link.
    std::lock_guard<std::mutex> lock(streams_mu_);
    for (const auto& s : streams_) out += s ? s->held_bytes() : 0;
  }
  m.host["outboxes"] += out;
  m.host["inbox"] += inbox_->held_memory(seen);
  m.host["link_residuals"] += residuals;
  m.host["algorithm"] += algorithm_->held_bytes();
  m.host["snapshots"] += snapshots;
  std::lock_guard<std::mutex> lock(returned_mu_);
  if (!returned_x_.empty()) m.host["push_sum_returned"] += returned_x_.capacity() * sizeof(float);
}

void GossipEngine::log_stats(int64_t step) {
  const Mixer::Stats m = mixer_.take_stats();
  applied_total_ += m.applied;
  dropped_total_ += m.dropped;
  coalesced_total_ += m.coalesced;
  MetricsBoard::Gossip board;
  JsonObject links;
  uint64_t sent = 0, received = 0;
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    const LinkStats s = transport_.link_stats(peers_[i]);
    sent += s.bytes_sent;
    received += s.bytes_received;
    // Links this peer has used (sent on, or heard from): a peer of 1,024 talks to few.
    if (!link_codecs_[i] && s.bytes_received == 0) continue;
    if (metrics_ != nullptr) {
      board.links.push_back({.neighbour = peers_[i], .connected = s.connected, .bytes_sent = s.bytes_sent,
                             .bytes_received = s.bytes_received, .queue_frames = s.queue_depth,
                             .queue_bytes = s.queue_bytes, .rtt_s = s.rtt_s});
    }
    JsonObject l;
    l.add("connected", s.connected).add("bytes_sent", static_cast<int64_t>(s.bytes_sent));
    l.add("bytes_received", static_cast<int64_t>(s.bytes_received)).add("queue", static_cast<int64_t>(s.queue_depth));
    if (s.rtt_s >= 0) l.add("rtt_s", s.rtt_s);
    if (link_codecs_[i]) {
      std::lock_guard<std::mutex> lock(link_codecs_[i]->mu);
      const CodecSpec& c = link_codecs_[i]->update->spec();
      l.add("codec", c.name).add("model_codec", link_codecs_[i]->model->spec().name);
      if (c.name == "topk" || c.name == "randomk") l.add("density", c.density);
    } else {
      l.add("codec", spec_.codec.name).add("model_codec", spec_.model_codec);  // nothing sent on it yet
    }
    {
      std::lock_guard<std::mutex> lock(link_mu_);
      if (link_bps_[i] > 0) l.add("throughput_Bps", link_bps_[i]);
    }
    links.add_raw(peers_[i], l.str());
  }
  const std::vector<std::string> quarantined_now = quarantined();  // the log's and the board's
  auto e = log_.event("gossip");
  e.add("step", step)
      .add("clock", static_cast<int64_t>(logical_clock_.load()))
      .add("bytes_sent", static_cast<int64_t>(sent))
      .add("bytes_received", static_cast<int64_t>(received))
      .add("applied", static_cast<int64_t>(m.applied))
      .add("dropped", static_cast<int64_t>(m.dropped))
      .add("coalesced", static_cast<int64_t>(m.coalesced))
      .add("rejected", static_cast<int64_t>(rejected_.load()))
      .add("tau_p50", m.tau_p50)
      .add("tau_p90", m.tau_p90)
      .add("tau_p99", m.tau_p99)
      .add("tau_max", m.tau_max)
      .add("weight_mean", m.weight_mean)
      .add("buffered_bytes", static_cast<int64_t>(buffered_bytes()))
      .add_raw("links", links.str());
  {
    JsonObject refused;
    for (const auto& [why, n] : guard_->refused()) refused.add(why, static_cast<int64_t>(n));
    e.add_raw("refused", refused.str());
    std::string q = "[";
    for (const auto& name : quarantined_now) q += (q.size() > 1 ? ",\"" : "\"") + json_escape(name) + "\"";
    e.add_raw("quarantined", q + "]");
  }
  for (const auto& ev : guard_->take_events()) {
    auto qe = log_.event("quarantine");
    qe.add("step", step).add("neighbour", peers_[ev.peer]).add("state", ev.quarantined ? "on" : "off").add("reason", ev.reason);
    if (ev.quarantined) qe.add("for_s", spec_.guard.quarantine_s);
    log_.write(qe);
  }
  if (!distances_.empty()) {
    JsonObject d;
    for (const auto& [peer, dist] : distances_) d.add(peer, dist);
    e.add_raw("model_distance", d.str());
    distances_.clear();
  }
  log_.write(e);
  if (metrics_ != nullptr) {
    for (auto kind : {MessageKind::kGradient, MessageKind::kModel, MessageKind::kModelDelta, MessageKind::kPushSum}) {
      board.bytes_sent_by_kind[message_kind_name(kind)] = sent_by_kind_[static_cast<size_t>(kind)].load();
    }
    board.applied = applied_total_;
    board.dropped = dropped_total_;
    board.coalesced = coalesced_total_;
    board.rejected = rejected_.load();
    board.refused = guard_->refused();
    board.quarantined = quarantined_now.size();
    board.buffered_bytes = buffered_bytes();
    board.staleness = mixer_.staleness();
    metrics_->offer_gossip(std::move(board));
  }
}

}  // namespace hearsay
