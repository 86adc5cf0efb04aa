// Decentralized training: the engine a peer runs beside its step loop. It sends the
// model or gradient to neighbours chosen by the topology, applies what arrives through
// the staleness-aware mixer, and never lets a local step wait for the network in the
// asynchronous algorithms. docs/ALGORITHMS.md states each update rule.
//
//   adpsgd       asynchronous pairwise model averaging (Lian et al., ICML 2018)
//   gossip_grad  gradients pushed to neighbours, applied with staleness-aware weights,
//                plus periodic model averaging
//   sgp          stochastic gradient push with push-sum weights (Assran et al., ICML 2019)
//   choco        compressed model gossip with public copies (Koloskova et al., ICML 2019)
//   allreduce    synchronous ring all-reduce SGD (baseline)
//   dpsgd        synchronous decentralized SGD (baseline)
//   local_sgd    H local steps, then a synchronous model average (baseline)
//   diloco       H local steps, then an outer Nesterov step on the averaged delta
//                (Douillard et al., 2023)
//   streaming_diloco  diloco by fragments, each all-reduce overlapping inner steps
//   dgc          Deep Gradient Compression: momentum-corrected top-k, sparse all-gather
//                (Lin et al., ICLR 2018)
//   demo         DeMo: top-k of a block DCT of each peer's own momentum, sparse
//                all-gather, signum step (Peng, Quesnelle, Kingma, 2024)
//   delta_gossip H local steps, then the H-step delta gossiped under the codec (error
//                feedback across rounds) and averaged with staleness weights
//
// Threads: the step loop calls before_step/step/after_step from one thread; arrivals come
// on the transport's threads and are queued, then applied on the step loop's thread
// between steps, so the model is never read while it is being written.
#pragma once

#include <array>
#include <atomic>
#include <thread>
#include <condition_variable>
#include <functional>
#include <stdexcept>
#include <map>
#include <memory>
#include <optional>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "hearsay/clock.h"
#include "hearsay/codec.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/metrics.h"
#include "hearsay/mixer.h"
#include "hearsay/trainable.h"
#include "hearsay/optim.h"
#include "hearsay/topology.h"
#include "hearsay/transport.h"

