#include "tcp_transport.h"

#include <openssl/err.h>
#include <sys/socket.h>

#include <cerrno>

#include <algorithm>
#include <asio.hpp>
#include <asio/ssl.hpp>
#include <atomic>
#include <deque>
#include <set>
#include <thread>

#include "../address.h"
#include "../asio_helpers.h"
#include "../dialer.h"
#include "../link_table.h"
#include "../session_connection.h"
#include "hearsay/process.h"
#include "hearsay/error.h"
#include "tls.h"

namespace hearsay {
namespace {

using asio::ip::tcp;
using Clock = std::chrono::steady_clock;
constexpr size_t kDirectReadBytes = 64 * 1024;
constexpr size_t kLowWaterBytes = 256 * 1024;
// A connection reads into a small buffer until its peer is admitted, a large one after.
constexpr size_t kUnadmittedReadBytes = 4 * 1024;
constexpr size_t kReadBytes = 256 * 1024;
// What OpenSSL may hold read ahead of the reader (its read buffer, kTlsReadAheadBytes
// in tls.cpp, plus a record), so the low-water mark never waits for bytes that already
// left the socket.
constexpr size_t kTlsBufferedBytes = 96 * 1024;
// Plaintext a connection encrypts or decrypts per turn on its strand before it lets its
// other work (the other direction, timers) run.
constexpr size_t kTlsTurnBytes = 1 << 20;

class TcpTransport;

class TcpConnection final : public SessionConnection, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(TcpTransport& t, tcp::socket sock, std::string address, std::string dial_peer);
  ~TcpConnection() override;
  void start();
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  void tick(Clock::time_point now);
  // An accepted connection counted against max_unadmitted. GUARDED_BY(t_.mu_)
  bool holds_slot = false;

 private:
  void begin();
  void read();
  // Where the next bytes go: straight into the frame's payload when inside a large one
  // (`direct`), else the read buffer.
  std::pair<uint8_t*, size_t> read_space(bool* direct);
  // Hands n bytes just read to the decoder; false once the connection failed.
  bool consume(bool direct, size_t n);
  void write_done(const asio::error_code& ec, size_t n);
  // TLS: OpenSSL reads and writes the (non-blocking) socket itself, records into and out
  // of the frames' own memory; the strand waits on the socket only when OpenSSL would
  // block, so a large payload costs no handler per record.
  void tls_handshake();
  void tls_read();
  void tls_write();
  void tls_flush();
  // Runs one SSL call (`call`, returning 1 on success) with OpenSSL's error queue cleared
  // first. kWaiting: it would block, and `retry` runs on the strand once the socket is
  // ready; kFailed: *error says why.
  enum class TlsStep { kDone, kWaiting, kFailed };
  template <class Call>
  TlsStep tls_step(Call call, void (TcpConnection::*retry)(), asio::error_code* error);
  // After an SSL call returned r: waits as OpenSSL asks, then runs `retry` on the strand.
  // false when r is a failure, not a wait.
  bool tls_wait(int r, void (TcpConnection::*retry)());
  asio::error_code tls_error(int r, int saved_errno);
  void set_low_water(int bytes);
  void queue(OutFrame frame, SendCallback done);
  void write_next();
  void fail(const std::string& reason, bool rejected);

  TcpTransport& t_;
  TlsNote tls_note_;              // read by ssl_'s callbacks
  tcp::socket sock_;
  SSL* ssl_ = nullptr;            // owned; null: plain TCP
  size_t tls_written_ = 0;        // bytes of the front frame OpenSSL has taken
  asio::strand<asio::any_io_executor> strand_;
  asio::steady_timer handshake_timer_;
  FrameDecoder decoder_;
  struct Pending {
    OutFrame frame;
    SendCallback done;
  };
  std::deque<Pending> queue_;
  bool writing_ = false;
  std::vector<uint8_t> rbuf_;
  int low_water_ = 1;         // SO_RCVLOWAT now set on the socket
  int low_water_wanted_ = 1;  // what read_space last asked for (before the cap)
};

class TcpTransport final : public LinkTableTransport {
 public:
  explicit TcpTransport(const TransportOptions& o)
      : LinkTableTransport("tcp"), options_(o), work_(asio::make_work_guard(io_)), heartbeat_(io_),
        dialer_(io_, options_, links_, [this](const Dialer::TargetPtr& target, std::shared_ptr<tcp::socket> sock, const std::string& remote) {
          start_connection(std::move(*sock), remote, target->peer_id);
        }) {
    if (options_.secret.empty()) throw InputError("tcp transport: the cluster secret is empty");
    if (options_.peer_id.empty()) throw InputError("tcp transport: peer id is empty");
    if (options_.tls) {
      tls_ = std::make_unique<TlsContext>(options_);
    } else if (!options_.tls_cert_file.empty() || !options_.tls_key_file.empty() || !options_.tls_ca_file.empty()) {
      throw InputError("tcp transport: TLS certificate files given but tls is off");
    }
    for (int i = 0; i < std::max(1, options_.io_threads); ++i) threads_.emplace_back([this] { run_thread("the tcp transport's io thread", [this] { io_.run(); }); });
    schedule_heartbeat();
  }
  ~TcpTransport() override { close(); }

