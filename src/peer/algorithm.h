// The private interface behind GossipEngine: one implementation per algorithm
// (src/peer/algorithms/). An algorithm owns the training step and the communication
// around it; it reaches the model, the mixer and the network only through the engine.
#pragma once

#include <initializer_list>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hearsay/codec.h"
#include "hearsay/error.h"
#include "hearsay/topology.h"

#include "message.h"
#include "phases.h"

namespace hearsay {

// Bytes the floats of these vectors hold (their capacity: what the allocator keeps).
inline uint64_t floats_held(std::initializer_list<const std::vector<float>*> vs) {
  uint64_t b = 0;
  for (const auto* v : vs) b += v->capacity() * sizeof(float);
  return b;
}

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual BatchStats step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) = 0;
  // The algorithm's own state, for checkpoints (little-endian floats and doubles; empty
  // when it keeps none). load throws InputError when the bytes do not fit this model.
  virtual std::string save() const { return {}; }
  virtual void load(const std::string& state, GossipEngine& e) {
    if (!state.empty()) throw InputError("checkpoint: algorithm state given to an algorithm that keeps none");
  }
  // After the run (GossipEngine::settle): take in what arrived since the last step, without
  // stepping. Only algorithms that conserve a quantity need it.
  virtual void settle(GossipEngine&) {}
  // Bit parity (engine_parity.cpp): where the algorithm marks equal copies
  // (GossipEngine::copies_equal), whether the model itself is one of them, and its own
  // buffers that every peer holds equal there too (diloco's outer model and momentum),
  // which are digested and repaired with it.
  virtual bool model_equal_at_copies() const { return true; }
  virtual std::vector<std::vector<float>*> equal_state() { return {}; }
  // Bytes of host memory the algorithm's own state holds now (public copies, an outer
  // model and its momentum, error-feedback memories): the `algorithm` owner of a peer's
  // memory event. Buffers of one step's life are not state and are not counted.
  virtual uint64_t held_bytes() const { return 0; }

  // What a wrapper around an algorithm (site replicas: site_replicas.h) supplies; an
  // algorithm of its own keeps these defaults.
  // Once, as the engine is made: a wrapper installs what it needs (GossipEngine::use_optimizer).
  virtual void attach(GossipEngine&) {}
  // The gradient of `batch` at the model into its gradient buffer (GossipEngine::gradient):
  // by default the model's own; site replicas sum it over the site.
  virtual BatchStats gradient(GossipEngine& e, const Batch& batch, uint64_t step);
  // The rows of a config's batch this peer takes (GossipEngine::batch_rows), and the time
  // its last computation of `rows` took (GossipEngine::note_compute).
  virtual int batch_rows(const GossipEngine&, int batch_size) const { return batch_size; }
  virtual void note_compute(double /*seconds*/, int /*rows*/) {}
};

// A little writer and reader for save()/load(): doubles and float vectors in order.
class StateWriter {
 public:
  StateWriter& put(double v) { return raw(&v, sizeof v); }
  StateWriter& put(const std::vector<float>& v) {
    put(static_cast<double>(v.size()));
    return raw(v.data(), 4 * v.size());
  }
  // A vector that may not exist yet (empty until the first step): a flag, then the vector.
  StateWriter& put_optional(const std::vector<float>& v) {
    put(v.empty() ? 0.0 : 1.0);
    return v.empty() ? *this : put(v);
  }
  std::string str() const { return out_; }

 private:
  StateWriter& raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  std::string out_;
};

class StateReader {
 public:
  explicit StateReader(const std::string& s) : s_(s) {}
  double get() {
    double v;
    take(&v, sizeof v);
    return v;
  }
  std::vector<float> get_floats(size_t expect) {
    const double n = get();
    if (n != static_cast<double>(expect)) throw InputError("checkpoint: algorithm state holds a vector of " + std::to_string(n) +
                                                           " floats, this model needs " + std::to_string(expect));
    std::vector<float> v(expect);
    take(v.data(), 4 * expect);
    return v;
  }
  // What put_optional wrote: left empty when it was, else `expect` floats.
  void get_optional(std::vector<float>* v, size_t expect) {
    if (get() != 0) *v = get_floats(expect);
  }
  bool done() const { return at_ == s_.size(); }

 private:
  void take(void* p, size_t n) {
    if (s_.size() - at_ < n) throw InputError("checkpoint: algorithm state is cut short");
    std::memcpy(p, s_.data() + at_, n);
    at_ += n;
  }
  const std::string& s_;
  size_t at_ = 0;
};

