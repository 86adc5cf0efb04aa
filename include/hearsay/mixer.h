// The staleness-aware mixer: decides how much an arriving update counts, from how stale
// it is. Staleness tau is measured on the receiver from logical clocks: tau =
// max(0, receiver's clock - sender's clock when it sent). Weights:
//
//   constant      f(tau) = 1
//   polynomial    f(tau) = 1 / (1 + tau)^alpha
//   exponential   f(tau) = exp(-lambda * tau)
//   inverse       f(tau) = 1 / max(1, tau)      (Zhang et al., IJCAI 2016: lr = alpha0 / tau, for gradients)
//
// Updates with tau > tau_max are dropped and counted. Model averaging stays a convex
// combination whatever the weights: the incoming model's share is clamped to [0, max_share].
// A gradient folded from m parts on a slow link arrives as the mean of its parts
// (Message::absorb) with its oldest part's clock, so it is weighted by that part's f(tau)
// and a sender's effective step does not grow with m.
// Every decision is recorded for the log (tau percentiles over a uniform sample of the
// window, weights, drops, coalescing). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "hearsay/metrics.h"
#include "hearsay/registry.h"
#include "hearsay/rng.h"

namespace hearsay {

struct MixerSpec {
  // The staleness weighting f(tau), by its registered name: constant, polynomial,
  // exponential, inverse, or one a program registers.
  std::string weighting = "polynomial";
  double alpha = 0.5;
  double lambda = 0.1;
  int64_t tau_max = 64;
  // Model averaging: scale the incoming share by samples seen, so a slow peer's model
  // counts for what it has learnt.
  bool weight_by_samples = false;
  double max_share = 0.5;
  // Robust model mixing against a Byzantine neighbour (src/mixer/robust.h): none,
  // centered_clip or trimmed_mean.
  enum class Robust { kNone, kCenteredClip, kTrimmedMean };
  Robust robust = Robust::kNone;
  double clip_factor = 1.0;  // centered_clip: tau = clip_factor x median recent difference
  double trim = 0.2;         // trimmed_mean: fraction cut from each side
};

// The one list of staleness weightings: f(tau) for an update tau steps stale, given the
// spec's parameters (alpha, lambda). hearsay's own are constant 1, polynomial
// 1/(1+tau)^alpha, exponential exp(-lambda tau) and inverse 1/max(1, tau).
using StalenessWeighting = std::function<double(double tau, const MixerSpec& spec)>;
// hearsay/registry.h; a program adds its own with staleness_weightings().add(name, f).
NamedRegistry<StalenessWeighting>& staleness_weightings();
// Parses "none", "centered_clip", "trimmed_mean"; throws InputError.
MixerSpec::Robust parse_robust(const std::string& name);

class Mixer {
 public:
  explicit Mixer(MixerSpec spec);

  struct Decision {
    bool drop = false;
    int64_t tau = 0;
    double weight = 0;  // the share (models) or the gradient scale
  };

  double staleness_weight(int64_t tau) const;
  // Share of an incoming model in x <- (1 - w) x + w y. `base` is the algorithm's share
  // before staleness (1/2 for pairwise averaging).
  Decision model(uint64_t my_clock, uint64_t their_clock, double base, uint64_t my_samples, uint64_t their_samples);
  // Scale of an incoming gradient.
  Decision gradient(uint64_t my_clock, uint64_t their_clock);
  // An update applied whole whatever its staleness (push-sum mass, which must never be
  // dropped): its staleness is recorded, and it counts as applied with weight 1.
  void applied(uint64_t my_clock, uint64_t their_clock);
  void count_coalesced(uint64_t n);
  // Updates dropped for a reason of the algorithm's own (an answer to an exchange it gave up).
  void count_dropped(uint64_t n);

  struct Stats {
    uint64_t applied = 0, dropped = 0, coalesced = 0;
    double tau_p50 = 0, tau_p90 = 0, tau_p99 = 0, tau_max = 0;
    double weight_mean = 0;
  };
  // Statistics since the last call, then starts a new window.
  Stats take_stats();
  // Every staleness recorded since the mixer was made, in buckets (for /metrics).
  StalenessHistogram staleness() const;
  const MixerSpec& spec() const { return spec_; }

 private:
  Decision record(int64_t tau, double weight, bool may_drop = true);

  MixerSpec spec_;
  StalenessWeighting weight_of_;  // spec_.weighting's function
  mutable std::mutex mu_;
  // A uniform sample of the window's taus (reservoir sampling, Vitter's Algorithm R): at
  // most kMaxTaus, each tau seen in the window kept with the same probability.
  std::vector<int64_t> taus_;  // GUARDED_BY(mu_)
  Rng rng_{0x7a05, 0};         // GUARDED_BY(mu_): which taus the reservoir keeps
  uint64_t applied_ = 0, dropped_ = 0, coalesced_ = 0, seen_ = 0;
  double weight_sum_ = 0;
  StalenessHistogram staleness_;  // GUARDED_BY(mu_): never reset
};

}  // namespace hearsay
