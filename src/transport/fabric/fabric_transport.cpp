#include "fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>

#include <sys/mman.h>

#include <asio.hpp>
#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "../address.h"
#include "../asio_helpers.h"
#include "../link_table.h"
#include "../session.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr size_t kChunkBytes = 256 * 1024;  // largest fabric message we send
constexpr size_t kRxmEagerBytes = 16000;
constexpr int kRecvBuffers = 32;
constexpr int kStagingBuffers = 32;
constexpr uint32_t kBootstrapMagic = 0x32595348;  // "HSY2": version 2 (with direct payloads)
constexpr size_t kBootstrapHeadBytes = 20;         // magic, name length, direct_from, stream
constexpr uint8_t kBootstrapReady = 1;             // the dialler knows the listener's address
constexpr uint32_t kMaxNameBytes = 4096;
// Payloads of at least this size travel as one tagged message received straight into
// the frame; smaller ones are cheaper through the reposted receive buffers.
constexpr uint64_t kDirectPayloadBytes = 32 * 1024;
// Untagged messages held while a direct payload is on its way (they belong after it).
constexpr size_t kMaxHeldBytes = 16u << 20;
// How long a closed link's stream keeps taking (and discarding) direct payloads that
// were on their way: the sender hears of the close through the bootstrap socket and
// then posts no more; what it had posted completes only once received.
constexpr auto kDiscardFor = std::chrono::seconds(10);
// Messages kept from a peer whose bootstrap is not finished: only handshake frames.
constexpr size_t kMaxEarlyBytes = 64 * 1024;

// What each side says of itself in the bootstrap.
struct BootstrapInfo {
  std::string name;          // libfabric endpoint name
  uint64_t direct_from = 0;  // smallest payload it sends and receives direct; 0: never
  uint32_t stream = 0;       // the tag prefix it wants on the direct payloads sent to it
};

uint64_t direct_tag(uint32_t stream, uint32_t seq) { return (uint64_t{stream} << 32) | seq; }

std::string fi_error(const char* call, int ret) {
  return std::string(call) + ": " + fi_strerror(-ret) + " (" + std::to_string(ret) + ")";
}

class FabricTransport;
struct Op;

// One peer reached over the fabric; its bootstrap socket is its liveness signal.
class FabricConnection final : public Connection, public std::enable_shared_from_this<FabricConnection> {
 public:
  FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<tcp::socket> bootstrap, std::string address,
                   std::string dial_peer, uint64_t direct_from, uint32_t my_stream, uint32_t their_stream);
  void start();  // progress thread
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  void close_now(const std::string& reason);  // progress thread
  LinkStats stats() const override;
  void on_bytes(const uint8_t* data, size_t n);  // an untagged message; progress thread
  void on_direct_payload(bool ok, fi_addr_t src, size_t n, const std::string& error);  // progress thread
  void fail(const std::string& reason, bool rejected);  // progress thread
  void tick(Clock::time_point now);  // progress thread
  void sent(size_t bytes) {
    counters_.bytes_sent += bytes;
    ++counters_.frames_sent;
  }
  void dequeued(size_t bytes) {
    --counters_.queue_depth;
    counters_.queue_bytes -= bytes;
  }
  fi_addr_t addr() const { return addr_; }
  // Whether a payload of this size goes direct; the tag for the next one that does, and
  // the count moved on once it is posted.
  bool sends_direct(size_t payload) const { return direct_from_ > 0 && payload >= direct_from_; }
  uint64_t send_tag() const { return direct_tag(their_stream_, send_seq_); }
  void sent_direct() { ++send_seq_; }
  bool closed() const { return closed_; }
  const std::string& dial_peer() const { return dial_peer_; }
  std::shared_ptr<tcp::socket> bootstrap() const { return bootstrap_; }

 private:
  void decode(const uint8_t* data, size_t n);
  void on_frame(InFrame&& f);      // a decoded frame, to the session
  bool decoded(FrameError error);  // false (and the link closed) on an error
  void receive_direct();

  FabricTransport& t_;
  fi_addr_t addr_;
  std::shared_ptr<tcp::socket> bootstrap_;
  std::string address_, dial_peer_;
  // Direct payloads (both sides offered them): the sender tags each with the receiver's
  // stream and its own count; the receiver posts a tagged receive into the frame as soon
  // as the frame's header has arrived, and holds later untagged messages until it is in.
  uint64_t direct_from_;
  uint32_t my_stream_, their_stream_;
  uint32_t send_seq_ = 0, recv_seq_ = 0;
  Op* direct_op_ = nullptr;  // the posted tagged receive, if any
  uint64_t direct_bytes_ = 0;
  std::deque<std::vector<uint8_t>> held_;
  size_t held_bytes_ = 0;
  FrameDecoder decoder_;
  Session session_;
  bool closed_ = false;
  LinkCounters counters_;
};

