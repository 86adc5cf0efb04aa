#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "hearsay/codec.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/wire.h"
#include "../transport/address.h"
#include "algorithm_options.h"
#include "locator.h"
#include "simulation_memory.h"

namespace hearsay {
namespace {

namespace pb = google::protobuf;
using config_text::CollectFirstError;
using config_text::Locator;

// The algorithm's options (an extension of GossipConfig, in brackets in the config):
// its own check runs with its errors placed at the field they name. Other algorithms'
// options may stand beside them (a sweep over algorithms keeps each one's); they apply
// only when that algorithm is chosen.
template <class Fail>
void check_algorithm_options(const config::Config& c, const AlgorithmEntry& algorithm, const Fail& fail) {
  const config::ClusterConfig& cl = c.cluster();
  const pb::FieldDescriptor* field = algorithm_options_field(cl.gossip(), algorithm);
  const std::string at = field == nullptr ? "cluster.gossip" : "cluster.gossip.[" + field->full_name() + "]";
  if (!algorithm.check) return;
  GossipSpec spec = gossip_spec(cl);
  spec.optimizer = optimizer_spec(c.optim());
  try {
    algorithm.check(*parse_algorithm_options(algorithm, spec.options), spec, std::max(2, cl.peers_size()));
  } catch (const OptionError& e) {
    fail(at + "." + e.field, e.why);
  } catch (const InputError& e) {
    fail("cluster.gossip", e.what());
  }
}

// A gossip field that is an algorithm's own option now (issue 13 moved them): an old
// config naming one is told where it went, not only that the field is unknown. Read off
// the registry: every algorithm whose options message has a field of that name.
std::string moved_option_hint(const std::string& parse_error) {
  if (parse_error.find("GossipConfig") == std::string::npos) return "";
  std::string field;
  std::vector<std::string> owners;  // registered algorithms with an option of that name
  for (const std::string& name : gossip_algorithms()) {
    const pb::Descriptor* options = algorithm_entry(name).options->GetDescriptor();
    for (int i = 0; i < options->field_count(); ++i) {
      const std::string& f = options->field(i)->name();
      if ((field.empty() || f == field) && parse_error.find("\"" + f + "\"") != std::string::npos) {
        field = f;
        owners.push_back(name);
      }
    }
  }
  if (owners.empty()) return "";
  std::string who;
  for (size_t i = 0; i < owners.size(); ++i) who += (i == 0 ? "" : i + 1 == owners.size() ? " or " : ", ") + owners[i];
  return "; '" + field + "' is an option of " + who + " now, set inside the gossip block as [hearsay.algorithms." + owners.front() +
         "] { " + field + ": ... } (docs/CONFIG.md, \"Algorithm options\")";
}

constexpr double kMaxEpochs = 1e6;
constexpr size_t kMaxConfigBytes = 16u << 20;
constexpr int64_t kMaxSteps = 1'000'000'000'000'000;

// A registry's names as an error lists them: "a, b, c".
std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

// A double as an error shows it: 1e+300, 0.5, inf.
std::string number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

// Bounds on what a link, a simulation and a name may be: each far beyond any real use,
// each short of what would stall or exhaust the program (docs/SIMULATION.md, "Bounds").
// An hour: a geostationary satellite hop is 0.25 s, and even Earth to Mars is at most 22
// minutes; a latency of 1e308 ms was once accepted, and the simulation never ended.
constexpr double kMaxLatencyMs = 3.6e6;
// 1 kbit/s (at which a 200 KB model takes nearly half an hour a hop; 1e-300 Mbit/s never
// ends) to 10 Tbit/s (six times the fastest Ethernet port, 1.6 Tbit/s; the simulator's
// "unlimited" is 1 Pbit/s).
constexpr double kMinBandwidthMbps = 1e-3;
constexpr double kMaxBandwidthMbps = 1e7;
// Virtual (and emulated) seconds: about 31 years, where a double still resolves 0.1 us,
// well inside SimGrid's 10 us quantum.
constexpr double kMaxSeconds = 1e9;
// A peer's step takes slowdown x its time: a million times the fastest's is past any
// cluster (the configs' slowest is 50).
constexpr double kMaxSlowdown = 1e6;
// A run's, a cluster's or a site's name goes into run directories, logs, metrics labels
// and one-line messages.
constexpr size_t kMaxNameBytes = 128;


// A name's problem, or "" when it is one: at most 128 bytes of printable ASCII.
std::string name_problem(const std::string& s) {
  if (s.size() > kMaxNameBytes) {
    return "is " + std::to_string(s.size()) + " bytes long; a name has at most " + std::to_string(kMaxNameBytes) +
           " bytes of printable ASCII";
  }
  for (size_t i = 0; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b > 0x7e) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      return std::string("has byte ") + hex + " at offset " + std::to_string(i) + "; a name is printable ASCII (at most " +
             std::to_string(kMaxNameBytes) + " bytes)";
    }
  }
  return "";
}

