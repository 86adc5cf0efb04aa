// adpsgd's defining invariant (Lian et al. 2018): pairs average atomically, so with no
// gradient the mean of the models stays put and they meet.
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

TEST_CASE("adpsgd: averages in atomic pairs: with no gradient the mean of the models stays put and every "
          "model converges to it") {
  // The mean is conserved up to fp32 rounding (a pair's exchange conserves the sum exactly
  // in real arithmetic) and the exchanges cut off when the peers stop, which are tiny once
  // the models agree.
  check_mean_kept_and_consensus(averaging_only("adpsgd", "random"));
}
