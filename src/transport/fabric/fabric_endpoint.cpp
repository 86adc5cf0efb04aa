#include "fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "fabric_connection.h"
#include "libfabric.h"
#include "hearsay/error.h"

namespace hearsay::fabric {
namespace {

constexpr size_t kChunkBytes = 256 * 1024;  // largest fabric message we send
constexpr size_t kRxmEagerBytes = 16000;
constexpr int kRecvBuffers = 32;
constexpr int kStagingBuffers = 32;
// Payloads of at least this size travel as one tagged message received straight into
// the frame; smaller ones are cheaper through the reposted receive buffers.
constexpr uint64_t kDirectPayloadBytes = 32 * 1024;

}  // namespace

std::string fi_error(const char* call, int ret) {
  return std::string(call) + ": " + libfabric().strerror(-ret) + " (" + std::to_string(ret) + ")";
}

// What an endpoint held for libfabric, taken from it by close() and released in the order
// libfabric needs.
struct FabricEndpoint::Remains {
  fi_info* info = nullptr;
  fid_fabric* fabric = nullptr;
  fid_domain* domain = nullptr;
  fid_cq* cq = nullptr;
  fid_av* av = nullptr;
  fid_ep* ep = nullptr;
  std::vector<Buffer> recv, staging;  // the posted receives' contexts; registrations
  std::set<fid_mr*> caller_mrs;
  // The sends and tagged receives still posted: their contexts, and the frames of the sends,
  // whose memory a peer may still copy from (shm's receiver copies out of the sender).
  std::set<Op*> posted;

  ~Remains() { release(); }
  void release();
};

void FabricEndpoint::Remains::release() {
  // Receives still posted go with the endpoint; then their memory can go.
  if (ep != nullptr) fi_close(&ep->fid);
  ep = nullptr;
  for (Op* op : posted) delete op;
  posted.clear();
  for (auto& b : recv) {
    if (b.mr != nullptr) fi_close(&b.mr->fid);
  }
  for (auto& b : staging) {
    if (b.mr != nullptr) fi_close(&b.mr->fid);
  }
  recv.clear();
  staging.clear();
  // A domain with registrations open would refuse to close (FI_EBUSY).
  for (fid_mr* mr : caller_mrs) fi_close(&mr->fid);
  caller_mrs.clear();
  if (av != nullptr) fi_close(&av->fid);
  if (cq != nullptr) fi_close(&cq->fid);
  if (domain != nullptr) fi_close(&domain->fid);
  if (fabric != nullptr) fi_close(&fabric->fid);
  if (info != nullptr) libfabric().freeinfo(info);
  av = nullptr;
  cq = nullptr;
  domain = nullptr;
  fabric = nullptr;
  info = nullptr;
}

// libfabric's shm provider reaches a peer endpoint of this same process through that
// endpoint's own mapping of its region: smr_map_to_region finds the peer's name in the
// process's list of shm endpoints (ep_name_list) and takes the region pointer from there
// instead of mapping the region again. Closing an endpoint unmaps its region (smr_ep_close,
// smr_free) while the other endpoints here may still use it: a send posted to it takes the
// region's lock, and progress takes it for every response to a send it had taken
// (smr_progress_resp_entry: pthread_spin_trylock(&peer_smr->lock)). On the unmapped page
// that is a crash (libfabric 1.17, in both places, in our tests: both peers of a link in
// one process; the fault was at the lock word, offset 0x18, of the region just unlinked).
// A peer in another process keeps its own mapping and is safe.
// Nothing in libfabric's API lets the other endpoints drop the region first (fi_av_remove
// writes into the peer's region too, and a send's pending response cannot be cancelled), so
// a closed shm endpoint of ours stays open, idle (no progress; its peers' sends land in its
// region and are never taken, as with a peer process that has gone), until no other shm
// endpoint of this process is open; the last one to close releases them all. One transport
// per process, the usual case, never waits.
class LocalShmEndpoints {
 public:
  static LocalShmEndpoints& get() {
    // Never destroyed: a transport may still close during static destruction.
    static auto* endpoints = new LocalShmEndpoints;
    return *endpoints;
  }
  // Before the endpoint's region exists.
  void opened() {
    std::lock_guard<std::mutex> lock(mu_);
    ++open_;
  }
  // Keeps what a closed endpoint leaves while another shm endpoint here is open; else
  // releases it and everything kept before (no shm progress runs anywhere here then).
  void closed(std::unique_ptr<FabricEndpoint::Remains> remains) {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back(std::move(remains));
    if (--open_ > 0) return;
    for (auto& k : kept_) k->release();
    kept_.clear();
  }

