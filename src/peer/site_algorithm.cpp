// Site replicas as a wrapper around any algorithm (site_replicas.h): the wrapped algorithm
// takes its steps on a site's leader, or on every peer where its collectives span them all,
// and never learns that a site exists. The wrapper gives it the site's gradient, runs the
// leader's and the members' roles around its steps, and gives a step up when the site's
// view changes during it.
#include "site_replicas.h"

namespace hearsay {
namespace {

class SiteReplicas final : public Algorithm {
 public:
  explicit SiteReplicas(std::unique_ptr<Algorithm> inner) : inner_(std::move(inner)) {}

  void attach(GossipEngine& e) override {
    inner_->attach(e);
    // A leader's optimizer steps are recorded, so that its members repeat them.
    if (leaders_run(e.spec())) {
      recorder_ = site_replay_optimizer(e, state_, e.own_optimizer());
      e.use_optimizer(recorder_.get());
    }
  }

  BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) override {
    const SiteRole role = site_role(e);
    if (step == 0) log_site(e, role);
    try {
      if (role == SiteRole::kLeader) {
        refresh_site_leaders(e);
        begin_site_replay(e, state_);
      }
      // A member takes part in its site's gradient sum and adopts its leader's update; the
      // leader runs the algorithm, then sends its site the update.
      const BatchStats s = role == SiteRole::kMember ? site_member_step(e, state_, batch, lr, step) : inner_->step(e, batch, lr, step);
      if (role == SiteRole::kLeader) send_site_update(e, state_, step);
      return s;
    } catch (const SiteViewChanged& changed) {
      end_site_replay(e, state_);
      // The step is given up: the site holds its decider's model, and a peer that was
      // behind the newest skips to its step.
      e.skip_steps(changed.skip);
      return changed.stats;
    } catch (...) {
      end_site_replay(e, state_);
      throw;
    }
  }

  BatchStats gradient(GossipEngine& e, const Batch& batch, uint64_t step) override {
    return site_gradient(e, state_, batch, step);
  }
  int batch_rows(const GossipEngine& e, int batch_size) const override { return site_batch_rows(e, state_, batch_size); }
  void note_compute(double seconds, int rows) override {
    if (rows > 0 && seconds > 0) state_.split.seconds_per_sample = seconds / rows;
  }

  std::string save() const override { return inner_->save(); }
  uint64_t held_bytes() const override { return inner_->held_bytes() + site_held_bytes(state_); }
  void load(const std::string& state, GossipEngine& e) override { inner_->load(state, e); }
  void settle(GossipEngine& e) override {
    // A site that trains as one replica holds the leader's model as of its last step; what
    // the leader would take in now could not reach its site any more.
    if (site_role(e) != SiteRole::kNone) return;
    inner_->settle(e);
  }

 private:
  std::unique_ptr<Algorithm> inner_;
  SiteState state_;
  std::unique_ptr<Optimizer> recorder_;  // the leader's record of its optimizer's steps
};

}  // namespace

std::unique_ptr<Algorithm> wrap_in_site_replicas(std::unique_ptr<Algorithm> inner) {
  return std::make_unique<SiteReplicas>(std::move(inner));
}

}  // namespace hearsay