  std::string kind() const override { return "tcp"; }

  std::string listen(const std::string& address) override {
    std::string reachable;
    auto a = std::make_unique<Acceptor>(Acceptor{std::move(*open_acceptor(io_, address, "tcp", &reachable)), asio::steady_timer(io_),
                                                 reachable, 0});
    std::lock_guard<std::mutex> lock(mu_);
    acceptors_.push_back(std::move(a));
    accept(acceptors_.back().get());
    return reachable;
  }

  void connect(const std::string& peer_id, const std::string& address) override {
    split_host_port(address);  // validate now, in the caller's thread
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
    }
    dialer_.add(peer_id, address);
  }

  void close() override {
    std::set<std::shared_ptr<TcpConnection>> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      live = live_;
    }
    dialer_.stop();
    asio::post(io_, [this] {
      asio::error_code ec;
      for (auto& a : acceptors_) {
        a->socket.close(ec);
        a->retry.cancel();
      }
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
    // The link table (the base class's, destroyed after this class's io context) must not
    // hold the last reference to a connection: its strand needs the io context alive. They
    // are let go here, while it is (a peer with connections still up at its end read freed
    // memory in its destructor: AddressSanitizer, 5 peers).
    const auto taken = links_.take_all();
    std::lock_guard<std::mutex> lock(mu_);
    live_.clear();
    // The io threads may have stopped before they ran the handler above: the listening
    // ports close here too, so they are free once close() returns (a peer closed and
    // started again in one process listens on the same address).
    asio::error_code ec;
    for (auto& a : acceptors_) a->socket.close(ec);
  }

  // --- used by TcpConnection ---------------------------------------------------------
  const TransportOptions& options() const { return options_; }
  asio::io_context& io() { return io_; }
  TlsContext* tls() { return tls_.get(); }
  // Under TLS every record is authenticated (AES-GCM or ChaCha20-Poly1305): a payload
  // CRC32C would only repeat that check, weaker, at a cost of two passes per byte.
  bool omits_crc() const override { return tls_ != nullptr; }

  void connection_admitted(const std::shared_ptr<TcpConnection>& c, const std::string& peer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      release_slot(*c);
    }
    // Only a connection we dialled to that peer proves the address works.
    if (c->dial_peer() == peer) dialer_.reset_backoff(peer);
  }