struct FrameInFlight {
  OutFrame frame;
  SendCallback done;
  std::shared_ptr<FabricConnection> conn;
  size_t posted = 0;       // bytes of head + payload posted so far
  size_t outstanding = 0;  // posted messages not yet completed
  bool failed = false;
  bool finished = false;  // its callback has run (the provider may still hold its memory)
  std::string error;
  size_t total() const { return frame.size(); }
};

// Anonymous memory mapped without reserving swap: pages exist once written.
class ScratchSpace {
 public:
  ScratchSpace() = default;
  explicit ScratchSpace(size_t bytes) : size_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap of " + std::to_string(bytes) + " bytes: " + std::strerror(errno));
    data_ = static_cast<uint8_t*>(p);
  }
  ScratchSpace(ScratchSpace&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  ScratchSpace& operator=(ScratchSpace&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~ScratchSpace() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

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

class FabricTransport final : public LinkTableTransport {
 public:
  explicit FabricTransport(const TransportOptions& o)
      : LinkTableTransport("fabric(" + o.fabric_provider + ")"), options_(o), work_(asio::make_work_guard(io_)),
        rng_(std::random_device{}()) {
    if (options_.secret.empty()) throw InputError("fabric transport: the cluster secret is empty");
    if (options_.peer_id.empty()) throw InputError("fabric transport: peer id is empty");
  }
  ~FabricTransport() override { close(); }

  std::string kind() const override { return "fabric(" + options_.fabric_provider + ")"; }
  // Same-host shared memory: a payload arrives exactly as it left (and an admitted peer
  // is on this host), so the CRC32C would only cost two passes over every byte.
  bool omits_crc() const override { return options_.fabric_provider == "shm"; }

  std::string listen(const std::string& address) override {
    const auto [host, port] = split_host_port(address);
    open_endpoint(host);
    std::string reachable;
    auto acceptor = open_acceptor(io_, address, "fabric (bootstrap)", &reachable);
    std::lock_guard<std::mutex> lock(mu_);
    acceptors_.push_back(std::move(acceptor));
    accept(acceptors_.back().get());
    return reachable;
  }

  void connect(const std::string& peer_id, const std::string& address) override {
    const auto [host, port] = split_host_port(address);
    open_endpoint(host == "localhost" ? "127.0.0.1" : host);
    auto d = std::make_shared<Dialer>(Dialer{peer_id, address, 0, asio::steady_timer(io_)});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      dialers_.push_back(d);
    }
    asio::post(io_, [this, d] { dial(d); });
  }



  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
    }
    // Byes go out through the progress thread; wait until they are queued, then a
    // moment for them to leave.
    if (progress_.joinable()) {
      auto queued = std::make_shared<std::promise<void>>();
      run_on_progress([this, queued] {
        for (auto& [addr, c] : std::map<fi_addr_t, std::shared_ptr<FabricConnection>>(by_addr_)) c->close_now("transport closed");
        queued->set_value();
      });
      queued->get_future().wait_for(std::chrono::seconds(1));
      const auto deadline = Clock::now() + std::chrono::milliseconds(300);
      while (Clock::now() < deadline) {
        bool idle;
        {
          std::lock_guard<std::mutex> lock(mu_);
          idle = send_queue_.empty() && inflight_sends_ == 0;
        }
        if (idle) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      stop_ = true;
      progress_.join();
    }
    asio::post(io_, [this] {
      asio::error_code ec;
      for (auto& a : acceptors_) a->close(ec);
      for (auto& d : dialers_) d->timer.cancel();
    });
    work_.reset();
    io_.stop();
    if (io_thread_.joinable()) io_thread_.join();
    // Fail whatever never left.
    for (auto& f : send_queue_) {
      if (f->done) f->done({false, "fabric: transport closed"});
    }
    send_queue_.clear();
    for (auto& [addr, c] : std::map<fi_addr_t, std::shared_ptr<FabricConnection>>(by_addr_)) {
      if (!c->closed()) c->fail("transport closed", false);
    }
    by_addr_.clear();
    // With the I/O thread gone the bootstrap sockets can be closed here; their close is
    // what tells the other side we are gone.
    for (auto& sock : sockets_) {
      asio::error_code ec;
      sock->close(ec);
    }
    sockets_.clear();
    teardown();
  }

  // --- used by FabricConnection ---------------------------------------------------------
  const TransportOptions& options() const { return options_; }

  void enqueue(std::shared_ptr<FrameInFlight> f) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      send_queue_.push_back(std::move(f));
    }
  }
  void run_on_progress(std::function<void()> task) {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  void connection_closed(const std::shared_ptr<FabricConnection>& c) {  // progress thread
    by_addr_.erase(c->addr());
    auto sock = c->bootstrap();
    {
      std::lock_guard<std::mutex> lock(mu_);
      sockets_.erase(sock);
    }
    asio::post(io_, [sock] {
      asio::error_code ec;
      sock->close(ec);
    });
    std::shared_ptr<Dialer> redial;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      for (auto& d : dialers_) {
        if (!c->dial_peer().empty() && d->peer_id == c->dial_peer()) redial = d;
      }
    }
    if (redial) asio::post(io_, [this, redial] { retry_later(redial); });
  }
  void connection_admitted(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& d : dialers_) {
      if (d->peer_id == peer) d->attempt = 0;
    }
  }

 private:
  struct Dialer {
    std::string peer_id, address;
    int attempt;
    asio::steady_timer timer;
  };

  // Opens the fabric, domain, endpoint and queues once, and starts the threads.
  void open_endpoint(const std::string& host) {
    std::lock_guard<std::mutex> lock(open_mu_);
    if (ep_ != nullptr) return;
    // For IP providers, bind to the listen host (loopback in tests); shm needs no node.
    const bool ip = options_.fabric_provider.find("tcp") != std::string::npos ||
                    options_.fabric_provider.find("verbs") != std::string::npos;
    auto get_info = [&](uint64_t caps) {
      fi_info* hints = fi_allocinfo();
      hints->ep_attr->type = FI_EP_RDM;
      hints->caps = caps;
      hints->mode = FI_CONTEXT;
      hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
      hints->domain_attr->threading = FI_THREAD_DOMAIN;
      hints->tx_attr->msg_order = FI_ORDER_SAS;
      hints->rx_attr->msg_order = FI_ORDER_SAS;
      hints->fabric_attr->prov_name = strdup(options_.fabric_provider.c_str());
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
      throw InputError("fabric: provider '" + options_.fabric_provider + "' offers no reliable-datagram endpoint here (" +
                       fi_error("fi_getinfo", ret) + "); see fi_info");
    }
    auto check = [&](const char* call, int r) {
      if (r != 0) throw InputError("fabric(" + options_.fabric_provider + "): " + fi_error(call, r));
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
    if (options_.fabric_provider.find("ofi_rxm") != std::string::npos) chunk_ = std::min<size_t>(chunk_, kRxmEagerBytes);
    need_local_mr_ = (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0;
    // A payload goes direct when any payload fits one message, the memory it lands in
    // needs no registration, and the provider is not ofi_rxm (its large-message path
    // stalls, above).
    const bool direct = (info_->caps & FI_TAGGED) != 0 && !need_local_mr_ &&
                        info_->ep_attr->max_msg_size >= options_.limits.max_payload_bytes &&
                        options_.fabric_provider.find("ofi_rxm") == std::string::npos;
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
    progress_ = std::thread([this] { progress_loop(); });
    io_thread_ = std::thread([this] { io_.run(); });
  }

  void teardown() {
    // Receives still posted go with the endpoint; then their memory can go.
    if (ep_ != nullptr) fi_close(&ep_->fid);
    ep_ = nullptr;
    for (Op* op : posted_ops_) delete op;
    posted_ops_.clear();
    for (auto& b : recv_) {
      if (b.mr != nullptr) fi_close(&b.mr->fid);
    }
    for (auto& b : staging_) {
      if (b.mr != nullptr) fi_close(&b.mr->fid);
    }
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

  struct Buffer {
    std::vector<uint8_t> data;
    fid_mr* mr = nullptr;
    Op op;
  };

  void post_recv(int i) {
    Buffer& b = recv_[i];
    b.op = Op{};
    b.op.kind = Op::kRecv;
    b.op.buffer = i;
    const int ret = post_when_taken(
        [&] { return fi_recv(ep_, b.data.data(), b.data.size(), b.mr ? fi_mr_desc(b.mr) : nullptr, FI_ADDR_UNSPEC, &b.op.ctx); });
    HEARSAY_CHECK(ret == 0, fi_error("fi_recv", ret));
  }

  // Posts a receive, driving progress while the provider's queue is full; 0 or the error.
  template <class Post>
  int post_when_taken(Post post) {
    ssize_t ret;
    while ((ret = post()) == -FI_EAGAIN) fi_cq_read(cq_, nullptr, 0);
    return static_cast<int>(ret);
  }

 public:
  // --- direct payloads (progress thread) ---------------------------------------------------
  // Posts a tagged receive of exactly len bytes at dst, which c owns; nullptr and the
  // error if the provider refuses it.
  Op* post_direct_recv(const std::shared_ptr<FabricConnection>& c, uint8_t* dst, size_t len, uint64_t tag,
                       std::string* error) {
    auto* op = new Op{};
    op->kind = Op::kDirectRecv;
    op->conn = c;
    const int ret = post_when_taken([&] { return fi_trecv(ep_, dst, len, nullptr, FI_ADDR_UNSPEC, tag, 0, &op->ctx); });
    if (ret != 0) {
      delete op;
      *error = fi_error("fi_trecv", ret);
      return nullptr;
    }
    posted_ops_.insert(op);
    return op;
  }
  // A closed connection's frames still in the provider's hands fail now: a send whose
  // receiver went away may never complete (a direct payload nobody will receive), and
  // the sender must not wait for it. Their memory stays with their ops until they
  // complete or the endpoint closes.
  void abandon_sends(const FabricConnection* c, const std::string& reason) {
    std::vector<std::shared_ptr<FrameInFlight>> frames;
    for (Op* op : posted_ops_) {
      if (op->kind == Op::kSend && op->frame->conn.get() == c && !op->frame->finished) frames.push_back(op->frame);
    }
    for (auto& f : frames) {
      if (!f->failed) {
        f->failed = true;
        f->error = "fabric: connection closed: " + reason;
      }
      finish(f);
    }
  }
  // Takes and drops whatever direct payloads a closed link's stream still receives, for
  // kDiscardFor: each completes its sender's send, which frees the sender's memory and
  // the provider's unexpected-message entry here. The scratch space is as large as any
  // payload may be, because shm (libfabric 1.17) never returns from a receive smaller
  // than its message; it is reserved address space, and only what arrives is touched.
  void discard_stream(uint32_t stream) {
    auto* op = new Op{};
    op->kind = Op::kDiscard;
    op->stream = stream;
    op->until = Clock::now() + kDiscardFor;
    try {
      op->scratch = ScratchSpace(options_.limits.max_payload_bytes);
    } catch (const std::exception& e) {
      links_.dropped("", "fabric", std::string("discard: ") + e.what());
      delete op;
      return;
    }
    if (post_discard(op)) posted_ops_.insert(op);
  }
  // A cancelled receive completes with FI_ECANCELED; one the provider cannot cancel stays
  // posted (into memory its Op keeps alive) until the endpoint closes.
  void cancel(Op* op) {
    if (ep_ != nullptr) fi_cancel(&ep_->fid, &op->ctx);
  }

 private:

  // Posts as much of the send queue as the provider takes. Progress thread.
  bool post_sends() {
    bool did = false;
    for (;;) {
      std::shared_ptr<FrameInFlight> f;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (send_queue_.empty()) return did;
        f = send_queue_.front();
      }
      if (f->conn->closed()) {
        f->failed = true;
        f->error = "fabric: connection closed";
      }
      while (!f->failed && f->posted < f->total()) {
        // The head goes as one message; the payload in chunks.
        const size_t head = f->frame.head.size();
        const uint8_t* src;
        size_t len;
        bool direct = false;
        if (f->posted < head) {
          src = reinterpret_cast<const uint8_t*>(f->frame.head.data()) + f->posted;
          len = std::min(chunk_, head - f->posted);
        } else if (f->posted == head && f->conn->sends_direct(f->frame.payload_size)) {
          src = f->frame.payload;
          len = f->frame.payload_size;
          direct = true;
        } else {
          const size_t off = f->posted - head;
          src = f->frame.payload + off;
          len = std::min(chunk_, f->frame.payload_size - off);
        }
        auto* op = new Op{};
        op->kind = Op::kSend;
        op->frame = f;
        void* desc = nullptr;
        if (need_local_mr_) {
          if (free_staging_.empty()) {
            delete op;
            return did;
          }
          op->buffer = free_staging_.back();
          free_staging_.pop_back();
          std::memcpy(staging_[op->buffer].data.data(), src, len);
          src = staging_[op->buffer].data.data();
          desc = fi_mr_desc(staging_[op->buffer].mr);
        }
        const ssize_t ret = direct ? fi_tsend(ep_, src, len, desc, f->conn->addr(), f->conn->send_tag(), &op->ctx)
                                   : fi_send(ep_, src, len, desc, f->conn->addr(), &op->ctx);
        if (ret == -FI_EAGAIN) {
          if (op->buffer >= 0) free_staging_.push_back(op->buffer);
          delete op;
          return did;
        }
        if (ret != 0) {
          if (op->buffer >= 0) free_staging_.push_back(op->buffer);
          delete op;
          f->failed = true;
          f->error = "fabric: " + fi_error("fi_send", static_cast<int>(ret));
          break;
        }
        if (direct) f->conn->sent_direct();
        posted_ops_.insert(op);
        did = true;
        ++f->outstanding;
        ++inflight_sends_;
        f->posted += len;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        send_queue_.pop_front();
      }
      if (f->outstanding == 0) finish(f);
    }
  }

  void finish(const std::shared_ptr<FrameInFlight>& f) {
    if (f->finished) return;
    f->finished = true;
    f->conn->dequeued(f->frame.size());
    if (!f->failed) f->conn->sent(f->frame.size());
    if (f->done) f->done(f->failed ? SendStatus{false, f->error} : SendStatus{});
    f->done = nullptr;
  }

  // Posts op's receive into its scratch space, matching any tag of its stream; false (op
  // deleted) if refused.
  bool post_discard(Op* op) {
    const int ret = post_when_taken([&] {
      return fi_trecv(ep_, op->scratch.data(), op->scratch.size(), nullptr, FI_ADDR_UNSPEC, direct_tag(op->stream, 0), 0xffffffffu,
                      &op->ctx);
    });
    if (ret == 0) return true;
    delete op;
    return false;
  }

  void complete(Op* op, bool ok, const std::string& error, fi_addr_t src, size_t len) {
    if (op->kind == Op::kDiscard) {
      // A payload taken (reported truncated) or the time is up (cancelled).
      if (!op->cancelled && !stop_ && Clock::now() < op->until) {
        op->ctx = fi_context{};
        if (post_discard(op)) return;
      } else {
        delete op;
      }
      posted_ops_.erase(op);
      return;
    }
    if (op->kind == Op::kDirectRecv) {
      posted_ops_.erase(op);
      auto conn = std::move(op->conn);
      delete op;
      conn->on_direct_payload(ok, src, len, error);
      return;
    }
    if (op->kind == Op::kRecv) {
      if (ok) {
        auto it = by_addr_.find(src);
        auto early = early_.find(src);
        if (it != by_addr_.end()) {
          it->second->on_bytes(recv_[op->buffer].data.data(), len);
        } else if (early != early_.end() && early->second.bytes + len <= kMaxEarlyBytes) {
          const uint8_t* data = recv_[op->buffer].data.data();
          early->second.messages.emplace_back(data, data + len);
          early->second.bytes += len;
        } else {
          links_.dropped("", "fabric", "unknown_source: message from an address no bootstrap introduced");
        }
      }
      if (!stop_) post_recv(op->buffer);
      return;
    }
    auto f = op->frame;
    if (op->buffer >= 0) free_staging_.push_back(op->buffer);
    --inflight_sends_;
    posted_ops_.erase(op);
    delete op;
    if (!ok && !f->failed) {
      f->failed = true;
      f->error = "fabric: send failed: " + error;
      f->conn->fail("send failed: " + error, false);
    }
    if (--f->outstanding == 0 && (f->posted == f->total() || f->failed)) finish(f);
  }

  void progress_loop() {
    fi_cq_data_entry entries[16];
    fi_addr_t sources[16];
    int idle = 0;
    auto last_tick = Clock::now();
    while (!stop_) {
      std::vector<std::function<void()>> tasks;
      {
        std::lock_guard<std::mutex> lock(mu_);
        tasks.swap(tasks_);
      }
      for (auto& t : tasks) t();
      bool busy = !tasks.empty();
      const ssize_t n = fi_cq_readfrom(cq_, entries, 16, sources);
      if (n > 0) {
        busy = true;
        for (ssize_t i = 0; i < n; ++i) {
          complete(static_cast<Op*>(entries[i].op_context), true, "", sources[i], entries[i].len);
        }
      } else if (n == -FI_EAVAIL) {
        busy = true;
        fi_cq_err_entry err{};
        if (fi_cq_readerr(cq_, &err, 0) > 0) {
          char buf[256];
          const char* text = fi_cq_strerror(cq_, err.prov_errno, err.err_data, buf, sizeof(buf));
          complete(static_cast<Op*>(err.op_context), false, text ? text : fi_strerror(err.err), FI_ADDR_NOTAVAIL, 0);
        }
      }
      busy |= post_sends();
      const auto now = Clock::now();
      if (now - last_tick > std::chrono::milliseconds(50)) {
        last_tick = now;
        for (auto& [addr, c] : std::map<fi_addr_t, std::shared_ptr<FabricConnection>>(by_addr_)) c->tick(now);
        for (Op* op : posted_ops_) {
          if (op->kind == Op::kDiscard && !op->cancelled && now >= op->until) {
            op->cancelled = true;
            cancel(op);
          }
        }
      }
      // Spin while there is work, then back off to short sleeps so an idle peer costs
      // little CPU on a shared machine.
      idle = busy ? 0 : idle + 1;
      if (idle > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // --- bootstrap (Asio thread) -----------------------------------------------------------
  // Our side of a new bootstrap: the endpoint name, whether we do direct payloads, and
  // a stream number for the direct payloads sent to us on this link.
  BootstrapInfo our_bootstrap() {
    std::lock_guard<std::mutex> lock(mu_);
    return BootstrapInfo{name_, direct_from_, ++last_stream_};
  }
  static std::string bootstrap_message(const BootstrapInfo& b) {
    std::string m(kBootstrapHeadBytes, '\0');
    const uint32_t magic = kBootstrapMagic, len = static_cast<uint32_t>(b.name.size());
    std::memcpy(m.data(), &magic, 4);
    std::memcpy(m.data() + 4, &len, 4);
    std::memcpy(m.data() + 8, &b.direct_from, 8);
    std::memcpy(m.data() + 16, &b.stream, 4);
    return m + b.name;
  }

  // Reads the other side's bootstrap; calls back with it, or with the error.
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

  // Inserts a name into the address vector on the progress thread; waits for it.
  fi_addr_t insert_address(const std::string& name, std::string* error) {
    auto result = std::make_shared<std::promise<std::pair<fi_addr_t, std::string>>>();
    auto fut = result->get_future();
    run_on_progress([this, name, result] {
      fi_addr_t addr = FI_ADDR_NOTAVAIL;
      const int ret = fi_av_insert(av_, name.data(), 1, &addr, 0, nullptr);
      if (ret == 1) early_[addr] = Early{};
      result->set_value({addr, ret == 1 ? "" : "bad_bootstrap: endpoint name not accepted by the provider (" + fi_error("fi_av_insert", ret) + ")"});
    });
    if (fut.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      *error = "fabric: address insertion timed out";
      return FI_ADDR_NOTAVAIL;
    }
    auto [addr, err] = fut.get();
    *error = err;
    return addr;
  }

  // A bootstrap that ended before its connection started keeps nothing.
  void forget_early(fi_addr_t addr) {
    run_on_progress([this, addr] { early_.erase(addr); });
  }

  void start_connection(std::shared_ptr<tcp::socket> sock, fi_addr_t addr, const std::string& remote, const std::string& dial_peer,
                        const BootstrapInfo& ours, const BootstrapInfo& theirs) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sockets_.insert(sock);
    }
    // Direct payloads only where both sides offered them, from the larger threshold.
    const uint64_t direct_from = ours.direct_from > 0 && theirs.direct_from > 0 ? std::max(ours.direct_from, theirs.direct_from) : 0;
    auto c = std::make_shared<FabricConnection>(*this, addr, sock, remote, dial_peer, direct_from, ours.stream, theirs.stream);
    run_on_progress([this, c] {
      auto old = by_addr_.find(c->addr());
      if (old != by_addr_.end()) old->second->fail("replaced by a new connection", false);
      by_addr_[c->addr()] = c;
      c->start();
      auto early = early_.find(c->addr());
      if (early != early_.end()) {
        for (const auto& m : early->second.messages) c->on_bytes(m.data(), m.size());
        early_.erase(early);
      }
    });
    // The socket's only job now is to say when the peer goes away.
    auto byte = std::make_shared<uint8_t>();
    asio::async_read(*sock, asio::buffer(byte.get(), 1), [this, c, byte](asio::error_code ec, size_t) {
      const std::string why = ec ? (ec == asio::error::eof ? "connection closed by peer" : "bootstrap: " + ec.message())
                                 : "bootstrap: unexpected data";
      run_on_progress([c, why] { c->fail(why, false); });
    });
  }

  void accept(tcp::acceptor* acceptor) {
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
        const fi_addr_t addr = insert_address(theirs.name, &error);
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
            forget_early(addr);
            asio::error_code e;
            sock->close(e);
          });
        });
      });
      accept(acceptor);
    });
  }

  void dial(const std::shared_ptr<Dialer>& d) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
    }
    async_dial(io_, d->address, [this, d](std::shared_ptr<tcp::socket> sock, const std::string& remote) {
      if (!sock) return retry_later(d);
      const BootstrapInfo ours = our_bootstrap();
      auto hello = std::make_shared<std::string>(bootstrap_message(ours));
      asio::async_write(*sock, asio::buffer(*hello), [this, d, sock, hello, remote, ours](asio::error_code ec, size_t) {
        if (ec) return retry_later(d);
        read_bootstrap(sock, [this, d, sock, remote, ours](BootstrapInfo theirs, std::string error) {
          if (error.empty()) {
            const fi_addr_t addr = insert_address(theirs.name, &error);
            if (error.empty()) {
              auto ready = std::make_shared<uint8_t>(kBootstrapReady);
              return asio::async_write(*sock, asio::buffer(ready.get(), 1), [this, d, sock, ready, addr, remote, ours, theirs](asio::error_code ec2, size_t) {
                if (ec2) {
                  forget_early(addr);
                  return retry_later(d);
                }
                start_connection(sock, addr, remote, d->peer_id, ours, theirs);
              });
            }
          }
          links_.rejected(d->peer_id, remote, error);
          retry_later(d);
        });
      });
    });
  }

  void retry_later(const std::shared_ptr<Dialer>& d) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    const double delay = backoff_delay(options_, d->attempt++, rng_);
    d->timer.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(delay)));
    d->timer.async_wait([this, d](asio::error_code ec) {
      if (!ec) dial(d);
    });
  }

  TransportOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread io_thread_, progress_;
  std::atomic<bool> stop_{false};
  std::mutex open_mu_;

  // libfabric objects: created once, then used only by the progress thread.
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_av* av_ = nullptr;
  fid_ep* ep_ = nullptr;
  std::string name_;
  size_t chunk_ = kChunkBytes;
  bool need_local_mr_ = false;
  uint64_t direct_from_ = 0;     // what we offer; set before any bootstrap
  std::set<Op*> posted_ops_;  // sends and tagged receives the provider holds; progress thread (then teardown)
  // Messages from an address inserted by a bootstrap whose connection has not started
  // yet (the other side may start first); handed to the connection when it does.
  struct Early {
    std::vector<std::vector<uint8_t>> messages;
    size_t bytes = 0;
  };
  std::map<fi_addr_t, Early> early_;  // progress thread
  std::vector<Buffer> recv_, staging_;
  std::vector<int> free_staging_;
  std::map<fi_addr_t, std::shared_ptr<FabricConnection>> by_addr_;  // progress thread only
  std::atomic<uint64_t> inflight_sends_{0};

  std::mutex mu_;
  bool closing_ = false;                                     // GUARDED_BY(mu_)
  std::deque<std::shared_ptr<FrameInFlight>> send_queue_;    // GUARDED_BY(mu_)
  std::vector<std::function<void()>> tasks_;                 // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors_;    // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Dialer>> dialers_;             // GUARDED_BY(mu_)
  std::set<std::shared_ptr<tcp::socket>> sockets_;           // GUARDED_BY(mu_)
  std::mt19937_64 rng_;                                      // GUARDED_BY(mu_)
  uint32_t last_stream_ = 0;                                 // GUARDED_BY(mu_)
};

