// The tcp transport: Asio, a few I/O threads, one strand per connection, scatter-gather
// writes of (head, payload) without copying the payload, TCP_NODELAY and keepalive,
// reconnects with exponential back-off and jitter, IPv4, IPv6 and host names.
#pragma once

#include <memory>

#include "hearsay/transport.h"

namespace hearsay {

std::unique_ptr<Transport> create_tcp_transport(const TransportOptions& options);

}  // namespace hearsay
