#include "tcp_transport.h"

#include <sys/socket.h>

#include <asio.hpp>
#include <atomic>
#include <deque>
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
constexpr size_t kDirectReadBytes = 64 * 1024;
constexpr size_t kLowWaterBytes = 256 * 1024;

class TcpTransport;

class TcpConnection final : public Connection, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(TcpTransport& t, tcp::socket sock, std::string address, std::string dial_peer);
  void start();
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  LinkStats stats() const override;
  void tick(Clock::time_point now);
  const std::string& dial_peer() const { return dial_peer_; }

 private:
  void read();
  void set_low_water(int bytes);
  void queue(OutFrame frame, SendCallback done);
  void write_next();
  void fail(const std::string& reason, bool rejected);

  TcpTransport& t_;
  tcp::socket sock_;
  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer handshake_timer_;
  std::string address_;
  std::string dial_peer_;
  FrameDecoder decoder_;
  Session session_;
  struct Pending {
    OutFrame frame;
    SendCallback done;
  };
  std::deque<Pending> queue_;
  bool writing_ = false;
  bool closed_ = false;
  std::vector<uint8_t> rbuf_;
  int low_water_ = 1;  // SO_RCVLOWAT now set on the socket
  LinkCounters counters_;
};

class TcpTransport final : public LinkTableTransport {
 public:
  explicit TcpTransport(const TransportOptions& o)
      : LinkTableTransport("tcp"), options_(o), work_(asio::make_work_guard(io_)), heartbeat_(io_), rng_(std::random_device{}()) {
    if (options_.secret.empty()) throw InputError("tcp transport: the cluster secret is empty");
    if (options_.peer_id.empty()) throw InputError("tcp transport: peer id is empty");
    for (int i = 0; i < std::max(1, options_.io_threads); ++i) threads_.emplace_back([this] { io_.run(); });
    schedule_heartbeat();
  }
  ~TcpTransport() override { close(); }

  std::string kind() const override { return "tcp"; }

  std::string listen(const std::string& address) override {
    std::string reachable;
    auto acceptor = open_acceptor(io_, address, "tcp", &reachable);
    std::lock_guard<std::mutex> lock(mu_);
    acceptors_.push_back(std::move(acceptor));
    accept(acceptors_.back().get());
    return reachable;
  }

  void connect(const std::string& peer_id, const std::string& address) override {
    split_host_port(address);  // validate now, in the caller's thread
    auto d = std::make_shared<Dialer>(Dialer{peer_id, address, 0, asio::steady_timer(io_)});
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      dialers_.push_back(d);
    }
    asio::post(io_, [this, d] { dial(d); });
  }



  void close() override {
    std::set<std::shared_ptr<TcpConnection>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      live = live_;
    }
    asio::post(io_, [this] {
      asio::error_code ec;
      for (auto& a : acceptors_) a->close(ec);
      for (auto& d : dialers_) d->timer.cancel();
      heartbeat_.cancel();
    });
    for (auto& c : live) c->close("transport closed");
    work_.reset();
    // Give queued Byes a moment to leave, then stop whatever is still waiting on a peer.
    const auto deadline = Clock::now() + std::chrono::milliseconds(500);
    while (Clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (live_.empty()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    io_.stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_.clear();
  }

  // --- used by TcpConnection ---------------------------------------------------------
  const TransportOptions& options() const { return options_; }
  asio::io_context& io() { return io_; }

  void connection_admitted(const std::shared_ptr<TcpConnection>& c, const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& d : dialers_) {
      if (d->peer_id == peer && c->dial_peer() == peer) d->attempt = 0;
    }
  }

  void connection_closed(const std::shared_ptr<TcpConnection>& c) {
    std::shared_ptr<Dialer> redial;
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(c);
      if (closing_) return;
      for (auto& d : dialers_) {
        if (!c->dial_peer().empty() && d->peer_id == c->dial_peer()) redial = d;
      }
    }
    if (redial) retry_later(redial);
  }

 private:
  struct Dialer {
    std::string peer_id;
    std::string address;
    int attempt;
    asio::steady_timer timer;
  };

  void accept(tcp::acceptor* acceptor) {
    acceptor->async_accept([this, acceptor](asio::error_code ec, tcp::socket sock) {
      if (ec) return;  // closed
      asio::error_code ignored;
      const auto remote = sock.remote_endpoint(ignored);
      start_connection(std::move(sock), join_host_port(remote.address().to_string(), remote.port()), "");
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
      start_connection(std::move(*sock), remote, d->peer_id);
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

  void start_connection(tcp::socket sock, const std::string& address, const std::string& dial_peer) {
    auto c = std::make_shared<TcpConnection>(*this, std::move(sock), address, dial_peer);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      live_.insert(c);
    }
    c->start();
  }

  void schedule_heartbeat() {
    heartbeat_.expires_after(std::chrono::milliseconds(100));
    heartbeat_.async_wait([this](asio::error_code ec) {
      if (ec) return;
      std::set<std::shared_ptr<TcpConnection>> live;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closing_) return;
        live = live_;
      }
      const auto now = Clock::now();
      for (auto& c : live) c->tick(now);
      schedule_heartbeat();
    });
  }

  TransportOptions options_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer heartbeat_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  bool closing_ = false;                                       // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<tcp::acceptor>> acceptors_;      // GUARDED_BY(mu_)
  std::vector<std::shared_ptr<Dialer>> dialers_;               // GUARDED_BY(mu_)
  std::set<std::shared_ptr<TcpConnection>> live_;              // GUARDED_BY(mu_)
  std::mt19937_64 rng_;                                        // GUARDED_BY(mu_)
};

