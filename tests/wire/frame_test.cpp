#include <doctest/doctest.h>

#include <functional>

#include <cstring>

#include "hearsay/wire.pb.h"
#include "hearsay/rng.h"
#include "hearsay/wire.h"

using namespace hearsay;

namespace {

std::vector<InFrame> decode_all(const std::string& bytes, FrameError* err, size_t chunk = 0, WireLimits limits = {}) {
  FrameDecoder d(limits);
  std::vector<InFrame> out;
  *err = FrameError::kNone;
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t step = chunk == 0 ? bytes.size() : chunk;
  for (size_t i = 0; i < bytes.size() && *err == FrameError::kNone; i += step) {
    *err = d.feed(p + i, std::min(step, bytes.size() - i), [&](InFrame&& f) { out.push_back(std::move(f)); });
  }
  return out;
}

wire::Envelope update_envelope(uint64_t n) {
  wire::Envelope e;
  auto* u = e.mutable_update();
  u->set_sender("p1");
  u->set_clock(42);
  u->set_step(7);
  u->set_samples_seen(4096);
  u->set_kind(wire::MODEL_DELTA);
  u->mutable_codec()->set_codec_id(0);
  u->set_tensor_length(n);
  u->set_segment_offset(0);
  u->set_segment_length(n);
  return e;
}

}  // namespace

TEST_CASE("crc32c matches the Castagnoli check value") {
  CHECK(crc32c("123456789", 9) == 0xE3069283u);
  CHECK(crc32c("", 0) == 0u);
  // Incremental use gives the same as one call.
  CHECK(crc32c("56789", 5, crc32c("1234", 4)) == 0xE3069283u);
}

TEST_CASE("frames: every message kind round-trips, whole and byte by byte") {
  std::vector<wire::Envelope> kinds(5);
  kinds[0].mutable_hello()->set_peer_id("a");
  kinds[0].mutable_hello()->set_nonce(std::string(32, 'n'));
  kinds[1].mutable_heartbeat()->set_seq(3);
  kinds[2] = update_envelope(3);
  kinds[3].mutable_credit()->set_credits(2);
  kinds[4].mutable_bye()->set_reason("done");
  const float payload[3] = {1.5f, -2.0f, 3.25f};
  std::string stream;
  for (size_t i = 0; i < kinds.size(); ++i) {
    const bool with_payload = i == 2;
    stream += flatten(make_frame(kinds[i], with_payload ? reinterpret_cast<const uint8_t*>(payload) : nullptr,
                                 with_payload ? sizeof(payload) : 0));
  }
  for (size_t chunk : {size_t{0}, size_t{1}, size_t{7}}) {
    FrameError err;
    const auto frames = decode_all(stream, &err, chunk);
    CHECK(err == FrameError::kNone);
    REQUIRE(frames.size() == 5);
    for (size_t i = 0; i < 5; ++i) CHECK(frames[i].envelope->SerializeAsString() == kinds[i].SerializeAsString());
    REQUIRE(frames[2].payload.size() == sizeof(payload));
    CHECK(std::memcmp(frames[2].payload.data(), payload, sizeof(payload)) == 0);
  }
}

TEST_CASE("frames: each kind of corruption is rejected with its reason") {
  const float payload[4] = {1, 2, 3, 4};
  const std::string good = flatten(make_frame(update_envelope(4), reinterpret_cast<const uint8_t*>(payload), 16));
  FrameError err;

  std::string bad = good;
  bad[0] = 'X';
  CHECK(decode_all(bad, &err).empty());
  CHECK(err == FrameError::kBadMagic);

  bad = good;
  bad[4] = 9;
  decode_all(bad, &err);
  CHECK(err == FrameError::kBadVersion);

  bad = good;
  bad[bad.size() - 1] ^= 1;  // payload bit flip
  decode_all(bad, &err);
  CHECK(err == FrameError::kBadCrc);

  bad = good;
  bad[kFixedHeaderSize] = '\xff';  // protobuf garbage: field 31, wire type 7
  decode_all(bad, &err);
  CHECK(err == FrameError::kBadProtobuf);

  WireLimits small;
  small.max_payload_bytes = 8;
  decode_all(good, &err, 0, small);
  CHECK(err == FrameError::kPayloadTooLarge);
  small = WireLimits{};
  small.max_header_bytes = 4;
  decode_all(good, &err, 0, small);
  CHECK(err == FrameError::kHeaderTooLarge);
}

TEST_CASE("frames: a truncated frame yields nothing and waits, a huge claimed payload allocates nothing up front") {
  const std::string good = flatten(make_frame(update_envelope(0)));
  FrameDecoder d;
  int frames = 0;
  CHECK(d.feed(reinterpret_cast<const uint8_t*>(good.data()), good.size() - 1, [&](InFrame&&) { ++frames; }) ==
        FrameError::kNone);
  CHECK(frames == 0);
  CHECK(d.pending() == good.size() - 1);

  // A header that claims 1 GiB followed by 10 bytes: accepted as pending, memory stays small.
  std::string claim = flatten(make_frame(update_envelope(0)));
  const uint64_t huge = uint64_t{1} << 30;
  std::memcpy(&claim[12], &huge, 8);
  claim += std::string(10, 'x');
  FrameDecoder d2;
  CHECK(d2.feed(reinterpret_cast<const uint8_t*>(claim.data()), claim.size(), [&](InFrame&&) { ++frames; }) ==
        FrameError::kNone);
  CHECK(frames == 0);
  CHECK(d2.pending() < 1024);
}

