// The one launcher resolution (include/hearsay/launcher.h) that hearsay-peer and the Python
// front end share: its precedence and its checks.
#include <doctest/doctest.h>

#include <map>

#include "hearsay/error.h"
#include "hearsay/launcher.h"

using namespace hearsay;

namespace {

Environment env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& v) -> std::optional<std::string> {
    const auto it = vars.find(v);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

const std::vector<std::string> kPeers = {"a", "b"};

}  // namespace

TEST_CASE("launcher: torchrun's rank first, then a Slurm job array's, then a Slurm step's, then RANK alone") {
  // torchrun under srun: both set, torchrun's rank names the process.
  auto p = peer_from_launcher(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"SLURM_PROCID", "0"},
                                      {"SLURM_NTASKS", "1"}}),
                              kPeers, "c");
  REQUIRE(p);
  CHECK(p->name == "b");
  CHECK(p->launcher == "torchrun");
  CHECK(p->local_rank == 1);
  // An array task is SLURM_PROCID 0 of a job of one task: the array index names it.
  p = peer_from_launcher(env_of({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "2"}, {"SLURM_PROCID", "0"},
                                 {"SLURM_NTASKS", "1"}}),
                         kPeers, "c");
  REQUIRE(p);
  CHECK(p->name == "b");
  CHECK(p->launcher == "slurm array");
  // A Slurm step's rank beats a RANK without WORLD_SIZE.
  p = peer_from_launcher(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"RANK", "1"}}),
                         kPeers, "c");
  REQUIRE(p);
  CHECK(p->name == "a");
  CHECK(p->launcher == "slurm");
  p = peer_from_launcher(env_of({{"RANK", "1"}}), kPeers, "c");
  REQUIRE(p);
  CHECK(p->name == "b");
  CHECK(p->launcher == "RANK");
  CHECK_FALSE(peer_from_launcher(env_of({{"LOCAL_RANK", "0"}, {"SLURM_NTASKS", "2"}}), kPeers, "c"));
}

TEST_CASE("launcher: a count other than the peers', a rank outside them or a local rank not a number is named") {
  CHECK_THROWS_WITH_AS(peer_from_launcher(env_of({{"RANK", "1"}, {"WORLD_SIZE", "3"}}), kPeers, "c.textproto"),
                       doctest::Contains("WORLD_SIZE=3 (torchrun) but c.textproto lists 2 peers in cluster.peers"),
                       InputError);
  CHECK_THROWS_WITH_AS(peer_from_launcher(env_of({{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_COUNT", "3"}}), kPeers, "c"),
                       doctest::Contains("launch one array task per peer (sbatch --array=0-1)"), InputError);
  CHECK_THROWS_WITH_AS(peer_from_launcher(env_of({{"SLURM_PROCID", "2"}}), kPeers, "c"),
                       doctest::Contains("SLURM_PROCID=2: not an index into the 2 peers of c"), InputError);
  CHECK_THROWS_WITH_AS(peer_from_launcher(env_of({{"RANK", "-1"}}), kPeers, "c"),
                       doctest::Contains("RANK=-1: not an index"), InputError);
  CHECK_THROWS_WITH_AS(peer_from_launcher(env_of({{"RANK", "0"}, {"LOCAL_RANK", "x"}}), kPeers, "c"),
                       doctest::Contains("LOCAL_RANK=x: not a number"), InputError);
}