TcpConnection::TcpConnection(TcpTransport& t, tcp::socket sock, std::string address, std::string dial_peer)
    : t_(t), sock_(std::move(sock)), strand_(asio::make_strand(t.io().get_executor())), handshake_timer_(strand_),
      address_(std::move(address)), dial_peer_(std::move(dial_peer)), decoder_(kHandshakeLimits),
      session_(t.options(), address_,
               Session::Hooks{
                   [this](OutFrame f) { queue(std::move(f), nullptr); },
                   [this](const std::string& reason) { fail(reason, true); },
                   [this](const std::string& peer) {
                     if (!dial_peer_.empty() && peer != dial_peer_) {
                       return fail("admission: dialled peer '" + dial_peer_ + "' but it is '" + peer + "'", true);
                     }
                     handshake_timer_.cancel();
                     counters_.admitted = true;
                     decoder_.set_limits(t_.options().limits);
                     t_.links().admitted(peer, shared_from_this(), address_);
                     t_.connection_admitted(shared_from_this(), peer);
                   },
                   [this](InFrame&& f) { t_.links().deliver(session_.peer_id(), std::move(f)); },
                   [this](const std::string& reason) { t_.links().dropped(session_.peer_id(), address_, reason); },
               }),
      rbuf_(256 * 1024) {}

void TcpConnection::start() {
  asio::error_code ec;
  sock_.set_option(tcp::no_delay(true), ec);
  sock_.set_option(asio::socket_base::keep_alive(true), ec);
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self] {
    handshake_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(t_.options().handshake_timeout_s)));
    handshake_timer_.async_wait([this, self](asio::error_code ec2) {
      if (!ec2 && !session_.admitted()) fail("admission: no valid Hello within the handshake timeout", true);
    });
    session_.start();
    read();
  });
}

