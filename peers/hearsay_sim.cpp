// hearsay-sim: every peer of a cluster config in this one process, on SimGrid's virtual
// clock and network model (docs/SIMULATION.md). hearsay-run --simulate runs it once per
// run of an experiment. Exit status: 0 done, 2 bad input (config, data, arguments), 1 a
// peer failed or anything else.
#include <malloc.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "hearsay/build_config.h"
#include "hearsay/command_line.h"
#include "program.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"
#include "hearsay/log.h"
#include "hearsay/process.h"
#include "hearsay/signals.h"
#include "hearsay/simulation.h"

namespace {

constexpr const char* kUsage =
    "usage: hearsay-sim --config FILE [--set FRAGMENT]... [--log-dir DIR] [--progress-every S]\n"
    "  Runs the config's whole cluster on virtual time: each peer's log in DIR/NAME.jsonl, the\n"
    "  simulator's in DIR/cluster.jsonl (faults, the mean model's accuracy, its end), and its\n"
    "  wall-clock figures (time, speed, memory) in DIR/sim_stats.json.\n"
    "  --config FILE        experiment config (docs/CONFIG.md); experiment.simulate is set\n"
    "  --set FRAG           merge a text-format fragment over the config\n"
    "  --log-dir DIR        where the logs go (default: none are written)\n"
    "  --progress-every S   wall seconds between progress lines on stderr (default 2; 0: none)\n";

int usage_error(const std::string& why) { return hearsay::usage_error("hearsay-sim", kUsage, why); }

}  // namespace

int main(int argc, char** argv) {
  hearsay::own_signals("hearsay-sim");  // first: before anything that takes time
  hearsay::raise_descriptor_limit();  // 1,024 peers' logs
  // Models and messages are allocated afresh all the time; above glibc's mmap threshold
  // each would be mapped and its pages zeroed anew (a tenth of a 256-peer run's time).
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  std::string config_path, log_dir;
  std::vector<std::string> overrides;
  double progress_every = 2;
  hearsay::CommandLine cli;
  cli.stop({"--help", "-h"})
      .stop({"--version"})
      .text("--config", &config_path, "a file")
      .texts("--set", &overrides, "a text-format fragment")
      .text("--log-dir", &log_dir, "a directory")
      .number("--progress-every", &progress_every, 0.0, 1e6, "a number of seconds");
  if (const int done = hearsay::parse_program_args("hearsay-sim", kUsage, cli, argc, argv); done >= 0) return done;
  if (config_path.empty()) return usage_error("--config is required");
  return hearsay::run_reporting_errors("hearsay-sim", [&] {
    // Checked as a simulated run: what the simulator cannot model is refused here, with
    // the field's place in the file.
    overrides.push_back("experiment { simulate: true }");
    const hearsay::config::Config cfg = hearsay::load_config_file(config_path, overrides);
    hearsay::SimulationOptions options;
    options.log_dir = log_dir;
    options.progress_every_s = progress_every;
    // A signal stops every simulated peer at its next step; the logs are written whole.
    const hearsay::StopOnSignal polled;
    options.stop = hearsay::stop_flag();
    const hearsay::SimulationResult r = hearsay::run_simulation(cfg, options);
    if (!log_dir.empty()) {
      // Wall-clock figures live apart from the logs, which are the same from run to run.
      hearsay::JsonObject stats;
      stats.add("virtual_s", r.virtual_s).add("wall_s", r.wall_s).add("virtual_per_wall", r.wall_s > 0 ? r.virtual_s / r.wall_s : 0.0);
      stats.add("peers", r.peers).add("events", static_cast<int64_t>(r.events));
      stats.add("events_per_s", r.wall_s > 0 ? static_cast<double>(r.events) / r.wall_s : 0.0);
      stats.add("peak_rss_bytes", static_cast<int64_t>(r.peak_rss_bytes)).add("stopped_by", r.stopped_by);
      std::ofstream(log_dir + "/sim_stats.json") << stats.str() << "\n";
    }
    std::printf("simulated %d peers for %.1f virtual s in %.1f wall s (%.1fx), %llu events, peak memory %.0f MiB, stopped by %s\n",
                r.peers, r.virtual_s, r.wall_s, r.wall_s > 0 ? r.virtual_s / r.wall_s : 0.0,
                static_cast<unsigned long long>(r.events), r.peak_rss_bytes / 1048576.0, r.stopped_by.c_str());
    if (hearsay::stop_requested()) {
      std::fprintf(stderr, "hearsay-sim: stopped by %s\n", hearsay::stop_signal_name());
      return hearsay::stop_exit_status();
    }
    return 0;
  });
}