 private:
  std::mutex mu_;
  int open_ = 0;                                                // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<FabricEndpoint::Remains>> kept_;  // GUARDED_BY(mu_)
};

void FabricEndpoint::open(const TransportOptions& options, const std::string& host) {
  const std::string& provider = options.fabric_provider;
  // For IP providers, bind to the listen host (loopback in tests); shm needs no node.
  const bool ip = provider.find("tcp") != std::string::npos || provider.find("verbs") != std::string::npos;
  auto get_info = [&](uint64_t caps) {
    fi_info* hints = libfabric().dupinfo(nullptr);  // fi_allocinfo()
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = caps;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(provider.c_str());
    const int r = libfabric().getinfo(FI_VERSION(1, 9), ip ? host.c_str() : nullptr, nullptr, ip ? FI_SOURCE : 0, hints, &info_);
    libfabric().freeinfo(hints);
    return r;
  };
  // Tagged messages carry direct payloads; a provider without them still works. (Not
  // FI_DIRECTED_RECV: with it, libfabric 1.17's shm reports no source address for
  // untagged messages.)
  int ret = get_info(FI_MSG | FI_TAGGED | FI_SOURCE);
  if (ret != 0) ret = get_info(FI_MSG | FI_SOURCE);
  if (ret != 0) {
    throw InputError("fabric: provider '" + provider + "' offers no reliable-datagram endpoint here (" +
                     fi_error("fi_getinfo", ret) + "); see fi_info");
  }
  auto check = [&](const char* call, int r) {
    if (r != 0) throw InputError("fabric(" + provider + "): " + fi_error(call, r));
  };
  const char* prov_name = info_->fabric_attr->prov_name;
  if (prov_name != nullptr && std::strcmp(prov_name, "shm") == 0) {
    local_shm_ = true;
    LocalShmEndpoints::get().opened();
  }
  check("fi_fabric", libfabric().fabric(info_->fabric_attr, &fabric_, nullptr));
  check("fi_domain", fi_domain(fabric_, info_, &domain_, nullptr));
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_DATA;
  cq_attr.size = 1024;
  cq_attr.wait_obj = FI_WAIT_NONE;
  check("fi_cq_open", fi_cq_open(domain_, &cq_attr, &cq_, nullptr));
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  check("fi_av_open", fi_av_open(domain_, &av_attr, &av_, nullptr));
  check("fi_endpoint", fi_endpoint(domain_, info_, &ep_, nullptr));
  check("fi_ep_bind(av)", fi_ep_bind(ep_, &av_->fid, 0));
  check("fi_ep_bind(cq)", fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV));
  check("fi_enable", fi_enable(ep_));
  name_.resize(256);
  size_t len = name_.size();
  check("fi_getname", fi_getname(&ep_->fid, name_.data(), &len));
  name_.resize(len);
  chunk_ = std::min<size_t>(kChunkBytes, info_->ep_attr->max_msg_size);
  // ofi_rxm's rendezvous path for large messages stalls under streaming load here
  // (libfabric 1.17); keep every message within its eager buffer (16 KiB by default).
  if (provider.find("ofi_rxm") != std::string::npos) chunk_ = std::min<size_t>(chunk_, kRxmEagerBytes);
  mr_mode_ = info_->domain_attr->mr_mode;
  need_local_mr_ = (mr_mode_ & FI_MR_LOCAL) != 0;
  // A payload goes direct when any payload fits one message, the memory it lands in
  // needs no registration, and the provider is not ofi_rxm (its large-message path
  // stalls, above).
  const bool direct = (info_->caps & FI_TAGGED) != 0 && !need_local_mr_ &&
                      info_->ep_attr->max_msg_size >= options.limits.max_payload_bytes &&
                      provider.find("ofi_rxm") == std::string::npos;
  direct_from_ = direct ? kDirectPayloadBytes : 0;

  // Receive buffers: registered once, reposted after each message.
  recv_.resize(kRecvBuffers);
  for (int i = 0; i < kRecvBuffers; ++i) {
    recv_[i].data.resize(chunk_);
    if (need_local_mr_) check("fi_mr_reg", fi_mr_reg(domain_, recv_[i].data.data(), chunk_, FI_RECV, 0, 0, 0, &recv_[i].mr, nullptr));
    post_recv(i);
  }
  if (need_local_mr_) {
    staging_.resize(kStagingBuffers);
    for (int i = 0; i < kStagingBuffers; ++i) {
      staging_[i].data.resize(chunk_);
      check("fi_mr_reg", fi_mr_reg(domain_, staging_[i].data.data(), chunk_, FI_SEND, 0, 0, 0, &staging_[i].mr, nullptr));
      free_staging_.push_back(i);
    }
  }
}

