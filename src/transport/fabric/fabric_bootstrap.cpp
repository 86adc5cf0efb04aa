#include "fabric_bootstrap.h"

#include <array>
#include <cstring>

#include "../address.h"
#include "fabric_connection.h"
#include "fabric_transport_impl.h"

namespace hearsay::fabric {
namespace {

using asio::ip::tcp;

constexpr uint32_t kBootstrapMagic = 0x32595348;  // "HSY2": version 2 (with direct payloads)
constexpr size_t kBootstrapHeadBytes = 20;         // magic, name length, direct_from, stream
constexpr uint32_t kMaxNameBytes = 4096;

}  // namespace

std::string bootstrap_message(const BootstrapInfo& b) {
  std::string m(kBootstrapHeadBytes, '\0');
  const uint32_t magic = kBootstrapMagic, len = static_cast<uint32_t>(b.name.size());
  std::memcpy(m.data(), &magic, 4);
  std::memcpy(m.data() + 4, &len, 4);
  std::memcpy(m.data() + 8, &b.direct_from, 8);
  std::memcpy(m.data() + 16, &b.stream, 4);
  return m + b.name;
}

void read_bootstrap(std::shared_ptr<tcp::socket> sock, std::function<void(BootstrapInfo, std::string)> then) {
  auto head = std::make_shared<std::array<uint8_t, kBootstrapHeadBytes>>();
  asio::async_read(*sock, asio::buffer(*head), [sock, head, then](asio::error_code ec, size_t) {
    if (ec) return then({}, "bootstrap read: " + ec.message());
    uint32_t magic, len;
    BootstrapInfo b;
    std::memcpy(&magic, head->data(), 4);
    std::memcpy(&len, head->data() + 4, 4);
    std::memcpy(&b.direct_from, head->data() + 8, 8);
    std::memcpy(&b.stream, head->data() + 16, 4);
    if (magic != kBootstrapMagic) return then({}, "bad_magic: bootstrap greeting is not hearsay's (or from another version)");
    if (len == 0 || len > kMaxNameBytes) return then({}, "bad_bootstrap: endpoint name of " + std::to_string(len) + " bytes");
    auto info = std::make_shared<BootstrapInfo>(b);
    info->name.resize(len);
    asio::async_read(*sock, asio::buffer(info->name.data(), len), [info, then](asio::error_code ec2, size_t) {
      if (ec2) return then({}, "bootstrap read: " + ec2.message());
      then(*info, "");
    });
  });
}

BootstrapInfo FabricTransport::our_bootstrap() {
  std::lock_guard<std::mutex> lock(mu_);
  return BootstrapInfo{endpoint_.name(), endpoint_.direct_from(), ++last_stream_};
}

// The listener's side: their greeting, our answer, then their ready byte.
void FabricTransport::accept(tcp::acceptor* acceptor) {
  acceptor->async_accept([this, acceptor](asio::error_code ec, tcp::socket s) {
    if (ec) return;
    auto sock = std::make_shared<tcp::socket>(std::move(s));
    asio::error_code ignored;
    const auto ep = sock->remote_endpoint(ignored);
    const std::string remote = join_host_port(ep.address().to_string(), ep.port());
    read_bootstrap(sock, [this, sock, remote](BootstrapInfo theirs, std::string error) {
      if (!error.empty()) {
        links_.rejected("", remote, error);
        asio::error_code e;
        sock->close(e);
        return;
      }
      const fi_addr_t addr = progress_.insert_address(theirs.name, &error);
      if (!error.empty()) {
        links_.rejected("", remote, error);
        return;
      }
      const BootstrapInfo ours = our_bootstrap();
      auto reply = std::make_shared<std::string>(bootstrap_message(ours));
      asio::async_write(*sock, asio::buffer(*reply), [this, sock, reply, addr, remote, ours, theirs](asio::error_code ec2, size_t) {
        if (ec2) return;
        // Our first fabric message must not reach the dialler before it knows our
        // address (it would be dropped as from an unknown source): wait for its word.
        auto ready = std::make_shared<uint8_t>(0);
        asio::async_read(*sock, asio::buffer(ready.get(), 1), [this, sock, ready, addr, remote, ours, theirs](asio::error_code ec3, size_t) {
          if (!ec3 && *ready == kBootstrapReady) return start_connection(sock, addr, remote, "", ours, theirs);
          links_.rejected("", remote, ec3 ? "bootstrap read: " + ec3.message() : "bad_bootstrap: no ready byte after the names");
          progress_.forget_early(addr);
          asio::error_code e;
          sock->close(e);
        });
      });
    });
    accept(acceptor);
  });
}

// The dialler's side, on a socket the dialer connected: our greeting, theirs, our ready
// byte. A failure before the connection starts dials again after the back-off.
void FabricTransport::greet(const Dialer::TargetPtr& target, std::shared_ptr<tcp::socket> sock, const std::string& remote) {
  const BootstrapInfo ours = our_bootstrap();
  auto hello = std::make_shared<std::string>(bootstrap_message(ours));
  asio::async_write(*sock, asio::buffer(*hello), [this, target, sock, hello, remote, ours](asio::error_code ec, size_t) {
    if (ec) return dialer_.retry_later(target);
    read_bootstrap(sock, [this, target, sock, remote, ours](BootstrapInfo theirs, std::string error) {
      if (error.empty()) {
        const fi_addr_t addr = progress_.insert_address(theirs.name, &error);
        if (error.empty()) {
          auto ready = std::make_shared<uint8_t>(kBootstrapReady);
          return asio::async_write(*sock, asio::buffer(ready.get(), 1), [this, target, sock, ready, addr, remote, ours, theirs](asio::error_code ec2, size_t) {
            if (ec2) {
              progress_.forget_early(addr);
              return dialer_.retry_later(target);
            }
            start_connection(sock, addr, remote, target->peer_id, ours, theirs);
          });
        }
      }
      links_.rejected(target->peer_id, remote, error);
      dialer_.retry_later(target);
    });
  });
}

void FabricTransport::start_connection(std::shared_ptr<tcp::socket> sock, fi_addr_t addr, const std::string& remote,
                                       const std::string& dial_peer, const BootstrapInfo& ours, const BootstrapInfo& theirs) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sockets_.insert(sock);
  }
  // Direct payloads only where both sides offered them, from the larger threshold.
  const uint64_t direct_from = ours.direct_from > 0 && theirs.direct_from > 0 ? std::max(ours.direct_from, theirs.direct_from) : 0;
  auto c = std::make_shared<FabricConnection>(*this, addr, sock, remote, dial_peer, direct_from, ours.stream, theirs.stream);
  progress_.run([this, c] { progress_.add(c); });
  // The socket's only job now is to say when the peer goes away.
  auto byte = std::make_shared<uint8_t>();
  asio::async_read(*sock, asio::buffer(byte.get(), 1), [this, c, byte](asio::error_code ec, size_t) {
    const std::string why = ec ? (ec == asio::error::eof ? "connection closed by peer" : "bootstrap: " + ec.message())
                               : "bootstrap: unexpected data";
    // The peer's last messages (a Bye that says why it went) left before its socket
    // closed: take what has arrived before failing the link.
    progress_.run([this, c, why] {
      progress_.drain_completions();
      c->fail(why, false);
    });
  });
}

}  // namespace hearsay::fabric
