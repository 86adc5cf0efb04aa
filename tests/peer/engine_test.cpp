// The engine alone: two GossipEngines over inproc transports, no Peer, no step loop. What
// the algorithms rely on from its wire side: an encoded update reaches a receiver as the
// sender's own decoding of it, bit for bit, under every codec (choco's public copies and
// DiLoCo's outer sums are built on that), and a synchronous part answers only its round
// and phase.
#include <doctest/doctest.h>

#include "engine_pair.h"
#include "hearsay/codec.h"
#include "test_util.h"

using namespace hearsay;
using namespace hearsay::test;

namespace {

GossipSpec spec_with_codec(const std::string& codec) {
  GossipSpec g;
  g.algorithm = "gossip_grad";
  g.topology.kind = "ring";
  g.codec.name = codec;
  g.codec.density = 0.05;
  g.codec.rank = 2;
  return g;
}

}  // namespace

TEST_CASE("engine: an update encoded once reaches its receiver as the sender decoded it, bit for bit, under every codec") {
  for (const std::string& codec : codec_names()) {
    CAPTURE(codec);
    Pair p(spec_with_codec(codec), "cpu", "cpu");
    GossipEngine& a = *p.engines[0];
    const auto x = normal_vector(p.n(), 21);
    const auto encoded = a.encode_once(x);
    a.send_encoded(1, {.kind = MessageKind::kGradient}, encoded);
    auto got = p.await_arrivals(1);
    REQUIRE(got.size() == 1);
    CHECK(got[0].from == 0);
    // A host peer keeps the bytes it was sent, not a decoded copy; decoded, they are the
    // sender's values.
    CHECK(got[0].kept_only());
    decode_kept(got[0]);
    CHECK(same_bits(got[0].data, encoded->decoded));
    // Exact only where the codec is: the check above is not comparing x with itself.
    CHECK(same_bits(encoded->decoded, x) == (codec == "none"));
  }
}

TEST_CASE("engine: a synchronous part answers only its round and phase, exact, and a wait for another times out") {
  Pair p(spec_with_codec("int8"), "cpu", "cpu");
  GossipEngine& a = *p.engines[0];
  GossipEngine& b = *p.engines[1];
  const auto x = normal_vector(p.n(), 22);
  // Synchronous exchanges travel as fp32 whatever the codec: sums must be exact.
  a.send(1, {.kind = MessageKind::kModel, .synchronous = true, .round = 3, .phase = 1}, x);
  const auto m = b.wait_sync_for(0, 3, 1, 20.0);
  REQUIRE(m.has_value());
  CHECK(same_bits(m->data, x));
  CHECK_FALSE(b.poll_sync(0, 3, 1).has_value());  // taken once
  const double t0 = p.clock.now();
  CHECK_FALSE(b.wait_sync_for(0, 3, 2, 0.2).has_value());
  CHECK_FALSE(b.wait_sync_for(0, 4, 1, 0.2).has_value());
  CHECK(p.clock.now() - t0 >= 0.4);
  CHECK(b.take_async().empty());  // a synchronous part is never an asynchronous arrival
}
