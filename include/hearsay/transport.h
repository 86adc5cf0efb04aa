// Transports move frames (include/hearsay/wire.h) between peers named by id. One
// interface, one folder per implementation: tcp (Asio, the default), fabric (libfabric
// RDM endpoints), inproc (in-process queues, for tests and one-process clusters); and
// decorators with the same interface: link emulation (emulated.h).
//
// Every connection starts with the admission handshake (docs/WIRE.md): nothing from a
// connection reaches the receiver before the other side has proven knowledge of the
// cluster secret. Hello, Heartbeat and Bye frames are handled inside the transport;
// Update and Credit frames are delivered.
//
// Threads: a transport runs its own threads. The receiver and link callbacks run on them
// and must not block. send() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/wire.h"

namespace hearsay {

// The admission protocol's version (docs/WIRE.md); 2: proofs over the whole transcript.
inline constexpr uint32_t kProtocolVersion = 2;

struct TransportOptions {
  std::string peer_id;
  std::string site;
  std::string cluster_id = "hearsay";
  // The cluster secret itself (loaded by the caller from a file or an environment
  // variable, never from the command line). Must not be empty.
  std::string secret;
  // The names that may be admitted (the cluster's peers). Empty: any name but our own.
  std::vector<std::string> cluster_peers;
  WireLimits limits;
  int io_threads = 1;
  double handshake_timeout_s = 5.0;
  double heartbeat_interval_s = 1.0;  // 0: no heartbeats
  // An admitted neighbour silent this long (no frame, not even a heartbeat) is dropped;
  // it comes back when it reconnects. 0: never.
  double liveness_timeout_s = 10.0;
  double reconnect_initial_s = 0.05;  // back-off doubles from here, with jitter...
  double reconnect_max_s = 2.0;       // ...up to here
  std::string fabric_provider = "tcp;ofi_rxm";
  // tcp: TLS 1.3 on every connection, keyed by a pre-shared key derived from the secret
  // and cluster_id (docs/WIRE.md, "Trust"); admission then runs inside it. false: plain
  // TCP, for networks the operator trusts. Every peer of a cluster must agree.
  bool tls = true;
  // tcp with TLS: per-site certificates instead of the pre-shared key; PEM files, all
  // three or none. The peer's certificate must verify against the CA, and the name it
  // claims in admission must be the certificate's CN or a DNS SAN.
  std::string tls_cert_file, tls_key_file, tls_ca_file;
  // tcp: accepted connections not yet admitted, at most; more are closed at once and
  // counted as rejected ("admission: too many unadmitted connections").
  int max_unadmitted = 64;
};

struct SendStatus {
  bool ok = true;
  std::string error;
};
using SendCallback = std::function<void(const SendStatus&)>;

struct LinkStats {
  bool connected = false;
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t frames_sent = 0, frames_received = 0;
  uint64_t queue_depth = 0;  // frames accepted by send() and not yet on the wire
  uint64_t queue_bytes = 0;
  double rtt_s = -1;         // smoothed heartbeat round trip; < 0 while unknown
};

// What a transport refused, by reason (frame_error_name, or "admission: ...").
struct TransportCounters {
  std::map<std::string, uint64_t> rejected;
  uint64_t connections_admitted = 0;
  // Admitted connections that took over a name from an older live connection.
  uint64_t connections_replaced = 0;
};

struct LinkEvent {
  // kUnreachable: a dial that reached no one (the reason says why: a name that does not
  // resolve, a refused or timed-out connect); told once per distinct reason until the
  // peer is admitted again.
  enum class Kind { kUp, kDown, kRejected, kUnreachable };
  Kind kind;
  // Empty when an accepted connection is rejected before the peer named itself; for a
  // connection this side dialled, the peer it dialled.
  std::string peer_id;
  std::string remote_address;
  std::string reason;
};

// Where a buffer lives: host memory, or a GPU's (a device pointer).
enum class MemoryKind { kHost, kDevice };

// A buffer made known to a transport for zero-copy I/O: RDMA providers may need the memory
// registered with the NIC (libfabric's FI_MR_LOCAL), and a NIC reads GPU memory only once
// it is registered. Move-only; destroying it, or release(), deregisters. It must not
// outlive the transport that made it, nor be released while that transport closes.
class MemoryRegistration {
 public:
  MemoryRegistration() = default;
  // `note` says how the transport handled the memory (for logs and tests); `descriptor`
  // is the provider's local descriptor; `release` undoes the registration, and is empty
  // when the transport registered nothing.
  MemoryRegistration(void* data, size_t bytes, MemoryKind kind, std::string note, void* descriptor = nullptr,
                     std::function<void()> release = nullptr)
      : data_(data), bytes_(bytes), kind_(kind), note_(std::move(note)), descriptor_(descriptor),
        release_(std::move(release)) {}
  MemoryRegistration(MemoryRegistration&& o) noexcept { *this = std::move(o); }
  MemoryRegistration& operator=(MemoryRegistration&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      kind_ = o.kind_;
      note_ = std::move(o.note_);
      descriptor_ = std::exchange(o.descriptor_, nullptr);
      release_ = std::exchange(o.release_, nullptr);
    }
    return *this;
  }
  MemoryRegistration(const MemoryRegistration&) = delete;
  MemoryRegistration& operator=(const MemoryRegistration&) = delete;
  ~MemoryRegistration() { release(); }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  MemoryKind kind() const { return kind_; }
  // true: the transport registered the memory with its provider, until release(). false:
  // it needs no registration and uses the memory as it is.
  bool registered() const { return static_cast<bool>(release_); }
  // The provider's local descriptor for sends and receives from this memory (fi_mr_desc);
  // null when nothing is registered.
  void* descriptor() const { return descriptor_; }
  // "fabric(verbs): registered with fi_mr_reg (...)", "tcp: no registration (...)".
  const std::string& note() const { return note_; }
  // Deregisters now; idempotent.
  void release() {
    descriptor_ = nullptr;
    if (auto undo = std::exchange(release_, nullptr)) undo();
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  MemoryKind kind_ = MemoryKind::kHost;
  std::string note_;
  void* descriptor_ = nullptr;
  std::function<void()> release_;
};

class Transport {
 public:
  using Receiver = std::function<void(const std::string& from_peer, InFrame&& frame)>;
  using LinkListener = std::function<void(const LinkEvent& event)>;

