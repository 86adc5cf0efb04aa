// D-PSGD's defining invariant (Lian et al. 2017): Metropolis-Hastings weights are doubly
// stochastic, so the mean of the models is kept on a graph of unequal degrees.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "averaging.h"
#include "hearsay/cluster.h"
#include "test_util.h"

using namespace hearsay;
using namespace hearsay::test;

TEST_CASE("dpsgd: its Metropolis-Hastings weights keep the mean of the models on a graph of unequal degrees and "
          "bring every model to it") {
  // The star: the hub has 7 neighbours, each spoke 1. Weights 1/(1 + degree) are not
  // doubly stochastic there, and the models would meet elsewhere than their mean.
  check_mean_kept_and_consensus(averaging_only("dpsgd", "star"));  // fp32 rounding only
}