namespace hearsay {

class ChunkedCopy;    // src/peer/chunked_copy.h
class MessageStream;  // src/peer/message_stream.h

namespace ckpt {
class Checkpoint;  // proto/hearsay/checkpoint.proto: what save_state fills in
}  // namespace ckpt

// Thrown out of a step when stop() interrupted a wait: the run ends, it did not fail.
struct StopRequested : std::runtime_error {
  StopRequested() : std::runtime_error("stop requested") {}
};

// Thrown by GossipEngine::wait_sync when peer index `peer` sent nothing for the round
// within gossip.sync_timeout_s. A site's peers catch it to elect a new leader
// (site_replicas.cpp); everywhere else it is the InputError it always was.
struct PeerTimeout : InputError {
  PeerTimeout(const std::string& what, int peer_index) : InputError(what), peer(peer_index) {}
  int peer;
};

// Checks on what neighbours send (src/peer/update_guard.h, docs/ALGORITHMS.md).
struct UpdateGuardSpec {
  // An asynchronous update's L2 norm may be at most this many times the receiver's model
  // norm (models, deltas) or own recent gradient norm (gradients). 0: no norm check.
  double max_norm_ratio = 10;
  int strikes = 3;            // refusals in a row that quarantine a neighbour (0: never)
  double quarantine_s = 30;   // how long a quarantine lasts before the neighbour is readmitted
};

// What a gossip message carries (docs/WIRE.md, Update.kind): parameters travel as
// models, never tagged as gradients.
enum class MessageKind { kGradient, kModel, kModelDelta, kPushSum };
const char* message_kind_name(MessageKind kind);

// What GossipSpec::byzantine may be (fault injection for experiments): the config's check
// and the engine's read this one list.
inline bool is_byzantine_kind(const std::string& kind) {
  return kind == "none" || kind == "scaled" || kind == "sign_flip" || kind == "random" || kind == "absurd";
}

struct GossipSpec {
  // A registered algorithm's name (src/peer/algorithm_registry.h; docs/ALGORITHMS.md).
  std::string algorithm = "adpsgd";
  // The algorithm's own options: its options message in protobuf text format, e.g.
  // "outer_lr: 0.5 local_steps: 16" for diloco; empty: its defaults. The config loader
  // fills it from the config's extension ([hearsay.algorithms.diloco] { ... }).
  std::string options;
  TopologySpec topology;
  MixerSpec mixer;
  int gossip_every = 1;        // steps between sends (async algorithms)
  double sync_timeout_s = 60;  // synchronous algorithms: how long to wait for a peer
  bool parity_check = false;   // gossip.parity_check: digests of the model after each equal-copies step
  size_t segment_elements = 1 << 20;  // updates larger than this travel in segments
  // A message of more bytes than this (a model of hundreds of megabytes) travels as a
  // stream (src/peer/message_stream.h; docs/WIRE.md, "Large messages"): at most this many
  // bytes sent and not yet acknowledged by the receiver, and a link cut in the middle goes
  // on from the receiver's last acknowledgement once it is back, within
  // stream_resume_timeout_s.
  uint64_t stream_window_bytes = 64u << 20;
  double stream_resume_timeout_s = 60;
  CodecSpec codec;                    // gradients and model deltas (asynchronous algorithms)
  std::string model_codec = "none";   // whole models: none, fp16, bf16, int8
  AdaptiveSpec adaptive;              // per-link choice of codec (replaces codec.name)
  UpdateGuardSpec guard;
  // Fault injection for robustness experiments: this peer lies in every asynchronous
  // update it sends. none; scaled (x 5); sign_flip (negated); random (Gaussian of the
  // same norm); absurd (x 1e30, in synchronous exchanges too). docs/ALGORITHMS.md,
  // "Hostile and broken updates".
  std::string byzantine = "none";  // one of byzantine_kinds()
  // cluster.site_replicas (docs/ALGORITHMS.md, "Site replicas"): a site's peers train as
  // one replica; `site_codec` carries the hops of its gradient sum (empty: codec.name).
  bool site_replicas = false;
  std::string site_codec;
  std::string site_split = "speed";  // "speed" or "equal": each peer's share of its site's batch
  // The peers' optimizer (optim), for an algorithm that applies it itself: dgc's momentum
  // correction takes its momentum, Nesterov, weight decay and clipping norm. The peer
  // fills it in from its own spec; the config loader for the algorithms' checks.
  OptimizerSpec optimizer;
};

// Throws InputError naming the problem (the algorithm's own options are checked where the
// algorithm declares them).
void check_gossip_spec(const GossipSpec& spec, int peers);
// Throws InputError for what cluster.site_replicas cannot honour: allreduce (already
// hierarchical), a site codec that cannot be summed, an algorithm the leaders run with
// one site or a topology that picks peers inside sites (src/peer/site_replicas.cpp).
void check_site_replicas(const GossipSpec& spec, int peers);
// Throws InputError when the algorithm cannot run on the topology: dpsgd's and choco's
// weights need an undirected graph (every neighbour relation both ways).
void check_algorithm_topology(const GossipSpec& spec, int peers);
// The registered algorithms' names, sorted, and whether one is synchronous (false for a
// name not registered).
std::vector<std::string> gossip_algorithms();
bool is_synchronous(const std::string& algorithm);

class Algorithm;
class CallbackGate;
class Inbox;
class UpdateGuard;
class RobustMixing;
class Outbox;
class DeviceLinkEncoder;  // hearsay/device_codec.h (builds with CUDA)

class GossipEngine;
// The engine of a peer as its spec says (src/peer/engine_factory.cpp): the spec checked,
// its topology (among the sites' leaders where site replicas run the algorithm there), and
// its algorithm from the registry, wrapped in site replicas where cluster.site_replicas
// asks. `peers` lists every peer's id in cluster order; `me` is this peer's index. The
// transport must already be connecting to the neighbours; the engine installs its
// receiver on it. Model, optimizer, transport and log must outlive the engine.
std::unique_ptr<GossipEngine> make_gossip_engine(const GossipSpec& spec, std::vector<std::string> peers, int me,
                                                 Transport& transport, Trainable& model, Optimizer& optimizer, Clock& clock,
                                                 EventLog& log, uint64_t seed);

class GossipEngine {
 public:
  // As make_gossip_engine, with the topology and the algorithm it made: the engine knows
  // neither which algorithm it runs nor whether a site wraps it.
  GossipEngine(const GossipSpec& spec, std::vector<std::string> peers, int me, Transport& transport, Trainable& model,
               Optimizer& optimizer, Clock& clock, EventLog& log, uint64_t seed, std::unique_ptr<Topology> topology,
               std::unique_ptr<Algorithm> algorithm);
  ~GossipEngine();

