// The bounded queues between the step loop and the network.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "hearsay/codec.h"

#include "../../src/peer/mailboxes.h"

using namespace hearsay;
using Message = GossipEngine::Message;

namespace {

Message msg(MessageKind kind, std::vector<float> data, uint64_t clock, double w = 0) {
  Message m;
  m.kind = kind;
  m.data = std::move(data);
  m.clock = clock;
  m.push_sum_weight = w;
  m.total = m.data.size();
  return m;
}

// One uncompressed (codec 0) segment of these floats.
std::string add_floats(Inbox& inbox, int from, const wire::Update& u, const std::vector<float>& v) {
  return inbox.add_segment(from, u, reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
}

// An outbox's send that records each message and its callback (a test calls it when the
// link is done with the message).
std::function<void(Message&&, std::function<void(const SendStatus&)>)> recorder(
    std::vector<Message>& sent, std::vector<std::function<void(const SendStatus&)>>& callbacks) {
  return [&sent, &callbacks](Message&& m, std::function<void(const SendStatus&)> done) {
    sent.push_back(std::move(m));
    callbacks.push_back(std::move(done));
  };
}

}  // namespace

TEST_CASE("outbox: while a message is in flight, newer ones fold into one pending message per kind") {
  Mixer mixer({});
  std::vector<Message> sent;
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  Outbox out(recorder(sent, callbacks), mixer);
  out.offer(msg(MessageKind::kGradient, {1, 1}, 1));          // goes out at once
  out.offer(msg(MessageKind::kGradient, {2, 3}, 2));          // pending
  out.offer(msg(MessageKind::kGradient, {10, 10}, 3));        // folded into the pending one
  out.offer(msg(MessageKind::kModel, {5, 5}, 4));             // pending model
  out.offer(msg(MessageKind::kModel, {7, 7}, 5));             // newest model wins
  CHECK(sent.size() == 1);
  CHECK(out.buffered_bytes() == 3 * 2 * sizeof(float));  // in flight + two pending
  callbacks[0]({});
  REQUIRE(sent.size() == 2);
  callbacks[1]({});
  REQUIRE(sent.size() == 3);
  // Pending messages leave in kind order: GRADIENT (0) then MODEL (1).
  CHECK(sent[1].data == std::vector<float>{6, 6.5});  // the mean of the two
  CHECK(sent[1].clock == 2);  // as stale as its oldest part
  CHECK(sent[1].coalesced == 1);
  CHECK(sent[2].data == std::vector<float>{7, 7});
  CHECK(mixer.take_stats().coalesced == 2);
}

TEST_CASE("outbox: gradients encoded once fold behind a busy link, fp16 into their mean in fp16, so one waits per link") {
  Mixer mixer({});
  std::vector<Message> sent;
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  Outbox out(recorder(sent, callbacks), mixer);
  const size_t n = 1024;
  CodecSpec s;
  s.name = "fp16";
  auto codec = make_codec(s, {}, 1);
  auto encoded = [&](float scale) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = scale * std::cos(0.1f * static_cast<float>(i));
    return build_encoded(n, {{0, n / 2}, {n / 2, n / 2}}, [&](size_t b, size_t len, std::vector<uint8_t>& payload, CodecParams& p) {
      codec->encode(x.data() + b, len, b, payload, p);
    });
  };
  out.offer(msg(MessageKind::kGradient, std::vector<float>(n, 0.0f), 0));  // in flight: the link is busy
  for (int k = 0; k < 5; ++k) {
    Message m;
    m.kind = MessageKind::kGradient;
    m.clock = 1 + k;
    m.total = n;
    m.encoded = encoded(0.01f * static_cast<float>(k + 1));
    out.offer(std::move(m));
  }
  callbacks[0]({});
  REQUIRE(sent.size() == 2);  // the five went as one
  CHECK(sent[1].coalesced == 4);
  CHECK(sent[1].clock == 1);
  REQUIRE(sent[1].encoded != nullptr);  // still the codec's bytes, not floats
  CHECK(sent[1].data.empty());
  std::vector<float> scratch;
  double worst = 0;
  for_each_decoded(*sent[1].encoded, scratch, [&](size_t at, const float* y, size_t len) {
    for (size_t i = 0; i < len; ++i) worst = std::max(worst, std::fabs(y[i] - 0.03 * std::cos(0.1f * static_cast<float>(at + i))));
  });
  CHECK(worst < 0.05 * std::ldexp(1.0, -9));  // the mean of 0.01 .. 0.05 x cos, rounded a few times
}

