#include "inproc_transport.h"

#include <atomic>
#include <future>
#include <condition_variable>
#include <deque>
#include <map>
#include <set>
#include <thread>

#include "../backoff.h"
#include "../link_table.h"
#include "../session_connection.h"
#include "../timed_executor.h"
#include "hearsay/process.h"
#include "hearsay/error.h"

namespace hearsay {
namespace {

using Clock = std::chrono::steady_clock;

using Mailbox = TimedExecutor;

class InprocTransport;

class InprocConnection final : public SessionConnection, public std::enable_shared_from_this<InprocConnection> {
 public:
  InprocConnection(InprocTransport& t, std::shared_ptr<Mailbox> home, std::string address, std::string dial_peer);
  void pair_with(const std::shared_ptr<InprocConnection>& other) {
    other_ = other;
    other_home_ = other->home_;
  }
  void start();
  void send(OutFrame frame, SendCallback done) override;
  void close(const std::string& reason) override;
  // On our own thread.
  void close_now(const std::string& reason);
  void tick(Clock::time_point now) { tick_session(now); }
  void on_bytes(const std::shared_ptr<const std::string>& bytes);
  void remote_closed();

 private:
  void transmit(const OutFrame& frame);
  void fail(const std::string& reason, bool rejected);

  InprocTransport& t_;
  std::shared_ptr<Mailbox> home_;
  std::weak_ptr<InprocConnection> other_;
  std::weak_ptr<Mailbox> other_home_;
  FrameDecoder decoder_;
};

// Process-wide directory of listening inproc transports.
std::mutex g_directory_mu;
std::map<std::string, InprocTransport*> g_directory;
std::atomic<uint64_t> g_next_name{0};

class InprocTransport final : public LinkTableTransport {
 public:
  explicit InprocTransport(const TransportOptions& o) : LinkTableTransport("inproc"), options_(o), home_(std::make_shared<Mailbox>()) {
    if (options_.secret.empty()) throw InputError("inproc transport: the cluster secret is empty");
    if (options_.peer_id.empty()) throw InputError("inproc transport: peer id is empty");
    thread_ = std::thread([this] { run_thread("the inproc transport's thread", [this] { home_->run(); }); });
    schedule_heartbeat();
  }
  ~InprocTransport() override { close(); }

  std::string kind() const override { return "inproc"; }

  std::string listen(const std::string& address) override {
    const std::string name = address.empty() ? "inproc-" + std::to_string(++g_next_name) : address;
    std::lock_guard<std::mutex> lock(g_directory_mu);
    if (g_directory.count(name) != 0) throw InputError("inproc: address '" + name + "' is already in use");
    g_directory[name] = this;
    names_.push_back(name);
    return name;
  }

  void connect(const std::string& peer_id, const std::string& address) override {
    home_->post([this, peer_id, address] { dial(peer_id, address, 0); });
  }



  void close() override {
    if (closing_.exchange(true)) return;
    {
      std::lock_guard<std::mutex> lock(g_directory_mu);
      for (const auto& n : names_) g_directory.erase(n);
    }
    // Close every connection on our own thread (Bye first), then stop it.
    std::promise<void> done;
    home_->post([this, &done] {
      for (auto& c : std::set<std::shared_ptr<InprocConnection>>(live_)) c->close_now("transport closed");
      done.set_value();
    });
    done.get_future().wait_for(std::chrono::seconds(2));
    home_->stop();
    if (thread_.joinable()) thread_.join();
    live_.clear();
  }

  // --- used by InprocConnection, on our thread ----------------------------------------
  const TransportOptions& options() const { return options_; }
  bool closing() const { return closing_; }
  void add_live(const std::shared_ptr<InprocConnection>& c) { live_.insert(c); }
  void connection_closed(const std::shared_ptr<InprocConnection>& c) {
    live_.erase(c);
    if (closing_ || c->dial_peer().empty() || c->displaced()) return;
    const auto it = dial_targets_.find(c->dial_peer());
    if (it == dial_targets_.end()) return;
    // Back off before redialling, so a peer that keeps refusing us is not hammered.
    const int attempt = ++redials_[it->first];
    const double delay = backoff_delay(options_, attempt, rng_);
    home_->post([this, peer = it->first, address = it->second, attempt] { dial(peer, address, attempt); },
                Clock::now() + seconds_to_duration(delay));
  }
  void reset_backoff(const std::string& peer) { redials_.erase(peer); }
  const std::shared_ptr<Mailbox>& home() const { return home_; }

  // Called on the acceptor's thread to take the far end of a new connection.
  void accept(const std::shared_ptr<InprocConnection>& local) {
    add_live(local);
    local->start();
  }

