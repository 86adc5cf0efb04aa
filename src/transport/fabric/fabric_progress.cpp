#include "fabric_progress.h"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <future>

#include "fabric_connection.h"
#include "hearsay/process.h"
#include "hearsay/error.h"

namespace hearsay::fabric {
namespace {

// How long a closed link's stream keeps taking (and discarding) direct payloads that
// were on their way: the sender hears of the close through the bootstrap socket and
// then posts no more; what it had posted completes only once received.
constexpr auto kDiscardFor = std::chrono::seconds(10);
// Messages kept from a peer whose bootstrap is not finished: only handshake frames.
constexpr size_t kMaxEarlyBytes = 64 * 1024;

}  // namespace

FabricProgress::FabricProgress(FabricEndpoint& endpoint, const TransportOptions& options, LinkTable& links)
    : endpoint_(endpoint), options_(options), links_(links) {}

void FabricProgress::start() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  thread_ = std::thread([this] { run_thread("the fabric transport's progress thread", [this] { loop(); }); });
  thread_id_ = thread_.get_id();
}

void FabricProgress::stop() {
  if (!thread_.joinable()) return;
  stop_ = true;
  thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  ended_ = true;
  called_.notify_all();
}

void FabricProgress::run(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
}

bool FabricProgress::call(const std::function<void()>& fn) {
  auto done = std::make_shared<bool>(false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || ended_) return false;
    if (std::this_thread::get_id() == thread_id_) {
      done.reset();
    } else {
      tasks_.push_back([this, &fn, done] {
        fn();
        std::lock_guard<std::mutex> l(mu_);
        *done = true;
        called_.notify_all();
      });
    }
  }
  if (!done) {  // on the progress thread itself: waiting would never end
    fn();
    return true;
  }
  std::unique_lock<std::mutex> lock(mu_);
  called_.wait(lock, [&] { return *done || ended_; });
  return *done;
}

void FabricProgress::enqueue(std::shared_ptr<FrameInFlight> f) {
  std::lock_guard<std::mutex> lock(mu_);
  send_queue_.push_back(std::move(f));
}

bool FabricProgress::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return send_queue_.empty() && inflight_sends_ == 0;
}