// The engine's topology: the gossip topology among sites, played by their leaders, when
// the leaders run the algorithm; else the gossip topology among peers.
std::unique_ptr<Topology> make_engine_topology(const GossipSpec& s, int peers);
// The plain local step: the gradient (GossipEngine::gradient), then the optimizer.
BatchStats local_step(GossipEngine& e, const Batch& batch, float lr, uint64_t step);
// An algorithm's synchronous phases stay inside kAlgorithmPhases (phases.h); the engine's
// own exchanges (a site's gradient ring, its leader's update) have ranges of their own.
// The peers of each site in cluster order, by site index (all in site 0 where the topology
// names no sites); the one place site membership is derived, for site_step and AllReduce.
std::map<int, std::vector<int>> peers_by_site(const GossipEngine& e);
// This peer's site: its peers in cluster order (after a view change, those still
// alive, site_replicas.cpp), this peer among them.
std::vector<int> my_site(const GossipEngine& e);
// Whether allreduce_sum can carry a codec's payloads: a dense codec whose hops are
// decoded, summed in fp32 and encoded again (none, fp16, bf16, int8, int4).
bool summable_codec(const std::string& codec);
// diloco's and streaming_diloco's `replica` (only "peer": a site as one replica is
// cluster.site_replicas now) and codecs: `outer_codec` (empty: gossip.codec) carries the
// outer all-reduce; with `any_codec` (diloco) a codec that cannot be summed goes through
// a CompressedSum, else it must be summable (streaming_diloco's overlapped all-reduce;
// a sparse codec there would drop most of every sum, silently).
void check_diloco_replica_and_codecs(const GossipSpec& s, const std::string& replica, const std::string& outer_codec,
                                     bool any_codec = false);
// Whom a collective sums over: every peer, or only this peer's site.
enum class ReduceScope { kCluster, kSite };
// Sum of `v` (messages of `kind`) over all peers (collectives.cpp): a ring within one
// site; with sites, up to each site's leader, a ring among the leaders, and back down.
// With ReduceScope::kSite, a ring among this peer's site only.
// With `compressed`, each hop travels under gossip.codec (none, fp16, bf16, int8), else
// as fp32; every peer ends with bit-identical sums. Uses the synchronous phases phase0 ..
// phase0 + n + 1 of `round` (kSite: phase0 .. phase0 + 2 n - 3 for a site of n, the ring
// all-gather's); waits for the peers.
// `codec` (with `compressed`): a codec by name in place of gossip.codec (DiLoCo's
// outer_codec); empty for gossip.codec.
std::vector<float> allreduce_sum(GossipEngine& e, MessageKind kind, std::vector<float> v, uint64_t round, uint32_t phase0,
                                 bool compressed, ReduceScope scope = ReduceScope::kCluster, const std::string& codec = "");
// allreduce_sum over n floats the caller holds (a host peer's gradient or parameter buffer),
// summed where they lie: no model-sized copy beside them.
void allreduce_sum_in_place(GossipEngine& e, MessageKind kind, float* v, size_t n, uint64_t round, uint32_t phase0,
                            bool compressed, ReduceScope scope = ReduceScope::kCluster, const std::string& codec = "");
// allreduce_sum as an object, so that it can run a piece at a time between training
// steps (Streaming DiLoCo overlaps it with them): progress() does what the messages
// that have arrived allow and never waits; finish() waits for the rest and returns the
// sum. The same plan, in the same order, as allreduce_sum.
class AllReduce {
 public:
  struct Op;
  AllReduce(GossipEngine& e, MessageKind kind, std::vector<float> v, uint64_t round, uint32_t phase0, bool compressed,
            ReduceScope scope = ReduceScope::kCluster, const std::string& codec = "");
  // Over n floats the caller holds and keeps alive (and leaves alone) until finish(): the
  // sum is left in them, and finish() returns an empty vector.
  AllReduce(GossipEngine& e, MessageKind kind, float* v, size_t n, uint64_t round, uint32_t phase0, bool compressed,
            ReduceScope scope = ReduceScope::kCluster, const std::string& codec = "");
  ~AllReduce();
  AllReduce(const AllReduce&) = delete;
  AllReduce& operator=(const AllReduce&) = delete;
  // True when every step is done (finish() then only returns the sum).
  bool progress();
  std::vector<float> finish();

