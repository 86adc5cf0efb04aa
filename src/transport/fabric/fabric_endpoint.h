// One libfabric reliable-datagram endpoint and what its provider allows: the fabric,
// domain, completion queue, address vector and endpoint, opened once; the receive buffers,
// reposted after each message; where the provider needs local registration (FI_MR_LOCAL),
// the registered buffers that sends are staged through; and the operations the provider
// holds until they complete.
//
// Threads: open() and close() are called by the transport while its progress thread is not
// running; everything else runs on the progress thread only (the domain is opened
// FI_THREAD_DOMAIN: one thread at a time uses it).
//
// On shm, close() may leave the libfabric objects open, idle, until every other shm
// endpoint of this process has closed too: see LocalShmEndpoints in fabric_endpoint.cpp.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "hearsay/transport.h"
#include "scratch_space.h"

namespace hearsay::fabric {

class FabricConnection;
class LocalShmEndpoints;
struct FrameInFlight;

using Clock = std::chrono::steady_clock;

// "CALL: text (code)" for a libfabric return code.
std::string fi_error(const char* call, int ret);

// The tag of a direct payload: the receiver's stream for this link, then the sender's count.
inline uint64_t direct_tag(uint32_t stream, uint32_t seq) { return (uint64_t{stream} << 32) | seq; }

// Every posted operation carries one of these; fi_context must come first (FI_CONTEXT).
struct Op {
  fi_context ctx;
  enum Kind { kRecv, kSend, kDirectRecv, kDiscard } kind;
  int buffer = -1;  // receive or staging buffer index
  std::shared_ptr<FrameInFlight> frame;
  std::shared_ptr<FabricConnection> conn;  // kDirectRecv: owns the memory received into
  uint32_t stream = 0;      // kDiscard: the closed link's stream
  Clock::time_point until;  // kDiscard: when to stop
  bool cancelled = false;   // kDiscard: a cancel was asked for
  ScratchSpace scratch;     // kDiscard: where discarded payloads land
};

class FabricEndpoint {
 public:
  FabricEndpoint() = default;
  FabricEndpoint(const FabricEndpoint&) = delete;
  FabricEndpoint& operator=(const FabricEndpoint&) = delete;
  ~FabricEndpoint() { close(); }

  // Opens everything for options.fabric_provider, bound to `host` for IP providers, and
  // posts the receives. Throws InputError naming the provider and the call that failed.
  void open(const TransportOptions& options, const std::string& host);
  bool is_open() const { return ep_ != nullptr; }
  // Closes the endpoint (with it, what is still posted), then the memory and the rest; on
  // shm, once no other shm endpoint of this process is open (until then they stay, idle).
  // Either way this object is closed on return and lets go of every connection.
  void close();

  const std::string& name() const { return name_; }  // for the other side's address vector
  size_t chunk() const { return chunk_; }           // the largest message we send
  // Whether the provider needs the memory of every send and receive registered.
  bool needs_local_mr() const { return need_local_mr_; }
  uint64_t mr_mode() const { return mr_mode_; }
  // The smallest payload we offer to send and receive direct; 0: never.
  uint64_t direct_from() const { return direct_from_; }

  // --- progress thread -----------------------------------------------------------------
  // Reposts receive buffer i (a broken invariant if the provider refuses).
  void post_recv(int i);
  const uint8_t* received(int i) const { return recv_[i].data.data(); }
  // Posts op's send of len bytes at src to dest, tagged with `tag` when `tagged`, staged
  // through a registered buffer when the provider needs local registration. 0 (op is then
  // posted), -FI_EAGAIN when the provider's queue or the staging buffers are full, or the
  // provider's error.
  ssize_t post_send(Op* op, const uint8_t* src, size_t len, fi_addr_t dest, bool tagged, uint64_t tag);
  // A completed send gives its staging buffer back.
  void release_staging(const Op* op);
  // Posts op's receive of len bytes at dst for a tag (bits in `ignore` match anything),
  // driving progress while the provider's queue is full; 0 (op is then posted) or the error.
  int post_tagged_recv(Op* op, void* dst, size_t len, uint64_t tag, uint64_t ignore);
  // Asks the provider to cancel a posted receive; it completes with FI_ECANCELED, or stays
  // posted until close() where the provider cannot cancel it.
  void cancel(Op* op);
  // The sends and tagged receives the provider holds (posted, not yet completed).
  std::set<Op*>& posted() { return posted_; }
  ssize_t read_completions(fi_cq_data_entry* entries, size_t count, fi_addr_t* sources);
  // After read_completions returned -FI_EAVAIL: the failed operation and why, or nullptr.
  Op* read_error(std::string* text);
  // 1 and the address, or the provider's error.
  int insert_address(const std::string& name, fi_addr_t* addr);

  // --- memory registration (progress thread, or any once it has stopped) ----------------
  // Registers caller memory for sends and receives; the provider's handle, or nullptr and
  // the error.
  fid_mr* register_memory(void* data, size_t bytes, std::string* error);
  // Deregisters what register_memory returned; nothing once close() has (it closes those
  // still open before the domain).
  void deregister(fid_mr* mr);

 private:
  struct Buffer {
    std::vector<uint8_t> data;
    fid_mr* mr = nullptr;
    Op op;
  };
  // What close() takes from this object for libfabric to release (fabric_endpoint.cpp).
  struct Remains;
  friend class LocalShmEndpoints;
  // Posts with `post`, driving progress while the provider's queue is full; 0 or the error.
  template <class Post>
  int post_when_taken(Post post);

  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::string name_;
  size_t chunk_ = 0;
  bool need_local_mr_ = false;
  uint64_t mr_mode_ = 0;
  uint64_t direct_from_ = 0;
  std::vector<Buffer> recv_, staging_;
  std::vector<int> free_staging_;
  std::set<Op*> posted_;
  std::mutex caller_mr_mu_;               // deregister() may race close() on the closing thread
  std::set<fid_mr*> caller_mrs_;          // GUARDED_BY(caller_mr_mu_)
  bool local_shm_ = false;                // counted among this process's open shm endpoints
};

}  // namespace hearsay::fabric
