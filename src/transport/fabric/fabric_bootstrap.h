// How two fabric peers meet: a small TCP exchange at the listen address. The dialler sends
// its greeting (magic, endpoint name, what it offers for direct payloads), the listener
// answers with its own, both insert the other's endpoint name into their address vector,
// and the dialler says it is ready (the listener's first fabric message must not arrive
// before the dialler knows its address). The socket then stays open as the link's
// liveness signal. The exchanges themselves are FabricTransport's (fabric_bootstrap.cpp);
// this is the greeting.
#pragma once

#include <asio.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace hearsay::fabric {

// The dialler's last bootstrap byte: it knows the listener's address now.
inline constexpr uint8_t kBootstrapReady = 1;

// What each side says of itself in the bootstrap.
struct BootstrapInfo {
  std::string name;          // libfabric endpoint name
  uint64_t direct_from = 0;  // smallest payload it sends and receives direct; 0: never
  uint32_t stream = 0;       // the tag prefix it wants on the direct payloads sent to it
};

std::string bootstrap_message(const BootstrapInfo& b);

// Reads the other side's greeting; calls back with it, or with the error (a reason for
// LinkTable::rejected). On the socket's I/O thread; never throws.
void read_bootstrap(std::shared_ptr<asio::ip::tcp::socket> sock, std::function<void(BootstrapInfo, std::string)> then);

}  // namespace hearsay::fabric