// A bandwidth in Mbit/s: 0 (unlimited), or from 1 kbit/s to 10 Tbit/s.
template <class Fail>
void check_bandwidth(double mbps, const std::string& path, const Fail& fail) {
  if (mbps == 0 || (mbps >= kMinBandwidthMbps && mbps <= kMaxBandwidthMbps)) return;
  fail(path, "must be 0 (unlimited) or in [0.001, 1e7] Mbit/s (1 kbit/s to 10 Tbit/s), got " + number(mbps));
}

// experiment.simulate and experiment.simulation: what the simulator can model
// (docs/SIMULATION.md), and what only it models (refused in a real run).
template <class Fail>
void validate_simulation(const config::Config& c, const Fail& fail) {
  const auto& e = c.experiment();
  const auto& s = e.simulation();
  const auto& cl = c.cluster();
  if (!e.simulate()) {
    const char* only = "only the simulator models it: run with hearsay-run --simulate (or experiment.simulate: true)";
    if (s.sites_size() > 0) fail("experiment.simulation.sites", std::string("site access links: ") + only, 0);
    if (s.faults_size() > 0) fail("experiment.simulation.faults", std::string("faults: ") + only, 0);
    if (s.churn_per_peer_hour() > 0) fail("experiment.simulation.churn_per_peer_hour", std::string("churn: ") + only);
    return;
  }
  const char* why = "the simulator runs the native peer on virtual time";
  if (!c.program().empty()) fail("program", std::string("a Python program cannot be simulated (") + why + "); remove program or run without --simulate");
  if (cl.transport().rfind("fabric", 0) == 0) {
    fail("cluster.transport", "'" + wire_text(cl.transport()) + "' cannot be simulated: the simulator models TCP flows (SimGrid's CM02 or LV08), not libfabric's RDMA; use tcp");
  }
  if (cl.peers_size() < 2) fail("cluster.peers", "the simulator runs clusters: list at least 2 peers");
  if (s.network_model() != "CM02" && s.network_model() != "LV08") {
    fail("experiment.simulation.network_model", "unknown '" + wire_text(s.network_model()) + "'; use CM02 or LV08");
  }
  if (!(s.max_virtual_s() >= 0 && s.max_virtual_s() <= kMaxSeconds)) {
    fail("experiment.simulation.max_virtual_s", "must be in [0, 1e9] seconds (0: no limit), got " + number(s.max_virtual_s()));
  }
  if (s.eval_peers() < 0 || s.eval_peers() > cl.peers_size()) {
    fail("experiment.simulation.eval_peers", "must be in [0, " + std::to_string(cl.peers_size()) + "] (0: every peer)");
  }
  if (!(s.step_jitter() >= 0 && s.step_jitter() < 1)) fail("experiment.simulation.step_jitter", "must be in [0, 1)");
  if (!(s.time_precision_s() > 0 && s.time_precision_s() <= 0.1)) {
    fail("experiment.simulation.time_precision_s", "must be in (0, 0.1] seconds (SimGrid's default: 0.00001)");
  }
  if (s.sender_completion() != "arrival" && s.sender_completion() != "departure") {
    fail("experiment.simulation.sender_completion", "unknown '" + wire_text(s.sender_completion()) + "'; use arrival or departure");
  }
  if (s.has_sender_completion() && s.sender_completion() == "departure" && s.network_model() != "CM02") {
    fail("experiment.simulation.sender_completion", "departure needs network_model CM02 (LV08's latency is part of its TCP model)");
  }
  std::set<std::string> sites;
  for (const auto& p : cl.peers()) sites.insert(p.site());
  for (int i = 0; i < s.sites_size(); ++i) {
    const auto& a = s.sites(i);
    const std::string at_i = "experiment.simulation.sites[" + std::to_string(i) + "]";
    if (const std::string why = name_problem(a.site()); !why.empty()) fail(at_i + ".site", why);
    if (sites.count(a.site()) == 0) fail(at_i + ".site", "site '" + a.site() + "' has no peer in cluster.peers");
    check_bandwidth(a.uplink_mbps(), at_i + ".uplink_mbps", fail);
    check_bandwidth(a.downlink_mbps(), at_i + ".downlink_mbps", fail);
  }
  std::set<std::string> peers;
  for (const auto& p : cl.peers()) peers.insert(p.name());
  for (int i = 0; i < s.faults_size(); ++i) {
    const auto& f = s.faults(i);
    const std::string at_i = "experiment.simulation.faults[" + std::to_string(i) + "]";
    if (!(f.at_s() >= 0 && f.at_s() <= kMaxSeconds)) fail(at_i + ".at_s", "must be in [0, 1e9] seconds, got " + number(f.at_s()));
    if (!(f.for_s() > 0 && f.for_s() <= kMaxSeconds)) fail(at_i + ".for_s", "must be in (0, 1e9] seconds, got " + number(f.for_s()));
    if (f.kind() == config::FaultConfig::SITE_DOWN) {
      if (const std::string why = name_problem(f.site()); !why.empty()) fail(at_i + ".site", why);
      if (sites.count(f.site()) == 0) fail(at_i + ".site", "site '" + f.site() + "' has no peer in cluster.peers");
      continue;
    }
    if (f.peer().empty() == !(f.fraction() > 0)) fail(at_i, "a PEER_CRASH names one peer, or gives a fraction in (0, 1] of them");
    if (!f.peer().empty() && peers.count(f.peer()) == 0) fail(at_i + ".peer", "no peer '" + wire_text(f.peer()) + "' in cluster.peers");
    if (!(f.fraction() >= 0 && f.fraction() <= 1)) fail(at_i + ".fraction", "must be in [0, 1]");
    if (!(f.spread_s() >= 0 && f.spread_s() <= kMaxSeconds)) fail(at_i + ".spread_s", "must be in [0, 1e9] seconds, got " + number(f.spread_s()));
  }
  if (!(s.churn_per_peer_hour() >= 0) || !std::isfinite(s.churn_per_peer_hour())) fail("experiment.simulation.churn_per_peer_hour", "must be a finite number >= 0");
  if (!(s.churn_downtime_s() > 0 && s.churn_downtime_s() <= kMaxSeconds)) {
    fail("experiment.simulation.churn_downtime_s", "must be in (0, 1e9] seconds, got " + number(s.churn_downtime_s()));
  }
  for (int i = 0; i < cl.site_links_size(); ++i) {
    const auto& sl = cl.site_links(i);
    if (sl.site_a() == sl.site_b() && sl.link().outages_size() > 0) {
      fail("cluster.site_links[" + std::to_string(i) + "].link.outages",
           "the simulator models outages on links between two sites (a site's own network is its peers' interfaces)", 0);
    }
  }
  if (cl.default_link().outages_size() > 0 && sites.size() < 2) {
    fail("cluster.default_link.outages", "the simulator models outages on links between two sites; this cluster has one site", 0);
  }
}

