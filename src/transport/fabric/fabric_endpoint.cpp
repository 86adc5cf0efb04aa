#include "fabric_endpoint.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <algorithm>
#include <cstring>

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
  return std::string(call) + ": " + fi_strerror(-ret) + " (" + std::to_string(ret) + ")";
}

void FabricEndpoint::open(const TransportOptions& options, const std::string& host) {
  const std::string& provider = options.fabric_provider;
  // For IP providers, bind to the listen host (loopback in tests); shm needs no node.
  const bool ip = provider.find("tcp") != std::string::npos || provider.find("verbs") != std::string::npos;
  auto get_info = [&](uint64_t caps) {
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = caps;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(provider.c_str());
    const int r = fi_getinfo(FI_VERSION(1, 9), ip ? host.c_str() : nullptr, nullptr, ip ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
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
  check("fi_fabric", fi_fabric(info_->fabric_attr, &fabric_, nullptr));
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
  std::lock_guard<std::mutex> lock(caller_mr_mu_);
  // Receives still posted go with the endpoint; then their memory can go.
  if (ep_ != nullptr) fi_close(&ep_->fid);
  ep_ = nullptr;
  for (Op* op : posted_) delete op;
  posted_.clear();
  for (auto& b : recv_) {
    if (b.mr != nullptr) fi_close(&b.mr->fid);
  }
  for (auto& b : staging_) {
    if (b.mr != nullptr) fi_close(&b.mr->fid);
  }
  // A domain with registrations open would refuse to close (FI_EBUSY).
  for (fid_mr* mr : caller_mrs_) fi_close(&mr->fid);
  caller_mrs_.clear();
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_freeinfo(info_);
  av_ = nullptr;
  cq_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  info_ = nullptr;
  recv_.clear();
  staging_.clear();
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
  *text = said ? said : fi_strerror(err.err);
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
