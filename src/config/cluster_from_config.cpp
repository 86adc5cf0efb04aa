#include <google/protobuf/text_format.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "algorithm_options.h"

namespace hearsay {

std::vector<int> site_indices(const config::ClusterConfig& c) {
  std::vector<std::string> sites;
  std::vector<int> out;
  for (const auto& p : c.peers()) {
    auto it = std::find(sites.begin(), sites.end(), p.site());
    if (it == sites.end()) {
      sites.push_back(p.site());
      it = sites.end() - 1;
    }
    out.push_back(static_cast<int>(it - sites.begin()));
  }
  return out;
}

const google::protobuf::FieldDescriptor* algorithm_options_field(const config::GossipConfig& g,
                                                                 const AlgorithmEntry& algorithm) {
  std::vector<const google::protobuf::FieldDescriptor*> set;
  g.GetReflection()->ListFields(g, &set);
  for (const auto* f : set) {
    if (f->is_extension() && f->message_type() == algorithm.options->GetDescriptor()) return f;
  }
  return nullptr;
}

// The algorithm's options as the config gives them, in text format; "" when none is set.
static std::string algorithm_options_text(const config::GossipConfig& g) {
  const AlgorithmEntry* entry = find_algorithm(g.algorithm());
  const auto* field = entry == nullptr ? nullptr : algorithm_options_field(g, *entry);
  if (field == nullptr) return "";
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  std::string text;
  printer.PrintToString(g.GetReflection()->GetMessage(g, field), &text);
  while (!text.empty() && text.back() == ' ') text.pop_back();  // single-line mode ends in a space
  return text;
}

GossipSpec gossip_spec(const config::ClusterConfig& c) {
  const auto& g = c.gossip();
  GossipSpec s;
  s.algorithm = g.algorithm();
  s.topology.kind = g.topology();
  s.topology.site_of = site_indices(c);
  s.topology.cross_every = g.cross_every();
  s.topology.floor = g.bandwidth_floor();
  s.topology.degree = g.degree();
  s.mixer.weighting = g.weighting();
  s.mixer.alpha = g.alpha();
  s.mixer.lambda = g.lambda();
  s.mixer.tau_max = g.tau_max();
  s.mixer.weight_by_samples = g.weight_by_samples();
  s.gossip_every = g.gossip_every();
  s.options = algorithm_options_text(g);
  s.sync_timeout_s = g.sync_timeout_s();
  s.parity_check = g.parity_check();
  const auto& codec = g.codec();
  s.codec.name = codec.name();
  s.codec.density = codec.density();
  s.codec.exact_topk = codec.exact_topk();
  s.codec.value_bits = codec.value_bits();
  s.codec.levels = codec.levels();
  s.codec.block = codec.block();
  s.codec.rank = codec.rank();
  s.codec.error_feedback = codec.error_feedback();
  s.model_codec = codec.model_codec();
  s.adaptive.enabled = codec.adaptive();
  s.adaptive.step_fraction = codec.step_fraction();
  s.adaptive.min_density = codec.min_density();
  s.adaptive.max_density = codec.max_density();
  s.guard.max_norm_ratio = g.guard().max_norm_ratio();
  s.guard.strikes = g.guard().strikes();
  s.guard.quarantine_s = g.guard().quarantine_s();
  s.mixer.robust = parse_robust(g.robust());
  s.mixer.clip_factor = g.clip_factor();
  s.mixer.trim = g.trim();
  s.site_replicas = c.site_replicas();
  s.site_codec = c.site_codec();
  s.site_split = c.site_split();
  return s;
}

LinkModel link_model(const config::LinkConfig& l) {
  LinkModel m;
  m.latency_s = l.latency_ms() / 1000.0;
  m.jitter_s = l.jitter_ms() / 1000.0;
  m.bandwidth_bps = l.bandwidth_mbps() * 1e6;
  m.loss = l.loss();
  for (const auto& o : l.outages()) m.outages.emplace_back(o.start_s(), o.end_s());
  return m;
}

LinkModel link_between(const config::ClusterConfig& c, int from, int to) {
  const std::string& a = c.peers(from).site();
  const std::string& b = c.peers(to).site();
  for (const auto& sl : c.site_links()) {
    if ((sl.site_a() == a && sl.site_b() == b) || (sl.site_a() == b && sl.site_b() == a)) return link_model(sl.link());
  }
  return link_model(c.default_link());
}

bool emulates_links(const config::ClusterConfig& c) { return c.has_default_link() || c.site_links_size() > 0; }

std::string load_cluster_secret(const config::ClusterConfig& c) {
  std::string secret;
  if (!c.secret_file().empty()) {
    std::ifstream in(c.secret_file(), std::ios::binary);
    if (!in) throw InputError("cluster.secret_file '" + c.secret_file() + "': cannot open: " + std::strerror(errno));
    std::stringstream ss;
    ss << in.rdbuf();
    secret = ss.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
    if (secret.empty()) throw InputError("cluster.secret_file '" + c.secret_file() + "' is empty");
  } else if (!c.secret_env().empty()) {
    const char* v = std::getenv(c.secret_env().c_str());
    if (v == nullptr || *v == '\0') {
      throw InputError("cluster.secret_env: environment variable " + c.secret_env() + " is not set or empty");
    }
    secret = v;
  } else {
    throw InputError("cluster: no secret: set cluster.secret_file or cluster.secret_env (never on the command line)");
  }
  // A short secret can be guessed offline from one recorded admission.
  if (secret.size() < kMinSecretBytes) {
    const std::string where = !c.secret_file().empty() ? "cluster.secret_file '" + c.secret_file() + "'"
                                                        : "cluster.secret_env: environment variable " + c.secret_env();
    throw InputError(where + ": the secret has " + std::to_string(secret.size()) + " bytes; it must have at least " +
                     std::to_string(kMinSecretBytes) + " (e.g. openssl rand -hex 32)");
  }
  return secret;
}

}  // namespace hearsay
