#include "asio_helpers.h"

#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>

#include "address.h"
#include "fork_guard.h"
#include "hearsay/error.h"

namespace hearsay {

using asio::ip::tcp;

namespace {

// Dialling retries forever, so each failure worth a word is said once per distinct error
// and host (again after the host has worked in between).
std::mutex report_mu;
std::map<std::string, std::string> reported;  // GUARDED_BY(report_mu): host -> last error said

void report_once(const std::string& host, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(report_mu);
    std::string& last = reported[host];
    if (last == message) return;
    last = message;
  }
  std::fprintf(stderr, "hearsay: %s; retrying\n", message.c_str());
}

void report_ok(const std::string& host) {
  std::lock_guard<std::mutex> lock(report_mu);
  reported.erase(host);
}

bool out_of_descriptors(const asio::error_code& ec) {
  return ec.category() == asio::system_category() && (ec.value() == EMFILE || ec.value() == ENFILE || ec.value() == ENOBUFS);
}

}  // namespace

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
  keep_listener_from_children(acceptor->native_handle());
  *reachable = join_host_port(host, acceptor->local_endpoint().port());
  return acceptor;
}

void async_dial(asio::io_context& io, const std::string& address,
                std::function<void(std::shared_ptr<tcp::socket>, const std::string&, const std::string&)> done,
                const std::string& who) {
  const auto [host, port] = split_host_port(address);
  auto resolver = std::make_shared<tcp::resolver>(io);
  resolver->async_resolve(host, port, [&io, resolver, done, who, host = host, address](asio::error_code ec,
                                                                                    tcp::resolver::results_type results) {
    if (ec || results.empty()) {
      const std::string why = "cannot resolve " + host + ": " + (ec ? ec.message() : "no addresses");
      report_once(host, who + ": " + why);
      return done(nullptr, "", why);
    }
    auto sock = std::make_shared<tcp::socket>(io);
    asio::async_connect(*sock, results, [sock, done, who, host, address](asio::error_code ec2, const tcp::endpoint& ep) {
      if (ec2) {
        // Refused or unreachable is what a peer that is not up yet looks like; running out
        // of descriptors is this process's trouble and worth saying.
        if (out_of_descriptors(ec2)) report_once(host, who + ": cannot dial " + address + ": " + ec2.message());
        return done(nullptr, "", "connect to " + address + ": " + ec2.message());
      }
      report_ok(host);
      done(sock, join_host_port(ep.address().to_string(), ep.port()), "");
    });
  });
}

}  // namespace hearsay
