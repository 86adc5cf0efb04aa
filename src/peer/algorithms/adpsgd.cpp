// AD-PSGD (Lian et al., ICML 2018): each step a peer computes the gradient on its model
// as it reads it, averages its model with one neighbour's in an atomic pairwise exchange,
// and applies the gradient to the averaged model:
//
//   g = grad F(x_a)                                  (x_a read before the averaging)
//   x_a, x_b <- x_a + w (x_b - x_a), x_b + w (x_a - x_b)   (w = 1/2, staleness-weighted)
//   x_a <- x_a - lr g
//
// The exchange is atomic without locks or waits: a asks b with its model x_a (and keeps
// the copy it sent); b, between two of its steps, moves its model by w (x_a - x_b) and
// answers with the x_b it had and the w it used; a, when the answer arrives, moves its
// model by w (x_b - x_a_sent). The two moves cancel, so the sum of all models changes only
// by gradient steps, whatever else happened at a in between (a's own steps and other
// exchanges are kept: a adds a difference, it does not overwrite). Nobody waits, so there
// is no deadlock whatever the graph. A peer has at most one exchange open per neighbour;
// one unanswered for kExchangeTimeoutS is given up (if b did answer, that exchange's mass
// is then lost: the only way the sum can drift, with lossy model codecs' rounding and
// robust mixing, which is not an average by design). A host peer (models_encode_once)
// sends its model as the model codec's bytes, encoded once, and keeps those bytes as the
// exchange's base: a measures the reply from what b decoded, so the sum changes only by
// the reply's rounding, and the base costs the codec's bytes. A peer whose engine copies the model
// between steps (an external peer: GossipEngine::copy_between_steps) sends its requests at
// the next step's start, with the model this step left, which is the one it would have
// sent here: the copy was taken while its framework computed the next gradient.
#include <chrono>
#include <map>
#include <set>

#include "../algorithm.h"
#include "../algorithm_registry.h"
#include "hearsay/algorithms/adpsgd.pb.h"

namespace hearsay {
namespace {

constexpr double kExchangeTimeoutS = 10.0;

class Adpsgd final : public Algorithm {
 public:
  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const BatchStats s = e.gradient(batch, step);
    // The requests the last step decided on, when the engine copies the model between steps
    // (below): the model they carry is the one that step left, which this step starts from.
    if (!requested_.empty()) {
      const auto params = e.start_snapshot();
      for (int t : requested_) send_request(e, t, params);
      requested_.clear();
    }
    // Requests are answered before this peer's own exchanges complete: the first answer
    // then carries the step's start, shared (for an external peer, the copy made between
    // steps), not a copy of the model made now. Either order is an atomic exchange each.
    bool moved = false;  // whether this step has changed the model yet
    auto arrivals = e.take_async();
    for (auto& m : arrivals) {
      if (m.kind == MessageKind::kModel && m.reply_requested) moved = answer(e, std::move(m), moved) || moved;
    }
    for (auto& m : arrivals) {
      if (m.kind == MessageKind::kModel && !m.reply_requested) moved = complete(e, m) || moved;
    }
    e.optimizer().step(e.model().params(), e.model().grads(), lr);
    expire(e.time().now());
    if (step % static_cast<uint64_t>(e.spec().gossip_every) == 0) {
      std::vector<int> targets;
      for (int t : e.live_targets(static_cast<int64_t>(step))) {
        if (open_.count(t) != 0) t = idle_neighbour(e);  // one open exchange per neighbour
        if (t < 0) continue;
        open_[t] = Open{.at = e.time().now()};  // open now: a later target of this round picks another
        targets.push_back(t);
      }
      // A request stays a host send even on a GPU peer: the model sent is kept, as the
      // base that complete() measures the reply from (move_toward_neighbour's host
      // arithmetic, and a robust rule's), so it is downloaded once either way, and that one
      // copy is what every request carries and every exchange keeps (a model is tens of
      // megabytes: no copy to spare).
      // Where the engine copies the model between steps, off this step's time, the
      // requests go at the next step's start with that copy: the same model, sent a
      // gradient's computation later.
      if (e.copies_between_steps()) {
        requested_ = targets;
      } else if (e.models_encode_once()) {
        // A host peer sends the model as the model codec's bytes, encoded once for every
        // target of the round, and keeps those bytes as the exchange's base: what the
        // receiver decoded, so the two halves cancel to the reply's rounding alone, and
        // the base costs the codec's bytes (an fp16 model: half an fp32 copy).
        std::shared_ptr<const GossipEngine::Encoded> model;
        if (!targets.empty()) model = e.encode_model();
        for (int t : targets) {
          open_[t].sent_encoded = model;
          e.send_encoded(t, {.kind = MessageKind::kModel, .reply_requested = true}, model);
        }
      } else {
        std::shared_ptr<const std::vector<float>> params;
        if (!targets.empty()) params = e.snapshot_params();
        for (int t : targets) send_request(e, t, params);
      }
    }
    return s;
  }