  // One training step on a minibatch already on the device, with the algorithm's
  // communication around it. Returns the batch's stats.
  BatchStats step(const Batch& batch, float lr);
  // Seconds the last step worked (computation, the optimizer, codecs, mixing), the time it
  // waited on neighbours (their messages, its sends draining) excluded: what an emulated
  // or slowed device stretches. Summed span by span, so on the simulator's virtual clock,
  // where work takes no time, it is exactly 0.
  double last_work_s() const { return work_s_; }
  // Of that, the last step's own computation: its forward and backward passes and its
  // optimizer steps (docs/LOGS.md, compute utilisation).
  double last_compute_s() const { return compute_s_; }
  // Site replicas with site_split "speed": the rows this peer takes in its next step, its
  // share of its site's batch (the site's peers x `batch_size`); else `batch_size`.
  int batch_rows(int batch_size) const;
  // The seconds this peer's last step computed for (its slowdown and emulation included,
  // waits excluded), for the site's split.
  void note_compute(double seconds, int rows);
  // Asynchronous algorithms, before the first step: with `quorum` > 0, waits (up to
  // quorum_timeout_s) until that many peers have answered a hello, and throws InputError
  // naming the silent ones if they have not (a link that is up is not yet a neighbour
  // that trains); then, with `adopt_model`, asks a connected neighbour for its model and
  // starts from it if that neighbour has already trained (a peer that joins late or
  // restarts without a checkpoint), asking the next if one does not answer within a
  // second, 5 s at most in all. Answers others' requests meanwhile.
  void join(bool adopt_model = true, int quorum = 0, double quorum_timeout_s = 30.0);
  // The round's targets among the neighbours that are connected now: a target that is
  // down is replaced by a connected neighbour, so its share goes to the live ones.
  std::vector<int> live_targets(int64_t round);
  // Names of the neighbours whose updates this step took in (for a divergence message).
  std::vector<std::string> mixed_this_step() const;
  // Neighbours quarantined now (their updates fail the checks; docs/ALGORITHMS.md).
  std::vector<std::string> quarantined() const;
  // Writes a "gossip" event (traffic, staleness, mixing) to the log, and hands the same
  // figures to the metrics board when there is one.
  void log_stats(int64_t step);
  // Adds the host memory the engine's own owners hold now (docs/LOGS.md, `memory`):
  // outboxes, inbox, link encoders' residuals, the algorithm's state, the parameter
  // snapshots, push-sum's returned mass. Step-loop thread.
  void add_memory(MemoryUse& m);
  // Where log_stats also publishes (hearsay-peer --metrics); null: nowhere. Must outlive
  // the engine.
  void set_metrics(MetricsBoard* board) { metrics_ = board; }
  // Answers the join requests and hellos that peers joining or restarting have sent (at
  // every step's start, in this peer's own join, and wherever it waits long outside a
  // step: a peer waiting in its final consensus is still a neighbour that answers).
  void serve_join_requests();
  // Stops waiting in synchronous algorithms (shutdown).
  void stop();
  // After the run, for tests of conservation: whether nothing is left in this peer's
  // outboxes or on its transport's links, and settle() takes in what has arrived since
  // the last step (sgp's push-sum mass) without stepping.
  bool idle() const;
  void settle();
  // The engine's part of a checkpoint: clocks, step count, each link's error-feedback
  // residual and codec, the algorithm's state. load throws InputError when it does not
  // fit this cluster and model.
  void save_state(ckpt::Checkpoint& c) const;
  // The algorithm's part of save_state alone.
  std::string algorithm_state() const;
  void load_state(const ckpt::Checkpoint& c);

  uint64_t clock() const { return logical_clock_; }
  // The time the peer runs on (real, or the simulator's virtual time): what an algorithm
  // reads for timeouts and compute time.
  Clock& time() { return clock_; }
  const std::vector<std::string>& peers() const { return peers_; }
  int me() const { return me_; }
  // Bytes sent to every neighbour so far, whole frames (the transport's count).
  uint64_t bytes_sent() const;
  // Bytes of memory held in outboxes and the inbox (bounded; tests assert it).
  size_t buffered_bytes() const;