void validate(const config::Config& c, const Locator& at) {
  // path: a dotted field path; index: for a repeated last field.
  auto fail = [&](const std::string& path, const std::string& why, int index = -1) {
    throw InputError(at.at(index >= 0 ? path + "[" + std::to_string(index) + "]" : path) + ": " + why);
  };
  if (c.threads() < 1 || c.threads() > 256) fail("threads", "must be in [1, 256], got " + std::to_string(c.threads()));
  if (c.device().empty()) fail("device", "must name a device: 'cpu' or 'cuda:N'");
  if (const std::string why = name_problem(c.name()); !why.empty()) fail("name", why);
  if (c.name().find('/') != std::string::npos) {
    fail("name", "'" + c.name() + "' has a '/': the name names the run's directory (runs/NAME-TIMESTAMP/), and a '/' would put it elsewhere");
  }

  const auto& m = c.model();
  for (int i = 0; i < m.hidden_size(); ++i) {
    if (m.hidden(i) < 1 || m.hidden(i) > 65536) fail("model.hidden", "width must be in [1, 65536], got " + std::to_string(m.hidden(i)), i);
  }
  for (int i = 0; i < m.conv_channels_size(); ++i) {
    if (m.conv_channels(i) < 1 || m.conv_channels(i) > 4096) fail("model.conv_channels", "must be in [1, 4096], got " + std::to_string(m.conv_channels(i)), i);
  }
  if (m.kernel() < 1 || m.kernel() % 2 == 0 || m.kernel() > 15) fail("model.kernel", "must be odd and in [1, 15], got " + std::to_string(m.kernel()));
  if (m.fc_width() < 1 || m.fc_width() > 65536) fail("model.fc_width", "must be in [1, 65536], got " + std::to_string(m.fc_width()));
  if (m.kind() == config::ModelConfig::LOGREG && m.hidden_size() > 0) fail("model.hidden", "a LOGREG model has no hidden layers");

  const auto& d = c.data();
  if (d.format() == config::DataConfig::LIBSVM && (d.train_path().empty() || d.test_path().empty())) {
    fail("data.format", "LIBSVM needs data.train_path and data.test_path");
  }
  if (d.num_shards() < 1) fail("data.num_shards", "must be >= 1, got " + std::to_string(d.num_shards()));
  if (d.shard() < 0 || d.shard() >= d.num_shards()) {
    fail("data.shard", "must be in [0, num_shards=" + std::to_string(d.num_shards()) + "), got " + std::to_string(d.shard()));
  }
  if (!(d.dirichlet_alpha() > 0) || !std::isfinite(d.dirichlet_alpha())) fail("data.dirichlet_alpha", "must be a positive number");
  if (d.num_classes() < 0 || d.num_classes() > 65536) fail("data.num_classes", "must be in [0, 65536]");
  if (d.num_features() < 0 || d.num_features() > (1 << 20)) fail("data.num_features", "must be in [0, 2^20]");
  if (d.format() == config::DataConfig::SYNTHETIC) {
    if (d.synthetic_train() < 1 || d.synthetic_train() > 10'000'000) fail("data.synthetic_train", "must be in [1, 1e7]");
    if (d.synthetic_test() < 1 || d.synthetic_test() > 10'000'000) fail("data.synthetic_test", "must be in [1, 1e7]");
    if (d.synthetic_dim() < 1 || d.synthetic_dim() > 65536) fail("data.synthetic_dim", "must be in [1, 65536]");
    if (d.has_num_classes() && d.num_classes() == 1) fail("data.num_classes", "must be >= 2");
  }
  if (d.test_limit() < 0) fail("data.test_limit", "must be >= 0");

  const auto& o = c.optim();
  if (!(o.lr() > 0) || !std::isfinite(o.lr())) fail("optim.lr", "must be a positive number");
  if (!(o.momentum() >= 0 && o.momentum() < 1)) fail("optim.momentum", "must be in [0, 1)");
  if (!(o.weight_decay() >= 0) || !std::isfinite(o.weight_decay())) fail("optim.weight_decay", "must be >= 0");
  if (o.warmup_steps() < 0) fail("optim.warmup_steps", "must be >= 0");
  if (o.schedule() == config::OptimConfig::STEP && o.step_size() < 1) fail("optim.step_size", "must be >= 1 for the STEP schedule");
  if (!(o.gamma() > 0) || !std::isfinite(o.gamma())) fail("optim.gamma", "must be a positive number");
  if (!(o.min_lr() >= 0) || o.min_lr() > o.lr()) fail("optim.min_lr", "must be in [0, lr]");
  // The optimizer by name; the deprecated enum optim.kind counts as the name it stands
  // for (optimizer_name(), which the peer uses, reads it the same way).
  if (o.has_kind() && o.has_optimizer()) {
    const std::string by_kind = o.kind() == config::OptimConfig::ADAMW ? "adamw" : "sgd";
    if (o.optimizer() != by_kind) {
      fail("optim.kind", config::OptimConfig::Kind_Name(o.kind()) + " (deprecated) stands for optimizer '" + by_kind +
                             "', but optim.optimizer is '" + wire_text(o.optimizer()) + "'; name the one you mean with optimizer alone");
    }
  }
  const std::string optimizer = optimizer_name(o);
  const auto optimizers = hearsay::optimizers().names();
  if (std::find(optimizers.begin(), optimizers.end(), optimizer) == optimizers.end()) {
    fail("optim.optimizer", "unknown '" + wire_text(optimizer) + "'; known optimizers: " + join(optimizers));
  }
  if (optimizer == "adamw") {
    if (o.nesterov()) fail("optim.nesterov", "applies to optimizer sgd only; adamw has no Nesterov variant");
    if (!(o.beta1() >= 0 && o.beta1() < 1)) fail("optim.beta1", "must be in [0, 1), got " + number(o.beta1()));
    if (!(o.beta2() >= 0 && o.beta2() < 1)) fail("optim.beta2", "must be in [0, 1), got " + number(o.beta2()));
    if (!(o.eps() > 0) || !std::isfinite(o.eps())) fail("optim.eps", "must be a positive number, got " + number(o.eps()));
  } else if (optimizer == "sgd") {
    if (o.nesterov() && o.momentum() == 0) fail("optim.nesterov", "needs momentum > 0");
    const char* why = "applies to optimizer adamw only (this config's optimizer is sgd)";
    if (o.has_beta1()) fail("optim.beta1", why);
    if (o.has_beta2()) fail("optim.beta2", why);
    if (o.has_eps()) fail("optim.eps", why);
  }

  const auto& t = c.train();
  if (t.batch_size() < 1 || t.batch_size() > 65536) fail("train.batch_size", "must be in [1, 65536], got " + std::to_string(t.batch_size()));
  if (t.eval_batch_size() < 1 || t.eval_batch_size() > 65536) fail("train.eval_batch_size", "must be in [1, 65536]");
  // Bounded so that epochs x shard / batch stays a step count: 1e300 epochs once overflowed
  // it and trained nothing.
  if (!(t.epochs() >= 0 && t.epochs() <= kMaxEpochs)) fail("train.epochs", "must be in [0, 1e6], got " + number(t.epochs()));
  if (t.max_steps() < 0 || t.max_steps() > kMaxSteps) fail("train.max_steps", "must be in [0, 1e15], got " + std::to_string(t.max_steps()));
  if (t.epochs() == 0 && t.max_steps() == 0) fail("train.epochs", "is 0 and max_steps is 0: training would never start or never stop");
  if (!(t.target_test_acc() >= 0 && t.target_test_acc() <= 1)) fail("train.target_test_acc", "must be in [0, 1]");
  if (t.eval_every_steps() < 0) fail("train.eval_every_steps", "must be >= 0");
  // Seconds of (virtual) time, bounded as the simulator's are.
  const auto seconds = [&](double v, const std::string& path) {
    if (!(v >= 0 && v <= kMaxSeconds)) fail(path, "must be a finite number >= 0 and at most 1e9 seconds, got " + number(v));
  };
  seconds(t.eval_every_s(), "train.eval_every_s");
  seconds(t.emulated_step_s(), "train.emulated_step_s");
  seconds(t.emulated_eval_s(), "train.emulated_eval_s");
  if (!(c.experiment().emulate_headroom() >= 1 && c.experiment().emulate_headroom() <= 100)) {
    fail("experiment.emulate_headroom", "must be in [1, 100] (a margin over the measured times), got " + number(c.experiment().emulate_headroom()));
  }
  if (t.eval_every_s() > 0 && t.eval_every_steps() > 0) {
    fail("train.eval_every_s", "and eval_every_steps are both set: evaluate by the clock or by steps, not both");
  }
  if (c.log().every_steps() < 1) fail("log.every_steps", "must be >= 1");

  if (c.has_cluster()) {
    const auto& cl = c.cluster();
    if (const std::string why = name_problem(cl.id()); !why.empty()) fail("cluster.id", why);
    std::set<std::string> names, addresses;
    for (int i = 0; i < cl.peers_size(); ++i) {
      const auto& p = cl.peers(i);
      const std::string at_i = "cluster.peers[" + std::to_string(i) + "]";
      if (p.name().empty()) fail(at_i, "every peer needs a name");
      if (!is_peer_name(p.name())) {
        fail(at_i + ".name", "'" + wire_text(p.name()) + "' is not a peer name: 1 to " + std::to_string(kMaxPeerNameBytes) +
                                 " letters, digits, '.', '_' or '-', not starting with '.' (it names the peer's log file)");
      }
      if (!names.insert(p.name()).second) fail(at_i + ".name", "name '" + p.name() + "' appears twice");
      if (const std::string why = name_problem(p.site()); !why.empty()) fail(at_i + ".site", why);
      if (p.address().empty() && cl.transport() != "inproc") fail(at_i, "peer '" + p.name() + "' needs an address (host:port)");
      if (!p.address().empty() && !addresses.insert(p.address()).second) {
        fail(at_i + ".address", "address '" + wire_text(p.address()) + "' is used by two peers");
      }
      if (!p.listen().empty()) {
        if (p.address().empty()) {
          fail(at_i + ".listen", "peer '" + p.name() + "' listens at '" + wire_text(p.listen()) +
                                     "' but has no address for the others to dial; set address (host:port)");
        }
        try {
          split_host_port(p.listen());
        } catch (const InputError& e) {
          fail(at_i + ".listen", e.what());
        }
      }
      if (!(p.slowdown() >= 1 && p.slowdown() <= kMaxSlowdown)) {
        fail(at_i + ".slowdown", "must be >= 1 and at most 1e6, got " + number(p.slowdown()));
      }
      if (!is_byzantine_kind(p.byzantine())) {
        fail(at_i + ".byzantine", "unknown '" + wire_text(p.byzantine()) + "'; use none, scaled, sign_flip, random or absurd");
      }
    }
    if (c.experiment().simulate()) {
      if (const std::string problem = simulation_memory_problem(c); !problem.empty()) fail("cluster.peers", problem);
    }
    const int neighbours = std::max(0, cl.peers_size() - 1);
    if (cl.has_min_neighbours() && (cl.min_neighbours() < 0 || cl.min_neighbours() > neighbours)) {
      fail("cluster.min_neighbours", "must be in [0, " + std::to_string(neighbours) +
                                         "] (0: a peer may start alone; at most its neighbours), got " +
                                         std::to_string(cl.min_neighbours()));
    }
    const auto& g = cl.gossip();
    const AlgorithmEntry* algorithm = find_algorithm(g.algorithm());
    if (algorithm == nullptr) {
      fail("cluster.gossip.algorithm", "unknown '" + wire_text(g.algorithm()) + "'; use " + join(gossip_algorithms()));
    }
    check_algorithm_options(c, *algorithm, fail);
    if (algorithm->owns_update) {
      // Its momentum is its own (DeMo's decoupled momentum) and it never calls the
      // optimizer: a momentum, decay or clip set in optim would silently not apply.
      const auto& o = c.optim();
      const std::string why = "algorithm '" + g.algorithm() + "' keeps its own momentum and takes its own step, so optim's " +
                              "would not apply: set it to 0 (or remove it) and set the algorithm's in [hearsay.algorithms." +
                              g.algorithm() + "] { ... }";
      if (optimizer_name(o) != "sgd") fail("optim.optimizer", "'" + optimizer_name(o) + "': " + why);
      if (o.has_momentum() && o.momentum() != 0) fail("optim.momentum", why);
      if (o.nesterov()) fail("optim.nesterov", why);
      if (o.weight_decay() != 0) fail("optim.weight_decay", why);
      if (o.grad_clip_norm() != 0) fail("optim.grad_clip_norm", why);
    }
    const auto topologies = hearsay::topologies().names();
    if (std::find(topologies.begin(), topologies.end(), g.topology()) == topologies.end()) {
      fail("cluster.gossip.topology", "unknown '" + wire_text(g.topology()) + "'; use " + join(topologies));
    }
    const auto weightings = staleness_weightings().names();
    if (std::find(weightings.begin(), weightings.end(), g.weighting()) == weightings.end()) {
      fail("cluster.gossip.weighting", "unknown '" + wire_text(g.weighting()) + "'; use " + join(weightings));
    }
    if (g.gossip_every() < 1) fail("cluster.gossip.gossip_every", "must be >= 1");
    if (g.tau_max() < 0) fail("cluster.gossip.tau_max", "must be >= 0");
    // Each field the gossip engine, mixer, topology and codecs check again at run time is
    // checked here first, so the error points at the field, not at the gossip block.
    if (!(g.alpha() >= 0) || !std::isfinite(g.alpha())) fail("cluster.gossip.alpha", "must be a finite number >= 0");
    if (!(g.lambda() >= 0) || !std::isfinite(g.lambda())) fail("cluster.gossip.lambda", "must be a finite number >= 0");
    if (g.cross_every() < 1) fail("cluster.gossip.cross_every", "must be >= 1");
    if (!(g.bandwidth_floor() > 0 && g.bandwidth_floor() <= 1)) fail("cluster.gossip.bandwidth_floor", "must be in (0, 1]");
    if (!(g.sync_timeout_s() > 0) || !std::isfinite(g.sync_timeout_s())) fail("cluster.gossip.sync_timeout_s", "must be a positive number");
    if (g.parity_check() && !algorithm->equal_copies) {
      fail("cluster.gossip.parity_check", "checks the copies a synchronous algorithm holds equal on every peer; " +
                                              wire_text(g.algorithm()) + " holds none (use allreduce, local_sgd, diloco or "
                                              "streaming_diloco)");
    }
    if (g.parity_check() && cl.site_replicas()) {
      fail("cluster.gossip.parity_check", "is not served under cluster.site_replicas yet (a site's members repeat their "
                                          "leader's step)");
    }
    const std::set<std::string> robust{"none", "centered_clip", "trimmed_mean"};
    if (robust.count(g.robust()) == 0) fail("cluster.gossip.robust", "unknown '" + wire_text(g.robust()) + "'; use none, centered_clip or trimmed_mean");
    if (!(g.clip_factor() > 0) || !std::isfinite(g.clip_factor())) fail("cluster.gossip.clip_factor", "must be a positive number");
    if (!(g.trim() >= 0 && g.trim() < 0.5)) fail("cluster.gossip.trim", "must be in [0, 0.5), got " + number(g.trim()));
    const auto& guard = g.guard();
    if (!(guard.max_norm_ratio() >= 0) || !std::isfinite(guard.max_norm_ratio())) {
      fail("cluster.gossip.guard.max_norm_ratio", "must be a finite number >= 0 (0: no norm check)");
    }
    if (guard.strikes() < 0) fail("cluster.gossip.guard.strikes", "must be >= 0 (0: never quarantine)");
    if (!(guard.quarantine_s() >= 0) || !std::isfinite(guard.quarantine_s())) fail("cluster.gossip.guard.quarantine_s", "must be a finite number >= 0");
    const auto& k = g.codec();
    const auto codecs = codec_names();
    if (std::find(codecs.begin(), codecs.end(), k.name()) == codecs.end()) {
      fail("cluster.gossip.codec.name", "unknown '" + wire_text(k.name()) + "'; use none, fp16, bf16, int8, int4, qsgd, topk, randomk, sign or powersgd");
    }
    if (!(k.density() > 0 && k.density() <= 1)) fail("cluster.gossip.codec.density", "must be in (0, 1], got " + number(k.density()));
    if (k.levels() < 1 || k.levels() > 32767) fail("cluster.gossip.codec.levels", "must be in [1, 32767], got " + std::to_string(k.levels()));
    if (k.block() < 8 || k.block() > (1 << 20)) fail("cluster.gossip.codec.block", "must be in [8, 1048576], got " + std::to_string(k.block()));
    if (k.value_bits() != 16 && k.value_bits() != 32) fail("cluster.gossip.codec.value_bits", "must be 16 or 32, got " + std::to_string(k.value_bits()));
    if (k.rank() < 1 || k.rank() > 256) fail("cluster.gossip.codec.rank", "must be in [1, 256], got " + std::to_string(k.rank()));
    const std::set<std::string> feedback{"auto", "on", "off"};
    if (feedback.count(k.error_feedback()) == 0) fail("cluster.gossip.codec.error_feedback", "must be auto, on or off, got '" + wire_text(k.error_feedback()) + "'");
    const std::set<std::string> model_codecs{"none", "fp16", "bf16", "int8"};
    if (model_codecs.count(k.model_codec()) == 0) {
      fail("cluster.gossip.codec.model_codec", "unknown '" + wire_text(k.model_codec()) + "'; use none, fp16, bf16 or int8 (whole models are not sparsified)");
    }
    if (!(k.step_fraction() > 0) || !std::isfinite(k.step_fraction())) fail("cluster.gossip.codec.step_fraction", "must be a positive number");
    if (!(k.max_density() > 0 && k.max_density() <= 1)) fail("cluster.gossip.codec.max_density", "must be in (0, 1]");
    if (!(k.min_density() > 0 && k.min_density() <= k.max_density())) fail("cluster.gossip.codec.min_density", "must be in (0, max_density]");
    if (!(cl.connect_timeout_s() > 0) || !std::isfinite(cl.connect_timeout_s())) fail("cluster.connect_timeout_s", "must be a positive number");
    if (!(cl.join_grace_s() >= 0) || !std::isfinite(cl.join_grace_s())) fail("cluster.join_grace_s", "must be a number >= 0");
    if (!(cl.finish_timeout_s() > 0) || !std::isfinite(cl.finish_timeout_s())) {
      fail("cluster.finish_timeout_s", "must be a number > 0");
    }

    auto check_link = [&](const config::LinkConfig& l, const std::string& path) {
      const auto milliseconds = [&](double v, const std::string& field) {
        if (!(v >= 0 && v <= kMaxLatencyMs)) fail(path + "." + field, "must be a finite number >= 0 and at most 3600000 ms (an hour), got " + number(v));
      };
      milliseconds(l.latency_ms(), "latency_ms");
      milliseconds(l.jitter_ms(), "jitter_ms");
      check_bandwidth(l.bandwidth_mbps(), path + ".bandwidth_mbps", fail);
      if (!(l.loss() >= 0 && l.loss() < 1)) fail(path + ".loss", "must be in [0, 1), got " + number(l.loss()));
      for (int j = 0; j < l.outages_size(); ++j) {
        const auto& o = l.outages(j);
        if (!(o.start_s() >= 0 && o.end_s() > o.start_s() && o.end_s() <= kMaxSeconds)) {
          fail(path + ".outages[" + std::to_string(j) + "]", "must be [start_s, end_s) with 0 <= start_s < end_s <= 1e9 seconds");
        }
      }
      try {
        check_link_model(link_model(l), path);
      } catch (const InputError& e) {
        fail(path, e.what());
      }
    };
    if (cl.has_default_link()) check_link(cl.default_link(), "cluster.default_link");
    std::set<std::string> sites;
    for (const auto& p : cl.peers()) sites.insert(p.site());
    for (int i = 0; i < cl.site_links_size(); ++i) {
      const auto& sl = cl.site_links(i);
      const std::string at_i = "cluster.site_links[" + std::to_string(i) + "]";
      if (const std::string why = name_problem(sl.site_a()); !why.empty()) fail(at_i + ".site_a", why);
      if (const std::string why = name_problem(sl.site_b()); !why.empty()) fail(at_i + ".site_b", why);
      if (sites.count(sl.site_a()) == 0) fail(at_i + ".site_a", "site '" + sl.site_a() + "' has no peer in cluster.peers");
      if (sites.count(sl.site_b()) == 0) fail(at_i + ".site_b", "site '" + sl.site_b() + "' has no peer in cluster.peers");
      check_link(sl.link(), at_i + ".link");
    }
    if (!cl.site_replicas()) {
      // Set, they would be ignored: a run that meant site replicas would train without
      // them and say nothing.
      const std::string why = " is set, but cluster.site_replicas is off, and only a site's gradient sum under site_replicas "
                              "uses it: remove it, or set site_replicas: true";
      if (cl.has_site_codec()) fail("cluster.site_codec", "'" + wire_text(cl.site_codec()) + "'" + why);
      if (cl.has_site_split()) fail("cluster.site_split", "'" + wire_text(cl.site_split()) + "'" + why);
    }
    if (cl.site_replicas() && cl.peers_size() >= 2) {
      try {
        check_site_replicas(gossip_spec(cl), cl.peers_size());
      } catch (const OptionError& e) {
        fail("cluster." + e.field, e.why);
      } catch (const InputError& e) {
        fail("cluster.site_replicas", e.what());
      }
    }
    if (cl.peers_size() >= 2) {
      try {
        check_algorithm_topology(gossip_spec(cl), cl.peers_size());
      } catch (const InputError& e) {
        fail("cluster.gossip.topology", e.what());
      }
    }
    try {
      check_gossip_spec(gossip_spec(cl), std::max(2, cl.peers_size()));
    } catch (const InputError& e) {
      fail("cluster.gossip", e.what());
    }
  }

  const auto& e = c.experiment();
  if (e.repeats() < 1 || e.repeats() > 1000) fail("experiment.repeats", "must be in [1, 1000]");
  if (!(e.max_wall_s() >= 0) || !std::isfinite(e.max_wall_s())) fail("experiment.max_wall_s", "must be >= 0");
  if (!(e.progress_every_s() > 0) || !std::isfinite(e.progress_every_s())) fail("experiment.progress_every_s", "must be > 0");
  for (int i = 0; i < e.sweep_size(); ++i) {
    const auto& axis = e.sweep(i);
    if (axis.values_size() == 0) fail("experiment.sweep", "axis '" + wire_text(axis.field()) + "' has no values", i);
    if (axis.also_set_size() > axis.values_size()) fail("experiment.sweep", "more also_set fragments than values", i);
    try {
      field_fragment(axis.field(), axis.values(0));
    } catch (const InputError& err) {
      fail("experiment.sweep", err.what(), i);
    }
  }
  if (c.checkpoint().every_steps() < 0) fail("checkpoint.every_steps", "must be >= 0");
  validate_simulation(c, fail);
  if (!c.experiment().simulate()) {
    bool several = false;
    if (const std::string problem = peer_memory_problem(c, &several); !problem.empty()) {
      fail(several ? "cluster.peers" : "model", problem);
    }
  }
}

}  // namespace

