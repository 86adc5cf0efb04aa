// hearsay-peer: one site's peer process. Exit status: 0 done, 2 bad input (config, data,
// arguments), 1 anything else.
#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <map>
#include <memory>
#include <cstdio>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "hearsay/build_config.h"
#include "hearsay/checkpoint.h"
#include "hearsay/checkpoint.pb.h"
#include "hearsay/command_line.h"
#include "program.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/metrics.h"
#include "hearsay/peer_metrics.h"
#include "hearsay/peer.h"
#include "hearsay/preflight.h"
#include "hearsay/process.h"
#include "hearsay/signals.h"

namespace {

constexpr const char* kUsage =
    "usage: hearsay-peer --config FILE [--peer NAME] [--set FRAGMENT]... [--log PATH] [--quiet]\n"
    "                    [--metrics HOST:PORT]\n"
    "       hearsay-peer --config FILE --check [--peer NAME] [--check-bytes N]\n"
    "       hearsay-peer --config FILE --list-peers | --print-config | --plan | --measure-step N\n"
    "       hearsay-peer --config FILE --sample --checkpoint FILE --prompt TEXT [--tokens N]\n"
    "                    [--temperature T]\n"
    "  --peer NAME    which peer of the config's cluster this process is (default: from\n"
    "                 SLURM_PROCID or RANK); without a cluster the peer trains alone\n"
    "  --check        preflight, before any training: dial every other peer of the cluster,\n"
    "                 prove the secret, measure each link's round trip and bandwidth (N\n"
    "                 bytes, default 4 MiB), and answer the others' checks; exit 0 when\n"
    "                 every link is ok, 2 naming each that is not (docs/OPERATIONS.md)\n"
    "  --list-peers   print the cluster's peer names, one per line, and exit\n"
    "  --print-config print the config with every --set merged (text format), and exit\n"
    "  --plan         check every run of the experiment (sweep x repeats) and print them\n"
    "                 as JSON, for hearsay-run; exit 2 on the first bad one\n"
    "  --measure-step N  train N steps alone and print the median step time, and that of\n"
    "                 an evaluation, as JSON\n"
    "                 (hearsay-run's experiment.emulate_compute)\n"
    "  --sample       print the prompt and N bytes (default 200) a trained GPT writes after\n"
    "                 it, drawn at temperature T (default 0.8; 0: the likeliest byte), from\n"
    "                 the parameters of a checkpoint (checkpoint.dir/NAME.ckpt) of the\n"
    "                 config's model\n"
    "  --config FILE  experiment or peer config (protobuf text format, docs/CONFIG.md)\n"
    "  --set FRAG     merge a text-format fragment over the config, e.g. 'train { epochs: 1 }'\n"
    "  --log PATH     JSON Lines event log (docs/LOGS.md); overrides log.path\n"
    "  --quiet        no progress display\n"
    "  --metrics HOST:PORT  serve live metrics in Prometheus's text format at\n"
    "                 http://HOST:PORT/metrics (docs/OPERATIONS.md); port 0 picks one\n";

// Every run of the experiment, each checked by loading the config with its fragments.
std::string plan_json(const hearsay::config::Config& cfg, const std::string& path, const std::vector<std::string>& overrides) {
  using hearsay::JsonObject;
  std::vector<JsonObject> points;
  for (const auto& p : hearsay::sweep_points(cfg)) {
    std::vector<std::string> all = overrides;
    all.insert(all.end(), p.sets.begin(), p.sets.end());
    std::string program;
    try {
      program = hearsay::load_config_file(path, all).program();
    } catch (const hearsay::InputError& e) {
      std::string what;
      for (const auto& [k, v] : p.values) {
        if (!what.empty()) what += ", ";
        what += k;
        what += " = ";
        what += v;
      }
      throw hearsay::InputError("experiment run " + std::to_string(p.index) + " (" + what + "): " + e.what());
    }
    JsonObject values;
    for (const auto& [k, v] : p.values) values.add(k, v);
    JsonObject o;
    o.add("index", p.index).add("repeat", p.repeat).add("values", values).add("sets", p.sets).add("program", program);
    points.push_back(std::move(o));
  }
  std::vector<JsonObject> peers;
  for (const auto& p : cfg.cluster().peers()) {
    JsonObject o;
    o.add("name", p.name()).add("site", p.site()).add("address", p.address()).add("slowdown", p.slowdown());
    peers.push_back(std::move(o));
  }
  const auto& e = cfg.experiment();
  JsonObject out;
  out.add("name", cfg.name()).add("synchronous", hearsay::is_synchronous(cfg.cluster().gossip().algorithm()));
  out.add("secret_env", cfg.cluster().secret_env()).add("target_test_acc", cfg.train().target_test_acc());
  out.add("stop_at_target", e.stop_at_target()).add("max_wall_s", e.max_wall_s());
  out.add("progress_every_s", e.progress_every_s()).add("out_dir", e.out_dir());
  out.add("emulate_compute", e.emulate_compute()).add("emulate_headroom", e.emulate_headroom());
  out.add("emulated_step_s", cfg.train().emulated_step_s());
  out.add("simulate", e.simulate());
  out.add("checkpoint_dir", cfg.checkpoint().dir()).add("checkpoint_every_steps", static_cast<int64_t>(cfg.checkpoint().every_steps()));
  out.add("peers", peers).add("points", points);
  return out.str() + "\n";
}

int usage_error(const std::string& why) { return hearsay::usage_error("hearsay-peer", kUsage, why); }

}  // namespace

