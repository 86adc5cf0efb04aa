// hearsay-bench compression: four peers in one process train the Fashion-MNIST MLP with
// each codec; reports the bytes sent until every peer reached the target test accuracy,
// and the final accuracy, against the same cluster running uncompressed allreduce.
#include <cmath>
#include <sstream>

#include "hearsay/config.pb.h"
#include "bench_util.h"
#include "hearsay/cluster.h"
#include "hearsay/command_line.h"
#include "hearsay/config.h"
#include "hearsay/error.h"

namespace hearsay::bench {
namespace {

struct Options {
  std::vector<std::string> codecs{"none",   "fp16",          "bf16",      "int8",       "qsgd:4",    "sign",
                                  "powersgd:2", "randomk:0.05", "topk:0.01", "topk:0.003", "topk:0.001"};
  // Gradients to every peer, weighed alike: on 2 shared cores a thread's staleness says
  // more about the scheduler than about the peer, so the staleness weighting is left out
  // of this comparison of codecs.
  std::string algorithm = "gossip_grad";
  std::string topology = "complete";
  std::string weighting = "constant";
  double target = 0.85;
  double epochs = 4;
  int peers = 4;
  int repeats = 1;
  int gossip_every = 1;
  int average_every = 0;  // gossip_grad: dense model exchanges would dwarf compressed gradients
  std::vector<std::string> set;  // --set fragments over the base config
};

Options parse(int argc, char** argv) {
  Options o;
  CommandLine("compression bench")
      .text_list("--codecs", &o.codecs, "a list of codecs (name or name:knob)")
      .text("--algorithm", &o.algorithm, "an algorithm")
      .text("--weighting", &o.weighting, "a weighting")
      .text("--topology", &o.topology, "a topology")
      .number("--target", &o.target, 0, 1, "a test accuracy")
      .number("--epochs", &o.epochs, 1e-3, 1e6, "a number of epochs")
      .integer("--peers", &o.peers, 1, 1024, "a number of peers")
      .integer("--average-every", &o.average_every, 0, 1000000, "a number of steps")
      .integer("--gossip-every", &o.gossip_every, 0, 1000000, "a number of steps")
      .integer("--repeats", &o.repeats, 1, 1000, "a number of repeats")
      .texts("--set", &o.set, "a text-format fragment")
      .parse(argc, argv, 0);
  return o;
}

// "topk:0.01" -> topk at density 0.01; the number is the codec's main knob.
CodecSpec parse_codec(const std::string& s) {
  CodecSpec c;
  const auto colon = s.find(':');
  c.name = s.substr(0, colon);
  if (colon != std::string::npos) {
    const double v = std::stod(s.substr(colon + 1));
    if (c.name == "topk" || c.name == "randomk") c.density = v;
    else if (c.name == "powersgd") c.rank = static_cast<int>(v);
    else if (c.name == "qsgd") c.levels = static_cast<int>(v);
    else if (c.name == "int8") c.block = static_cast<int>(v);
    else throw InputError("compression bench: codec '" + c.name + "' takes no parameter ('" + s + "')");
  }
  check_codec_spec(c);
  return c;
}

const char* kBase = R"(
  name: "compression"
  seed: 1
  device: "cpu"
  model { kind: MLP hidden: [256, 256] }
  data { format: IDX }
  optim { lr: 0.05 momentum: 0.9 nesterov: true schedule: COSINE }
  train { batch_size: 64 eval_every_steps: 25 }
  log { every_steps: 1000000 }
)";

struct Outcome {
  std::optional<double> bytes_to_target;  // summed over peers; null unless every peer got there
  double bytes_total = 0, final_acc = 0, min_acc = 1, wall_s = 0;
};

Outcome run(const Options& o, const std::string& algorithm, const std::string& topology, const CodecSpec& codec, int repeat) {
  std::vector<std::string> set = o.set;
  std::ostringstream t;
  t << "seed: " << 1 + repeat << " train { epochs: " << o.epochs << " target_test_acc: " << o.target << " }";
  set.push_back(t.str());
  ClusterSpec s;
  s.base = peer_spec(parse_config(kBase, "compression-bench", set));
  s.peers = o.peers;
  s.gossip.algorithm = algorithm;
  s.gossip.topology.kind = topology;
  s.gossip.codec = codec;
  if (algorithm != "allreduce") s.gossip.gossip_every = o.gossip_every;
  if (algorithm == "gossip_grad") s.gossip.options = "average_every: " + std::to_string(o.average_every);
  s.gossip.mixer.weighting = o.weighting;
  // Whole models (gossip_grad's averaging) travel at the codec's precision where it is a
  // dense one, else as int8.
  s.gossip.model_codec = codec.name == "fp16" || codec.name == "bf16" || codec.name == "none" ? codec.name : "int8";
  const ClusterResult r = run_cluster(s);
  Outcome out;
  double to_target = 0;
  bool all = true;
  for (const auto& p : r.peers) {
    out.bytes_total += static_cast<double>(p.bytes_sent);
    out.final_acc += p.final_test_acc / static_cast<double>(r.peers.size());
    out.min_acc = std::min(out.min_acc, p.final_test_acc);
    all = all && p.time_to_target_s.has_value();
    to_target += static_cast<double>(p.bytes_to_target);
  }
  if (all) out.bytes_to_target = to_target;
  out.wall_s = r.wall_s;
  return out;
}

}  // namespace

int run_compression_bench(int argc, char** argv) {
  const Options o = parse(argc, argv);
  std::vector<CodecSpec> codecs;
  for (const auto& c : o.codecs) codecs.push_back(parse_codec(c));
  for (int rep = 0; rep < o.repeats; ++rep) {
    const Outcome base = run(o, "allreduce", "ring", CodecSpec{}, rep);
    auto report = [&](const std::string& label, const Outcome& r, const std::string& codec) {
      JsonObject e;
      e.add("algorithm", label.substr(0, label.find(' '))).add("codec", codec).add("repeat", rep);
      e.add("peers", o.peers).add("target_test_acc", o.target);
      if (r.bytes_to_target) {
        e.add("bytes_to_target", *r.bytes_to_target);
      } else {
        e.add_null("bytes_to_target");
      }
      if (r.bytes_to_target && base.bytes_to_target) {
        e.add("reduction_vs_allreduce", *base.bytes_to_target / *r.bytes_to_target);
      } else {
        e.add_null("reduction_vs_allreduce");
      }
      e.add("bytes_sent_total", r.bytes_total).add("final_test_acc", r.final_acc).add("min_final_test_acc", r.min_acc);
      e.add("acc_vs_allreduce", r.final_acc - base.final_acc).add("wall_s", r.wall_s);
      emit("compression", label, "bytes_to_target", r.bytes_to_target.value_or(-1), "B", &e);
    };
    report("allreduce none", base, "none");
    for (size_t i = 0; i < codecs.size(); ++i) report(o.algorithm + " " + o.codecs[i], run(o, o.algorithm, o.topology, codecs[i], rep), o.codecs[i]);
  }
  return 0;
}

}  // namespace hearsay::bench
