// PeerCheck's verdict per link, in process: the peers of --check without the CLI around them.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/preflight.h"
#include "hearsay/transport.h"
#include "test_util.h"

namespace hearsay::test {
namespace {

config::Config two_peer_cluster(const TempDir& dir, const std::string& secret_name) {
  return parse_config(R"(
    cluster {
      id: "preflight-unit"
      secret_file: ")" + dir.file(secret_name) + R"("
      peers { name: "a" address: "127.0.0.1:17471" }
      peers { name: "d" address: "127.0.0.1:17472" }
    }
  )", "preflight_test");
}

}  // namespace

TEST_CASE("preflight: a neighbour that refused this secret and then went away is reported as rejected, not unreachable") {
  TempDir dir;
  write_file(dir.file("ours"), "the-secret-of-the-preflight-unit-test");
  write_file(dir.file("theirs"), "another-secret-of-another-cluster-00");
  const config::Config ours = two_peer_cluster(dir, "ours");
  const config::Config theirs = two_peer_cluster(dir, "theirs");

  // d listens under another secret, refuses a's dials, then its process is gone: a's
  // later redials find nobody at the address.
  auto d = cluster_transport(theirs, 1, false);
  std::atomic<bool> d_refused{false};
  d->set_link_listener([&](const LinkEvent& e) {
    if (e.kind == LinkEvent::Kind::kRejected) d_refused = true;
  });
  listen_as_peer(*d, theirs.cluster(), 1);
  CheckOptions options;
  options.connect_s = kSanitized ? 10.0 : 3.0;  // a TLS handshake under a sanitizer takes seconds
  options.probe_bytes = 0;
  PeerCheck check(ours, "a", options);
  std::thread closer([&] {
    // Closed once it has refused a, with time left before a's deadline for a redial to
    // find nobody there.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.connect_s - 1.0);
    while (!d_refused && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    d->close();
  });
  const CheckReport report = check.run(nullptr);
  closer.join();
  REQUIRE(d_refused);
  REQUIRE(report.links.size() == 1);
  const LinkCheck& link = report.links[0];
  INFO(link.failure);
  CHECK_FALSE(link.ok);
  CHECK(link.failure.rfind("rejected: admission: ", 0) == 0);
  CHECK(report.text().find("1 of 1 links failed") != std::string::npos);
}

}  // namespace hearsay::test
