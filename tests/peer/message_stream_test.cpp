// MessageStream (src/peer/message_stream.h): a large message as a stream of segments,
// at most a window sent and unacknowledged, resumed from the receiver's last
// acknowledgement after a cut. Driven by hand here: the transport is a list of the frames
// handed to it, the clock is set by the test.
#include <doctest/doctest.h>

#include <vector>

#include "hearsay/wire.pb.h"
#include "../../src/peer/message_stream.h"

using namespace hearsay;

namespace {

// Time that moves only when the test says.
class SetClock final : public Clock {
 public:
  double now() const override { return t; }
  void sleep_for(double s) override { t += s; }
  bool wait_for(std::unique_lock<std::mutex>&, std::condition_variable&, double, const std::function<bool()>& ready) override {
    return ready();
  }
  double t = 0;
};

constexpr uint32_t kSegments = 10;
constexpr size_t kPayload = 1000;

struct Harness {
  SetClock clock;
  std::vector<uint32_t> sent;   // the segment index of every frame handed over, in order
  std::vector<uint32_t> made;   // every index made (encoded)
  bool fail_sends = false;
  int done_calls = 0;
  SendStatus status;
  uint64_t bytes = 0;
  std::shared_ptr<MessageStream> stream;

  explicit Harness(uint64_t window) {
    MessageStream::Options o;
    o.window_bytes = window;
    o.retry_s = 0.5;
    o.resume_timeout_s = 30;
    o.stall_s = 10;
    static const std::vector<uint8_t> payload(kPayload, 7);
    stream = std::make_shared<MessageStream>(
        42, kSegments,
        [this](uint32_t i) {
          made.push_back(i);
          wire::Envelope e;
          e.mutable_update()->set_segment_index(i);
          return make_frame(e, payload.data(), payload.size(), std::shared_ptr<const void>(&payload, [](const void*) {}));
        },
        [this](OutFrame f, SendCallback done) {
          wire::Envelope e;
          REQUIRE(e.ParseFromString(f.head.substr(kFixedHeaderSize)));
          sent.push_back(e.update().segment_index());
          done(fail_sends ? SendStatus{false, "connection lost"} : SendStatus{});
        },
        [this](const SendStatus& s, uint64_t b) {
          ++done_calls;
          status = s;
          bytes = b;
        },
        o, clock);
  }
  static size_t frame_bytes() {
    wire::Envelope e;
    e.mutable_update()->set_segment_index(0);
    static const std::vector<uint8_t> payload(kPayload, 7);
    return make_frame(e, payload.data(), payload.size(), std::shared_ptr<const void>(&payload, [](const void*) {})).size();
  }
};

}  // namespace

TEST_CASE("message stream: at most a window is sent and unacknowledged, each segment made as it goes, and it ends "
          "when the receiver acknowledges the last") {
  const size_t f = Harness::frame_bytes();
  Harness h(3 * f);  // three frames' worth
  h.stream->start();
  CHECK(h.sent == std::vector<uint32_t>{0, 1, 2});
  CHECK(h.made == h.sent);  // nothing is made ahead of the window
  CHECK(h.stream->bytes_in_flight() == 3 * f);
  h.stream->acknowledged(42, 2);
  CHECK(h.sent == std::vector<uint32_t>{0, 1, 2, 3, 4});
  CHECK(h.stream->held_bytes() == 3 * f);  // kept until acknowledged: a window at most
  h.stream->acknowledged(41, 5);            // another update's: nothing
  h.stream->acknowledged(42, 9);            // more than was sent: only what was
  CHECK(h.sent.size() == 8);
  CHECK(h.done_calls == 0);
  h.stream->acknowledged(42, 8);
  h.stream->acknowledged(42, 10);
  CHECK(h.sent.size() == kSegments);
  CHECK(h.done_calls == 1);
  CHECK(h.status.ok);
  CHECK(h.bytes == kSegments * f);
  CHECK(h.stream->held_bytes() == 0);
}

TEST_CASE("message stream: after a failed send it waits for the link, then resends only what the receiver had not "
          "acknowledged, and down past the resume timeout it fails") {
  const size_t f = Harness::frame_bytes();
  Harness h(4 * f);
  h.stream->start();
  h.stream->acknowledged(42, 2);  // 0..5 sent, 0..1 acknowledged
  REQUIRE(h.sent.size() == 6);
  h.fail_sends = true;
  h.stream->acknowledged(42, 3);  // 6 goes out and fails: the link is down
  REQUIRE(h.sent.size() == 7);
  h.fail_sends = false;
  h.clock.t = 0.2;
  h.stream->tick(true);  // too soon
  h.clock.t = 1.0;
  h.stream->tick(false);  // not connected
  CHECK(h.sent.size() == 7);
  h.stream->tick(true);
  // From 3 (the last acknowledgement) again: 3, 4, 5, 6 resent from what was kept, none made again.
  CHECK(std::vector<uint32_t>(h.sent.begin() + 7, h.sent.end()) == std::vector<uint32_t>{3, 4, 5, 6});
  CHECK(h.made == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6});
  h.stream->acknowledged(42, 10 - 0);  // the receiver cannot hold more than was sent
  CHECK(h.done_calls == 0);
  h.stream->acknowledged(42, 7);
  h.stream->acknowledged(42, 10);
  CHECK(h.done_calls == 1);
  CHECK(h.status.ok);
  CHECK(h.bytes == (kSegments + 4) * f);

  Harness down(4 * f);
  down.fail_sends = true;
  down.stream->start();
  down.clock.t = 31;
  down.stream->tick(false);
  CHECK(down.done_calls == 1);
  CHECK_FALSE(down.status.ok);
  CHECK(down.status.error.find("no segment acknowledged for 31 s in the middle of the message (connection lost)") !=
        std::string::npos);
}

TEST_CASE("message stream: with no acknowledgement for the stall time it goes on from the last one, and a receiver that "
          "holds fewer segments than it acknowledged fails it") {
  const size_t f = Harness::frame_bytes();
  Harness h(2 * f);
  h.stream->start();
  h.stream->acknowledged(42, 1);  // 0, 1, 2 sent, then the acknowledgements stop (a cut the transport did not see)
  REQUIRE(h.sent == std::vector<uint32_t>{0, 1, 2});
  h.clock.t = 5;
  h.stream->tick(true);
  CHECK(h.sent.size() == 3);
  h.clock.t = 10.5;
  h.stream->tick(true);
  CHECK(h.sent == std::vector<uint32_t>{0, 1, 2, 1, 2});
  h.stream->acknowledged(42, 0);  // it lost what it had
  CHECK(h.done_calls == 1);
  CHECK_FALSE(h.status.ok);
  CHECK(h.status.error.find("the receiver no longer holds the message (it had acknowledged 1 of 10") != std::string::npos);
}

TEST_CASE("message stream: a link seen down with segments in flight suspends it at once, and it goes on from the last "
          "acknowledgement when the link is back") {
  const size_t f = Harness::frame_bytes();
  Harness h(3 * f);
  h.stream->start();
  h.stream->acknowledged(42, 1);  // 0..3 sent; the transport took them and said nothing of the cut
  REQUIRE(h.sent == std::vector<uint32_t>{0, 1, 2, 3});
  h.stream->tick(false);  // the engine sees the link down
  h.clock.t = 0.6;
  h.stream->tick(true);
  CHECK(h.sent == std::vector<uint32_t>{0, 1, 2, 3, 1, 2, 3});
  h.stream->tick(true);  // up, nothing in flight lost: nothing more
  CHECK(h.sent.size() == 7);
}
