# The cases of fast-tier executables that belong to the long tier (make test-all), each by
# its whole ctest name: "<executable>:<doctest case>". Why each is long:
set(hearsay_long_cases
  # 21 s: two 8-peer clusters for a fixed schedule each, one peer emulated 10x slower.
  "cluster_test:cluster: with one peer 10x slower, asynchronous peers keep their pace, and allreduce and sgp's bounded delay do not"
  # 13 s: every algorithm's 8-peer cluster to the optimum.
  "cluster_test:cluster: every algorithm on 8 peers reaches the centralized optimum of logistic regression"
  # 15 s: every algorithm and the never-communicating peers, three seeds each.
  "cluster_test:cluster: on non-IID shards every algorithm beats peers that never communicate by several times their seed-to-seed spread"
  # 30 s, 11 s, 10 s: real peer processes killed and replaced.
  "site_replicas_test:site replicas: a killed leader is replaced by its site's first live peer, and training goes on"
  "site_replicas_test:site replicas: a killed member leaves its site to the others, the leader stays"
  "site_replicas_test:site replicas: a leader that dies with its model still on the way to one member: that member skips to the newest step, and the site ends together"
  # Real peer processes (the peer program's clusters, checks and restarts; every process of
  # a CUDA build also loads cuBLAS, 0.36 s each):
  # 18 s in a CUDA build: a hearsay-peer process per config and sweep point.
  "peer_test:cli: every ready config and launch example is valid in every run it sweeps"
  # 7 s: three peer processes and a wait for the unreachable one.
  "peer_test:cli: --check names an unreachable neighbour and one with another secret, measures the one that answers, and exits 2 in under 10 s"
  # 7 s: peer processes checking each other.
  "peer_test:cli: a Slurm array task is the peer of its index, whatever its SLURM_PROCID, and a wrong array size is named"
  # 5 s: a real cluster, one of its processes killed and restarted.
  "peer_test:checkpoint: a peer killed with SIGKILL and restarted resumes from its checkpoint's step and rejoins"
  # 4 s: a GPT trained by a peer process.
  "peer_test:cli: a GPT on text trains, checkpoints and samples, and bad text, a text/model mismatch or a wrong checkpoint exit 2"
  # 4 s: peer processes and a timeout.
  "peer_test:preflight: a neighbour that refused this secret and then went away is reported as rejected, not unreachable"
  # 3 s: a peer process waiting out its connect timeout.
  "peer_test:cli: an asynchronous peer whose neighbours never come up exits 2 naming them, unless min_neighbours is 0"
  # 3 s: two-process clusters.
  "peer_test:cli: a peer listening on one address and reached at another (a port forward), by host name or over IPv6, trains with its neighbour"
  # 3 s: peer processes checking each other.
  "peer_test:cli: --check passes (exit 0) when every neighbour answers, and is refused without a cluster"
  # 3 s: a two-process cluster.
  "peer_test:cli: two peer processes of a cluster config find each other over tcp and train"
)
foreach(long_case IN LISTS hearsay_long_cases)
  set_tests_properties("${long_case}" PROPERTIES LABELS long)
endforeach()