 private:
  struct Open {
    std::shared_ptr<const std::vector<float>> sent;  // the model this peer sent
    std::shared_ptr<const GossipEngine::Encoded> sent_encoded;  // or its bytes, where sent so (models_encode_once)
    double at = 0;            // when, on the peer's clock (virtual time when simulated)
  };

  void send_request(GossipEngine& e, int t, const std::shared_ptr<const std::vector<float>>& params) {
    open_[t].sent = params;
    e.send_shared(t, {.kind = MessageKind::kModel, .reply_requested = true}, params);
  }

  // b's half: x_b += w (x_a - x_b), answering with the x_b before it and w. Before the
  // step has moved the model (`moved`), x_b is the step's start: that copy, shared.
  // Returns whether it moved the model.
  bool answer(GossipEngine& e, GossipEngine::Message&& m, bool moved) {
    const auto d = e.mixer().model(e.clock(), m.clock, 0.5, e.samples_seen(), m.samples);
    const double w = d.drop ? 0.0 : d.weight;  // too stale: both halves do nothing
    GossipEngine::Message reply;
    reply.kind = MessageKind::kModel;
    reply.mix_share = w;
    if (e.gossip_on_device()) {
      e.send_device(m.from, std::move(reply), e.snapshot_device(e.model().params(), e.model().num_params()));
    } else if (e.models_encode_once()) {
      e.send_encoded(m.from, std::move(reply), e.encode_model());  // the codec's bytes, no fp32 copy
    } else if (!moved) {
      e.send_shared(m.from, std::move(reply), e.start_snapshot());
    } else {
      e.send(m.from, std::move(reply), e.params_host());
    }
    if (w == 0) return false;
    e.note_model_distance(e.peers()[m.from], m);
    e.mix_neighbour_model(m.from, m, w);
    return true;
  }

  // a's half, once b has answered: x_a += w (x_b - x_a_sent). Returns whether it moved the model.
  bool complete(GossipEngine& e, const GossipEngine::Message& m) {
    const auto it = open_.find(m.from);
    if (it == open_.end()) {
      e.mixer().count_dropped(1);  // an answer to an exchange given up
      return false;
    }
    const double w = m.mix_share;
    bool moved = false;
    if (w > 0 && it->second.sent_encoded && m.elements() == e.model().num_params()) {
      e.move_toward_neighbour(m.from, *it->second.sent_encoded, m, w);
      moved = true;
    } else if (w > 0 && it->second.sent && m.elements() == it->second.sent->size()) {
      e.move_toward_neighbour(m.from, *it->second.sent, m, w);
      moved = true;
    }
    open_.erase(it);
    return moved;
  }

  // A connected neighbour with no exchange open, at random; -1 if there is none.
  int idle_neighbour(GossipEngine& e) {
    std::vector<int> idle;
    for (int j : e.topology().neighbours(e.me())) {
      if (open_.count(j) == 0 && e.connected(j)) idle.push_back(j);
    }
    return idle.empty() ? -1 : idle[e.rng().below(idle.size())];
  }

  void expire(double now) {
    for (auto it = open_.begin(); it != open_.end();) {
      it = now - it->second.at > kExchangeTimeoutS ? open_.erase(it) : std::next(it);
    }
  }

  std::map<int, Open> open_;

 public:
  // The bases of the open exchanges (one buffer where a round's targets share it).
  uint64_t held_bytes() const override {
    std::set<const void*> seen;
    uint64_t b = 0;
    for (const auto& [t, o] : open_) {
      if (o.sent_encoded && seen.insert(o.sent_encoded.get()).second) {
        for (const auto& seg : o.sent_encoded->segments) b += seg.payload->size();
      }
    }
    return b;
  }
  std::vector<int> requested_;  // requests to send at the next step's start (copies_between_steps)
};

}  // namespace

const bool registered = register_algorithm<algorithms::AdpsgdOptions>({
    .name = "adpsgd",
    .joins_from_neighbour = true,
    .new_site_leader = true,  // it keeps nothing a neighbour relies on
    .sends = {{MessageKind::kModel, Compression::kModel}},
    .make = [](const GossipSpec&, const algorithms::AdpsgdOptions&) { return std::make_unique<Adpsgd>(); },
});

}  // namespace hearsay
