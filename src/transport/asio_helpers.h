// The TCP plumbing the tcp transport and the fabric bootstrap share: opening a listening
// socket, dialling an address, and the reconnect back-off.
#pragma once

#include <asio.hpp>
#include <functional>
#include <memory>
#include <random>
#include <string>

#include "hearsay/transport.h"

namespace hearsay {

// Resolves `address` ("host:port", port 0 picks one) and listens there. Returns the
// acceptor and sets `reachable` to the address others should dial. Throws InputError
// naming `who` and the address.
std::unique_ptr<asio::ip::tcp::acceptor> open_acceptor(asio::io_context& io, const std::string& address,
                                                       const std::string& who, std::string* reachable);

// Resolves and connects asynchronously; `done` gets the socket and the remote address,
// or a null socket when resolution or connection failed.
void async_dial(asio::io_context& io, const std::string& address,
                std::function<void(std::shared_ptr<asio::ip::tcp::socket>, const std::string& remote)> done);

// Seconds to wait before the attempt-th reconnect: exponential from reconnect_initial_s,
// capped at reconnect_max_s, jittered into [1/2, 1] of that so peers do not redial in step.
double backoff_delay(const TransportOptions& options, int attempt, std::mt19937_64& rng);

}  // namespace hearsay
