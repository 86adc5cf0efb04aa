#include "fabric_transport.h"

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

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
constexpr uint32_t kBootstrapMagic = 0x42595348;  // "HSYB"
constexpr uint32_t kMaxNameBytes = 4096;

std::string fi_error(const char* call, int ret) {
  return std::string(call) + ": " + fi_strerror(-ret) + " (" + std::to_string(ret) + ")";
}

class FabricTransport;

// One peer reached over the fabric; its bootstrap socket is its liveness signal.
class FabricConnection final : public Connection, public std::enable_shared_from_this<FabricConnection> {
 public:
  FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<tcp::socket> bootstrap, std::string address,
                   std::string dial_peer);
  void start();  // progress thread
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  void close_now(const std::string& reason);  // progress thread
  LinkStats stats() const override;
  void on_bytes(const uint8_t* data, size_t n);  // progress thread
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
  bool closed() const { return closed_; }
  const std::string& dial_peer() const { return dial_peer_; }
  std::shared_ptr<tcp::socket> bootstrap() const { return bootstrap_; }

 private:
  FabricTransport& t_;
  fi_addr_t addr_;
  std::shared_ptr<tcp::socket> bootstrap_;
  std::string address_, dial_peer_;
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
  std::string error;
  size_t total() const { return frame.size(); }
};

