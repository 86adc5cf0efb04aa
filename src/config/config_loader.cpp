#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cerrno>
#include <algorithm>
#include <deque>
#include <set>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "hearsay/config.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

namespace pb = google::protobuf;

class CollectFirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": " + message;
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// Finds where a field was written, so semantic errors point at the line too. Sources are
// searched last first: an override (--set) wins over the file it was merged into.
class Locator {
 public:
  struct Source {
    std::string name;
    const pb::TextFormat::ParseInfoTree* tree;
  };
  explicit Locator(std::vector<Source> sources) : sources_(std::move(sources)) {}

  // path: "train.batch_size"; index for repeated fields.
  std::string at(const std::string& path, int index = -1) const {
    std::vector<std::string> names;
    std::stringstream parts(path);
    for (std::string part; std::getline(parts, part, '.');) names.push_back(part);
    for (auto it = sources_.rbegin(); it != sources_.rend(); ++it) {
      const pb::Descriptor* desc = config::Config::descriptor();
      const pb::TextFormat::ParseInfoTree* tree = it->tree;
      for (size_t i = 0; i < names.size() && desc != nullptr && tree != nullptr; ++i) {
        const pb::FieldDescriptor* field = desc->FindFieldByName(names[i]);
        if (field == nullptr) break;
        if (i + 1 == names.size()) {
          const auto loc = tree->GetLocation(field, field->is_repeated() ? std::max(index, 0) : -1);
          if (loc.line >= 0) {
            return it->name + ":" + std::to_string(loc.line + 1) + ":" + std::to_string(loc.column + 1) + ": " + path;
          }
          break;
        }
        tree = tree->GetTreeForNested(field, -1);
        desc = field->message_type();
      }
    }
    return sources_.front().name + ": " + path;
  }

 private:
  std::vector<Source> sources_;
};

void validate(const config::Config& c, const Locator& at) {
  auto fail = [&](const std::string& path, const std::string& why, int index = -1) {
    const std::string suffix = index >= 0 ? "[" + std::to_string(index) + "]" : "";
    throw InputError(at.at(path, index) + suffix + ": " + why);
  };
  if (c.threads() < 1 || c.threads() > 256) fail("threads", "must be in [1, 256], got " + std::to_string(c.threads()));
  if (c.device().empty()) fail("device", "must name a device: 'cpu' or 'cuda:N'");

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
  if (o.nesterov() && o.momentum() == 0) fail("optim.nesterov", "needs momentum > 0");

  const auto& t = c.train();
  if (t.batch_size() < 1 || t.batch_size() > 65536) fail("train.batch_size", "must be in [1, 65536], got " + std::to_string(t.batch_size()));
  if (t.eval_batch_size() < 1 || t.eval_batch_size() > 65536) fail("train.eval_batch_size", "must be in [1, 65536]");
  if (!(t.epochs() >= 0) || !std::isfinite(t.epochs())) fail("train.epochs", "must be >= 0");
  if (t.max_steps() < 0) fail("train.max_steps", "must be >= 0");
  if (t.epochs() == 0 && t.max_steps() == 0) fail("train.epochs", "is 0 and max_steps is 0: training would never start or never stop");
  if (!(t.target_test_acc() >= 0 && t.target_test_acc() <= 1)) fail("train.target_test_acc", "must be in [0, 1]");
  if (t.eval_every_steps() < 0) fail("train.eval_every_steps", "must be >= 0");
  if (c.log().every_steps() < 1) fail("log.every_steps", "must be >= 1");

  if (c.has_cluster()) {
    const auto& cl = c.cluster();
    std::set<std::string> names, addresses;
    for (int i = 0; i < cl.peers_size(); ++i) {
      const auto& p = cl.peers(i);
      if (p.name().empty()) fail("cluster.peers", "every peer needs a name", i);
      if (!names.insert(p.name()).second) fail("cluster.peers", "name '" + p.name() + "' appears twice", i);
      if (p.address().empty() && cl.transport() != "inproc") fail("cluster.peers", "peer '" + p.name() + "' needs an address (host:port)", i);
      if (!p.address().empty() && !addresses.insert(p.address()).second) {
        fail("cluster.peers", "address '" + p.address() + "' is used by two peers", i);
      }
      if (!(p.slowdown() >= 1) || !std::isfinite(p.slowdown())) fail("cluster.peers", "slowdown must be >= 1", i);
    }
    const auto& g = cl.gossip();
    const auto algorithms = gossip_algorithms();
    if (std::find(algorithms.begin(), algorithms.end(), g.algorithm()) == algorithms.end()) {
      fail("cluster.gossip.algorithm", "unknown '" + g.algorithm() + "'; use adpsgd, gossip_grad, sgp, choco, allreduce, dpsgd, local_sgd or diloco");
    }
    const std::set<std::string> topologies{"ring", "torus", "exponential", "complete", "random", "hierarchical", "bandwidth"};
    if (topologies.count(g.topology()) == 0) fail("cluster.gossip.topology", "unknown '" + g.topology() + "'");
    const std::set<std::string> weightings{"constant", "polynomial", "exponential", "inverse"};
    if (weightings.count(g.weighting()) == 0) fail("cluster.gossip.weighting", "unknown '" + g.weighting() + "'");
    if (g.gossip_every() < 1) fail("cluster.gossip.gossip_every", "must be >= 1");
    if (g.local_steps() < 1) fail("cluster.gossip.local_steps", "must be >= 1");
    if (g.tau_max() < 0) fail("cluster.gossip.tau_max", "must be >= 0");
    auto check_link = [&](const config::LinkConfig& l, const std::string& path) {
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
      for (const std::string& site : {sl.site_a(), sl.site_b()}) {
        if (sites.count(site) == 0) fail("cluster.site_links", "site '" + site + "' has no peer in cluster.peers", i);
      }
      check_link(sl.link(), "cluster.site_links");
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
    if (axis.values_size() == 0) fail("experiment.sweep", "axis '" + axis.field() + "' has no values", i);
    if (axis.also_set_size() > axis.values_size()) fail("experiment.sweep", "more also_set fragments than values", i);
    try {
      field_fragment(axis.field(), axis.values(0));
    } catch (const InputError& err) {
      fail("experiment.sweep", err.what(), i);
    }
  }
  if (c.checkpoint().every_steps() < 0) fail("checkpoint.every_steps", "must be >= 0");
}

}  // namespace

config::Config parse_config(const std::string& text, const std::string& source,
                            const std::vector<std::string>& overrides) {
  config::Config c;
  // Trees must outlive validation; a deque keeps their addresses stable.
  std::deque<pb::TextFormat::ParseInfoTree> trees;
  std::vector<Locator::Source> sources;
  auto merge = [&](const std::string& body, const std::string& name) {
    pb::TextFormat::Parser parser;
    CollectFirstError errors;
    trees.emplace_back();
    parser.RecordErrorsTo(&errors);
    parser.WriteLocationsTo(&trees.back());
    // MergeFromString lets a fragment set fields of a message the file already set;
    // within one text, setting a singular field twice is still an error.
    if (!parser.MergeFromString(body, &c)) {
      throw InputError(name + ":" + (errors.first().empty() ? std::string("could not parse") : errors.first()));
    }
    sources.push_back({name, &trees.back()});
  };
  merge(text, source);
  for (size_t i = 0; i < overrides.size(); ++i) merge(overrides[i], "--set #" + std::to_string(i + 1));
  validate(c, Locator(sources));
  return c;
}

config::Config load_config_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open config: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(path + ": read error");
  return parse_config(text.str(), path, overrides);
}

}  // namespace hearsay