  // --- for the algorithms (src/peer/algorithms) --------------------------------------
  struct Message;
  struct Encoded;
  struct DeviceSnapshot;
  Trainable& model() { return model_; }
  // The gradient of `batch` at the model, into its gradient buffer: where the engine's
  // site replicas apply (cluster.site_replicas), the sum over this peer's site, so that
  // every peer of the site holds the same gradient bit for bit (site_replicas.h). Every
  // algorithm takes its gradient here; `step` is the round its exchanges are keyed by.
  BatchStats gradient(const Batch& batch, uint64_t step);
  // The model's forward and backward pass on `batch`, timed as the step's own computation
  // (last_compute_s): the one way an algorithm or a wrapper computes a gradient.
  BatchStats forward_backward(const Batch& batch);
  // The peer's optimizer; under site replicas, seen through the leader's record of its
  // step (use_optimizer). Its steps are timed as the step's own computation.
  Optimizer& optimizer() { return *timed_optimizer_; }
  Mixer& mixer() { return mixer_; }
  Topology& topology() { return *topology_; }
  EventLog& log() { return log_; }
  Rng& rng() { return rng_; }
  const GossipSpec& spec() const { return spec_; }
  uint64_t samples_seen() const { return samples_seen_; }
  // Sends `data` (host) to peer index `to` as the message `header` describes, by name:
  //   e.send(j, {.kind = MessageKind::kModel, .synchronous = true, .round = step}, x);
  // the engine fills in the sender, clocks, step and tensor length.
  // Asynchronous sends made inside step() leave when the step's work is done (the
  // transport's threads, which encrypt and copy them, then do not compete with it); a
  // link keeps their order. Synchronous ones leave at once: the step waits on them.
  void send(int to, Message header, std::vector<float> data);
  // A host copy of the parameters to send and keep (adpsgd's request: the model sent is
  // the base its exchange is measured from): every send of it and the caller share it.
  std::shared_ptr<const std::vector<float>> snapshot_params();
  // A framework that owns the loop (an external peer) computes the next gradient between
  // two steps and does not write the parameters then. With `on` (a host model, real time)
  // the engine copies them after every step on a helper thread meanwhile, and the next
  // step starts from that copy (start_snapshot) instead of copying on its own time;
  // step() first waits for the helper. Step-loop thread; once, before the first step.
  void copy_between_steps(bool on);
  bool copies_between_steps() const { return copy_between_steps_; }
  // The parameters as they are at this step's start, shared and read-only: the helper's
  // copy when there is one, else a copy made now. Call it before the step changes the
  // parameters (an optimizer step, a mix); the same copy for the rest of the step.
  std::shared_ptr<const std::vector<float>> start_snapshot();
  // With `on`, step() leaves the end of the step to its owner's end_step(): the
  // asynchronous sends it held and the helper's copy start when the owner's own
  // bookkeeping is done too, just before it hands the thread back to its framework (the
  // threads they wake would otherwise take the core from that bookkeeping).
  void owner_ends_steps(bool on) { owner_ends_steps_ = on; }
  // Ends the step: its asynchronous sends leave, the helper starts its copy. Once per
  // step (again: nothing); step() calls it itself unless owner_ends_steps.
  void end_step();
  // The parameters were written from outside the engine between steps (a checkpoint
  // loaded): waits for the helper and drops its copy.
  void params_written();
  // Ends copy_between_steps: waits for the helper's copy and ends its thread (before the
  // framework frees the parameters). Step-loop thread; the destructor does it too.
  void stop_copying();
  // As send(), for such a copy: never copied again on its way.
  void send_shared(int to, Message header, std::shared_ptr<const std::vector<float>> data);
  // Encodes `data` (a whole tensor) once with the configured codec (gossip.codec, no
  // error feedback: the caller keeps what was not sent; random-k unscaled). The result's
  // `decoded` is, bit for bit, what each receiver's take_async gives for it. `offset`:
  // where `data` starts within the whole tensor (layout-aware codecs).
  // `codec`: a codec by name instead of gossip.codec's (its other settings kept), as
  // DiLoCo's outer_codec; empty for gossip.codec.
  std::shared_ptr<const Encoded> encode_once(const std::vector<float>& data, uint64_t offset = 0,
                                             const std::string& codec = "");
  // The same with a whole codec spec of the algorithm's own (dgc's density of the
  // moment); its codec is kept for the next call with an equal spec.
  // `keep_decoded` false: the result's `decoded` is left empty (a caller that reads the
  // decoded values a segment at a time, for_each_decoded, holds no dense copy of them).
  std::shared_ptr<const Encoded> encode_once(const std::vector<float>& data, const CodecSpec& spec, uint64_t offset = 0,
                                             bool keep_decoded = true);
  // encode_once of data[0, n) by codec name (empty: gossip.codec), replacing data with what
  // each receiver decodes: the result holds no decoded copy (the all-reduce's hops, which
  // keep the decoded values in their own vector).
  std::shared_ptr<const Encoded> encode_in_place(float* data, size_t n, uint64_t offset, const std::string& codec);
  // The parameters as they are now, encoded once with the model codec (gossip.codec.
  // model_codec), read in place on a host backend; no decoded copy kept. What an
  // algorithm sends whole models as (send_encoded) and keeps as the base of an exchange
  // (adpsgd): codec-sized, and exactly what every receiver decodes.
  std::shared_ptr<const Encoded> encode_model();
  // Whether whole models may go that way: a host peer that copies nothing between steps,
  // without fault injection (it lies per send) or per-link adaptive codecs (a link's
  // own choice); otherwise the link encodes a snapshot.
  bool models_encode_once() const;
  // An update (a gradient, a delta: gossip.codec's payload) of n host floats encoded once,
  // the same bytes for every target (send_encoded), where updates_encode_once(): no copy
  // of it in fp32 while it is sent, and no residual per link.
  std::shared_ptr<const Encoded> encode_update_once(const float* x, size_t n);
  // Whether updates may go that way: where models_encode_once() and gossip.codec keeps no
  // error feedback (a residual is owed per link: each link then encodes its own send).
  bool updates_encode_once() const;
  // Whether this peer encodes and decodes gossip on its device: its model is in device
  // memory (a CUDA backend) in a build with CUDA. Then an algorithm sends what lives on
  // the device as a snapshot (send_device) and applies arrivals with the Message overloads of
  // axpy_params, axpy_grads and mix_neighbour_model; otherwise it keeps the host calls.
  bool gossip_on_device() const { return on_device_; }
  // A copy of `n` floats of the model's device memory (its gradient, its parameters, or a
  // delta the algorithm computed there), taken now and shared by every send of it. Only
  // where gossip_on_device(); step-loop thread.
  std::shared_ptr<const DeviceSnapshot> snapshot_device(const float* src, size_t n);
  // As send(to, header, data), for a device snapshot: the link's codec encodes it on the
  // device (the codec's device twin, with the link's error-feedback residual kept on the
  // device), so only the payload crosses PCIe; a raw fp32 send downloads it once for every
  // link. Falls back to the host encoder, saying so once on stderr, where the device
  // cannot: a codec without a device twin, a push-sum share under a lossy codec (its
  // rounding is given back to the sender as a host vector), fault injection (byzantine).
  void send_device(int to, Message header, std::shared_ptr<const DeviceSnapshot> data);
  // Sends an encoded update to peer index `to` as `header` describes: the same payload
  // bytes on every link, never re-encoded, never folded with another, in order.
  void send_encoded(int to, Message header, std::shared_ptr<const Encoded> update);
  // Whether peer index `peer` takes part now: its link is up, and it has not finished its
  // training (an external peer waiting in its final consensus keeps its links open).
  bool connected(int peer) const;
  // Whether the link to peer index `peer` is up now, finished or not.
  bool link_up(int peer) const;
  // Takes the asynchronous arrivals queued so far.
  std::vector<Message> take_async();
  // Push-sum mass this peer sent that no neighbour will take in, summed into one message
  // (data empty when there is none): whole messages whose send failed, and the rounding a
  // lossy model codec took off a numerator. The sender adds it back to its own (x, w).
  Message take_returned();
  // Sends not yet reported done (in outboxes or on the wire) that were made at or before
  // `step` (this peer's step count), over every link.
  bool unsent_since(uint64_t step) const;
  // Waits until unsent_since(step) is false, or stop(); throws StopRequested on stop.
  void wait_sent(uint64_t step);
  // Waits until ready() holds (checked every 200 us of the peer's clock, virtual time
  // when simulated) or timeout_s has passed; the wait is not the step's work. Returns
  // ready(); throws StopRequested on stop().
  bool wait_until(const std::function<bool()>& ready, double timeout_s);
  // Waits for the synchronous message of (round, phase) from peer index `from`.
  // A synchronous contribution (or a site leader's update) refused before anything of it
  // was taken: counted and said as every refusal is, a "refused" event in the log, then an
  // InputError that names the sender, the round and why (a synchronous algorithm cannot go
  // on without it; the peer ends saying so, never later as divergence).
  [[noreturn]] void refuse_sync(int from, uint64_t round, const std::string& why);
  // What a synchronous exchange's parts are held against: the norm of this peer's own
  // part `own`, or its model's where that is larger (a gradient share of one row may be all
  // but zero, honestly).
  double sync_reference_norm(const std::vector<float>& own) { return sync_reference_norm(own.data(), own.size()); }
  double sync_reference_norm(const float* own, size_t n);
  // The guard's bound on a synchronous part `m`: its norm at most max_norm_ratio x `parts`
  // x `reference` (sync_reference_norm); refuse_sync when it is over. No check while the
  // reference is 0 or the ratio is 0.
  void check_sync_part(const Message& m, uint64_t round, double reference, double parts);
  // The model's L2 norm: the last mix's measure while it is at most kNormAgeSteps old, else
  // measured now where the model lives.
  double model_norm();
  // Measures the model's norm now and keeps it as model_norm()'s answer until the
  // parameters are next written through the engine (params_written): for an algorithm
  // whose parameter buffer carries something else for a while (diloco's outer gradient).
  void hold_model_norm();
  Message wait_sync(int from, uint64_t round, uint32_t phase);
  // The same without waiting: the message when it has arrived, else nullopt (a refused
  // one throws as wait_sync does).
  std::optional<Message> poll_sync(int from, uint64_t round, uint32_t phase);
  // The same, waiting at most timeout_s (nullopt when nothing came; a refused one throws).
  std::optional<Message> wait_sync_for(int from, uint64_t round, uint32_t phase, double timeout_s);
  // poll_sync and wait_sync with the message as the inbox kept it: on a host peer its
  // payloads alone (Message::kept_only), for a caller that decodes it where it goes, a
  // segment at a time (for_each_part: the all-reduce's hops). The others decode it whole.
  std::optional<Message> poll_sync_kept(int from, uint64_t round, uint32_t phase);
  Message wait_sync_kept(int from, uint64_t round, uint32_t phase);
  // Drops the synchronous messages held for which stale(from, round, phase) is true: those
  // of a site's attempt that its view change gave up (they would count against the inbox's
  // bound on held rounds for good).
  void forget_sync(const std::function<bool(int from, uint64_t round, uint32_t phase)>& stale);
  // An algorithm calls it where its step leaves every peer with the same model (allreduce's
  // every step, local_sgd's average, diloco's outer step) or the same state of its own
  // (streaming_diloco's outer model): with gossip.parity_check the next step starts by
  // comparing the peers' digests of it (engine_parity.cpp).
  void copies_equal();
  // Fault injection for tests of bit parity: one bit of what parity checks flips (the
  // model, or the algorithm's equal state where the model is not one of the copies), as a
  // silent memory error would.
  void inject_bit_flip();
  // Host copy of the parameters, and writing them back.
  std::vector<float> params_host();
  void set_params_host(const std::vector<float>& p);
  // Parameters [offset, offset + n) into host memory `dst`, and written back from `src`:
  // the part of the model an algorithm works on, without a host copy of the whole model
  // (streaming_diloco's fragments). Straight from and into the model on a host backend.
  void read_params(size_t offset, size_t n, float* dst);
  void write_params(size_t offset, size_t n, const float* src);
  // x <- (1 - w) x + w y, on the device.
  void mix_params(const std::vector<float>& y, double w);
  // The same for a neighbour's model, through the robust rule when one is configured
  // (mixer.robust): y is replaced by what that rule says to mix toward.
  void mix_neighbour_model(int from, const std::vector<float>& y, double w);
  // x <- x + w (y - base): a move toward a neighbour's model measured from `base` (adpsgd's
  // half of an exchange it started, base = the model it sent), through the robust rule
  // (from base) when one is configured.
  void move_toward_neighbour(int from, const std::vector<float>& base, const std::vector<float>& y, double w);
  // The same for an arrival m (y = its values, decoded a segment at a time where it kept
  // only its payloads).
  void move_toward_neighbour(int from, const std::vector<float>& base, const Message& m, double w);
  // The same from a base encoded once (encode_model: the model this peer sent, as its
  // receiver decoded it), both decoded a segment at a time where their segments match.
  void move_toward_neighbour(int from, const Encoded& base, const Message& m, double w);
  // x <- x + a * y, on the device.
  void axpy_params(double a, const std::vector<float>& y);
  // g <- g + a * y into the gradient buffer, on the device.
  void axpy_grads(double a, const std::vector<float>& y);
  // The same three for an arrival m (y = m.data). Where gossip_on_device() and m kept the
  // payloads it arrived as, they are decoded with the weight straight into device memory
  // (the weight times each decoded value added in, as the host path's upload and axpy
  // do); otherwise, and always on a host peer, they are the host calls above on m.data.
  void axpy_params(double a, const Message& m);
  void axpy_grads(double a, const Message& m);
  void mix_neighbour_model(int from, const Message& m, double w);
  // This peer's distance to a neighbour's model m, for the log (once per neighbour and window).
  void note_model_distance(const std::string& peer, const Message& m);
  // An arrival's values a part at a time, in order: fn(offset within the tensor, values,
  // count). One call with its data; where it kept only its payloads (a host peer's
  // asynchronous arrival, Message::kept_only), a call per segment, decoded into a scratch
  // of one segment (gossip.segment_elements at most) that the next call reuses: no
  // model-sized copy. Step-loop thread.
  void for_each_part(const Message& m, const std::function<void(size_t at, const float* y, size_t n)>& fn);
  // This peer's own gradient (host copy), the reference for neighbours' gradient norms.
  void note_own_gradient(const std::vector<float>& g) { note_own_gradient(g.data(), g.size()); }
  void note_own_gradient(const float* g, size_t n);
  // The same, measured on the device.
  void note_own_gradient(const DeviceSnapshot& g);

