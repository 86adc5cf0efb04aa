// GossipEngine's receiving side: frames admitted from the transport, the update guard's screen,
// push-sum give-back, the waits (outside the step's work), and the synchronous exchanges'
// arrivals with their checks.

#include <algorithm>
#include <limits>
#include <cmath>

#include "algorithm.h"
#include "hearsay/build_config.h"
#include "hearsay/device_codec.h"
#include "hearsay/error.h"
#include "mailboxes.h"
#include "update_guard.h"

namespace hearsay {

void GossipEngine::on_frame(const std::string& from, InFrame&& frame) {
  const int idx = index_of(from);
  if (frame.envelope->has_credit()) {
    if (idx >= 0 && idx != me_) on_acknowledgement(idx, frame.envelope->credit().acked_update_id(), frame.envelope->credit().credits());
    return;
  }
  if (!frame.envelope->has_update()) return;
  const auto& u = frame.envelope->update();
  // An asynchronous update is always the whole model's size; a synchronous one may be a
  // smaller vector of a collective (PowerSGD's factors), never a larger one.
  const bool fits = u.synchronous() ? u.tensor_length() <= model_.num_params() : u.tensor_length() == model_.num_params();
  if (idx < 0 || !fits) {
    std::fprintf(stderr, "hearsay: peer %s: dropped an update from '%s': %s\n", peers_[me_].c_str(), from.c_str(),
                 idx < 0 ? "not a member of this cluster" : "its tensor does not match this model");
    return;
  }
  // A quarantined neighbour's updates are not even decoded.
  if (!guard_->admits(idx, clock_.now())) {
    ++rejected_;
    return;
  }
  // Lamport: our clock is at least every clock we have heard.
  uint64_t c = logical_clock_.load();
  while (u.clock() > c && !logical_clock_.compare_exchange_weak(c, u.clock())) {
  }
  uint32_t held = 0;
  const std::string err = inbox_->add_segment(idx, u, frame.payload.data(), frame.payload.size(), &held);
  if (!err.empty()) refuse(idx, err);
  // A stream's segments are acknowledged one by one: its sender's window moves on them,
  // and after a cut it resends from here.
  if (u.resumable() && err.empty() && held != Inbox::kNoAnswer) acknowledge(idx, u.update_id(), held);
}

void GossipEngine::refuse(int from, const std::string& why) {
  ++rejected_;
  std::fprintf(stderr, "hearsay: peer %s: refused an update from '%s': %s\n", peers_[me_].c_str(), peers_[from].c_str(),
               why.c_str());
  if (guard_->refuse(from, clock_.now(), why)) {
    std::fprintf(stderr, "hearsay: peer %s: neighbour '%s' quarantined for %g s after %d refused updates in a row (last: %s)\n",
                 peers_[me_].c_str(), peers_[from].c_str(), spec_.guard.quarantine_s, spec_.guard.strikes, why.c_str());
  }
}

std::vector<GossipEngine::Message> GossipEngine::screen(std::vector<Message> arrivals) {
  std::vector<Message> out;
  double model_norm = -1;  // measured once, and only when something arrived
  for (auto& m : arrivals) {
    if (!guard_->admits(m.from, clock_.now())) {
      ++rejected_;
      continue;
    }
    if (model_norm < 0 && m.kind != MessageKind::kGradient) model_norm = this->model_norm();
    // Folded gradients and deltas are sums of their parts; a folded model is the newest one.
    const uint64_t parts = m.kind == MessageKind::kModel ? 1 : m.coalesced + 1;
    const std::string why = check_update_norm(spec_.guard, m.kind, norm_of(m), parts, model_norm, own_grad_norm_.load());
    if (!why.empty()) {
      refuse(m.from, why);
      continue;
    }
    guard_->pass(m.from);
    mixed_this_step_.push_back(peers_[m.from]);
    out.push_back(std::move(m));
  }
  return out;
}


std::vector<GossipEngine::Message> GossipEngine::take_async() { return screen(inbox_->take_async()); }

void GossipEngine::give_back(const std::vector<float>& x, uint64_t offset, double w) {
  std::lock_guard<std::mutex> lock(returned_mu_);
  if (returned_x_.empty()) returned_x_.assign(model_.num_params(), 0.0f);
  for (size_t k = 0; k < x.size() && offset + k < returned_x_.size(); ++k) returned_x_[offset + k] += x[k];
  returned_w_ += w;
}

GossipEngine::Message GossipEngine::take_returned() {
  Message m;
  m.from = me_;
  m.kind = MessageKind::kPushSum;
  std::lock_guard<std::mutex> lock(returned_mu_);
  m.data = std::move(returned_x_);
  m.push_sum_weight = returned_w_;
  returned_x_.clear();
  returned_w_ = 0;
  return m;
}

bool GossipEngine::unsent_since(uint64_t step) const {
  for (const auto& o : outboxes_) {
    if (!o) continue;
    const auto oldest = o->oldest_unsent_step();
    if (oldest && *oldest <= step) return true;
  }
  return false;
}

// A wait on neighbours inside a step: its time is not the step's work (last_work_s).
class GossipEngine::WaitSpan {
 public:
  explicit WaitSpan(GossipEngine& e) : e_(e) { e_.work_s_ += e_.clock_.now() - e_.work_since_; }
  ~WaitSpan() { e_.work_since_ = e_.clock_.now(); }
  WaitSpan(const WaitSpan&) = delete;
  WaitSpan& operator=(const WaitSpan&) = delete;