fi_addr_t FabricProgress::insert_address(const std::string& name, std::string* error) {
  auto result = std::make_shared<std::promise<std::pair<fi_addr_t, std::string>>>();
  auto fut = result->get_future();
  run([this, name, result] {
    fi_addr_t addr = FI_ADDR_NOTAVAIL;
    const int ret = endpoint_.insert_address(name, &addr);
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

void FabricProgress::forget_early(fi_addr_t addr) {
  run([this, addr] { early_.erase(addr); });
}

void FabricProgress::add(const std::shared_ptr<FabricConnection>& c) {
  auto old = by_addr_.find(c->addr());
  if (old != by_addr_.end()) {
    const std::shared_ptr<FabricConnection> previous = old->second;  // its fail() erases the entry
    previous->fail("replaced by a new connection", false);
  }
  by_addr_[c->addr()] = c;
  c->start();
  auto early = early_.find(c->addr());
  if (early != early_.end()) {
    for (const auto& m : early->second.messages) c->on_bytes(m.data(), m.size());
    early_.erase(early);
  }
}

void FabricProgress::remove(const FabricConnection& c) { by_addr_.erase(c.addr()); }

std::vector<std::shared_ptr<FabricConnection>> FabricProgress::connections() const {
  std::vector<std::shared_ptr<FabricConnection>> all;
  for (const auto& [addr, c] : by_addr_) all.push_back(c);
  return all;
}

Op* FabricProgress::post_direct_recv(const std::shared_ptr<FabricConnection>& c, uint8_t* dst, size_t len, uint64_t tag,
                                     std::string* error) {
  auto* op = new Op{};
  op->kind = Op::kDirectRecv;
  op->conn = c;
  const int ret = endpoint_.post_tagged_recv(op, dst, len, tag, 0);
  if (ret != 0) {
    delete op;
    *error = fi_error("fi_trecv", ret);
    return nullptr;
  }
  return op;
}

void FabricProgress::abandon_sends(const FabricConnection* c, const std::string& reason) {
  std::vector<std::shared_ptr<FrameInFlight>> frames;
  for (Op* op : endpoint_.posted()) {
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

// The scratch space is as large as any payload may be, because shm (libfabric 1.17) never
// returns from a receive smaller than its message; it is reserved address space, and only
// what arrives is touched.
void FabricProgress::discard_stream(uint32_t stream) {
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
  post_discard(op);
}

// Posts op's receive into its scratch space, matching any tag of its stream; false (op
// deleted) if refused.
bool FabricProgress::post_discard(Op* op) {
  const int ret = endpoint_.post_tagged_recv(op, op->scratch.data(), op->scratch.size(), direct_tag(op->stream, 0), 0xffffffffu);
  if (ret == 0) return true;
  delete op;
  return false;
}

// Posts as much of the send queue as the provider takes.
bool FabricProgress::post_sends() {
  bool did = false;
  const size_t chunk = endpoint_.chunk();
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
      // The head goes as one message; the payload in chunks, or whole when it goes direct.
      const size_t head = f->frame.head.size();
      const uint8_t* src;
      size_t len;
      bool direct = false;
      if (f->posted < head) {
        src = reinterpret_cast<const uint8_t*>(f->frame.head.data()) + f->posted;
        len = std::min(chunk, head - f->posted);
      } else if (f->posted == head && f->conn->sends_direct(f->frame.payload_size)) {
        src = f->frame.payload;
        len = f->frame.payload_size;
        direct = true;
      } else {
        const size_t off = f->posted - head;
        src = f->frame.payload + off;
        len = std::min(chunk, f->frame.payload_size - off);
      }
      auto* op = new Op{};
      op->kind = Op::kSend;
      op->frame = f;
      const ssize_t ret = endpoint_.post_send(op, src, len, f->conn->addr(), direct, direct ? f->conn->send_tag() : 0);
      if (ret == -FI_EAGAIN) {
        delete op;
        return did;
      }
      if (ret != 0) {
        delete op;
        f->failed = true;
        f->error = "fabric: " + fi_error("fi_send", static_cast<int>(ret));
        break;
      }
      if (direct) f->conn->sent_direct();
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

void FabricProgress::finish(const std::shared_ptr<FrameInFlight>& f) {
  if (f->finished) return;
  f->finished = true;
  f->conn->dequeued(f->frame.size());
  if (!f->failed) f->conn->sent(f->frame.size());
  if (f->done) f->done(f->failed ? SendStatus{false, f->error} : SendStatus{});
  f->done = nullptr;
}

void FabricProgress::complete(Op* op, bool ok, const std::string& error, fi_addr_t src, size_t len) {
  if (op->kind == Op::kDiscard) {
    // A payload taken (reported truncated) or the time is up (cancelled).
    if (!op->cancelled && !stop_ && Clock::now() < op->until) {
      op->ctx = fi_context{};
      if (post_discard(op)) return;
    } else {
      delete op;
    }
    endpoint_.posted().erase(op);
    return;
  }
  if (op->kind == Op::kDirectRecv) {
    endpoint_.posted().erase(op);
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
        // Held across the call: a message that fails the link removes it from by_addr_,
        // and nothing else may hold it any more (its bootstrap socket may have closed).
        const std::shared_ptr<FabricConnection> conn = it->second;
        conn->on_bytes(endpoint_.received(op->buffer), len);
      } else if (early != early_.end() && early->second.bytes + len <= kMaxEarlyBytes) {
        const uint8_t* data = endpoint_.received(op->buffer);
        early->second.messages.emplace_back(data, data + len);
        early->second.bytes += len;
      } else {
        links_.dropped("", "fabric",
                       "unknown_source: message from an address no bootstrap introduced (fi_addr " +
                           (src == FI_ADDR_NOTAVAIL ? std::string("not in the address vector") : std::to_string(src)) + ", " +
                           std::to_string(len) + " bytes; " + std::to_string(by_addr_.size()) + " connections, " +
                           std::to_string(early_.size()) + " introduced)");
      }
    }
    if (!stop_) endpoint_.post_recv(op->buffer);
    return;
  }
  auto f = op->frame;
  endpoint_.release_staging(op);
  --inflight_sends_;
  endpoint_.posted().erase(op);
  delete op;
  if (!ok && !f->failed) {
    f->failed = true;
    f->error = "fabric: send failed: " + error;
    f->conn->fail("send failed: " + error, false);
  }
  if (--f->outstanding == 0 && (f->posted == f->total() || f->failed)) finish(f);
}

bool FabricProgress::poll_completions() {
  fi_cq_data_entry entries[16];
  fi_addr_t sources[16];
  const ssize_t n = endpoint_.read_completions(entries, 16, sources);
  if (n > 0) {
    for (ssize_t i = 0; i < n; ++i) complete(static_cast<Op*>(entries[i].op_context), true, "", sources[i], entries[i].len);
    return true;
  }
  if (n == -FI_EAVAIL) {
    std::string text;
    if (Op* op = endpoint_.read_error(&text)) complete(op, false, text, FI_ADDR_NOTAVAIL, 0);
    return true;
  }
  return false;
}

void FabricProgress::drain_completions() {
  // Reading the queue is also what moves a manual-progress provider's bytes along, so an
  // empty read or two is not yet the end; bounded, so a busy link cannot hold us here.
  for (int quiet = 0, reads = 0; quiet < 4 && reads < 256; ++reads) quiet = poll_completions() ? 0 : quiet + 1;
}

void FabricProgress::loop() {
  int idle = 0;
  auto last_tick = Clock::now(), idle_since = last_tick;
  while (!stop_) {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t();
    bool busy = !tasks.empty();
    busy |= poll_completions();
    busy |= post_sends();
    const auto now = Clock::now();
    if (now - last_tick > std::chrono::milliseconds(50)) {
      last_tick = now;
      for (auto& c : connections()) c->tick(now);
      for (Op* op : endpoint_.posted()) {
        if (op->kind == Op::kDiscard && !op->cancelled && now >= op->until) {
          op->cancelled = true;
          endpoint_.cancel(op);
        }
      }
    }
    // Spin while there is work, then back off to short sleeps, and after 100 ms with
    // nothing to 1 ms ones: every empty poll of the tcp provider is a system call, and
    // idle peers polling 20,000 times a second kept the cores of a 2-core machine busy
    // (a fabric transport test under ThreadSanitizer used half the CPU time after this).
    // A message to or from an idle peer waits up to 1 ms more; one under way never does.
    if (busy) {
      idle = 0;
      idle_since = now;
    } else {
      ++idle;
    }
    if (now - idle_since > std::chrono::milliseconds(100)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else if (idle > 2000) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

void FabricProgress::fail_all(const std::string& reason) {
  std::deque<std::shared_ptr<FrameInFlight>> never_left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    never_left.swap(send_queue_);
  }
  for (auto& f : never_left) {
    if (f->done) f->done({false, "fabric: " + reason});
  }
  for (auto& c : connections()) {
    if (!c->closed()) c->fail(reason, false);
  }
  by_addr_.clear();
}

}  // namespace hearsay::fabric
