// The TCP plumbing the tcp transport and the fabric bootstrap share: opening a listening
// socket and one attempt to dial an address (dialer.h keeps dialling, with backoff.h).
#pragma once

#include <asio.hpp>
#include <functional>
#include <memory>
#include <string>

#include "hearsay/transport.h"

namespace hearsay {

// Resolves `address` ("host:port", port 0 picks one) and listens there. Returns the
// acceptor and sets `reachable` to the address others should dial. Throws InputError
// naming `who` and the address.
std::unique_ptr<asio::ip::tcp::acceptor> open_acceptor(asio::io_context& io, const std::string& address,
                                                       const std::string& who, std::string* reachable);

// Resolves and connects asynchronously; `done` gets the socket and the remote address,
// or a null socket and what failed ("cannot resolve HOST: ...", "connect to ADDRESS:
// Connection refused") when resolution or connection failed. A host that does not resolve,
// and running out of descriptors, are said on stderr once per distinct error ("WHO:
// cannot resolve HOST: ..."); a refused connection is not (the peer is not up yet).
// Never throws on the I/O thread: every failure ends in `done`.
void async_dial(asio::io_context& io, const std::string& address,
                std::function<void(std::shared_ptr<asio::ip::tcp::socket>, const std::string& remote, const std::string& error)> done,
                const std::string& who = "tcp");

}  // namespace hearsay