 private:
  void dial(const std::string& peer_id, const std::string& address, int attempt) {
    if (closing_) return;
    dial_targets_[peer_id] = address;
    InprocTransport* target = nullptr;
    {
      std::lock_guard<std::mutex> lock(g_directory_mu);
      const auto it = g_directory.find(address);
      if (it != g_directory.end()) target = it->second;
    }
    if (target == nullptr || target->closing()) {
      const double delay = backoff_delay(options_, attempt, rng_);
      home_->post([this, peer_id, address, attempt] { dial(peer_id, address, attempt + 1); },
                  Clock::now() + seconds_to_duration(delay));
      return;
    }
    auto mine = std::make_shared<InprocConnection>(*this, home_, address, peer_id);
    auto theirs = std::make_shared<InprocConnection>(*target, target->home(), options_.peer_id + "@inproc", "");
    mine->pair_with(theirs);
    theirs->pair_with(mine);
    add_live(mine);
    // The far end starts on its own thread; frames it receives before then wait in its mailbox.
    target->home()->post([target, theirs] { target->accept(theirs); });
    mine->start();
  }

  void schedule_heartbeat() {
    home_->post(
        [this] {
          if (closing_) return;
          const auto now = Clock::now();
          for (auto& c : std::set<std::shared_ptr<InprocConnection>>(live_)) c->tick(now);
          schedule_heartbeat();
        },
        Clock::now() + std::chrono::milliseconds(100));
  }

  TransportOptions options_;
  std::shared_ptr<Mailbox> home_;
  std::thread thread_;
  std::atomic<bool> closing_{false};
  std::vector<std::string> names_;
  std::set<std::shared_ptr<InprocConnection>> live_;  // only touched on our thread
  std::map<std::string, std::string> dial_targets_;   // only touched on our thread
  std::map<std::string, int> redials_;                 // only touched on our thread
  std::mt19937_64 rng_{std::random_device{}()};        // only touched on our thread
};

InprocConnection::InprocConnection(InprocTransport& t, std::shared_ptr<Mailbox> home, std::string address,
                                   std::string dial_peer)
    : SessionConnection(t.options(), std::move(address), std::move(dial_peer),
                        Session::Hooks{
                            [this](OutFrame f) { transmit(f); },
                            [this](const std::string& reason) { fail(reason, true); },
                            [this](const std::string& peer) {
                              counters_.admitted = true;
                              t_.reset_backoff(peer);
                              decoder_.set_limits(t_.options().limits);
                              t_.links().admitted(peer, shared_from_this(), address_);
                            },
                            [this](InFrame&& f) { t_.links().deliver(session_.peer_id(), std::move(f)); },
                            [this](const std::string& reason) { t_.links().dropped(session_.peer_id(), address_, reason); },
                        }),
      t_(t), home_(std::move(home)), decoder_(kHandshakeLimits) {}

void InprocConnection::start() {
  session_.start();
  auto self = shared_from_this();
  home_->post(
      [this, self] {
        if (!closed_ && !session_.admitted()) fail("admission: no valid Hello within the handshake timeout", true);
      },
      Clock::now() + seconds_to_duration(t_.options().handshake_timeout_s));
}

// On our thread: hands the frame's bytes to the other end's mailbox.
void InprocConnection::transmit(const OutFrame& frame) {
  auto bytes = std::make_shared<const std::string>(flatten(frame));
  auto other = other_.lock();
  auto home = other_home_.lock();
  if (!other || !home) return;
  counters_.bytes_sent += bytes->size();
  ++counters_.frames_sent;
  home->post([other, bytes] { other->on_bytes(bytes); });
}

void InprocConnection::send(OutFrame frame, SendCallback done) {
  auto self = shared_from_this();
  ++counters_.queue_depth;
  home_->post([this, self, f = std::move(frame), d = std::move(done)] {
    --counters_.queue_depth;
    if (closed_) {
      if (d) d({false, "inproc: connection to '" + session_.peer_id() + "' closed"});
      return;
    }
    transmit(f);
    if (d) d({});
  });
}

void InprocConnection::on_bytes(const std::shared_ptr<const std::string>& bytes) {
  if (closed_) return;
  counters_.bytes_received += bytes->size();
  const FrameError err = decoder_.feed(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size(), [&](InFrame&& f) {
    ++counters_.frames_received;
    if (!closed_) session_.on_frame(std::move(f));
  });
  if (err != FrameError::kNone) fail(std::string(frame_error_name(err)) + ": " + decoder_.detail(), true);
}

void InprocConnection::close(const std::string& reason) {
  auto self = shared_from_this();
  home_->post([this, self, reason] { close_now(reason); });
}

void InprocConnection::close_now(const std::string& reason) {
  if (closed_) return;
  if (session_.admitted()) transmit(bye(reason));
  fail(reason, false);
}

void InprocConnection::remote_closed() { fail("connection closed by peer", false); }

void InprocConnection::fail(const std::string& reason, bool rejected) {
  if (!mark_closed()) return;
  if (auto other = other_.lock()) {
    if (auto home = other_home_.lock()) home->post([other] { other->remote_closed(); });
  }
  report_end(t_.links(), reason, rejected);
  t_.connection_closed(shared_from_this());
}

}  // namespace

std::unique_ptr<Transport> create_inproc_transport(const TransportOptions& options) {
  return std::make_unique<InprocTransport>(options);
}

}  // namespace hearsay
