// The bounded queues between the step loop and the network.
#include <doctest/doctest.h>

#include "hearsay/codec.h"

#include "../../src/peer/mailboxes.h"

using namespace hearsay;
using Message = GossipEngine::Message;

namespace {

Message msg(wire::PayloadKind kind, std::vector<float> data, uint64_t clock, double w = 0) {
  Message m;
  m.kind = kind;
  m.data = std::move(data);
  m.clock = clock;
  m.push_sum_weight = w;
  m.total = m.data.size();
  return m;
}

}  // namespace

TEST_CASE("outbox: while a message is in flight, newer ones fold into one pending message per kind") {
  Mixer mixer({});
  std::vector<Message> sent;
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  Outbox out([&](Message&& m, std::function<void(const SendStatus&)> done) {
    sent.push_back(std::move(m));
    callbacks.push_back(std::move(done));
  }, mixer);
  out.offer(msg(wire::GRADIENT, {1, 1}, 1));          // goes out at once
  out.offer(msg(wire::GRADIENT, {2, 3}, 2));          // pending
  out.offer(msg(wire::GRADIENT, {10, 10}, 3));        // summed into the pending one
  out.offer(msg(wire::MODEL, {5, 5}, 4));             // pending model
  out.offer(msg(wire::MODEL, {7, 7}, 5));             // newest model wins
  CHECK(sent.size() == 1);
  CHECK(out.buffered_bytes() == 3 * 2 * sizeof(float));  // in flight + two pending
  callbacks[0]({});
  REQUIRE(sent.size() == 2);
  callbacks[1]({});
  REQUIRE(sent.size() == 3);
  // Pending messages leave in kind order: GRADIENT (0) then MODEL (1).
  CHECK(sent[1].data == std::vector<float>{12, 13});
  CHECK(sent[1].clock == 2);  // a sum is as stale as its oldest part
  CHECK(sent[1].coalesced == 1);
  CHECK(sent[2].data == std::vector<float>{7, 7});
  CHECK(mixer.take_stats().coalesced == 2);
}

TEST_CASE("outbox: synchronous messages are never folded and keep their order") {
  Mixer mixer({});
  std::vector<Message> sent;
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  Outbox out([&](Message&& m, std::function<void(const SendStatus&)> done) {
    sent.push_back(std::move(m));
    callbacks.push_back(std::move(done));
  }, mixer);
  for (uint32_t p = 0; p < 3; ++p) {
    auto m = msg(wire::GRADIENT, {float(p)}, 1);
    m.synchronous = true;
    m.phase = p;
    out.offer(std::move(m));
  }
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(sent.size() == i + 1);
    CHECK(sent[i].phase == i);
    callbacks[i]({});
  }
}

TEST_CASE("inbox: segments reassemble; push-sum mass from one sender adds up; bad segments are refused") {
  Mixer mixer({});
  Inbox in(mixer);
  wire::Update u;
  u.set_kind(wire::PUSH_SUM_WEIGHT);
  u.set_tensor_length(4);
  u.set_update_id(1);
  u.set_segment_count(2);
  u.set_push_sum_weight(0.5);
  // One uncompressed (codec 0) segment of these floats.
  auto add = [](Inbox& inbox, int from, const wire::Update& update, std::vector<float> v) {
    return inbox.add_segment(from, update, reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
  };
  u.set_segment_offset(0);
  u.set_segment_length(2);
  CHECK(add(in, 0, u, {1, 2}).empty());
  CHECK(in.take_async().empty());  // half a message
  u.set_segment_offset(2);
  u.set_segment_index(1);
  CHECK(add(in, 0, u, {3, 4}).empty());
  u.set_update_id(2);
  u.set_segment_count(1);
  u.set_segment_index(0);
  u.set_segment_offset(0);
  u.set_segment_length(4);
  CHECK(add(in, 0, u, {1, 1, 1, 1}).empty());
  auto got = in.take_async();
  REQUIRE(got.size() == 1);
  CHECK(got[0].data == std::vector<float>{2, 3, 4, 5});
  CHECK(got[0].push_sum_weight == doctest::Approx(1.0));
  // A segment that does not continue its message is refused.
  u.set_update_id(3);
  u.set_segment_count(2);
  u.set_segment_length(2);
  CHECK(add(in, 1, u, {1, 1}).empty());
  u.set_segment_offset(3);
  u.set_segment_index(1);
  CHECK(add(in, 1, u, {1, 1}).find("does not follow") != std::string::npos);
}

TEST_CASE("inbox: compressed segments are decoded into the message; a payload that fails to decode is dropped whole") {
  Mixer mixer({});
  Inbox in(mixer);
  std::vector<float> g(1000, 0.0f);
  g[3] = 5;
  g[700] = -2;
  CodecSpec s;
  s.name = "topk";
  s.density = 0.002;
  auto codec = make_codec(s, {}, 1);
  wire::Update u;
  u.set_kind(wire::GRADIENT);
  u.set_tensor_length(1000);
  u.set_update_id(1);
  u.set_segment_count(2);
  std::vector<uint8_t> payload;
  u.set_segment_length(500);
  codec->encode(g.data(), 500, 0, payload, *u.mutable_codec());
  CHECK(in.add_segment(0, u, payload.data(), payload.size()).empty());
  u.set_segment_index(1);
  u.set_segment_offset(500);
  codec->encode(g.data() + 500, 500, 500, payload, *u.mutable_codec());
  CHECK(in.add_segment(0, u, payload.data(), payload.size()).empty());
  auto got = in.take_async();
  REQUIRE(got.size() == 1);
  CHECK(got[0].data == g);
  // The same update with its last byte cut: refused with the codec's reason, nothing kept.
  u.set_update_id(2);
  u.set_segment_count(1);
  u.set_segment_index(0);
  u.set_segment_offset(0);
  u.set_segment_length(1000);
  codec->encode(g.data(), 1000, 0, payload, *u.mutable_codec());
  payload.pop_back();
  CHECK(in.add_segment(0, u, payload.data(), payload.size()).find("codec topk") == 0);
  CHECK(in.take_async().empty());
  CHECK(in.buffered_bytes() == 0);
}