// Inside a large payload the socket need not wake this reader for every segment: the
// frame cannot complete before `room` more bytes anyway, so waking at a quarter MiB (or
// what is left of the frame, if less) never delays it, and halves-to-tenths the wake-ups.
// Between frames it is back to 1 byte, so small messages are never held.
void TcpConnection::set_low_water(int bytes) {
  if (bytes == low_water_) return;
  if (::setsockopt(sock_.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0) low_water_ = bytes;
}

void TcpConnection::read() {
  auto self = shared_from_this();
  // Inside a large payload, read straight into the frame's buffer: one copy fewer.
  const auto [direct, room] = decoder_.payload_space(kDirectReadBytes);
  set_low_water(direct != nullptr ? static_cast<int>(std::min<size_t>(room, kLowWaterBytes)) : 1);
  if (direct != nullptr) {
    sock_.async_read_some(asio::buffer(direct, room), asio::bind_executor(strand_, [this, self](asio::error_code ec, size_t n) {
      if (closed_) return;
      if (ec) return fail(ec == asio::error::eof ? "connection closed by peer" : "read: " + ec.message(), false);
      counters_.bytes_received += n;
      const FrameError err = decoder_.commit_payload(n, [&](InFrame&& f) {
        ++counters_.frames_received;
        if (!closed_) session_.on_frame(std::move(f));
      });
      if (err != FrameError::kNone) return fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
      if (!closed_) read();
    }));
    return;
  }
  sock_.async_read_some(asio::buffer(rbuf_), asio::bind_executor(strand_, [this, self](asio::error_code ec, size_t n) {
    if (closed_) return;
    if (ec) return fail(ec == asio::error::eof ? "connection closed by peer" : "read: " + ec.message(), false);
    counters_.bytes_received += n;
    const FrameError err = decoder_.feed(rbuf_.data(), n, [&](InFrame&& f) {
      ++counters_.frames_received;
      if (!closed_) session_.on_frame(std::move(f));
    });
    if (err != FrameError::kNone) return fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
    if (!closed_) read();
  }));
}

void TcpConnection::send(OutFrame frame, SendCallback done) {
  auto self = shared_from_this();
  counters_.queue_depth += 1;
  counters_.queue_bytes += frame.size();
  asio::dispatch(strand_, [this, self, f = std::move(frame), d = std::move(done)]() mutable {
    counters_.queue_depth -= 1;
    counters_.queue_bytes -= f.size();
    if (closed_) {
      if (d) d({false, "tcp: connection to '" + session_.peer_id() + "' closed"});
      return;
    }
    queue(std::move(f), std::move(d));
  });
}

// On the strand.
void TcpConnection::queue(OutFrame frame, SendCallback done) {
  counters_.queue_depth += 1;
  counters_.queue_bytes += frame.size();
  queue_.push_back({std::move(frame), std::move(done)});
  if (!writing_) write_next();
}

void TcpConnection::write_next() {
  if (queue_.empty() || closed_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  const Pending& p = queue_.front();
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(p.frame.head), asio::buffer(p.frame.payload, p.frame.payload_size)};
  auto self = shared_from_this();
  asio::async_write(sock_, bufs, asio::bind_executor(strand_, [this, self](asio::error_code ec, size_t n) {
    if (queue_.empty()) return;
    Pending p = std::move(queue_.front());
    queue_.pop_front();
    counters_.queue_depth -= 1;
    counters_.queue_bytes -= p.frame.size();
    if (ec) {
      if (p.done) p.done({false, "tcp: write to " + address_ + ": " + ec.message()});
      return fail("write: " + ec.message(), false);
    }
    counters_.bytes_sent += n;
    ++counters_.frames_sent;
    if (p.done) p.done({});
    write_next();
  }));
}

void TcpConnection::close(const std::string& reason) {
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self, reason] {
    if (closed_) return;
    if (!session_.admitted()) return fail(reason, false);
    // Say Bye after what is queued, then close.
    queue(session_.bye(reason), [this, self, reason](const SendStatus&) { fail(reason, false); });
  });
}

// On the strand.
void TcpConnection::fail(const std::string& reason, bool rejected) {
  if (closed_) return;
  closed_ = true;
  counters_.open = false;
  asio::error_code ec;
  handshake_timer_.cancel();
  sock_.shutdown(tcp::socket::shutdown_both, ec);
  sock_.close(ec);
  for (auto& p : queue_) {
    if (p.done) p.done({false, "tcp: connection to " + address_ + " closed: " + reason});
  }
  counters_.queue_depth -= queue_.size();
  queue_.clear();
  counters_.queue_bytes = 0;
  if (rejected) t_.links().rejected(session_.peer_id(), address_, reason);
  t_.links().closed(session_.peer_id(), this, address_, reason);
  t_.connection_closed(shared_from_this());
}

LinkStats TcpConnection::stats() const { return counters_.snapshot(); }

void TcpConnection::tick(Clock::time_point now) {
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self, now] {
    if (closed_) return;
    session_.tick(now);
    counters_.rtt_s = session_.rtt_s();
  });
}

}  // namespace

std::unique_ptr<Transport> create_tcp_transport(const TransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace hearsay