FabricConnection::FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<tcp::socket> bootstrap,
                                   std::string address, std::string dial_peer, uint64_t direct_from, uint32_t my_stream,
                                   uint32_t their_stream)
    : t_(t), addr_(addr), bootstrap_(std::move(bootstrap)), address_(std::move(address)), dial_peer_(std::move(dial_peer)),
      direct_from_(direct_from), my_stream_(my_stream), their_stream_(their_stream), decoder_(kHandshakeLimits),
      session_(t.options(), address_, dial_peer_,
               Session::Hooks{
                   [this](OutFrame f) {
                     ++counters_.queue_depth;
                     counters_.queue_bytes += f.size();
                     auto fl = std::make_shared<FrameInFlight>();
                     fl->frame = std::move(f);
                     fl->conn = shared_from_this();
                     t_.enqueue(std::move(fl));
                   },
                   [this](const std::string& reason) { fail(reason, true); },
                   [this](const std::string& peer) {
                     counters_.admitted = true;
                     t_.connection_admitted(peer);
                     decoder_.set_limits(t_.options().limits);
                     decoder_.accept_unchecked_payloads(t_.omits_crc());
                     t_.links().admitted(peer, shared_from_this(), address_);
                   },
                   [this](InFrame&& f) { t_.links().deliver(session_.peer_id(), std::move(f)); },
                   [this](const std::string& reason) { t_.links().dropped(session_.peer_id(), address_, reason); },
               }) {}

