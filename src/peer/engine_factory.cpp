// A peer's engine as its spec says: the spec's checks, the topology the algorithm runs on,
// and the algorithm from the registry, wrapped in site replicas where the config asks. The
// one place that knows both the engine and site replicas: the engine itself knows neither
// which algorithm it runs nor whether a site wraps it.
#include "algorithm.h"
#include "algorithm_registry.h"
#include "hearsay/codec.h"
#include "hearsay/error.h"
#include "site_replicas.h"

namespace hearsay {

void check_gossip_spec(const GossipSpec& s, int peers) {
  const AlgorithmEntry& entry = algorithm_entry(s.algorithm);
  if (peers < 2) throw InputError("algorithm '" + s.algorithm + "': needs at least 2 peers");
  if (s.gossip_every < 1) throw InputError("gossip_every must be >= 1");
  if (!(s.sync_timeout_s > 0)) throw InputError("sync_timeout_s must be > 0");
  if (s.segment_elements < 1024) throw InputError("segment_elements must be >= 1024");
  if (!is_byzantine_kind(s.byzantine)) {
    throw InputError("byzantine '" + s.byzantine + "': use none, scaled, sign_flip, random or absurd");
  }
  if (!(s.guard.max_norm_ratio >= 0) || s.guard.strikes < 0 || !(s.guard.quarantine_s >= 0)) {
    throw InputError("guard: max_norm_ratio and quarantine_s must be >= 0 and strikes >= 0");
  }
  check_codec_spec(s.codec);
  check_site_replicas(s, peers);
  if (s.model_codec != "none" && s.model_codec != "fp16" && s.model_codec != "bf16" && s.model_codec != "int8") {
    throw InputError("codec.model_codec '" + s.model_codec + "': use none, fp16, bf16 or int8 (whole models are not sparsified)");
  }
  const AdaptiveSpec& a = s.adaptive;
  if (!(a.step_fraction > 0) || !(a.min_density > 0 && a.min_density <= a.max_density && a.max_density <= 1)) {
    throw InputError("codec: adaptive needs step_fraction > 0 and 0 < min_density <= max_density <= 1");
  }
  check_algorithm_topology(s, peers);
  if (entry.check) {
    const auto options = parse_algorithm_options(entry, s.options);
    try {
      entry.check(*options, s, peers);
    } catch (const OptionError& e) {
      throw InputError(s.algorithm + " options: " + e.what());
    }
  }
}

void check_algorithm_topology(const GossipSpec& s, int peers) {
  if (leaders_run(s)) {
    // The algorithm runs among the sites' leaders: its topology is the one among sites.
    int sites = 0;
    const GossipSpec among = among_sites(s, peers, &sites);
    if (sites >= 2) check_algorithm_topology(among, sites);
    return;
  }
  const AlgorithmEntry* entry = find_algorithm(s.algorithm);
  if (entry == nullptr || !entry->undirected_topology || peers < 2) return;
  const auto t = make_topology(s.topology, peers);
  for (int i = 0; i < peers; ++i) {
    for (int j : t->neighbours(i)) {
      const auto back = t->neighbours(j);
      if (std::find(back.begin(), back.end(), i) != back.end()) continue;
      throw InputError(s.algorithm + " needs an undirected topology, and '" + s.topology.kind + "' on " + std::to_string(peers) +
                       " peers is directed (peer " + std::to_string(i) + " sends to peer " + std::to_string(j) +
                       ", which never sends back): its Metropolis-Hastings weights would not be doubly stochastic and "
                       "each round would wait for messages that never come; use ring, torus, complete, random, "
                       "hierarchical, bandwidth or star");
    }
  }
}

std::unique_ptr<GossipEngine> make_gossip_engine(const GossipSpec& spec, std::vector<std::string> peers, int me,
                                                 Transport& transport, Trainable& model, Optimizer& optimizer, Clock& clock,
                                                 EventLog& log, uint64_t seed) {
  const int n = static_cast<int>(peers.size());
  check_gossip_spec(spec, n);
  const AlgorithmEntry& entry = algorithm_entry(spec.algorithm);
  std::unique_ptr<Algorithm> algorithm = entry.make(spec, *parse_algorithm_options(entry, spec.options));
  if (spec.site_replicas) algorithm = wrap_in_site_replicas(std::move(algorithm));
  return std::make_unique<GossipEngine>(spec, std::move(peers), me, transport, model, optimizer, clock, log, seed,
                                        make_engine_topology(spec, n), std::move(algorithm));
}

}  // namespace hearsay