TEST_CASE("outbox: a tensor shared by the messages in flight on two links is counted once in their memory") {
  Mixer mixer({});
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  auto send = [&](Message&&, std::function<void(const SendStatus&)> done) { callbacks.push_back(std::move(done)); };
  Outbox a(send, mixer), b(send, mixer);
  const auto shared = std::make_shared<const std::vector<float>>(1000, 1.0f);
  for (Outbox* o : {&a, &b}) {
    Message m;
    m.kind = MessageKind::kModel;
    m.shared = shared;
    m.total = 1000;
    o->offer(std::move(m));
  }
  std::unordered_set<const void*> seen;
  CHECK(a.held_memory(seen) + b.held_memory(seen) == 4000);  // one buffer, not two
  seen.clear();
  seen.insert(shared.get());  // held by another owner already (the algorithm's snapshot)
  CHECK(a.held_memory(seen) + b.held_memory(seen) == 0);
  for (auto& done : callbacks) done(SendStatus{});
  seen.clear();
  CHECK(a.held_memory(seen) + b.held_memory(seen) == 0);
}

TEST_CASE("outbox: synchronous messages are never folded and keep their order") {
  Mixer mixer({});
  std::vector<Message> sent;
  std::vector<std::function<void(const SendStatus&)>> callbacks;
  Outbox out(recorder(sent, callbacks), mixer);
  for (uint32_t p = 0; p < 3; ++p) {
    auto m = msg(MessageKind::kGradient, {float(p)}, 1);
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

TEST_CASE("inbox: segments reassemble, push-sum mass from one sender adds up, bad segments are refused") {
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

TEST_CASE("inbox: compressed segments are decoded into the message, a payload that fails to decode is dropped whole") {
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
  CodecParams params;
  u.set_segment_length(500);
  codec->encode(g.data(), 500, 0, payload, params);
  write_codec_params(params, u.mutable_codec());
  CHECK(in.add_segment(0, u, payload.data(), payload.size()).empty());
  u.set_segment_index(1);
  u.set_segment_offset(500);
  codec->encode(g.data() + 500, 500, 500, payload, params);
  write_codec_params(params, u.mutable_codec());
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
  codec->encode(g.data(), 1000, 0, payload, params);
  write_codec_params(params, u.mutable_codec());
  payload.pop_back();
  CHECK(in.add_segment(0, u, payload.data(), payload.size()).find("codec topk") == 0);
  CHECK(in.take_async().empty());
  CHECK(in.buffered_bytes() == 0);
}

TEST_CASE("inbox: a host peer's inbox keeps an asynchronous model as the fp16 bytes it came in, decodes them as before, refuses a NaN") {
  Mixer mixer({});
  Inbox lean(mixer, false, nullptr, true), plain(mixer);
  std::vector<float> x(4096);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i) - 1.5f;
  CodecSpec s;
  s.name = "fp16";
  auto codec = make_codec(s, {}, 1);
  wire::Update u;
  u.set_kind(wire::MODEL);
  u.set_tensor_length(x.size());
  u.set_update_id(1);
  u.set_segment_count(2);
  u.set_segment_length(2048);
  std::vector<uint8_t> first, second;
  CodecParams params;
  codec->encode(x.data(), 2048, 0, first, params);
  write_codec_params(params, u.mutable_codec());
  for (Inbox* in : {&lean, &plain}) CHECK(in->add_segment(0, u, first.data(), first.size()).empty());
  u.set_segment_index(1);
  u.set_segment_offset(2048);
  codec->encode(x.data() + 2048, 2048, 2048, second, params);
  write_codec_params(params, u.mutable_codec());
  for (Inbox* in : {&lean, &plain}) CHECK(in->add_segment(0, u, second.data(), second.size()).empty());
  // Half the bytes of the decoded copy the plain inbox holds: the payloads, no floats.
  CHECK(lean.buffered_bytes() == first.size() + second.size());
  CHECK(plain.buffered_bytes() == 4 * x.size());
  auto kept = lean.take_async(), decoded = plain.take_async();
  REQUIRE(kept.size() == 1);
  REQUIRE(decoded.size() == 1);
  CHECK(kept[0].kept_only());
  CHECK(kept[0].elements() == x.size());
  CHECK(kept[0].sum_squares == decoded[0].sum_squares);  // measured as it was decoded, for the guard
  decode_kept(kept[0]);
  CHECK(kept[0].data == decoded[0].data);
  // A NaN is refused on arrival, as the plain inbox refuses it: nothing is kept.
  std::vector<float> bad(x.begin(), x.begin() + 2048);
  bad[17] = std::numeric_limits<float>::quiet_NaN();
  u.set_update_id(2);
  u.set_segment_index(0);
  u.set_segment_offset(0);
  codec->encode(bad.data(), 2048, 0, first, params);
  write_codec_params(params, u.mutable_codec());
  CHECK(lean.add_segment(0, u, first.data(), first.size()).find("non-finite") == 0);
  CHECK(lean.buffered_bytes() == 0);
}

TEST_CASE("inbox: fp16 gradients from one sender fold into their mean in fp16 on a host peer, one message's bytes held") {
  Mixer mixer({});
  Inbox lean(mixer, false, nullptr, true), plain(mixer);
  const size_t n = 4096;
  CodecSpec s;
  s.name = "fp16";
  auto codec = make_codec(s, {}, 1);
  std::vector<std::vector<float>> parts;
  size_t payload_bytes = 0;
  for (int k = 0; k < 3; ++k) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.01f * std::sin(0.37f * static_cast<float>(i) + static_cast<float>(k));
    parts.push_back(x);
    wire::Update u;
    u.set_kind(wire::GRADIENT);
    u.set_tensor_length(n);
    u.set_update_id(10 + k);
    u.set_clock(5 + k);
    u.set_segment_count(2);
    u.set_segment_length(n / 2);
    for (uint32_t seg = 0; seg < 2; ++seg) {
      std::vector<uint8_t> payload;
      CodecParams params;
      codec->encode(x.data() + seg * (n / 2), n / 2, seg * (n / 2), payload, params);
      write_codec_params(params, u.mutable_codec());
      u.set_segment_index(seg);
      u.set_segment_offset(seg * (n / 2));
      for (Inbox* in : {&lean, &plain}) REQUIRE(in->add_segment(3, u, payload.data(), payload.size()).empty());
      if (k == 0) payload_bytes += payload.size();
    }
  }
  // Three arrivals held as one message of fp16 bytes; the plain inbox folds them in fp32.
  CHECK(lean.buffered_bytes() == payload_bytes);
  CHECK(plain.buffered_bytes() == 4 * n);
  auto kept = lean.take_async(), dense = plain.take_async();
  REQUIRE(kept.size() == 1);
  REQUIRE(dense.size() == 1);
  CHECK(kept[0].kept_only());
  CHECK(kept[0].coalesced == 2);
  CHECK(kept[0].clock == 5);  // the oldest part's, for its staleness
  const double sq = kept[0].sum_squares;
  decode_kept(kept[0]);
  // The same mean as the dense fold's, but for fp16's rounding of it: half an ulp of the
  // parts' magnitude (0.01) a fold, two folds.
  double worst = 0, own_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    worst = std::max(worst, std::fabs(double(kept[0].data[i]) - dense[0].data[i]));
    own_sq += double(kept[0].data[i]) * kept[0].data[i];
  }
  CHECK(worst > 0);  // rounded again, so not the dense fold's bits
  CHECK(worst <= 2 * 0.01 * std::ldexp(1.0, -11));
  CHECK(sq == doctest::Approx(own_sq));  // the guard measures what will be added
}