void FabricConnection::start() { session_.start(); }

void FabricConnection::send(OutFrame frame, SendCallback done) {
  ++counters_.queue_depth;
  counters_.queue_bytes += frame.size();
  auto fl = std::make_shared<FrameInFlight>();
  fl->frame = std::move(frame);
  fl->done = std::move(done);
  fl->conn = shared_from_this();
  t_.enqueue(std::move(fl));
}

void FabricConnection::close(const std::string& reason) {
  auto self = shared_from_this();
  t_.run_on_progress([this, self, reason] { close_now(reason); });
}

void FabricConnection::close_now(const std::string& reason) {
  auto self = shared_from_this();
  {
    if (closed_) return;
    if (session_.admitted()) {
      auto fl = std::make_shared<FrameInFlight>();
      fl->frame = session_.bye(reason);
      fl->conn = self;
      ++counters_.queue_depth;
      counters_.queue_bytes += fl->frame.size();
      // Close once the Bye has left.
      fl->done = [this, self, reason](const SendStatus&) { fail(reason, false); };
      t_.enqueue(std::move(fl));
      return;
    }
    fail(reason, false);
  }
}

void FabricConnection::on_bytes(const uint8_t* data, size_t n) {
  if (closed_) return;
  if (direct_op_ != nullptr) {  // sent after the payload on its way: wait for it
    if (held_bytes_ + n > kMaxHeldBytes) {
      return fail("protocol: " + std::to_string(held_bytes_ + n) + " bytes of messages arrived while waiting for a direct payload of " +
                      std::to_string(direct_bytes_) + " bytes",
                  true);
    }
    held_.emplace_back(data, data + n);
    held_bytes_ += n;
    return;
  }
  decode(data, n);
}

