// Site replicas: a site's members repeat their leader's step instead of receiving its model.
//
// Every peer of a site holds the same model, the same optimizer state and, after the
// site's gradient sum, the same gradient. Where the leader's step was only its optimizer's
// step on that gradient (an asynchronous algorithm between two arrivals from the WAN:
// most of its steps), a member that takes the same optimizer step with the same learning
// rate reaches the leader's model bit for bit; the leader sends it the rate, not the model.
// Where the algorithm moved the model before the optimizer stepped (a neighbour's model
// mixed in), or changed the gradient (a neighbour's gradient added), the leader sends that
// model or that gradient too, and the member still takes the optimizer step itself, so its
// optimizer's state stays the leader's. What the record cannot describe (an algorithm that
// steps without the optimizer, or more than once, or moves the model after it) makes the
// leader send its whole model every step from then on, as before replays.
//
// Every kResyncEvery steps, at the first step, and after a view change, the leader sends
// its model and optimizer state whole: a member whose float arithmetic differs (another
// GPU generation in the same site), or one that became a member after a view change,
// holds the leader's bits again from there.
#include <cmath>
#include <cstring>

#include "algorithm.h"
#include "site_replicas.h"
#include "update_guard.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/trainable.h"

namespace hearsay {
namespace {

constexpr uint64_t kResyncEvery = 100;

// The first part of every update: its form and what follows.
enum class Form { kModel = 0, kReplay = 1, kResync = 2 };
constexpr uint32_t kHeaderPart = 0, kBeforePart = 1, kGradientPart = 2, kModelPart = 3, kFirstStatePart = 4;
constexpr float kMovedFlag = 1, kRegradedFlag = 2;
constexpr size_t kHeaderFloats = 8;  // form, lr, flags, state buffers, the optimizer's steps (4 x 16 bits)

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

void download(GossipEngine& e, std::vector<float>& out, const float* device) {
  out.resize(e.model().num_params());
  e.model().backend().download(out.data(), device, sizeof(float) * out.size());
}

std::vector<float> header(Form form, float lr, float flags, size_t buffers, int64_t steps) {
  std::vector<float> h{static_cast<float>(form), lr, flags, static_cast<float>(buffers)};
  const std::vector<float> s = round_as_floats(static_cast<uint64_t>(steps));
  h.insert(h.end(), s.begin(), s.end());
  return h;
}

class SiteReplayOptimizer final : public Optimizer {
 public:
  SiteReplayOptimizer(GossipEngine& e, SiteReplay& replay, Optimizer& inner) : e_(e), r_(replay), inner_(inner) {}
  const std::string& name() const override { return inner_.name(); }
  int64_t steps() const override { return inner_.steps(); }
  OptimizerState save_state() const override { return inner_.save_state(); }
  void load_state(const OptimizerState& state, const std::string& where) override { inner_.load_state(state, where); }
  bool state_is_saved() const override { return inner_.state_is_saved(); }

  void step(float* w, const float* g, float lr) override {
    auto& r = r_;
    if (!r.recording || r.whole_models) return inner_.step(w, g, lr);
    r.described = ++r.optimizer_steps == 1 && w == e_.model().params() && g == e_.model().grads();
    if (!r.described) return inner_.step(w, g, lr);
    r.lr = lr;
    download(e_, r.before, w);
    r.moved = !same_bits(r.before, r.held);
    download(e_, r.stepped_gradient, g);
    r.regraded = !same_bits(r.stepped_gradient, r.gradient);
    inner_.step(w, g, lr);
    download(e_, r.after, w);
  }

