// Site replicas (site_replicas.cpp, site_replay.cpp; docs/ALGORITHMS.md, "Site replicas"):
// a site's peers train as one replica. What the engine and the site's own files use; the
// algorithms never include it (they take their gradient from GossipEngine::gradient).
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "algorithm.h"

namespace hearsay {

// The rows every peer of this site takes (in its order, all equal until the first split),
// and this peer's seconds per sample.
struct SiteSplit {
  std::vector<int> rows;
  double seconds_per_sample = 0;
};
// A leader's record of its step, so that its site's members repeat the step rather than
// receive its model (site_replay.cpp): the optimizer's one step, with the model and
// gradient it stepped from where they are not what the members hold.
struct SiteReplay {
  bool recording = false;     // a leader, inside its algorithm's step
  bool whole_models = false;  // the algorithm's step is not one that can be repeated: whole models from now on
  bool resync = false;        // the next step sends the model and the optimizer's state whole
  int optimizer_steps = 0;    // this step's
  bool described = false;     // its one optimizer step was on the model's own buffers
  bool moved = false;         // the model it stepped from is not the one the members hold
  bool regraded = false;      // the gradient it stepped with is not the site's
  float lr = 0;
  std::vector<float> held;      // the model the members hold (the last step's end); empty: not known
  std::vector<float> gradient;  // the site's gradient, as site_gradient left it
  std::vector<float> before, stepped_gradient, after;  // at the optimizer step
};
// What site replicas keep of their own, in the algorithm that wraps the configured one
// (wrap_in_site_replicas); the site's agreed view is the engine's (GossipEngine::site_view).
struct SiteState {
  SiteSplit split;
  SiteReplay replay;
};
// Bytes a site's replay holds (up to five model-sized vectors on a leader).
inline uint64_t site_held_bytes(const SiteState& s) {
  const SiteReplay& r = s.replay;
  return (r.held.capacity() + r.gradient.capacity() + r.before.capacity() + r.stepped_gradient.capacity() +
          r.after.capacity()) * sizeof(float);
}

// The configured algorithm run as site replicas (cluster.site_replicas): the wrapper
// supplies its gradient (the site's sum), runs the leader's and the members' roles around
// its steps (a member never runs it), replays the leader's step to the members, and changes
// the site's view when a peer of it stops answering. The wrapped algorithm sees a peer.
std::unique_ptr<Algorithm> wrap_in_site_replicas(std::unique_ptr<Algorithm> inner);

// The gradient of `batch` at the model into its gradient buffer; under
// cluster.site_replicas averaged over this peer's site (a ring among its peers, each hop
// under the site codec; never across the WAN), so every peer of the site holds the same
// gradient bit for bit. Uses the synchronous phases of kSiteRingPhases (phases.h) of round `step`;
// waits for the site's peers. Every algorithm takes its gradient here.
BatchStats site_gradient(GossipEngine& e, SiteState& state, const Batch& batch, uint64_t step);

// Site replicas (site_replicas.cpp; docs/ALGORITHMS.md, "Site replicas").
// Whether only the sites' leaders run the algorithm (site replicas, and an algorithm
// that is not a collective over every peer).
bool leaders_run(const GossipSpec& s);
// The spec with the topology among sites (each site one node), and how many sites.
GossipSpec among_sites(const GossipSpec& s, int peers, int* sites);
enum class SiteRole { kNone, kLeader, kMember };
// kLeader: runs the algorithm and sends its site the model each step; kMember: takes
// part in the site's gradient sum and adopts the leader's model; kNone: runs the
// algorithm as every peer does (no site replicas, a collective algorithm, a site of one).
SiteRole site_role(const GossipEngine& e);
// The `site` event (docs/LOGS.md): this peer's site, role, leader and the site's size.
void log_site(GossipEngine& e, SiteRole role);
// Whether a site can go on without a peer that stopped answering: its live peers agree on
// a new view, the first of them leads (docs/ALGORITHMS.md, "A leader's death"). Only where
// the leaders run an algorithm whose state a new leader may start afresh.
bool elects_new_leader(const GossipSpec& s);
// Thrown out of a site's step when the site's view changed during it: the step is given
// up, every live peer of the site holds the decider's model. `stats`: this peer's batch;
// `skip`: the steps this peer was behind the decider, which it skips.
struct SiteViewChanged {
  BatchStats stats;
  uint64_t skip = 0;
};
// A leader's view of the other sites' leaders, before its step: a site whose leader is no
// longer connected is led by its first peer still connected (its view's rule), which
// this leader gossips with from then on (the `site_leader` event).
void refresh_site_leaders(GossipEngine& e);
// The rows of `total` each peer takes, in proportion to its speed (1 / its seconds per
// sample), none more than `cap` (the rest shared by speed among the others), whole rows
// by largest remainder, at least 1 each; they sum to `total` (when n x cap >= total).
std::vector<int> split_rows(const std::vector<double>& seconds_per_sample, int total, int cap);
// At most this many times the config's batch a peer takes of its site's: a peer's model
// holds that many rows' activations, so a site of 64 does not make each peer hold 64.
inline constexpr int kMaxSiteShare = 4;
// GossipEngine::batch_rows: this peer's rows of its site's split, else batch_size.
int site_batch_rows(const GossipEngine& e, const SiteState& state, int batch_size);
// A member's step: its part of the site's gradient sum, then its leader's update.
// `lr`: this step's rate on the member's own schedule (what the leader's may not exceed).
BatchStats site_member_step(GossipEngine& e, SiteState& state, const Batch& batch, float lr, uint64_t step);
// The leader's update to the rest of its site (fp32, exact), after its step.
void send_site_update(GossipEngine& e, SiteState& state, uint64_t step);
// A round or a count as four floats of 16 bits each (exact in fp32), and back (nullopt
// unless the first four are whole numbers in [0, 65535]); site_replicas.cpp.
std::vector<float> round_as_floats(uint64_t r);
std::optional<uint64_t> round_from_floats(const std::vector<float>& v);
// The leader's update of its site (site_replay.cpp): its members repeat its step (its
// optimizer's step, from the model and gradient it stepped from where the algorithm changed
// them) rather than receive its model; whole models where a step cannot be repeated.
// The optimizer a leader's algorithm steps: `inner`, recording that step.
std::unique_ptr<Optimizer> site_replay_optimizer(GossipEngine& e, SiteState& state, Optimizer& inner);
// A leader's step begins, and ends without an update (an exception, a site of one).
void begin_site_replay(GossipEngine& e, SiteState& state);
void end_site_replay(GossipEngine& e, SiteState& state);
// The site's gradient, as the site's peers hold it after site_gradient (the leader keeps it).
void note_site_gradient(GossipEngine& e, SiteState& state, std::vector<float>&& gradient);
// After the leader's step: the update's parts, each (its part number, its values).
std::vector<std::pair<uint32_t, std::vector<float>>> site_update_parts(GossipEngine& e, SiteState& state, uint64_t step);
// After a view change: the next update is whole (the model and the optimizer's state).
void forget_site_replay(GossipEngine& e, SiteState& state);
// A member's side: takes the update of `step` from peer `leader`, each part from
// receive(part), checks it (its form; its rate against `lr`, this step's on the member's
// own schedule; its models' and gradient's norms against the member's own, by the update
// guard's ratio) and applies it. Throws InputError naming the leader and the part when
// one is malformed, and refuses (GossipEngine::refuse_sync) one that fails a check;
// nothing is taken then.
void follow_site_leader(GossipEngine& e, SiteState& state, uint64_t step, int leader, float lr,
                        const std::function<std::vector<float>(uint32_t part)>& receive);

}  // namespace hearsay