 private:
  class WaitSpan;
  // wait_sync_for's wait, the message as the inbox kept it.
  std::optional<Message> take_sync(int from, uint64_t round, uint32_t phase, double timeout_s);
  // A synchronous algorithm cannot go on without a message the inbox refused.
  void on_frame(const std::string& from, InFrame&& frame);
  // A message's L2 norm: the inbox's measure of it when it took one.
  static double norm_of(const Message& m);
  void lie(std::vector<float>& v);  // spec_.byzantine
  bool lies_in(const Message& m) const;  // whether spec_.byzantine lies in this message
  // A neighbour's update failed a check: count it, say so, maybe quarantine the sender.
  void refuse(int from, const std::string& why);
  // The asynchronous arrivals that pass the norm check (the finite check ran on decode).
  std::vector<Message> screen(std::vector<Message> arrivals);
  // device_dst += a * y, y on the host (uploaded through scratch_).
  void axpy_host(double a, const std::vector<float>& y, float* device_dst);
  // The same for an arrival, a part at a time where it kept only its payloads.
  void axpy_host(double a, const Message& m, float* device_dst);
  // mix_neighbour_model for an arrival, on the host path.
  void mix_host(int from, const Message& m, double w);
  std::vector<float> part_scratch_;  // for_each_part's decoded segment (step-loop thread)
  std::vector<float> base_scratch_;  // move_toward_neighbour's decoded base segment (step-loop thread)
  // y where the backend reads it: y itself on a host backend, else uploaded to scratch_.
  const float* on_backend(const std::vector<float>& y);
  void put_on_wire(int to, Message&& m, std::function<void(const SendStatus&)> done);
  // put_on_wire for a device snapshot; false (nothing sent) when the host must encode it.
  bool put_device_on_wire(int to, Message& m, const std::function<void(const SendStatus&)>& done);
  // Hands a message's frames to the transport; `done` hears once the last has left. A
  // push-sum share (`returned`, at `offset`, weight `weight`) whose send fails is given back.
  void send_frames(int to, std::vector<OutFrame> frames, size_t bytes, std::function<void(const SendStatus&)> done,
                   std::shared_ptr<const std::vector<float>> returned, double weight, uint64_t offset);
  // device_dst += a * (m's payloads decoded), on the device; false when m kept none.
  bool decode_on_device(const Message& m, double a, float* device_dst);
  // One stderr line per distinct reason (the device path's fallbacks).
  void say_once(const std::string& what);
  void give_back(const std::vector<float>& x, uint64_t offset, double w);  // into returned_
  void adapt_codec(int to, size_t elements, bool update);
  // A message of `bytes` took `seconds` to link `to`: the topology's and the adaptive
  // codec's measure of the link (smoothed).
  void note_link_throughput(int to, uint64_t bytes, double seconds);
  LinkEncoder* link_encoder(int to, const Message& m, size_t elements, bool* update);
  // Fills in what the engine knows of a message it sends: sender, clocks, step, samples,
  // and the whole tensor's length when the algorithm left it 0.
  void stamp(Message& m) const;
  void wait_for_quorum(int quorum, double timeout_s);
  // Bit parity (engine_parity.cpp): the digests of the step copies_equal() marked,
  // compared before the next step; a peer off the majority takes the checked state (the
  // model where it is one of the copies, then the algorithm's equal_state) from its first
  // holder. Its digest (CRC-32C of those bytes in turn), its parts, and written back.
  void check_parity();
  uint32_t parity_digest();
  std::vector<std::vector<float>> parity_parts();
  std::vector<size_t> parity_part_sizes();
  void take_parity_parts(const std::vector<std::vector<float>>& parts);
  void adopt_neighbour_model(double timeout_s);
  int index_of(const std::string& id) const;
  // Peer i's outbox, made with its link encoders at first use (step-loop thread).
  Outbox& outgoing_link(int i);
  // Large messages: a stream per link while one is under way (message_stream.h). The
  // receiver's acknowledgement of a stream's segments (a Credit frame) moves its window;
  // the step thread resumes one whose link came back (tick_streams, each step and wait).
  // `shares_message`: the frames reference the message's own encoded bytes (send_encoded).
  void start_stream(int to, uint64_t update_id, uint32_t segments, std::function<OutFrame(uint32_t)> make,
                    std::function<void(const SendStatus&, uint64_t bytes)> done, bool shares_message);
  void on_acknowledgement(int from, uint64_t update_id, uint64_t held);
  void acknowledge(int to, uint64_t update_id, uint32_t held);
  void tick_streams();
  std::mutex streams_mu_;
  std::vector<std::shared_ptr<MessageStream>> streams_;  // GUARDED_BY(streams_mu_), by peer index
  // A stream's update id: this engine's random 64-bit base (drawn at construction, never
  // the same twice) plus its count, so a restarted sender's new stream never continues
  // one a receiver still holds from its life before.
  const uint64_t stream_id_base_;
  // Acknowledgements to one neighbour: one in flight and the newest waiting, no more (a
  // neighbour that sends segments and never reads costs one frame, not a queue).
  struct AckLane {
    std::mutex mu;
    bool in_flight = false;  // GUARDED_BY(mu)
    bool waiting = false;    // GUARDED_BY(mu)
    uint64_t update_id = 0;  // GUARDED_BY(mu): the waiting one's
    uint32_t held = 0;       // GUARDED_BY(mu)
  };
  std::vector<std::unique_ptr<AckLane>> ack_lanes_;  // by peer index, fixed after construction
  void send_acknowledgement(int to, uint64_t update_id, uint32_t held);