// Every posted operation carries one of these; fi_context must come first (FI_CONTEXT).
struct Op {
  fi_context ctx;
  enum Kind { kRecv, kSend } kind;
  int buffer = -1;  // receive or staging buffer index
  std::shared_ptr<FrameInFlight> frame;
  size_t bytes = 0;
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
    fi_info* hints = fi_allocinfo();
    hints->ep_attr->type = FI_EP_RDM;
    hints->caps = FI_MSG | FI_SOURCE;
    hints->mode = FI_CONTEXT;
    hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
    hints->domain_attr->threading = FI_THREAD_DOMAIN;
    hints->tx_attr->msg_order = FI_ORDER_SAS;
    hints->rx_attr->msg_order = FI_ORDER_SAS;
    hints->fabric_attr->prov_name = strdup(options_.fabric_provider.c_str());
    // For IP providers, bind to the listen host (loopback in tests); shm needs no node.
    const bool ip = options_.fabric_provider.find("tcp") != std::string::npos ||
                    options_.fabric_provider.find("verbs") != std::string::npos;
    int ret = fi_getinfo(FI_VERSION(1, 9), ip ? host.c_str() : nullptr, nullptr, ip ? FI_SOURCE : 0, hints, &info_);
    fi_freeinfo(hints);
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
    for (auto& b : recv_) {
      if (b.mr != nullptr) fi_close(&b.mr->fid);
    }
    for (auto& b : staging_) {
      if (b.mr != nullptr) fi_close(&b.mr->fid);
    }
    if (ep_ != nullptr) fi_close(&ep_->fid);
    if (av_ != nullptr) fi_close(&av_->fid);
    if (cq_ != nullptr) fi_close(&cq_->fid);
    if (domain_ != nullptr) fi_close(&domain_->fid);
    if (fabric_ != nullptr) fi_close(&fabric_->fid);
    if (info_ != nullptr) fi_freeinfo(info_);
    ep_ = nullptr;
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
    int ret;
    do {
      ret = static_cast<int>(fi_recv(ep_, b.data.data(), b.data.size(), b.mr ? fi_mr_desc(b.mr) : nullptr, FI_ADDR_UNSPEC, &b.op.ctx));
      if (ret == -FI_EAGAIN) fi_cq_read(cq_, nullptr, 0);  // drive progress
    } while (ret == -FI_EAGAIN);
    HEARSAY_CHECK(ret == 0, fi_error("fi_recv", ret));
  }

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
        if (f->posted < head) {
          src = reinterpret_cast<const uint8_t*>(f->frame.head.data()) + f->posted;
          len = std::min(chunk_, head - f->posted);
        } else {
          const size_t off = f->posted - head;
          src = f->frame.payload + off;
          len = std::min(chunk_, f->frame.payload_size - off);
        }
        auto* op = new Op{};
        op->kind = Op::kSend;
        op->frame = f;
        op->bytes = len;
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
        const ssize_t ret = fi_send(ep_, src, len, desc, f->conn->addr(), &op->ctx);
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
    f->conn->dequeued(f->frame.size());
    if (!f->failed) f->conn->sent(f->frame.size());
    if (f->done) f->done(f->failed ? SendStatus{false, f->error} : SendStatus{});
    f->done = nullptr;
  }

  void complete(Op* op, bool ok, const std::string& error, fi_addr_t src, size_t len) {
    if (op->kind == Op::kRecv) {
      if (ok) {
        auto it = by_addr_.find(src);
        if (it != by_addr_.end()) {
          it->second->on_bytes(recv_[op->buffer].data.data(), len);
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
    delete op;
    if (!ok && !f->failed) {
      f->failed = true;
      f->error = "fabric: send failed: " + error;
      f->conn->fail("send failed: " + error, false);
    }
    if (--f->outstanding == 0 && f->posted == f->total()) finish(f);
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
      }
      // Spin while there is work, then back off to short sleeps so an idle peer costs
      // little CPU on a shared machine.
      idle = busy ? 0 : idle + 1;
      if (idle > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // --- bootstrap (Asio thread) -----------------------------------------------------------
  static std::string bootstrap_message(const std::string& name) {
    std::string m(8, '\0');
    const uint32_t magic = kBootstrapMagic, len = static_cast<uint32_t>(name.size());
    std::memcpy(m.data(), &magic, 4);
    std::memcpy(m.data() + 4, &len, 4);
    return m + name;
  }

  // Reads the other side's endpoint name; calls back with it, or an empty string and the error.
  void read_name(std::shared_ptr<tcp::socket> sock, std::function<void(std::string, std::string)> then) {
    auto head = std::make_shared<std::array<uint8_t, 8>>();
    asio::async_read(*sock, asio::buffer(*head), [this, sock, head, then](asio::error_code ec, size_t) {
      if (ec) return then("", "bootstrap read: " + ec.message());
      uint32_t magic, len;
      std::memcpy(&magic, head->data(), 4);
      std::memcpy(&len, head->data() + 4, 4);
      if (magic != kBootstrapMagic) return then("", "bad_magic: bootstrap greeting is not hearsay's");
      if (len == 0 || len > kMaxNameBytes) return then("", "bad_bootstrap: endpoint name of " + std::to_string(len) + " bytes");
      auto name = std::make_shared<std::string>(len, '\0');
      asio::async_read(*sock, asio::buffer(name->data(), len), [name, then](asio::error_code ec2, size_t) {
        if (ec2) return then("", "bootstrap read: " + ec2.message());
        then(*name, "");
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

  void start_connection(std::shared_ptr<tcp::socket> sock, fi_addr_t addr, const std::string& remote, const std::string& dial_peer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sockets_.insert(sock);
    }
    auto c = std::make_shared<FabricConnection>(*this, addr, sock, remote, dial_peer);
    run_on_progress([this, c] {
      auto old = by_addr_.find(c->addr());
      if (old != by_addr_.end()) old->second->fail("replaced by a new connection", false);
      by_addr_[c->addr()] = c;
      c->start();
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
      read_name(sock, [this, sock, remote](std::string name, std::string error) {
        if (!error.empty()) {
          links_.rejected("", remote, error);
          asio::error_code e;
          sock->close(e);
          return;
        }
        const fi_addr_t addr = insert_address(name, &error);
        if (!error.empty()) {
          links_.rejected("", remote, error);
          return;
        }
        auto reply = std::make_shared<std::string>(bootstrap_message(name_));
        asio::async_write(*sock, asio::buffer(*reply), [this, sock, reply, addr, remote](asio::error_code ec2, size_t) {
          if (!ec2) start_connection(sock, addr, remote, "");
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
      auto hello = std::make_shared<std::string>(bootstrap_message(name_));
      asio::async_write(*sock, asio::buffer(*hello), [this, d, sock, hello, remote](asio::error_code ec, size_t) {
        if (ec) return retry_later(d);
        read_name(sock, [this, d, sock, remote](std::string name, std::string error) {
          if (error.empty()) {
            const fi_addr_t addr = insert_address(name, &error);
            if (error.empty()) return start_connection(sock, addr, remote, d->peer_id);
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
};

FabricConnection::FabricConnection(FabricTransport& t, fi_addr_t addr, std::shared_ptr<tcp::socket> bootstrap,
                                   std::string address, std::string dial_peer)
    : t_(t), addr_(addr), bootstrap_(std::move(bootstrap)), address_(std::move(address)), dial_peer_(std::move(dial_peer)),
      decoder_(kHandshakeLimits),
      session_(t.options(), address_,
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
                     if (!dial_peer_.empty() && peer != dial_peer_) {
                       return fail("admission: dialled peer '" + dial_peer_ + "' but it is '" + peer + "'", true);
                     }
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
  counters_.bytes_received += n;
  const FrameError err = decoder_.feed(data, n, [&](InFrame&& f) {
    ++counters_.frames_received;
    if (!closed_) session_.on_frame(std::move(f));
  });
  if (err != FrameError::kNone) fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
}

void FabricConnection::fail(const std::string& reason, bool rejected) {
  if (closed_) return;
  closed_ = true;
  counters_.open = false;
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