 private:
  GossipEngine::Message header(size_t offset, uint32_t phase) const;
  void plan(uint32_t phase0, ReduceScope scope);
  void post(const Op& op);
  void take(const Op& op, const GossipEngine::Message& m);

  GossipEngine& e_;
  MessageKind kind_;
  std::vector<float> owned_;  // the vector given by value; empty when the caller's is summed
  float* v_;                  // what is summed: owned_'s or the caller's
  size_t n_;
  double reference_norm_ = 0;  // of v as this peer gave it (sync_reference_norm): each arriving part's bound
  uint64_t round_;
  std::string codec_;  // encode_once's codec: empty for gossip.codec
  bool raw_;           // fp32 as it is; else codec_ (encode_once)
  std::vector<Op> plan_;
  size_t next_ = 0;
};
// A sparse all-gather (dgc, demo: sparse_gather.cpp): `mine` goes, as the same bytes, to
// every other peer as the synchronous message (round, phase) of `kind`; returns the sum
// of every peer's decoded update in peer order, this peer's own decoded from mine's
// segments as the others decode them (mine need keep no `decoded`), each a segment at a
// time, so every peer holds the same sum bit for bit. Waits for
// the others (gossip.sync_timeout_s).
std::vector<float> gather_sum(GossipEngine& e, MessageKind kind, const std::shared_ptr<const GossipEngine::Encoded>& mine,
                              uint64_t round, uint32_t phase);
// The same sum written into n floats the caller holds (overwritten; n the update's length).
void gather_sum_into(GossipEngine& e, MessageKind kind, const std::shared_ptr<const GossipEngine::Encoded>& mine,
                     uint64_t round, uint32_t phase, float* sum, size_t n);
// The sum over every peer of a vector under a codec that cannot be summed on the way
// (topk, randomk, sign, qsgd, powersgd), with error feedback across calls: each peer
// encodes v + r once, keeps r <- v + r - what it sent, and gather_sum adds every peer's
// decoded vector in peer order (the same sum, bit for bit, on every peer). diloco's outer
// gradient under such a codec: local steps composed with compression.
class CompressedSum {
 public:
  explicit CompressedSum(std::string codec) : codec_(std::move(codec)) {}
  std::vector<float> sum(GossipEngine& e, MessageKind kind, const std::vector<float>& v, uint64_t round, uint32_t phase);
  // What the codec has not sent yet (empty before the first sum), for checkpoints.
  const std::vector<float>& residual() const;
  std::vector<float>& residual(GossipEngine& e);

 private:
  void start(GossipEngine& e);
  std::string codec_;
  std::unique_ptr<LinkEncoder> encoder_;  // gossip.codec's settings under codec_, error feedback on
};
// The learning rate's factor for the mean of n peers' updates (allreduce, dgc): linear
// (1 growing to n over warmup_steps; Goyal et al., 2017) or 1.
float sync_lr_scale(int peers, uint64_t step, bool linear, int warmup_steps);
// Checks the sync_lr_scaling and sync_lr_warmup_steps options (OptionError naming them).
void check_sync_lr_options(const std::string& scaling, int warmup_steps);

// The mean of every peer's parameters (fp32, phases 0.. of `round`): local_sgd's
// average.
std::vector<float> average_models(GossipEngine& e, uint64_t round);

// allreduce with codec powersgd (powersgd_allreduce.cpp): the mean of every peer's
// gradient, each weight matrix as a rank-r product, with error feedback; two all-reduces
// per step (phases 0.. and kSecondPhase..).
class PowerSgdAllReduce {
 public:
  static constexpr uint32_t kSecondPhase = 1024;
  explicit PowerSgdAllReduce(int rank);
  std::vector<float> average(GossipEngine& e, std::vector<float> g, uint64_t round);
  // Its error memory and warm-start factors.
  uint64_t held_bytes() const {
    uint64_t b = floats_held({&error_});
    for (const auto& q : warm_) b += floats_held({&q});
    return b;
  }
  std::string save() const;
  void load(StateReader& r, GossipEngine& e);

 private:
  // The model's matrices and the stretches outside them (fixed for a model): once.
  void plan(GossipEngine& e);
  size_t rank_;
  std::vector<PowerSgdMatrix> mats_;
  std::vector<std::pair<size_t, size_t>> raw_;  // (start, length) of what travels as it is
  std::vector<float> error_;               // e: what the approximations left out, summed
  std::vector<std::vector<float>> warm_;   // each matrix's Q, the mean of the last step's
};

}  // namespace hearsay
