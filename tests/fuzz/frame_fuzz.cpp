// libFuzzer target: arbitrary bytes, cut into arbitrary chunks, through the frame decoder
// and a connection's session, as a hostile peer would send them. Built with clang
// (-fsanitize=fuzzer,address,undefined) when clang is present; ctest runs it for a
// bounded number of inputs. Run longer by hand: build/bin/hearsay-fuzz-frame -max_total_time=600
#include <cstddef>
#include <cstdint>

#include "hearsay/wire.pb.h"
#include "../../src/transport/session.h"
#include "hearsay/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t chunk = 1 + data[0] % 97;
  ++data;
  --size;
  hearsay::TransportOptions options;
  options.peer_id = "fuzz";
  options.cluster_id = "c";
  options.secret = "k";
  hearsay::WireLimits limits;
  limits.max_payload_bytes = 1 << 16;
  hearsay::FrameDecoder decoder(limits);
  bool closed = false;
  hearsay::Session session(options, "fuzz-peer", "",
                           hearsay::Session::Hooks{[](hearsay::OutFrame) {}, [&](const std::string&) { closed = true; },
                                                   [](const std::string&) {}, [](hearsay::InFrame&&) {},
                                                   [](const std::string&) {}});
  session.start();
  for (size_t i = 0; i < size && !closed; i += chunk) {
    const size_t n = size - i < chunk ? size - i : chunk;
    const auto err = decoder.feed(data + i, n, [&](hearsay::InFrame&& f) {
      if (f.envelope->has_update()) hearsay::check_update(f.envelope->update(), f.payload.size(), 1000);
      if (!closed) session.on_frame(std::move(f));
    });
    if (err != hearsay::FrameError::kNone) break;
  }
  return 0;
}