  void connection_closed(const std::shared_ptr<TcpConnection>& c) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.erase(c);
      release_slot(*c);
      if (closing_) return;
    }
    if (!c->dial_peer().empty() && !c->displaced()) dialer_.redial(c->dial_peer());
  }

 private:
  struct Acceptor {
    tcp::acceptor socket;
    asio::steady_timer retry;
    std::string address;
    double delay_s;  // back-off after a failed accept; 0 while accepting works
  };

  void accept(Acceptor* a) {
    a->socket.async_accept([this, a](asio::error_code ec, tcp::socket sock) {
      if (ec == asio::error::operation_aborted || !a->socket.is_open()) return;  // closed
      if (ec) return accept_failed(a, ec);
      a->delay_s = 0;
      asio::error_code ignored;
      const auto remote = sock.remote_endpoint(ignored);
      start_connection(std::move(sock), join_host_port(remote.address().to_string(), remote.port()), "");
      accept(a);
    });
  }

  // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays in the
  // backlog, so try again later, not at once (that would spin) and not never (the
  // acceptor would be dead for good). Reported once per episode.
  void accept_failed(Acceptor* a, const asio::error_code& ec) {
    if (a->delay_s == 0) {
      links().rejected("", a->address, "accept: " + ec.message() + "; retrying every 0.1 s to 1 s until it works again");
    }
    a->delay_s = a->delay_s == 0 ? 0.1 : std::min(1.0, 2 * a->delay_s);
    a->retry.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a->delay_s)));
    a->retry.async_wait([this, a](asio::error_code ec2) {
      if (!ec2 && a->socket.is_open()) accept(a);
    });
  }

  // GUARDED_BY(mu_)
  void release_slot(TcpConnection& c) {
    if (!c.holds_slot) return;
    c.holds_slot = false;
    --unadmitted_;
  }

  // An accepted connection takes one of max_unadmitted slots until it is admitted or
  // closed; with none free it is closed at once, so a flood of idle connections costs a
  // bounded number of descriptors and buffers.
  void start_connection(tcp::socket sock, const std::string& address, const std::string& dial_peer) {
    const bool accepted = dial_peer.empty();
    const int cap = std::max(1, options_.max_unadmitted);
    if (accepted) {
      bool full = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closing_) return;
        full = unadmitted_ >= cap;
        if (!full) ++unadmitted_;
      }
      if (full) {
        asio::error_code ec;
        sock.close(ec);
        links().rejected("", address, "admission: too many unadmitted connections (" + std::to_string(cap) + "); closed at once");
        return;
      }
    }
    auto c = std::make_shared<TcpConnection>(*this, std::move(sock), address, dial_peer);
    {
      std::lock_guard<std::mutex> lock(mu_);
      c->holds_slot = accepted;
      if (closing_) return release_slot(*c);
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
  std::unique_ptr<TlsContext> tls_;  // null: plain TCP
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  asio::steady_timer heartbeat_;
  std::vector<std::thread> threads_;
  Dialer dialer_;
  std::mutex mu_;
  bool closing_ = false;                                       // GUARDED_BY(mu_)
  std::vector<std::unique_ptr<Acceptor>> acceptors_;           // GUARDED_BY(mu_)
  int unadmitted_ = 0;                                         // GUARDED_BY(mu_)
  std::set<std::shared_ptr<TcpConnection>> live_;              // GUARDED_BY(mu_)
};

