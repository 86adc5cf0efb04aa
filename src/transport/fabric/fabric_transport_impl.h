// The fabric transport itself (see fabric_transport.h for how it works): it owns the
// endpoint, the progress thread, the Asio thread with the bootstrap's listeners, dialler
// and sockets, and the link table; its connections call back into it. fabric_transport.cpp
// holds its life cycle, fabric_bootstrap.cpp how its peers meet.
#pragma once

#include <asio.hpp>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../dialer.h"
#include "../link_table.h"
#include "fabric_bootstrap.h"
#include "fabric_endpoint.h"
#include "fabric_progress.h"

namespace hearsay::fabric {

class FabricTransport final : public LinkTableTransport {
 public:
  // Throws InputError for an empty secret or peer id; opens nothing yet.
  explicit FabricTransport(const TransportOptions& o);
  ~FabricTransport() override { close(); }

  std::string kind() const override { return "fabric(" + options_.fabric_provider + ")"; }
  // Same-host shared memory: a payload arrives exactly as it left (and an admitted peer
  // is on this host), so the CRC32C would only cost two passes over every byte.
  bool omits_crc() const override { return options_.fabric_provider == "shm"; }

  std::string listen(const std::string& address) override;
  void connect(const std::string& peer_id, const std::string& address) override;
  void close() override;
  // Registers with fi_mr_reg where the provider's domain asks for local registration
  // (FI_MR_LOCAL in its mr_mode), else says it needs none. Needs the endpoint: call after
  // listen() or connect() (InputError before, and after close()).
  MemoryRegistration register_memory(void* data, size_t bytes, MemoryKind kind) override;

  // --- used by FabricConnection --------------------------------------------------------
  const TransportOptions& options() const { return options_; }
  FabricProgress& progress() { return progress_; }
  void connection_admitted(const std::string& peer);
  void connection_closed(const std::shared_ptr<FabricConnection>& c);  // progress thread

 private:
  // Opens the endpoint once and starts the threads.
  void open_endpoint(const std::string& host);

  // --- bootstrap (fabric_bootstrap.cpp), on the Asio thread ------------------------------
  // Our side of a new bootstrap: the endpoint name, whether we do direct payloads, and
  // a stream number for the direct payloads sent to us on this link.
  BootstrapInfo our_bootstrap();
  void accept(asio::ip::tcp::acceptor* acceptor);
  void greet(const Dialer::TargetPtr& target, std::shared_ptr<asio::ip::tcp::socket> sock, const std::string& remote);
  void start_connection(std::shared_ptr<asio::ip::tcp::socket> sock, fi_addr_t addr, const std::string& remote,
                        const std::string& dial_peer, const BootstrapInfo& ours, const BootstrapInfo& theirs);

  TransportOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread io_thread_;
  std::mutex open_mu_;  // serializes open_endpoint
  // libfabric objects: opened once, then used only by the progress thread.
  FabricEndpoint endpoint_;
  FabricProgress progress_;
  Dialer dialer_;

  std::mutex mu_;
  bool closing_ = false;                                              // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<asio::ip::tcp::acceptor>> acceptors_;  // GUARDED_BY(mu_)
  std::set<std::shared_ptr<asio::ip::tcp::socket>> sockets_;         // GUARDED_BY(mu_)
  uint32_t last_stream_ = 0;                                          // GUARDED_BY(mu_)
};

}  // namespace hearsay::fabric
