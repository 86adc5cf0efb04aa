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
)
foreach(long_case IN LISTS hearsay_long_cases)
  set_tests_properties("${long_case}" PROPERTIES LABELS long)
endforeach()