  virtual ~Transport() = default;
  // "tcp", "fabric(shm)", "inproc", "emulated(tcp)".
  virtual std::string kind() const = 0;

  // Set both before listen() or connect(). Frames that arrive while no receiver is set
  // are held (up to 1024 frames, 64 MiB) and handed to the next receiver set, in order.
  // When it returns, no call of the receiver it replaced is still running (except on the
  // calling thread itself): its owner may then be destroyed.
  virtual void set_receiver(Receiver receiver) = 0;
  virtual void set_link_listener(LinkListener listener) = 0;

  // Accepts connections at `address` ("host:port"; port 0 picks one). Returns the address
  // others should connect to. Throws InputError if it cannot listen there.
  virtual std::string listen(const std::string& address) = 0;
  // Keeps a connection to `peer_id` at `address`, reconnecting with exponential back-off
  // and jitter whenever it drops, until close().
  virtual void connect(const std::string& peer_id, const std::string& address) = 0;
  // Queues a frame for `peer_id`. `done` runs exactly once: ok when the frame was handed
  // to the wire, or an error (not connected, connection lost, closed). Never blocks.
  virtual void send(const std::string& peer_id, OutFrame frame, SendCallback done) = 0;

  virtual LinkStats link_stats(const std::string& peer_id) const = 0;
  virtual std::vector<std::string> connected_peers() const = 0;
  virtual TransportCounters counters() const = 0;
  // Registers `bytes` at `data` for this transport's sends and receives, for as long as
  // the returned handle lives. A transport that needs no registration says so in the
  // handle (registered() false); this default is that, for host memory. Throws InputError
  // for memory this transport cannot use (device memory, on every transport built today)
  // or that its provider refuses. Any thread; register once and reuse, not per send.
  virtual MemoryRegistration register_memory(void* data, size_t bytes, MemoryKind kind);
  // Says Bye to every peer, stops the threads, fails what is still queued. Idempotent.
  virtual void close() = 0;
};

// Creates a transport by kind: "tcp", "inproc", "fabric" (provider from options).
// Throws InputError for an unknown or unavailable kind, or bad options.
std::unique_ptr<Transport> create_transport(const std::string& kind, const TransportOptions& options);
// Kinds this build offers.
std::vector<std::string> available_transports();

}  // namespace hearsay