void FabricConnection::on_frame(InFrame&& f) {
  ++counters_.frames_received;
  if (!closed_) session_.on_frame(std::move(f));
}

bool FabricConnection::decoded(FrameError err) {
  if (err == FrameError::kNone) return true;
  fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
  return false;
}

void FabricConnection::decode(const uint8_t* data, size_t n) {
  counters_.bytes_received += n;
  if (decoded(decoder_.feed(data, n, [this](InFrame&& f) { on_frame(std::move(f)); })) && !closed_) receive_direct();
}

// A frame whose header just arrived and whose payload is large enough: its payload comes
// as the next tagged message, straight into the frame.
void FabricConnection::receive_direct() {
  const uint64_t rest = decoder_.payload_remaining();
  if (direct_from_ == 0 || rest < direct_from_ || !session_.admitted()) return;
  const auto [dst, room] = decoder_.payload_space(static_cast<size_t>(rest));
  HEARSAY_CHECK(dst != nullptr && room == rest, "fabric: the decoder gave no room for a direct payload");
  std::string error;
  direct_op_ = t_.post_direct_recv(shared_from_this(), dst, static_cast<size_t>(rest), direct_tag(my_stream_, recv_seq_++), &error);
  if (direct_op_ == nullptr) return fail("direct payload: " + error, false);
  direct_bytes_ = rest;
}

