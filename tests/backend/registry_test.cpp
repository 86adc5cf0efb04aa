#include <doctest/doctest.h>

#include "hearsay/backend.h"
#include "hearsay/build_config.h"
#include "hearsay/error.h"

using namespace hearsay;

TEST_CASE("registry: cpu is always available and named") {
  auto b = create_backend("cpu", 2);
  CHECK(b->name() == "cpu");
  CHECK(b->is_host());
  CHECK(available_devices().front() == "cpu");
}

TEST_CASE("registry: unknown or malformed devices are input errors naming the device") {
  CHECK_THROWS_WITH_AS(create_backend("tpu:0"), doctest::Contains("tpu:0"), InputError);
  CHECK_THROWS_WITH_AS(create_backend("cuda:x"), doctest::Contains("cuda:N"), InputError);
  CHECK_THROWS_WITH_AS(create_backend("cuda:-1"), doctest::Contains("cuda:-1"), InputError);
  CHECK_THROWS_AS(create_backend("cpu", 0), InputError);
}

TEST_CASE("registry: a CUDA device that is not there is an input error, not a crash") {
  CHECK_THROWS_AS(create_backend("cuda:4096"), InputError);
}
