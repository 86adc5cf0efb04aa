// The fabric transport's life cycle: set-up on the first listen() or connect(), the
// dialled peers, what a connection's coming and going changes, close(), and registration.
#include "fabric_transport.h"

#include <future>
#include <map>
#include <sstream>

#include "../address.h"
#include "../asio_helpers.h"
#include "fabric_connection.h"
#include "fabric_transport_impl.h"
#include "hearsay/process.h"
#include "hearsay/error.h"

namespace hearsay {
namespace fabric {

using asio::ip::tcp;

FabricTransport::FabricTransport(const TransportOptions& o)
    : LinkTableTransport("fabric(" + o.fabric_provider + ")"), options_(o), work_(asio::make_work_guard(io_)),
      progress_(endpoint_, options_, links_),
      dialer_(io_, options_, links_, [this](const Dialer::TargetPtr& target, std::shared_ptr<tcp::socket> sock, const std::string& remote) {
        greet(target, std::move(sock), remote);
      }) {
  if (options_.secret.empty()) throw InputError("fabric transport: the cluster secret is empty");
  if (options_.peer_id.empty()) throw InputError("fabric transport: peer id is empty");
}

void FabricTransport::open_endpoint(const std::string& host) {
  std::lock_guard<std::mutex> lock(open_mu_);
  if (endpoint_.is_open()) return;
  endpoint_.open(options_, host);
  progress_.start();
  io_thread_ = std::thread([this] { run_thread("the fabric transport's bootstrap thread", [this] { io_.run(); }); });
}

std::string FabricTransport::listen(const std::string& address) {
  const auto [host, port] = split_host_port(address);
  open_endpoint(host);
  std::string reachable;
  auto acceptor = open_acceptor(io_, address, "fabric (bootstrap)", &reachable);
  std::lock_guard<std::mutex> lock(mu_);
  acceptors_.push_back(std::move(acceptor));
  accept(acceptors_.back().get());
  return reachable;
}

void FabricTransport::connect(const std::string& peer_id, const std::string& address) {
  const auto [host, port] = split_host_port(address);
  open_endpoint(host == "localhost" ? "127.0.0.1" : host);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
  }
  dialer_.add(peer_id, address);
}

void FabricTransport::close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  dialer_.stop();
  // Byes go out through the progress thread; wait until they are queued, then a
  // moment for them to leave.
  if (progress_.running()) {
    auto queued = std::make_shared<std::promise<void>>();
    progress_.run([this, queued] {
      for (auto& c : progress_.connections()) c->close_now("transport closed");
      queued->set_value();
    });
    queued->get_future().wait_for(std::chrono::seconds(1));
    const auto deadline = Clock::now() + std::chrono::milliseconds(300);
    while (Clock::now() < deadline && !progress_.idle()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    progress_.stop();
  }
  asio::post(io_, [this] {
    asio::error_code ec;
    for (auto& a : acceptors_) a->close(ec);
  });
  work_.reset();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  progress_.fail_all("transport closed");
  // With the I/O thread gone the bootstrap sockets can be closed here; their close is
  // what tells the other side we are gone.
  for (auto& sock : sockets_) {
    asio::error_code ec;
    sock->close(ec);
  }
  sockets_.clear();
  endpoint_.close();
}

void FabricTransport::connection_admitted(const std::string& peer) { dialer_.reset_backoff(peer); }

void FabricTransport::connection_closed(const std::shared_ptr<FabricConnection>& c) {
  progress_.remove(*c);
  auto sock = c->bootstrap();
  {
    std::lock_guard<std::mutex> lock(mu_);
    sockets_.erase(sock);
  }
  asio::post(io_, [sock] {
    asio::error_code ec;
    sock->close(ec);
  });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
  }
  if (!c->dial_peer().empty() && !c->displaced()) asio::post(io_, [this, peer = c->dial_peer()] { dialer_.redial(peer); });
}

MemoryRegistration FabricTransport::register_memory(void* data, size_t bytes, MemoryKind memory) {
  if (memory == MemoryKind::kDevice) {
    throw InputError(kind() + ": cannot register device memory (" + std::to_string(bytes) +
                     " bytes): the endpoint is opened without FI_HMEM");
  }
  bool needed = false;
  uint64_t mr_mode = 0;
  fid_mr* mr = nullptr;
  void* desc = nullptr;
  std::string error;
  // On the progress thread: the domain is used by one thread at a time.
  const bool ran = progress_.call([&] {
    mr_mode = endpoint_.mr_mode();
    needed = endpoint_.needs_local_mr();
    if (needed) mr = endpoint_.register_memory(data, bytes, &error);
    if (mr != nullptr) desc = fi_mr_desc(mr);
  });
  if (!ran) throw InputError(kind() + ": memory can be registered only between listen() or connect() and close()");
  std::ostringstream mode;
  mode << "mr_mode 0x" << std::hex << mr_mode;
  if (!needed) {
    return MemoryRegistration(data, bytes, memory, kind() + ": no registration (the provider's domain does not ask for local registration: " +
                                                       mode.str() + ", no FI_MR_LOCAL)");
  }
  if (mr == nullptr) throw InputError(kind() + ": cannot register " + std::to_string(bytes) + " bytes: " + error);
  return MemoryRegistration(data, bytes, memory, kind() + ": registered with fi_mr_reg (the provider's domain asks for FI_MR_LOCAL: " + mode.str() + ")",
                            desc, [this, mr] {
                              // Once the progress thread has stopped, no one else uses the domain.
                              if (!progress_.call([&] { endpoint_.deregister(mr); })) endpoint_.deregister(mr);
                            });
}

}  // namespace fabric

std::unique_ptr<Transport> create_fabric_transport(const TransportOptions& options) {
  return std::make_unique<fabric::FabricTransport>(options);
}

}  // namespace hearsay