 private:
  GossipEngine& e_;
};

void GossipEngine::wait_sent(uint64_t step) { wait_until([&] { return !unsent_since(step); }, std::numeric_limits<double>::infinity()); }

bool GossipEngine::wait_until(const std::function<bool()>& ready, double timeout_s) {
  const WaitSpan waiting(*this);
  const double deadline = clock_.now() + timeout_s;
  while (!ready()) {
    if (stopped_) throw StopRequested();
    tick_streams();
    if (clock_.now() >= deadline) return false;
    clock_.sleep_for(200e-6);
  }
  return true;
}

bool GossipEngine::idle() const {
  for (size_t i = 0; i < peers_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    if ((outboxes_[i] && outboxes_[i]->buffered_bytes() > 0) || transport_.link_stats(peers_[i]).queue_depth > 0) return false;
  }
  return true;
}

void GossipEngine::settle() { algorithm_->settle(*this); }

void GossipEngine::refuse_sync(int from, uint64_t round, const std::string& why) {
  refuse(from, why);
  log_.write(log_.event("refused").add("neighbour", peers_[from]).add("round", static_cast<int64_t>(round)).add("reason", why));
  throw InputError("peer " + peers_[me_] + ": " + spec_.algorithm + " refused peer " + peers_[from] + "'s update for round " +
                   std::to_string(round) + " (" + why + "); a synchronous algorithm cannot go on without it");
}

double GossipEngine::norm_of(const Message& m) {
  // The inbox measured it as it decoded the message, on the transport's thread.
  return std::sqrt(m.sum_squares >= 0 ? m.sum_squares : host_sum_squares(m.data.data(), m.data.size()));
}

double GossipEngine::model_norm() {
  if (params_sq_ >= 0 && steps_ - params_sq_step_ <= kNormAgeSteps) return std::sqrt(params_sq_);  // the last mix's
#if HEARSAY_HAVE_CUDA
  if (on_device_) {
    // Measured where the model lives, not downloaded for one number.
    model_.backend().synchronize();
    use_cuda_device(cuda_device_);
    return std::sqrt(device_sum_squares(model_.params(), model_.num_params()));
  }
#endif
  return std::sqrt(model_.backend().sum_squares(model_.params(), model_.num_params()));
}

void GossipEngine::hold_model_norm() {
  const double norm = model_norm();
  params_sq_ = norm * norm;
  params_sq_step_ = steps_;
}

double GossipEngine::sync_reference_norm(const float* own, size_t n) {
  return std::max(std::sqrt(host_sum_squares(own, n)), model_norm());
}

void GossipEngine::check_sync_part(const Message& m, uint64_t round, double reference, double parts) {
  const double ratio = spec_.guard.max_norm_ratio;
  if (ratio <= 0 || !(reference > 0)) return;
  const double norm = norm_of(m);
  if (norm <= ratio * parts * reference) return;
  char buf[200];
  std::snprintf(buf, sizeof buf, "norm: %.3g is %.3g times this peer's own part (%.3g); the bound is %g times", norm,
                norm / reference, reference, ratio * parts);
  refuse_sync(m.from, round, buf);
}

GossipEngine::Message GossipEngine::wait_sync(int from, uint64_t round, uint32_t phase) {
  Message m = wait_sync_kept(from, round, phase);
  decode_kept(m);
  return m;
}

GossipEngine::Message GossipEngine::wait_sync_kept(int from, uint64_t round, uint32_t phase) {
  auto m = take_sync(from, round, phase, spec_.sync_timeout_s);
  if (!m) {
    throw PeerTimeout("peer " + peers_[me_] + ": " + spec_.algorithm + " waited " + std::to_string(spec_.sync_timeout_s) +
                          " s for peer " + peers_[from] + " (round " + std::to_string(round) +
                          "); synchronous algorithms do not tolerate a missing peer",
                      from);
  }
  return std::move(*m);
}

std::optional<GossipEngine::Message> GossipEngine::wait_sync_for(int from, uint64_t round, uint32_t phase, double timeout_s) {
  auto m = take_sync(from, round, phase, timeout_s);
  if (m) decode_kept(*m);
  return m;
}

std::optional<GossipEngine::Message> GossipEngine::take_sync(int from, uint64_t round, uint32_t phase, double timeout_s) {
  std::string refused;
  std::optional<Message> m;
  {
    const WaitSpan waiting(*this);
    m = inbox_->wait_sync(from, round, phase, timeout_s, stopped_, &refused);
  }
  if (!m && stopped_) throw StopRequested();
  if (!m && !refused.empty()) refuse_sync(from, round, refused);
  return m;
}

void GossipEngine::forget_sync(const std::function<bool(int from, uint64_t round, uint32_t phase)>& stale) {
  inbox_->forget_sync(stale);
}

std::optional<GossipEngine::Message> GossipEngine::poll_sync(int from, uint64_t round, uint32_t phase) {
  auto m = poll_sync_kept(from, round, phase);
  if (m) decode_kept(*m);
  return m;
}

std::optional<GossipEngine::Message> GossipEngine::poll_sync_kept(int from, uint64_t round, uint32_t phase) {
  std::string refused;
  auto m = inbox_->wait_sync(from, round, phase, 0.0, stopped_, &refused);
  if (!m && !refused.empty()) refuse_sync(from, round, refused);
  if (!m && stopped_) throw StopRequested();
  return m;
}

}  // namespace hearsay