void FabricConnection::on_direct_payload(bool ok, fi_addr_t src, size_t n, const std::string& error) {
  direct_op_ = nullptr;
  if (closed_) return;
  if (!ok) return fail("direct payload: " + error, true);
  // The receive took any sender's message with this tag; only the admitted peer's counts.
  if (src != addr_) return fail("bad_frame: a direct payload from an endpoint other than the peer's", true);
  if (n != direct_bytes_) {
    return fail("bad_frame: direct payload of " + std::to_string(n) + " bytes, the header said " + std::to_string(direct_bytes_), true);
  }
  counters_.bytes_received += n;
  if (!decoded(decoder_.commit_payload(n, [this](InFrame&& f) { on_frame(std::move(f)); }))) return;
  while (!held_.empty() && direct_op_ == nullptr && !closed_) {
    const std::vector<uint8_t> m = std::move(held_.front());
    held_.pop_front();
    held_bytes_ -= m.size();
    decode(m.data(), m.size());
  }
}

void FabricConnection::fail(const std::string& reason, bool rejected) {
  if (closed_) return;
  closed_ = true;
  counters_.open = false;
  if (direct_op_ != nullptr) t_.cancel(direct_op_);
  if (direct_from_ > 0) t_.discard_stream(my_stream_);
  t_.abandon_sends(this, reason);
  held_.clear();
  held_bytes_ = 0;
  if (rejected) t_.links().rejected(session_.peer_id(), address_, reason);
  t_.links().closed(session_.peer_id(), this, address_, reason);
  t_.connection_closed(shared_from_this());
}

LinkStats FabricConnection::stats() const { return counters_.snapshot(); }

void FabricConnection::tick(Clock::time_point now) {
  if (closed_) return;
  session_.tick(now);
  counters_.rtt_s = session_.rtt_s();
}

}  // namespace

std::unique_ptr<Transport> create_fabric_transport(const TransportOptions& options) {
  return std::make_unique<FabricTransport>(options);
}

}  // namespace hearsay