TEST_CASE("inbox: a segment with a NaN or an infinity is refused as it is decoded, and a synchronous wait hears why") {
  Mixer mixer({});
  Inbox in(mixer);
  wire::Update u;
  u.set_kind(wire::MODEL);
  u.set_tensor_length(4);
  u.set_update_id(1);
  u.set_segment_length(4);
  const float inf = std::numeric_limits<float>::infinity();
  CHECK(add_floats(in, 0, u, {1, 2, std::nanf(""), 4}).find("non-finite: element 2 is NaN") == 0);
  u.set_update_id(2);
  CHECK(add_floats(in, 0, u, {1, -inf, 3, 4}).find("non-finite: element 1 is infinite") == 0);
  CHECK(in.take_async().empty());
  u.set_update_id(3);
  u.set_push_sum_weight(std::nan(""));
  CHECK(add_floats(in, 0, u, {1, 2, 3, 4}).find("non-finite: push-sum weight") == 0);
  // Synchronous: the waiter does not sit out its timeout for a message that was refused.
  u.set_update_id(4);
  u.set_push_sum_weight(0);
  u.set_synchronous(true);
  u.set_round(7);
  CHECK_FALSE(add_floats(in, 1, u, {inf, 0, 0, 0}).empty());
  std::atomic<bool> stop{false};
  std::string why;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(in.wait_sync(1, 7, 0, 30.0, stop, &why).has_value());
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
  CHECK(why.find("non-finite") == 0);
}