void FabricEndpoint::close() {
  auto remains = std::make_unique<Remains>();
  {
    std::lock_guard<std::mutex> lock(caller_mr_mu_);
    remains->info = std::exchange(info_, nullptr);
    remains->fabric = std::exchange(fabric_, nullptr);
    remains->domain = std::exchange(domain_, nullptr);
    remains->cq = std::exchange(cq_, nullptr);
    remains->av = std::exchange(av_, nullptr);
    remains->ep = std::exchange(ep_, nullptr);
    remains->caller_mrs = std::exchange(caller_mrs_, {});
  }
  // Moving the vectors keeps their elements, and with them the contexts the provider holds.
  remains->recv = std::exchange(recv_, {});
  remains->staging = std::exchange(staging_, {});
  free_staging_.clear();
  remains->posted = std::exchange(posted_, {});
  // The ops may outlive this transport (kept, above): they let go of its connections now,
  // whose bootstrap sockets belong to its I/O context. A send's frame stays, for its memory.
  for (Op* op : remains->posted) {
    op->conn.reset();
    if (op->frame != nullptr) {
      op->frame->conn.reset();
      op->frame->done = nullptr;
    }
  }
  if (local_shm_) {
    local_shm_ = false;
    LocalShmEndpoints::get().closed(std::move(remains));
  } else {
    remains->release();
  }
}

template <class Post>
int FabricEndpoint::post_when_taken(Post post) {
  ssize_t ret;
  while ((ret = post()) == -FI_EAGAIN) fi_cq_read(cq_, nullptr, 0);
  return static_cast<int>(ret);
}

void FabricEndpoint::post_recv(int i) {
  Buffer& b = recv_[i];
  b.op = Op{};
  b.op.kind = Op::kRecv;
  b.op.buffer = i;
  const int ret = post_when_taken(
      [&] { return fi_recv(ep_, b.data.data(), b.data.size(), b.mr ? fi_mr_desc(b.mr) : nullptr, FI_ADDR_UNSPEC, &b.op.ctx); });
  HEARSAY_CHECK(ret == 0, fi_error("fi_recv", ret));
}

ssize_t FabricEndpoint::post_send(Op* op, const uint8_t* src, size_t len, fi_addr_t dest, bool tagged, uint64_t tag) {
  void* desc = nullptr;
  if (need_local_mr_) {
    if (free_staging_.empty()) return -FI_EAGAIN;
    op->buffer = free_staging_.back();
    free_staging_.pop_back();
    std::memcpy(staging_[op->buffer].data.data(), src, len);
    src = staging_[op->buffer].data.data();
    desc = fi_mr_desc(staging_[op->buffer].mr);
  }
  const ssize_t ret = tagged ? fi_tsend(ep_, src, len, desc, dest, tag, &op->ctx) : fi_send(ep_, src, len, desc, dest, &op->ctx);
  if (ret != 0) {
    release_staging(op);
    op->buffer = -1;
    return ret;
  }
  posted_.insert(op);
  return 0;
}

void FabricEndpoint::release_staging(const Op* op) {
  if (op->buffer >= 0) free_staging_.push_back(op->buffer);
}

int FabricEndpoint::post_tagged_recv(Op* op, void* dst, size_t len, uint64_t tag, uint64_t ignore) {
  const int ret = post_when_taken([&] { return fi_trecv(ep_, dst, len, nullptr, FI_ADDR_UNSPEC, tag, ignore, &op->ctx); });
  if (ret == 0) posted_.insert(op);
  return ret;
}

void FabricEndpoint::cancel(Op* op) {
  if (ep_ != nullptr) fi_cancel(&ep_->fid, &op->ctx);
}

ssize_t FabricEndpoint::read_completions(fi_cq_data_entry* entries, size_t count, fi_addr_t* sources) {
  return fi_cq_readfrom(cq_, entries, count, sources);
}

Op* FabricEndpoint::read_error(std::string* text) {
  fi_cq_err_entry err{};
  if (fi_cq_readerr(cq_, &err, 0) <= 0) return nullptr;
  char buf[256];
  const char* said = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
  *text = said ? said : libfabric().strerror(err.err);
  return static_cast<Op*>(err.op_context);
}

int FabricEndpoint::insert_address(const std::string& name, fi_addr_t* addr) {
  return fi_av_insert(av_, name.data(), 1, addr, 0, nullptr);
}

fid_mr* FabricEndpoint::register_memory(void* data, size_t bytes, std::string* error) {
  std::lock_guard<std::mutex> lock(caller_mr_mu_);
  if (domain_ == nullptr) {
    *error = "the fabric domain is closed";
    return nullptr;
  }
  fid_mr* mr = nullptr;
  const int ret = fi_mr_reg(domain_, data, bytes, FI_SEND | FI_RECV, 0, 0, 0, &mr, nullptr);
  if (ret != 0) {
    *error = fi_error("fi_mr_reg", ret);
    return nullptr;
  }
  caller_mrs_.insert(mr);
  return mr;
}

void FabricEndpoint::deregister(fid_mr* mr) {
  std::lock_guard<std::mutex> lock(caller_mr_mu_);
  if (caller_mrs_.erase(mr) != 0) fi_close(&mr->fid);
}

}  // namespace hearsay::fabric
