#include "asio_helpers.h"

#include "address.h"
#include "hearsay/error.h"

namespace hearsay {

using asio::ip::tcp;

std::unique_ptr<tcp::acceptor> open_acceptor(asio::io_context& io, const std::string& address, const std::string& who,
                                             std::string* reachable) {
  const auto [host, port] = split_host_port(address);
  tcp::resolver resolver(io);
  asio::error_code ec;
  const auto results = resolver.resolve(host, port, tcp::resolver::passive, ec);
  if (ec || results.empty()) throw InputError(who + ": cannot resolve listen address '" + address + "': " + ec.message());
  const tcp::endpoint ep = *results.begin();
  auto acceptor = std::make_unique<tcp::acceptor>(io);
  acceptor->open(ep.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor->bind(ep, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw InputError(who + ": cannot listen on '" + address + "': " + ec.message());
  *reachable = join_host_port(host, acceptor->local_endpoint().port());
  return acceptor;
}

void async_dial(asio::io_context& io, const std::string& address,
                std::function<void(std::shared_ptr<tcp::socket>, const std::string&)> done) {
  const auto [host, port] = split_host_port(address);
  auto resolver = std::make_shared<tcp::resolver>(io);
  resolver->async_resolve(host, port, [&io, resolver, done](asio::error_code ec, tcp::resolver::results_type results) {
    if (ec) return done(nullptr, "");
    auto sock = std::make_shared<tcp::socket>(io);
    asio::async_connect(*sock, results, [sock, done](asio::error_code ec2, const tcp::endpoint& ep) {
      if (ec2) return done(nullptr, "");
      done(sock, join_host_port(ep.address().to_string(), ep.port()));
    });
  });
}

}  // namespace hearsay