TEST_CASE("inbox: finite updates whose sum overflows are refused, nothing non-finite is handed out") {
  // Found by hearsay-fuzz-session: each update passed the finite check as it was decoded,
  // and push-sum mass folded into the pending message made infinities.
  Mixer mixer({});
  Inbox in(mixer);
  wire::Update u;
  u.set_kind(wire::PUSH_SUM_WEIGHT);
  u.set_tensor_length(2);
  u.set_segment_length(2);
  u.set_push_sum_weight(0.5);
  u.set_update_id(1);
  CHECK(add_floats(in, 0, u, {3e38f, 1}).empty());
  u.set_update_id(2);
  CHECK(add_floats(in, 0, u, {3e38f, 1}) ==
        "non-finite: summed with the update pending from this peer, element 0 is infinite (an overflow)");
  CHECK(in.take_async().empty());
  u.set_push_sum_weight(1e308);
  u.set_update_id(3);
  CHECK(add_floats(in, 0, u, {1, 1}).empty());
  u.set_update_id(4);
  CHECK(add_floats(in, 0, u, {1, 1}).find("the push-sum weight is infinite") != std::string::npos);
  CHECK(in.take_async().empty());
  // A sum that stays finite still folds.
  u.set_push_sum_weight(0.5);
  u.set_update_id(5);
  CHECK(add_floats(in, 0, u, {1, 1}).empty());
  u.set_update_id(6);
  CHECK(add_floats(in, 0, u, {2, 2}).empty());
  const auto got = in.take_async();
  REQUIRE(got.size() == 1);
  CHECK(got[0].data == std::vector<float>{3, 3});
  CHECK(got[0].push_sum_weight == 1.0);
}

TEST_CASE("inbox: synchronous messages for future rounds are held within a window per sender, a flood is refused") {
  Mixer mixer({});
  Inbox in(mixer);
  wire::Update u;
  u.set_kind(wire::GRADIENT);
  u.set_tensor_length(1024);
  u.set_segment_length(1024);
  u.set_synchronous(true);
  const std::vector<float> v(1024, 1.0f);
  size_t refused = 0;
  for (uint64_t r = 0; r < 2500; ++r) {  // one sender, a new round each message
    u.set_update_id(r + 1);
    u.set_round(100 + r);
    refused += !add_floats(in, 0, u, v).empty();
  }
  CHECK(refused == 2500 - Inbox::kSyncRounds);
  CHECK(in.buffered_bytes() == Inbox::kSyncRounds * 1024 * sizeof(float));
  // Many phases of one round: bounded too.
  for (uint32_t p = 0; p < 200; ++p) {
    u.set_update_id(10000 + p);
    u.set_round(100);
    u.set_phase(p + 1);
    add_floats(in, 2, u, v);
  }
  CHECK(in.buffered_bytes() <= (Inbox::kSyncRounds + Inbox::kSyncMessages) * 1024 * sizeof(float));
  // Another sender is not affected, and held messages are still delivered.
  u.set_update_id(99999);
  u.set_round(100);
  u.set_phase(0);
  CHECK(add_floats(in, 1, u, v).empty());
  std::atomic<bool> stop{false};
  CHECK(in.wait_sync(1, 100, 0, 1.0, stop).has_value());
  CHECK(in.wait_sync(0, 100, 0, 1.0, stop).has_value());
}

TEST_CASE("outbox and inbox: m gradients folded on a slow link move the receiver no farther than one, whatever m") {
  // The step a receiver takes with a neighbour's gradient message is f(tau) times it, tau
  // the oldest part's staleness. Folded as a sum, m parts would step m times as far.
  MixerSpec spec;
  spec.tau_max = 1000;
  for (int m : {1, 2, 8, 64}) {
    CAPTURE(m);
    Mixer mixer(spec);
    std::vector<Message> sent;
    std::vector<std::function<void(const SendStatus&)>> callbacks;
    Outbox out(recorder(sent, callbacks), mixer);
    out.offer(msg(MessageKind::kGradient, {0, 0}, 0));  // in flight: the link is busy
    for (int k = 0; k < m; ++k) out.offer(msg(MessageKind::kGradient, {3, 4}, 1 + k));  // each of norm 5
    callbacks[0]({});
    REQUIRE(sent.size() == 2);
    CHECK(sent[1].coalesced == static_cast<uint64_t>(m - 1));
    // The receiver's inbox folds what arrives before its step the same way.
    Inbox in(mixer);
    wire::Update u;
    u.set_kind(wire::GRADIENT);
    u.set_tensor_length(2);
    u.set_segment_count(1);
    u.set_segment_length(2);
    for (int k = 0; k < m; ++k) {
      u.set_update_id(100 + k);
      u.set_clock(1 + k);
      REQUIRE(add_floats(in, 1, u, sent[1].data).empty());
    }
    const auto got = in.take_async();
    REQUIRE(got.size() == 1);
    const double w = mixer.gradient(m + 1, got[0].clock).weight;
    const double step = w * std::hypot(got[0].data[0], got[0].data[1]);
    CHECK(step == doctest::Approx(5 * mixer.staleness_weight(m)));
    CHECK(step <= 5.0 + 1e-9);
  }
}
