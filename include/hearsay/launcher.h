#pragma once
// Which peer of a cluster this process is, from its launcher's environment. One resolution,
// one precedence, for hearsay-peer (resolve_peer_name) and the Python front end
// (hearsay._engine.peer_from_launcher):
//   1. torchrun: RANK with WORLD_SIZE (and LOCAL_RANK). First, because torchrun run under
//      Slurm sees Slurm's variables too, and its own rank is the process's.
//   2. a Slurm job array (peers/slurm/hearsay.sbatch): SLURM_ARRAY_TASK_ID, counted by
//      SLURM_ARRAY_TASK_COUNT; each array task is a job of one task, SLURM_PROCID 0.
//   3. a Slurm step (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
//   4. RANK alone (with LOCAL_RANK): a launcher that gives no count.
// The launcher's count, where it gives one, must be the cluster's number of peers, or
// ranks would name the wrong peers.
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace hearsay {

struct LaunchedPeer {
  std::string name;      // the peer of the cluster this process is
  std::string launcher;  // "torchrun", "slurm array", "slurm", "RANK"
  int local_rank = 0;    // its index among the processes of its host (LOCAL_RANK, SLURM_LOCALID), 0 if not given
};

// The environment as the resolution reads it: a variable's value, or nullopt if unset.
using Environment = std::function<std::optional<std::string>(const std::string& var)>;
// The process's own environment.
Environment process_environment();

// The peer of `peers` that the launcher in `env` names, or nullopt where no launcher's
// variable is set. `config` names the config in errors. Throws InputError naming the
// variable, its value and the config when the count is not the peers' or the rank is not
// an index into them.
std::optional<LaunchedPeer> peer_from_launcher(const Environment& env, const std::vector<std::string>& peers,
                                               const std::string& config);

}  // namespace hearsay
