#include <algorithm>

#include "../algorithm.h"
#include "../algorithm_registry.h"

namespace hearsay {

BatchStats Algorithm::gradient(GossipEngine& e, const Batch& batch, uint64_t) { return e.forward_backward(batch); }

BatchStats local_step(GossipEngine& e, const Batch& batch, float lr, uint64_t step) {
  const BatchStats s = e.gradient(batch, step);
  e.optimizer().step(e.model().params(), e.model().grads(), lr);
  return s;
}

bool summable_codec(const std::string& codec) {
  return codec == "none" || codec == "fp16" || codec == "bf16" || codec == "int8" || codec == "int4";
}

void check_diloco_replica_and_codecs(const GossipSpec& s, const std::string& replica, const std::string& outer_codec,
                                     bool any_codec) {
  if (replica == "site") {
    throw OptionError("replica", "'site' moved: a site as one data-parallel replica is cluster { site_replicas: true } "
                                 "now, for every algorithm (its gradient sums under cluster.site_codec, empty: gossip.codec)");
  }
  if (replica != "peer") throw OptionError("replica", "'" + replica + "': use peer (a site as one replica: cluster.site_replicas)");
  if (any_codec) {
    const auto names = codec_names();
    if (!outer_codec.empty() && std::find(names.begin(), names.end(), outer_codec) == names.end()) {
      throw OptionError("outer_codec", "unknown '" + outer_codec + "'; use a codec's name (none, fp16, bf16, int8, int4, qsgd, " +
                                           "topk, randomk, sign, powersgd), or leave it empty");
    }
    return;
  }
  if (!outer_codec.empty() && !summable_codec(outer_codec)) {
    throw OptionError("outer_codec", "'" + outer_codec + "': use none, fp16, bf16, int8 or int4 (summed on the way), or leave it empty");
  }
  if (outer_codec.empty() && !summable_codec(s.codec.name)) {
    throw InputError("cluster.gossip.codec: '" + s.codec.name + "' cannot be summed on the way, and it carries the outer "
                     "all-reduce; use none, fp16, bf16, int8 or int4, or set outer_codec");
  }
}

std::map<int, std::vector<int>> peers_by_site(const GossipEngine& e) {
  const auto& site_of = e.spec().topology.site_of;
  std::map<int, std::vector<int>> sites;
  for (int i = 0; i < static_cast<int>(e.peers().size()); ++i) {
    sites[site_of.empty() ? 0 : site_of[static_cast<size_t>(i)]].push_back(i);
  }
  return sites;
}

std::vector<int> my_site(const GossipEngine& e) {
  // After a view change (a peer of the site stopped answering), the peers still alive.
  if (!e.site_view().members.empty()) return e.site_view().members;
  const auto& site_of = e.spec().topology.site_of;
  const int n = static_cast<int>(e.peers().size());
  std::vector<int> site;
  for (int i = 0; i < n; ++i) {
    // Every peer's site scanned, not peers_by_site's map built: this runs every site step.
    if (site_of.empty() || site_of[static_cast<size_t>(i)] == site_of[static_cast<size_t>(e.me())]) site.push_back(i);
  }
  return site;
}

}  // namespace hearsay