  GossipSpec spec_;
  std::vector<std::string> peers_;
  int me_;
  Transport& transport_;
  Trainable& model_;
  Optimizer& optimizer_;
  Clock& clock_;
  EventLog& log_;
  Mixer mixer_;
  std::unique_ptr<Topology> topology_;
  Rng rng_;
  std::unique_ptr<Inbox> inbox_;
  std::vector<std::unique_ptr<Outbox>> outboxes_;  // by peer index; null until first used
  uint64_t seed_ = 0;
  const struct AlgorithmEntry* entry_ = nullptr;  // the registry's; it outlives every engine
  std::unique_ptr<Algorithm> algorithm_;
  DeviceBuffer scratch_;
  std::atomic<uint64_t> logical_clock_{0};
  uint64_t steps_ = 0, samples_seen_ = 0;
  // The model's sum of squares as the last pass that wrote it measured it (a host mix),
  // and at which step; negative when unknown. The guard's norm check takes it while it is
  // at most kNormAgeSteps old (a bound on the ratio of norms: a few optimizer steps do not
  // move it) instead of reading the whole model again.
  double params_sq_ = -1;
  uint64_t params_sq_step_ = 0;
  static constexpr uint64_t kNormAgeSteps = 4;
  // copy_between_steps: the helper thread and what it hands over, under copy_mu_.
  std::atomic<bool> copy_between_steps_{false};  // atomic: close() may end it from another thread
  std::thread copier_;
  std::mutex copy_mu_;
  std::condition_variable copy_cv_;
  std::shared_ptr<ChunkedCopy> copy_job_;  // GUARDED_BY(copy_mu_): the copy the last step's end began; null once taken
  uint64_t copy_jobs_ = 0;                 // GUARDED_BY(copy_mu_): copies begun, so the helper sees a new one
  bool copy_quit_ = false;                 // GUARDED_BY(copy_mu_)
  double copy_sq_ = 0;                     // the last copy's sum of squares (step-loop thread)
  // The last copies' buffers (step-loop thread): one that nothing else holds any more is
  // filled again, so a copy does not fault in fresh pages (40 MB for 10M parameters).
  std::vector<std::shared_ptr<std::vector<float>>> copy_buffers_;
  std::shared_ptr<const std::vector<float>> start_snapshot_;  // this step's (step-loop thread)
  // The copy begun at the last step's end (null when none), finished here: the chunks the
  // helper has not begun are copied on this thread, those it is copying waited for.
  std::shared_ptr<const std::vector<float>> take_copy();
  // Drops the copy begun, if any, once the chunks under way are done (they read the
  // parameters).
  void cancel_copy();
  std::shared_ptr<std::vector<float>> copy_buffer();
  // Inside step(): asynchronous sends wait here for its end (send()), until end_step().
  bool in_step_ = false;
  bool owner_ends_steps_ = false;
  int64_t parity_due_ = -1;  // the step whose equal copies the next step checks first (copies_equal)
  bool said_no_majority_ = false;  // bit parity without a majority: said on stderr once (the log has each)
  std::vector<std::function<void()>> deferred_;
  // Offers a message to peer `to`'s outbox now, or at the step's end (deferred_).
  void offer(int to, Message&& m);
  void flush_deferred();
  // A host pass over the whole model (`whole`) summed its squares in eight lanes: params_sq_.
  void measured_params(const double (&lanes)[8], bool whole);
 public:
 public:
  // The site's peers that are alive as its last view change agreed (cluster order, the
  // leader first; empty: the config's site, before any change), and that change's number.
  // Site replicas (src/peer/site_replicas.cpp) agree on it; the collectives read it.
  struct SiteView {
    std::vector<int> members;
    uint32_t epoch = 0;
  };
  SiteView& site_view() { return site_view_; }
  const SiteView& site_view() const { return site_view_; }
  // Steps skipped since the last call (a site's view change put this peer behind the
  // others): the step loop adds them to its count, so the site's peers end together.
  int64_t take_skipped_steps() { return std::exchange(skipped_steps_, 0); }
  // Inside a step: this peer skips `steps` steps (a site's view change put it behind).
  void skip_steps(uint64_t steps) {
    steps_ += steps;
    skipped_steps_ += static_cast<int64_t>(steps);
  }
  // The optimizer the algorithms see (optimizer()) in place of the peer's own, or null for
  // the peer's own: a site's leader records its step through it (site_replay.cpp).
  void use_optimizer(Optimizer* o) { optimizer_seen_ = o; }
  // The peer's own optimizer, untimed and unwrapped: what such a recording wraps.
  Optimizer& own_optimizer() { return optimizer_; }