config::Config parse_config(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides) {
  config::Config c;
  std::vector<Locator::Source> sources;
  auto merge = [&](const std::string& body, const std::string& name) {
    pb::TextFormat::Parser parser;
    CollectFirstError errors;
    parser.RecordErrorsTo(&errors);
    // MergeFromString lets a fragment set fields of a message the file already set. It
    // also takes a singular field written twice in one text, the later value winning
    // (the Locator places it there).
    if (!parser.MergeFromString(body, &c)) {
      throw InputError(name + ":" + (errors.first().empty() ? std::string("could not parse") : errors.first()) +
                       moved_option_hint(errors.first()));
    }
    sources.push_back({name, &body});
  };
  merge(text, source);
  for (size_t i = 0; i < overrides.size(); ++i) merge(overrides[i], "--set #" + std::to_string(i + 1));
  validate(c, Locator(sources));
  return c;
}

config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  // Read with the system calls, so that every failure has its reason: an ifstream opens a
  // directory and reads it as an empty config, which then trains with every default.
  const std::string where = "config " + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw InputError(where + ": cannot open: " + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw InputError(where + ": cannot stat: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(where + ": is a directory");
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t got = ::read(fd, buf, sizeof(buf));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(where + ": cannot read: " + std::strerror(errno));
    if (got == 0) break;
    if (text.size() + static_cast<size_t>(got) > kMaxConfigBytes) throw InputError(where + ": larger than 16 MiB; not a config");
    text.append(buf, static_cast<size_t>(got));
  }
  config::Config c = parse_config(text, path, overrides);
  // Every field has a default, so an empty file (or one meant for another program) would
  // train a default model on default data and exit 0 as if it had done what was asked.
  if (!c.has_cluster() && !(c.has_model() && c.has_data())) {
    throw InputError(where + ": sets neither cluster nor both model and data; a config names at least its cluster, "
                             "or the model it trains and the data it trains on (docs/CONFIG.md)");
  }
  return c;
}

}  // namespace hearsay
