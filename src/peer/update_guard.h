// What a peer checks before it mixes anything a neighbour sent (docs/ALGORITHMS.md,
// "Hostile and broken updates"). Every decoded value must be finite (checked as each
// segment is decoded); an asynchronous update's norm must be plausible next to the
// receiver's own model or gradient; a neighbour whose updates fail `strikes` times in a
// row is quarantined (nothing of it is decoded or mixed) for `quarantine_s`, then
// readmitted. Thread-safe: the transport's threads and the step loop both report.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "hearsay/gossip.h"

namespace hearsay {

// Where the first non-finite value of x[0, n) is ("element 17 is NaN"); empty if none.
std::string find_non_finite(const float* x, size_t n);
// The same, and the sum of the squares of x[0, n) in the same pass.
std::string find_non_finite(const float* x, size_t n, double* sum_squares);

// The plausibility rule, alone (docs/ALGORITHMS.md): an update of `kind` whose L2 norm is
// `norm`, summed from `parts` messages, against the receiver's model norm and its own
// recent gradient norm (<= 0 while unknown). Empty when it passes, else why not.
std::string check_update_norm(const UpdateGuardSpec& spec, MessageKind kind, double norm, uint64_t parts,
                              double model_norm, double grad_norm);

// A site leader's replay (src/peer/site_replay.cpp), checked by its member before it takes
// anything: the rate within [0, this step's rate on the member's own schedule] (an
// algorithm steps at its schedule's rate or a share of it, gossip_grad's 1 / (1 + its
// targets)); empty when it passes, else why not.
std::string check_site_rate(float rate, float own_lr);
// A model a site leader sends its member (a replica of the member's own): its norm within
// `spec.max_norm_ratio` of the member's model's, both ways (a model of zeros, or of 1e30,
// is no replica's). 0: no check.
std::string check_site_model_norm(const UpdateGuardSpec& spec, double norm, double own_norm);

class UpdateGuard {
 public:
  UpdateGuard(UpdateGuardSpec spec, size_t peers) : spec_(spec), peers_(peers) {}

  // Whether `peer`'s updates are mixed now; a quarantine whose cool-down has passed ends
  // here (and released() reports it once).
  bool admits(int peer, double now);
  // An update of `peer` was refused for `reason`. Returns true when this refusal starts a
  // quarantine.
  bool refuse(int peer, double now, const std::string& reason);
  // An update of `peer` passed every check: its run of failures ends.
  void pass(int peer);

  struct Event {
    int peer;
    bool quarantined;  // false: released
    std::string reason;
    double until;
  };
  // Quarantines started and ended since the last call (for the log).
  std::vector<Event> take_events();
  // Peers in quarantine now, and refusals so far by the reason's kind (refusal_reason() in
  // include/hearsay/metrics.h: one of a fixed set, whatever the text).
  std::vector<int> quarantined() const;
  std::map<std::string, uint64_t> refused() const;
  const UpdateGuardSpec& spec() const { return spec_; }

 private:
  struct PeerState {
    int failures = 0;
    double until = -1;  // quarantined while now < until
  };
  UpdateGuardSpec spec_;
  mutable std::mutex mu_;
  std::vector<PeerState> peers_;              // GUARDED_BY(mu_)
  std::vector<Event> events_;                 // GUARDED_BY(mu_), at most 2 per peer between log lines
  std::map<std::string, uint64_t> refused_;   // GUARDED_BY(mu_)
};

}  // namespace hearsay