 private:
  SiteView site_view_;
  Optimizer* optimizer_seen_ = nullptr;
  int64_t skipped_steps_ = 0;
  std::atomic<uint64_t> next_update_id_{1};  // outboxes send from the step loop and transport threads
  std::atomic<bool> stopped_{false};
  double work_s_ = 0, work_since_ = 0;  // step-loop thread only: last_work_s, and when its current span began
  double compute_s_ = 0;                // step-loop thread only: last_compute_s
  // Every send completion enters through it; the destructor closes it, so none runs into a
  // freed engine (src/util/callback_gate.h).
  std::shared_ptr<CallbackGate> send_gate_;
  std::unique_ptr<Optimizer> timed_optimizer_;  // optimizer(): the one in force, timed into compute_s_
  mutable std::mutex link_mu_;
  std::vector<double> link_bps_;  // GUARDED_BY(link_mu_): measured throughput per link, smoothed
  std::map<std::string, double> distances_;  // step-loop thread only; one per neighbour per log window
  // Per outgoing link: the encoders (with their error-feedback residuals) for updates
  // (gradients, model deltas) and for whole models.
  struct LinkCodecs {
    std::mutex mu;
    std::unique_ptr<LinkEncoder> update, model;
    uint64_t seed = 0;  // both encoders'; their device twins take the same
    // Their device twins (a peer that gossips on its device), made at first use; they
    // follow the host encoders' codec choice. Shared pointers: the type is complete only
    // in builds with CUDA.
    std::shared_ptr<DeviceLinkEncoder> device_update, device_model;
  };
  std::vector<std::unique_ptr<LinkCodecs>> link_codecs_;  // by peer index; null until first used
  // Step-loop thread only: encode_once's codecs, by every setting a codec is made from
  // (name, density, exact_topk, value_bits, levels, block, rank).
  std::map<std::tuple<std::string, double, bool, int, int, int, int>, std::unique_ptr<Codec>> once_codecs_;
  Codec& once_codec(const CodecSpec& spec);
  std::unique_ptr<Codec> update_codec_once_;  // encode_update_once's: gossip.codec, made at first use  // once_codecs_'s codec for `spec`, made at first use
  std::atomic<double> step_s_{0};  // smoothed wall time of a step (adaptive compression)
  double last_step_at_ = 0;        // step-loop thread only
  std::atomic<uint64_t> rejected_{0};  // updates refused: failed to decode, non-finite, implausible
  std::array<std::atomic<uint64_t>, 4> sent_by_kind_{};  // bytes put on the wire, by MessageKind
  uint64_t applied_total_ = 0, dropped_total_ = 0, coalesced_total_ = 0;  // step-loop thread only: the mixer's windows summed
  MetricsBoard* metrics_ = nullptr;
  std::unique_ptr<UpdateGuard> guard_;
  std::unique_ptr<RobustMixing> robust_;  // step-loop thread only
  std::atomic<double> own_grad_norm_{0};  // smoothed; 0 until the first gradient
  std::vector<std::string> mixed_this_step_;  // step-loop thread only
  std::mutex returned_mu_;
  std::vector<float> returned_x_;  // GUARDED_BY(returned_mu_): push-sum mass given back, summed
  double returned_w_ = 0;          // GUARDED_BY(returned_mu_)
  bool on_device_ = false;  // gossip_on_device()
  int cuda_device_ = -1;    // the backend's CUDA device, where on_device_
  std::mutex said_mu_;
  std::vector<std::string> said_;  // GUARDED_BY(said_mu_): say_once's reasons so far
};

}  // namespace hearsay