TcpConnection::TcpConnection(TcpTransport& t, tcp::socket sock, std::string address, std::string dial_peer)
    : SessionConnection(t.options(), std::move(address), std::move(dial_peer),
                        Session::Hooks{
                            [this](OutFrame f) { queue(std::move(f), nullptr); },
                            [this](const std::string& reason) { fail(reason, true); },
                            [this](const std::string& peer) {
                              // With certificates, the name proven by the secret must also be the
                              // one the CA vouched for.
                              if (ssl_ != nullptr && t_.tls()->uses_certificates()) {
                                const auto names = TlsContext::peer_names(ssl_);
                                if (std::find(names.begin(), names.end(), peer) == names.end()) {
                                  std::string all;
                                  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
                                  return fail("admission: peer '" + peer + "' is not named in its TLS certificate (" + all + ")", true);
                                }
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
      t_(t), sock_(std::move(sock)), strand_(asio::make_strand(t.io().get_executor())), handshake_timer_(strand_),
      decoder_(kHandshakeLimits),
      rbuf_(kUnadmittedReadBytes) {
  if (t.tls() != nullptr) {
    ssl_ = SSL_new(t.tls()->context().native_handle());
    HEARSAY_CHECK(ssl_ != nullptr, "SSL_new failed");
    TlsContext::set_socket(ssl_, static_cast<int>(sock_.native_handle()));
    // Partial writes: SSL_write returns per record, so progress survives a full socket.
    // Buffers released while idle until admission, so unadmitted connections stay small.
    SSL_set_mode(ssl_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
    TlsContext::attach(ssl_, &tls_note_);
    decoder_.accept_unchecked_payloads(t.omits_crc());  // TLS: the record MAC checks instead
  }
}

TcpConnection::~TcpConnection() {
  if (ssl_ != nullptr) SSL_free(ssl_);  // the socket BIO does not own the descriptor
}

void TcpConnection::start() {
  asio::error_code ec;
  sock_.set_option(tcp::no_delay(true), ec);
  sock_.set_option(asio::socket_base::keep_alive(true), ec);
  sock_.non_blocking(true, ec);
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self] {
    handshake_timer_.expires_after(std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(t_.options().handshake_timeout_s)));
    // The timeout covers the TLS handshake too, and a connection that sends nothing.
    handshake_timer_.async_wait([this, self](asio::error_code ec2) {
      if (!ec2 && !session_.admitted()) fail("admission: no valid Hello within the handshake timeout", true);
    });
    if (ssl_ == nullptr) return begin();
    if (dial_peer_.empty()) {
      SSL_set_accept_state(ssl_);
    } else {
      SSL_set_connect_state(ssl_);
    }
    tls_handshake();
  });
}

template <class Call>
TcpConnection::TlsStep TcpConnection::tls_step(Call call, void (TcpConnection::*retry)(), asio::error_code* error) {
  ERR_clear_error();
  const int r = call();
  const int saved_errno = errno;
  if (r == 1) return TlsStep::kDone;
  if (tls_wait(r, retry)) return TlsStep::kWaiting;
  *error = tls_error(r, saved_errno);
  return TlsStep::kFailed;
}

void TcpConnection::tls_handshake() {
  asio::error_code ec;
  const TlsStep step = tls_step([this] { return SSL_do_handshake(ssl_); }, &TcpConnection::tls_handshake, &ec);
  if (step == TlsStep::kDone) return begin();
  if (step == TlsStep::kFailed) fail(TlsContext::failure(ssl_, ec), true);
}

bool TcpConnection::tls_wait(int r, void (TcpConnection::*retry)()) {
  const int e = SSL_get_error(ssl_, r);
  if (e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) return false;
  auto self = shared_from_this();
  sock_.async_wait(e == SSL_ERROR_WANT_READ ? tcp::socket::wait_read : tcp::socket::wait_write,
                   asio::bind_executor(strand_, [this, self, retry](asio::error_code ec) {
                     if (closed_) return;
                     if (ec) return fail("tls: waiting on the socket: " + ec.message(), false);
                     (this->*retry)();
                   }));
  return true;
}

// An SSL call's failure as an error code: the peer's end (close_notify, or the socket
// closing, which TLS calls truncation), a socket error, or OpenSSL's own.
asio::error_code TcpConnection::tls_error(int r, int saved_errno) {
  const int e = SSL_get_error(ssl_, r);
  const unsigned long err = ERR_peek_error();
  ERR_clear_error();
  if (e == SSL_ERROR_ZERO_RETURN) return asio::error::eof;
  if (e == SSL_ERROR_SYSCALL && err == 0) {
    return saved_errno != 0 ? asio::error_code(saved_errno, asio::system_category()) : asio::ssl::error::stream_truncated;
  }
  if (ERR_GET_REASON(err) == SSL_R_UNEXPECTED_EOF_WHILE_READING) return asio::ssl::error::stream_truncated;
  return asio::error_code(static_cast<int>(err), asio::error::get_ssl_category());
}

// On the strand, once the bytes are private (TLS) or at once (plain): admission.
void TcpConnection::begin() {
  session_.start();
  read();
}

// Inside a large payload the socket need not wake this reader for every segment: the
// frame cannot complete before `room` more bytes anyway, so waking at a quarter MiB (or
// what is left of the frame, if less) never delays it, and halves-to-tenths the wake-ups.
// Between frames it is back to 1 byte, so small messages are never held.
//
// Never above half the receive buffer: the window the sender may fill is smaller than
// the buffer (a fresh connection's is about 114 KiB of 128 KiB), and a mark above it is
// reached only after the sender's zero-window probe (0.2-0.5 s; seen with TLS, whose
// socket BIO sends in 128 KiB bursts).
void TcpConnection::set_low_water(int bytes) {
  if (bytes == low_water_wanted_) return;
  low_water_wanted_ = bytes;
  if (bytes > 1) {
    int rcvbuf = 0;
    socklen_t len = sizeof rcvbuf;
    if (::getsockopt(sock_.native_handle(), SOL_SOCKET, SO_RCVBUF, &rcvbuf, &len) != 0) rcvbuf = 0;
    bytes = std::max(1, std::min(bytes, rcvbuf / 2));
  }
  if (bytes == low_water_) return;
  if (::setsockopt(sock_.native_handle(), SOL_SOCKET, SO_RCVLOWAT, &bytes, sizeof bytes) == 0) low_water_ = bytes;
}

// The reason a read failed: a peer that goes away mid-stream is an ordinary end (TLS
// calls it truncation: hearsay's orderly end is Bye, not close_notify). Before admission
// it is the peer refusing this side, and says what commonly causes that.
static std::string read_failure(const asio::error_code& ec, bool admitted, bool tls) {
  const bool closed = ec == asio::error::eof || ec == asio::ssl::error::stream_truncated || ec == asio::error::connection_reset;
  if (closed && !admitted) {
    return std::string("admission: the peer closed the connection before admitting this side (") +
           (tls ? "another cluster secret or cluster id?)" : "another cluster secret? or it runs TLS: cluster.tls must be the same on every peer)");
  }
  if (ec == asio::error::eof || ec == asio::ssl::error::stream_truncated) return "connection closed by peer";
  return "read: " + ec.message();
}

std::pair<uint8_t*, size_t> TcpConnection::read_space(bool* direct) {
  if (counters_.admitted && rbuf_.size() < kReadBytes) {
    rbuf_ = std::vector<uint8_t>(kReadBytes);
    // OpenSSL may keep its record buffers from now on.
    if (ssl_ != nullptr) SSL_clear_mode(ssl_, SSL_MODE_RELEASE_BUFFERS);
  }
  // Inside a large payload, read straight into the frame's buffer: one copy fewer (with
  // TLS too: OpenSSL decrypts into it).
  const auto [space, room] = decoder_.payload_space(kDirectReadBytes);
  *direct = space != nullptr;
  size_t low_water = *direct ? std::min<size_t>(room, kLowWaterBytes) : 1;
  if (ssl_ != nullptr) low_water = low_water > 2 * kTlsBufferedBytes ? low_water - kTlsBufferedBytes : 1;
  set_low_water(static_cast<int>(low_water));
  if (*direct) return {space, room};
  return {rbuf_.data(), rbuf_.size()};
}

bool TcpConnection::consume(bool direct, size_t n) {
  const bool first = counters_.bytes_received == 0;
  counters_.bytes_received += n;
  auto on_frame = [&](InFrame&& f) {
    ++counters_.frames_received;
    if (!closed_) session_.on_frame(std::move(f));
  };
  const FrameError err = direct ? decoder_.commit_payload(n, on_frame) : decoder_.feed(rbuf_.data(), n, on_frame);
  // A TLS record (alert 0x15 or handshake 0x16, version 3.x) where a frame should start.
  if (err == FrameError::kBadMagic && first && ssl_ == nullptr && !direct && n >= 2 && (rbuf_[0] == 0x15 || rbuf_[0] == 0x16) &&
      rbuf_[1] == 0x03) {
    fail("admission: the peer speaks TLS and this side does not (cluster.tls must be the same on every peer)", true);
    return false;
  }
  if (err != FrameError::kNone) {
    fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
    return false;
  }
  return !closed_;
}

void TcpConnection::read() {
  if (ssl_ != nullptr) return tls_read();
  auto self = shared_from_this();
  bool direct = false;
  const auto [space, room] = read_space(&direct);
  sock_.async_read_some(asio::buffer(space, room), asio::bind_executor(strand_, [this, self, direct](asio::error_code ec, size_t n) {
    if (closed_) return;
    if (ec) return fail(read_failure(ec, session_.admitted(), false), !session_.admitted());
    if (consume(direct, n)) read();
  }));
}

void TcpConnection::tls_read() {
  for (size_t turn = 0; turn < kTlsTurnBytes && !closed_;) {
    bool direct = false;
    const auto [space, room] = read_space(&direct);
    size_t n = 0;
    asio::error_code ec;
    const TlsStep step = tls_step([&] { return SSL_read_ex(ssl_, space, room, &n); }, &TcpConnection::tls_read, &ec);
    if (step == TlsStep::kWaiting) return;
    if (step == TlsStep::kFailed) return fail(read_failure(ec, session_.admitted(), true), !session_.admitted());
    if (!consume(direct, n)) return;
    turn += n;
  }
  if (closed_) return;
  auto self = shared_from_this();
  asio::post(strand_, [this, self] {
    if (!closed_) tls_read();
  });
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
  if (frame.urgent) {
    // Ahead of the data frames waiting (not of the one being written, nor of other
    // control frames): a heartbeat or an acknowledgement never waits behind a window of
    // a large message's segments.
    auto at = queue_.begin() + (writing_ && !queue_.empty() ? 1 : 0);
    while (at != queue_.end() && at->frame.urgent) ++at;
    queue_.insert(at, {std::move(frame), std::move(done)});
  } else {
    queue_.push_back({std::move(frame), std::move(done)});
  }
  if (!writing_) write_next();
}

void TcpConnection::write_next() {
  if (queue_.empty() || closed_) {
    writing_ = false;
    return;
  }
  writing_ = true;
  if (ssl_ != nullptr) {
    tls_written_ = 0;
    return tls_write();
  }
  const Pending& p = queue_.front();
  const std::array<asio::const_buffer, 2> bufs{asio::buffer(p.frame.head), asio::buffer(p.frame.payload, p.frame.payload_size)};
  auto self = shared_from_this();
  asio::async_write(sock_, bufs, asio::bind_executor(strand_, [this, self](asio::error_code ec, size_t n) { write_done(ec, n); }));
}

// The head, then the payload straight from the sender's memory, a record at a time.
void TcpConnection::tls_write() {
  if (closed_ || queue_.empty()) return;
  const OutFrame& f = queue_.front().frame;
  const size_t head = f.head.size(), total = head + f.payload_size;
  for (size_t turn = 0; tls_written_ < total;) {
    if (turn >= kTlsTurnBytes) {
      auto self = shared_from_this();
      return asio::post(strand_, [this, self] { tls_write(); });
    }
    const bool in_head = tls_written_ < head;
    const uint8_t* from = in_head ? reinterpret_cast<const uint8_t*>(f.head.data()) + tls_written_ : f.payload + (tls_written_ - head);
    const size_t len = in_head ? head - tls_written_ : total - tls_written_;
    size_t n = 0;
    asio::error_code ec;
    const TlsStep step = tls_step([&] { return SSL_write_ex(ssl_, from, len, &n); }, &TcpConnection::tls_write, &ec);
    if (step == TlsStep::kWaiting) return;
    if (step == TlsStep::kFailed) return write_done(ec, 0);
    tls_written_ += n;
    turn += n;
  }
  tls_flush();
}

// The socket BIO gathers records (tls.cpp); a frame is sent once they left it.
void TcpConnection::tls_flush() {
  if (closed_ || queue_.empty()) return;
  BIO* out = SSL_get_wbio(ssl_);
  errno = 0;
  if (BIO_flush(out) > 0) return write_done({}, queue_.front().frame.size());
  const int saved_errno = errno;
  if (!BIO_should_retry(out)) return write_done(asio::error_code(saved_errno, asio::system_category()), 0);
  auto self = shared_from_this();
  sock_.async_wait(tcp::socket::wait_write, asio::bind_executor(strand_, [this, self](asio::error_code ec) {
    if (closed_) return;
    if (ec) return write_done(ec, 0);
    tls_flush();
  }));
}

void TcpConnection::write_done(const asio::error_code& ec, size_t n) {
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
}

void TcpConnection::close(const std::string& reason) {
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self, reason] {
    if (closed_) return;
    if (!session_.admitted()) return fail(reason, false);
    // Say Bye after what is queued, then close.
    queue(bye(reason), [this, self, reason](const SendStatus&) { fail(reason, false); });
  });
}

// On the strand.
void TcpConnection::fail(const std::string& reason, bool rejected) {
  if (!mark_closed()) return;
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
  report_end(t_.links(), reason, rejected);
  t_.connection_closed(shared_from_this());
}

void TcpConnection::tick(Clock::time_point now) {
  auto self = shared_from_this();
  asio::dispatch(strand_, [this, self, now] { tick_session(now); });
}

}  // namespace

std::unique_ptr<Transport> create_tcp_transport(const TransportOptions& options) {
  return std::make_unique<TcpTransport>(options);
}

}  // namespace hearsay
