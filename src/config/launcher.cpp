#include "hearsay/launcher.h"

#include <cstdlib>

#include "hearsay/command_line.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/error.h"

namespace hearsay {

namespace {

// One launcher's variables; an empty count or local means it gives none.
struct LauncherVariables {
  const char* label;
  const char* rank;
  const char* count;
  const char* local;
};

// The precedence of include/hearsay/launcher.h, in order.
LauncherVariables launcher_in(const Environment& env) {
  if (env("RANK") && env("WORLD_SIZE")) return {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"};
  if (env("SLURM_ARRAY_TASK_ID")) return {"slurm array", "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", ""};
  if (env("SLURM_PROCID")) return {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"};
  if (env("RANK")) return {"RANK", "RANK", "", "LOCAL_RANK"};
  return {nullptr, nullptr, nullptr, nullptr};
}

// A whole number in [0, bound) (parse_integer: no trailing characters, no overflow), or -1.
int64_t index_below(const std::string& text, size_t bound) {
  int64_t i = -1;
  return parse_integer(text, 0, static_cast<int64_t>(bound) - 1, &i) ? i : -1;
}

}  // namespace

Environment process_environment() {
  return [](const std::string& var) -> std::optional<std::string> {
    const char* v = std::getenv(var.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

std::optional<LaunchedPeer> peer_from_launcher(const Environment& env, const std::vector<std::string>& peers,
                                               const std::string& config) {
  const LauncherVariables l = launcher_in(env);
  if (l.label == nullptr) return std::nullopt;
  const std::string n = std::to_string(peers.size());
  if (*l.count != '\0') {
    if (const auto count = env(l.count); count && *count != n) {
      const bool array = std::string(l.label) == "slurm array";
      throw InputError(std::string(l.count) + "=" + *count + " (" + l.label + ") but " + config + " lists " + n +
                       " peers in cluster.peers; launch one " +
                       (array ? "array task per peer (sbatch --array=0-" + std::to_string(peers.size() - 1) + ")"
                              : std::string("process per peer")));
    }
  }
  const std::string rank_text = *env(l.rank);
  const int64_t rank = index_below(rank_text, peers.size());
  if (rank < 0) {
    throw InputError(std::string(l.rank) + "=" + rank_text + ": not an index into the " + n + " peers of " + config);
  }
  LaunchedPeer p{peers[static_cast<size_t>(rank)], l.label, 0};
  if (*l.local != '\0') {
    if (const auto local = env(l.local)) {
      const int64_t i = index_below(*local, 1 << 20);
      if (i < 0) throw InputError(std::string(l.local) + "=" + *local + ": not a number (" + l.label + ")");
      p.local_rank = static_cast<int>(i);
    }
  }
  return p;
}

std::string resolve_peer_name(const config::Config& cfg, const std::string& requested) {
  const auto& peers = cfg.cluster().peers();
  if (!requested.empty()) {
    for (const auto& p : peers) {
      if (p.name() == requested) return requested;
    }
    throw InputError("--peer '" + requested + "': no such peer in cluster.peers");
  }
  std::vector<std::string> names;
  for (const auto& p : peers) names.push_back(p.name());
  if (const auto launched = peer_from_launcher(process_environment(), names, "the config")) return launched->name;
  throw InputError(
      "the config lists a cluster: say which peer this is with --peer NAME (or a launcher's rank: RANK with "
      "WORLD_SIZE, SLURM_ARRAY_TASK_ID, SLURM_PROCID)");
}

}  // namespace hearsay