// The config's model with a checkpoint's parameters, then text it writes after `prompt`.
std::string sample_from_checkpoint(const hearsay::config::Config& cfg, const std::string& checkpoint_path,
                                   const std::string& prompt, int tokens, double temperature) {
  // The GPT's shape is all in the config; a marker data set stands in for the corpus.
  hearsay::Dataset text;
  text.context = cfg.model().gpt().context();
  const hearsay::ModelSpec spec = hearsay::model_spec(cfg.model(), text);
  auto backend = hearsay::create_backend(cfg.device(), cfg.threads());
  auto model = hearsay::create_model(spec, *backend, 1, cfg.seed());
  // The model and up to 15 more model-sized buffers, and room for the rest.
  const auto c = hearsay::read_checkpoint(checkpoint_path, 64 * static_cast<uint64_t>(model->num_params()) + (256u << 20));
  if (!c) throw hearsay::InputError(checkpoint_path + ": no such checkpoint (--checkpoint)");
  if (c->num_params() != model->num_params()) {
    throw hearsay::InputError(checkpoint_path + ": holds " + std::to_string(c->num_params()) +
                              " parameters, but the config's model has " + std::to_string(model->num_params()));
  }
  std::vector<float> params(model->num_params());
  hearsay::bytes_to_floats(c->params(), params.data(), params.size(), checkpoint_path + ": params");
  model->set_params(params);
  return hearsay::generate_text(*model, prompt, tokens, temperature, cfg.seed());
}