TEST_CASE("frames: random bytes and random corruptions never crash the decoder") {
  Rng rng(2024);
  const float payload[64] = {};
  const std::string good = flatten(make_frame(update_envelope(64), reinterpret_cast<const uint8_t*>(payload), sizeof(payload)));
  int decoded = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes;
    if (iter % 3 == 0) {
      bytes.resize(rng.below(300));
      for (auto& c : bytes) c = static_cast<char>(rng.below(256));
    } else {
      bytes = good + good;
      const int flips = 1 + static_cast<int>(rng.below(4));
      for (int f = 0; f < flips; ++f) bytes[rng.below(bytes.size())] ^= static_cast<char>(1 + rng.below(255));
      if (iter % 3 == 2) bytes.resize(rng.below(bytes.size()));
    }
    WireLimits limits;
    limits.max_payload_bytes = 1 << 16;
    FrameError err;
    decoded += static_cast<int>(decode_all(bytes, &err, 1 + rng.below(64), limits).size());
    rejected += err != FrameError::kNone;
  }
  CHECK(rejected > 1000);
  CHECK(decoded > 0);  // flips in fields that do not matter still decode
}

TEST_CASE("updates: segments outside the tensor and inconsistent payloads are refused") {
  wire::Update u = update_envelope(10).update();
  CHECK(check_update(u, 40).empty());
  CHECK(check_update(u, 40, 11).find("differs") != std::string::npos);
  CHECK(check_update(u, 39).find("payload bytes") != std::string::npos);
  u.set_segment_offset(5);
  u.set_segment_length(6);
  CHECK(check_update(u, 24).find("outside the tensor") != std::string::npos);
  u.set_segment_offset(~uint64_t{0} - 2);  // overflow attempt
  u.set_segment_length(4);
  CHECK(check_update(u, 16).find("outside the tensor") != std::string::npos);
  u = update_envelope(10).update();
  u.set_segment_count(2);
  u.set_segment_index(2);
  CHECK(check_update(u, 40).find("segment_index") != std::string::npos);
}

TEST_CASE("crc32c: the fast multi-lane path agrees with the bitwise definition at every length") {
  auto reference = [](const uint8_t* p, size_t n, uint32_t crc) {
    uint32_t c = ~crc;
    for (size_t i = 0; i < n; ++i) {
      c ^= p[i];
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? 0x82f63b78u : 0);
    }
    return ~c;
  };
  Rng rng(99);
  std::vector<uint8_t> data(3 * 8192 * 3 + 77);
  for (auto& b : data) b = static_cast<uint8_t>(rng.below(256));
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{24575}, size_t{24576}, size_t{24577},
                   size_t{49152}, size_t{50000}, data.size()}) {
    for (uint32_t start : {0u, 0xdeadbeefu}) {
      CAPTURE(n);
      CHECK(crc32c(data.data(), n, start) == reference(data.data(), n, start));
    }
  }
}

TEST_CASE("frames: a frame without a CRC is refused unless the transport accepts unchecked payloads") {
  const float payload[4] = {1, 2, 3, 4};
  OutFrame f = make_frame(update_envelope(4), reinterpret_cast<const uint8_t*>(payload), sizeof(payload));
  omit_crc(f);
  std::string bytes = f.head;
  bytes.append(reinterpret_cast<const char*>(payload), sizeof(payload));
  // A transport that checks (tcp, rxm, inproc) refuses it as a CRC fault.
  FrameError err;
  CHECK(decode_all(bytes, &err).empty());
  CHECK(err == FrameError::kBadCrc);
  // Same-host shared memory accepts it, and the payload arrives as sent.
  FrameDecoder d;
  d.accept_unchecked_payloads(true);
  std::vector<InFrame> got;
  CHECK(d.feed(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), [&](InFrame&& in) { got.push_back(std::move(in)); }) ==
        FrameError::kNone);
  REQUIRE(got.size() == 1);
  CHECK(std::memcmp(got[0].payload.data(), payload, sizeof(payload)) == 0);
  // A sealed frame still carries its CRC, and flatten() seals on the way.
  OutFrame g = make_frame(update_envelope(4), reinterpret_cast<const uint8_t*>(payload), sizeof(payload));
  CHECK_FALSE(g.sealed);
  const std::string whole = flatten(g);
  CHECK(decode_all(whole, &err).size() == 1);
  CHECK(err == FrameError::kNone);
}

TEST_CASE("frames: heartbeats, acknowledgements and probes are urgent (sent before queued data), updates, hellos and "
          "byes are not") {
  // Each kind of frame, and whether it is urgent: a Bye goes after what is queued (a close
  // says it last).
  const std::vector<std::pair<std::function<void(wire::Envelope&)>, bool>> kinds{
      {[](wire::Envelope& e) { e.mutable_heartbeat()->set_seq(1); }, true},
      {[](wire::Envelope& e) { e.mutable_credit()->set_credits(3); }, true},
      {[](wire::Envelope& e) { e.mutable_probe()->set_seq(1); }, true},
      {[](wire::Envelope& e) { e.mutable_update()->set_update_id(1); }, false},
      {[](wire::Envelope& e) { e.mutable_bye()->set_reason("done"); }, false},
      {[](wire::Envelope& e) { e.mutable_hello()->set_peer_id("a"); }, false},
  };
  for (const auto& [fill, urgent] : kinds) {
    wire::Envelope e;
    fill(e);
    CAPTURE(e.body_case());
    CHECK(make_frame(e).urgent == urgent);
  }
}