 private:
  GossipEngine& e_;
  SiteReplay& r_;
  Optimizer& inner_;
};

// Fault injection (GossipSpec::byzantine) on a leader's replay: the rate its members repeat.
float lied_rate(const std::string& byzantine, float lr) {
  if (byzantine == "scaled") return 5 * lr;
  if (byzantine == "sign_flip") return -lr;
  if (byzantine == "random") return 2 * lr;
  return lr;
}

// Why the record cannot describe this step, or "" when it can.
std::string undescribed(const SiteReplay& r, const std::vector<float>& params, bool state_saved) {
  if (!state_saved) return "the optimizer's state is kept by another framework";
  if (r.optimizer_steps == 0) return "the algorithm stepped without the optimizer";
  if (r.optimizer_steps > 1) return "the algorithm stepped the optimizer more than once";
  if (!r.described) return "the algorithm stepped the optimizer on buffers other than the model's";
  if (!same_bits(params, r.after)) return "the algorithm moved the model after the optimizer's step";
  return "";
}

}  // namespace

std::unique_ptr<Optimizer> site_replay_optimizer(GossipEngine& e, SiteState& state, Optimizer& inner) {
  return std::make_unique<SiteReplayOptimizer>(e, state.replay, inner);
}

void begin_site_replay(GossipEngine& e, SiteState& state) {
  auto& r = state.replay;
  r.recording = true;
  r.optimizer_steps = 0;
  r.described = r.moved = r.regraded = false;
}

void end_site_replay(GossipEngine& e, SiteState& state) { state.replay.recording = false; }

void note_site_gradient(GossipEngine& e, SiteState& state, std::vector<float>&& gradient) {
  auto& r = state.replay;
  if (r.recording) r.gradient = std::move(gradient);
}

std::vector<std::pair<uint32_t, std::vector<float>>> site_update_parts(GossipEngine& e, SiteState& state, uint64_t step) {
  auto& r = state.replay;
  r.recording = false;
  std::vector<float> params = e.params_host();
  std::vector<std::pair<uint32_t, std::vector<float>>> parts;
  if (!r.whole_models) {
    const std::string why = undescribed(r, params, e.optimizer().state_is_saved());
    if (!why.empty()) {
      r.whole_models = true;
      auto ev = e.log().event("site_replay");
      e.log().write(ev.add("step", static_cast<int64_t>(step)).add("whole_models", true).add("reason", why));
    }
  }
  if (r.whole_models) {
    parts.emplace_back(kHeaderPart, header(Form::kModel, 0, 0, 0, 0));
    parts.emplace_back(kModelPart, params);
  } else if (r.held.empty() || r.resync || step % kResyncEvery == kResyncEvery - 1) {
    OptimizerState state = e.optimizer().save_state();
    parts.emplace_back(kHeaderPart, header(Form::kResync, 0, 0, state.buffers.size(), state.steps));
    parts.emplace_back(kModelPart, params);
    uint32_t part = kFirstStatePart;
    for (auto& [name, values] : state.buffers) parts.emplace_back(part++, std::move(values));
  } else {
    const float flags = (r.moved ? kMovedFlag : 0) + (r.regraded ? kRegradedFlag : 0);
    parts.emplace_back(kHeaderPart, header(Form::kReplay, lied_rate(e.spec().byzantine, r.lr), flags, 0, 0));
    if (r.moved) parts.emplace_back(kBeforePart, r.before);
    if (r.regraded) parts.emplace_back(kGradientPart, r.stepped_gradient);
  }
  r.held = std::move(params);
  r.resync = false;
  return parts;
}

void forget_site_replay(GossipEngine& e, SiteState& state) {
  auto& r = state.replay;
  r.held.clear();
  r.resync = true;
}

void follow_site_leader(GossipEngine& e, SiteState& state, uint64_t step, int leader_index, float lr,
                        const std::function<std::vector<float>(uint32_t part)>& receive) {
  const size_t n = e.model().num_params();
  const std::string& leader = e.peers()[static_cast<size_t>(leader_index)];
  const std::string where = "peer " + e.peers()[static_cast<size_t>(e.me())] + ": its site leader " + leader + "'s update of step " +
                            std::to_string(step);
  // The update guard on this path too: a leader's model must be a replica's (its norm
  // within the ratio of this peer's own, both ways), its gradient within the ratio of the
  // site gradient this peer holds too, its rate this step's rate or a share of it.
  // Measured only for an update that carries a model (most replays carry none).
  const auto vet_model = [&](const std::vector<float>& v) {
    const std::string why = check_site_model_norm(e.spec().guard, std::sqrt(host_sum_squares(v.data(), v.size())), e.model_norm());
    if (!why.empty()) e.refuse_sync(leader_index, step, "site replay: " + why);
  };
  const std::vector<float> h = receive(kHeaderPart);
  const auto whole = [](float f, float hi) { return f >= 0 && f <= hi && f == std::floor(f); };
  const auto steps = h.size() == kHeaderFloats ? round_from_floats({h.begin() + 4, h.end()}) : std::nullopt;
  if (!steps || !whole(h[0], 2) || !std::isfinite(h[1]) || !whole(h[2], 3) || !whole(h[3], 16)) {
    throw InputError(where + " has a malformed header (" + std::to_string(h.size()) + " values; " +
                     std::to_string(kHeaderFloats) + ": a form 0-2, a learning rate, flags 0-3, a buffer count, 4 x 16 bits of steps)");
  }
  const auto form = static_cast<Form>(static_cast<int>(h[0]));
  const int flags = static_cast<int>(h[2]);
  const auto part_of = [&](uint32_t part, const char* what) {
    std::vector<float> v = receive(part);
    if (v.size() != n) {
      throw InputError(where + ": its " + what + " has " + std::to_string(v.size()) + " values, not the model's " + std::to_string(n));
    }
    return v;
  };
  // Everything is received and checked before anything is taken.
  if (form == Form::kModel) {
    std::vector<float> params = part_of(kModelPart, "model");
    vet_model(params);
    return e.set_params_host(params);
  }
  if (form == Form::kResync) {
    std::vector<float> params = part_of(kModelPart, "model");
    vet_model(params);
    OptimizerState state = e.optimizer().save_state();
    if (static_cast<size_t>(h[3]) != state.buffers.size()) {
      throw InputError(where + " carries " + std::to_string(static_cast<size_t>(h[3])) + " optimizer buffers; this peer's " +
                       state.optimizer + " keeps " + std::to_string(state.buffers.size()));
    }
    uint32_t part = kFirstStatePart;
    for (auto& [name, values] : state.buffers) {
      std::vector<float> v = receive(part++);
      if (v.size() != values.size()) {
        throw InputError(where + ": its optimizer buffer '" + name + "' has " + std::to_string(v.size()) + " values, not " +
                         std::to_string(values.size()));
      }
      values = std::move(v);
    }
    state.steps = static_cast<int64_t>(*steps);
    e.optimizer().load_state(state, where);
    return e.set_params_host(params);
  }
  if (const std::string why = check_site_rate(h[1], lr); !why.empty()) e.refuse_sync(leader_index, step, "site replay: " + why);
  std::vector<float> before, gradient;
  if ((flags & static_cast<int>(kMovedFlag)) != 0) {
    before = part_of(kBeforePart, "model before the step");
    vet_model(before);
  }
  if ((flags & static_cast<int>(kRegradedFlag)) != 0) {
    gradient = part_of(kGradientPart, "gradient");
    // Against the site's gradient, which this peer summed too: the leader's may add its
    // neighbours' gradients (at most the guard's ratio of it, as any gradient it mixes).
    const double own = std::sqrt(e.model().backend().sum_squares(e.model().grads(), n));
    const double theirs = std::sqrt(host_sum_squares(gradient.data(), gradient.size()));
    const std::string why = check_update_norm(e.spec().guard, MessageKind::kGradient, theirs, 1, 0, own);
    if (!why.empty()) e.refuse_sync(leader_index, step, "site replay: " + why);
  }
  if (!before.empty()) e.set_params_host(before);
  if (!gradient.empty()) e.model().backend().upload(e.model().grads(), gradient.data(), sizeof(float) * n);
  e.optimizer().step(e.model().params(), e.model().grads(), h[1]);
}

}  // namespace hearsay