int main(int argc, char** argv) {
  hearsay::own_signals("hearsay-peer");  // first: before anything that takes time
  hearsay::raise_descriptor_limit();
  std::string config_path, log_path, peer_name, metrics_address;
  std::vector<std::string> overrides;
  bool quiet = false, list_peers = false, print_config = false, plan = false, sample = false, check = false;
  int check_bytes = 4 << 20;
  int measure_steps = 0, sample_tokens = 200;
  std::string checkpoint_path, prompt;
  double temperature = 0.8;
  hearsay::CommandLine cli;
  cli.stop({"--help", "-h"})
      .stop({"--version"})
      .text("--config", &config_path, "a file")
      .text("--log", &log_path, "a path")
      .texts("--set", &overrides, "a text-format fragment")
      .text("--peer", &peer_name, "a name")
      .flag("--list-peers", &list_peers)
      .flag("--print-config", &print_config)
      .flag("--plan", &plan)
      .flag("--check", &check)
      .integer("--check-bytes", &check_bytes, 0, 1 << 30, "a number of bytes")
      .flag("--quiet", &quiet)
      .option("--metrics", "HOST:PORT", [&](const std::string& v) {
        metrics_address = v;
        return !v.empty();  // '' would run silently without metrics
      })
      .integer("--measure-step", &measure_steps, 1, 100000, "a number of steps")
      .flag("--sample", &sample)
      .text("--checkpoint", &checkpoint_path, "a file")
      .text("--prompt", &prompt, "a text")
      .integer("--tokens", &sample_tokens, 0, 1000000, "a number of bytes")
      .number("--temperature", &temperature, 0.0, 100.0, "a number");
  if (const int done = hearsay::parse_program_args("hearsay-peer", kUsage, cli, argc, argv); done >= 0) return done;
  if (config_path.empty()) return usage_error("--config is required");
  if (sample && (checkpoint_path.empty() || prompt.empty())) return usage_error("--sample needs --checkpoint and --prompt");
  // A closed pipe or socket is an error to report, not a reason to die.
  std::signal(SIGPIPE, SIG_IGN);

  return hearsay::run_reporting_errors("hearsay-peer", [&] {
    const hearsay::config::Config cfg = hearsay::load_config_file(config_path, overrides);
    if (list_peers) {
      for (const auto& p : cfg.cluster().peers()) std::printf("%s\n", p.name().c_str());
      return 0;
    }
    if (print_config) {
      std::string text;
      google::protobuf::TextFormat::PrintToString(cfg, &text);
      std::fputs(text.c_str(), stdout);
      return 0;
    }
    if (plan) {
      std::fputs(plan_json(cfg, config_path, overrides).c_str(), stdout);
      return 0;
    }
    if (check) {
      const hearsay::StopOnSignal polled;
      if (cfg.cluster().peers_size() < 2) throw hearsay::InputError("--check: the config has no cluster of at least 2 peers to check");
      hearsay::CheckOptions options;
      options.probe_bytes = static_cast<uint64_t>(check_bytes);
      hearsay::PeerCheck preflight(cfg, hearsay::resolve_peer_name(cfg, peer_name), options);
      const hearsay::CheckReport report = preflight.run(hearsay::stop_flag());
      std::fputs(report.text().c_str(), stdout);
      std::fflush(stdout);
      // The others' checks may still be measuring their links to this peer.
      preflight.linger(options.connect_s + options.probe_timeout_s, hearsay::stop_flag());
      if (hearsay::stop_requested()) {
        std::fprintf(stderr, "hearsay-peer: --check stopped by %s\n", hearsay::stop_signal_name());
        return hearsay::stop_exit_status();
      }
      return report.ok() ? 0 : 2;
    }
    if (sample) {
      const std::string text = sample_from_checkpoint(cfg, checkpoint_path, prompt, sample_tokens, temperature);
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fputc('\n', stdout);
      return 0;
    }
    if (measure_steps > 0) {
      // One peer's step alone, on this machine (hearsay-run's emulated compute time).
      hearsay::EventLog log("", cfg.name());
      hearsay::Peer peer(hearsay::peer_spec(cfg), log, nullptr);
      hearsay::JsonObject measured;
      measured.add("step_s", peer.measure_step_s(measure_steps)).add("steps", measure_steps).add("device", cfg.device());
      // And one whole evaluation alone (train.emulated_eval_s).
      measured.add("eval_s", peer.measure_eval_s(3));
      std::printf("%s\n", measured.str().c_str());
      return 0;
    }
    if (log_path.empty()) log_path = cfg.log().path();
    // From here a signal asks for a stop at the next step boundary: data loading and the
    // join go on to it, and the run ends with its stop checkpoint.
    const hearsay::StopOnSignal polled;
    hearsay::TrainResult r;
    const bool clustered = cfg.cluster().peers_size() >= 2;
    const std::string name = clustered ? hearsay::resolve_peer_name(cfg, peer_name) : cfg.name();
    // The metrics endpoint is up before anything else starts, so that a port in use stops
    // the peer before it joins, and an operator sees it while it waits for neighbours.
    hearsay::PeerMetrics metrics;
    if (!metrics_address.empty()) metrics = hearsay::serve_peer_metrics(cfg, clustered, name, metrics_address, "", "hearsay-peer");
    hearsay::MetricsBoard* const board = metrics.board.get();
    if (clustered) {
      hearsay::EventLog log(log_path, name);
      hearsay::Progress progress(stderr, name);
      std::fprintf(stderr, "hearsay-peer: %s of cluster %s (%s, %s)%s%s\n", name.c_str(), cfg.cluster().id().c_str(),
                   cfg.cluster().gossip().algorithm().c_str(), cfg.cluster().transport().c_str(),
                   log_path.empty() ? "" : ", log ", log_path.c_str());
      r = hearsay::run_cluster_peer(cfg, name, log, quiet ? nullptr : &progress, hearsay::stop_flag(), board);
    } else {
      hearsay::EventLog log(log_path, cfg.name());
      hearsay::Progress progress(stderr, cfg.name());
      hearsay::Peer peer(hearsay::peer_spec(cfg), log, quiet ? nullptr : &progress);
      peer.set_metrics(board);
      peer.stop_when(hearsay::stop_flag());
      std::fprintf(stderr, "hearsay-peer: %s on %s, %zu parameters, %lld training samples%s%s\n", cfg.name().c_str(),
                   cfg.device().c_str(), peer.model().num_params(), static_cast<long long>(peer.data().train.size),
                   log_path.empty() ? "" : ", log ", log_path.c_str());
      r = peer.run();
    }
    // Text: the accuracy is of next bytes, and the loss is also given in bits per byte.
    char bits[48] = "";
    if (cfg.data().format() == hearsay::config::DataConfig::TEXT) {
      std::snprintf(bits, sizeof bits, ", %.3f bits per byte", r.final_test_loss / std::log(2.0));
    }
    // Stopped (SIGTERM, SIGINT, scancel): said on stderr, and the signal's exit status
    // (143, 130), as a shell reports a process the signal ended, with the run's end kept.
    const bool stopped = hearsay::stop_requested();
    if (stopped) {
      std::fprintf(stderr, "hearsay-peer: %s: stopped by %s after %lld steps%s\n", name.c_str(), hearsay::stop_signal_name(),
                   static_cast<long long>(r.steps),
                   cfg.checkpoint().dir().empty() ? " (no checkpoint.dir: nothing saved)" : "; its stop checkpoint is in checkpoint.dir");
    }
    if (stopped && !r.evaluated) {
      std::printf("stopped by %s after %lld steps, %.2f epochs, %.1f s, before any evaluation\n", hearsay::stop_signal_name(),
                  static_cast<long long>(r.steps), r.epochs, r.wall_s);
      return hearsay::stop_exit_status();
    }
    std::printf("%s test accuracy %.2f%% (loss %.4f%s) after %lld steps, %.2f epochs, %.1f s\n",
                stopped ? "stopped by a signal; last" : "final", 100.0 * r.final_test_acc, r.final_test_loss, bits,
                static_cast<long long>(r.steps), r.epochs, r.wall_s);
    return stopped ? hearsay::stop_exit_status() : 0;
  });
}
