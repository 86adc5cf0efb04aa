// The fabric transport's progress thread, the one thread that drives the endpoint: it runs
// the tasks other threads hand it, posts the queued frames, reads the completion queue and
// hands each completion to its connection, and ticks the connections' sessions. It keeps
// the connections by fabric address, and the messages that arrive from an address whose
// connection has not started yet.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../link_table.h"
#include "fabric_endpoint.h"

namespace hearsay::fabric {

class FabricProgress {
 public:
  // `endpoint` must be open before start(); all three outlive this.
  FabricProgress(FabricEndpoint& endpoint, const TransportOptions& options, LinkTable& links);
  ~FabricProgress() { stop(); }

  void start();
  bool running() const { return thread_.joinable(); }
  // Stops the thread and waits for it; what is queued stays (see fail_all). Idempotent.
  void stop();

  // --- any thread ----------------------------------------------------------------------
  void run(std::function<void()> task);
  // Runs fn on the progress thread (at once when called there) and waits for it. false
  // when the thread is not running or stopped before it got to fn, which then never runs.
  bool call(const std::function<void()>& fn);
  void enqueue(std::shared_ptr<FrameInFlight> f);
  // Nothing queued to send and no send in the provider's hands.
  bool idle();
  // The bootstrap's part: inserts a peer's endpoint name into the address vector (messages
  // from it are kept from then on, until its connection starts); waits for it.
  fi_addr_t insert_address(const std::string& name, std::string* error);
  // A bootstrap that ended before its connection started keeps nothing.
  void forget_early(fi_addr_t addr);

  // --- progress thread ------------------------------------------------------------------
  // Takes over the connection's address (failing an older one there), starts it and hands
  // it what arrived early.
  void add(const std::shared_ptr<FabricConnection>& c);
  void remove(const FabricConnection& c);
  std::vector<std::shared_ptr<FabricConnection>> connections() const;
  // Posts a tagged receive of exactly len bytes at dst, which c owns; nullptr and the
  // error if the provider refuses it.
  Op* post_direct_recv(const std::shared_ptr<FabricConnection>& c, uint8_t* dst, size_t len, uint64_t tag, std::string* error);
  // A closed connection's frames still in the provider's hands fail now: a send whose
  // receiver went away may never complete (a direct payload nobody will receive), and
  // the sender must not wait for it. Their memory stays with their ops until they
  // complete or the endpoint closes.
  void abandon_sends(const FabricConnection* c, const std::string& reason);
  // Takes and drops whatever direct payloads a closed link's stream still receives, for
  // a while (kDiscardFor): each completes its sender's send, which frees the sender's
  // memory and the provider's unexpected-message entry here.
  void discard_stream(uint32_t stream);
  void cancel(Op* op) { endpoint_.cancel(op); }
  // Hands out every completion that has arrived (a closing peer's last messages).
  void drain_completions();

  // --- after stop(), on the closing thread ------------------------------------------------
  // Fails the frames that never left and the connections still open.
  void fail_all(const std::string& reason);

 private:
  void loop();
  bool poll_completions();  // one read of the queue; whether it had anything
  bool post_sends();
  void finish(const std::shared_ptr<FrameInFlight>& f);
  bool post_discard(Op* op);
  void complete(Op* op, bool ok, const std::string& error, fi_addr_t src, size_t len);

  FabricEndpoint& endpoint_;
  const TransportOptions& options_;
  LinkTable& links_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> inflight_sends_{0};
  // Messages from an address inserted by a bootstrap whose connection has not started
  // yet (the other side may start first); handed to the connection when it does.
  struct Early {
    std::vector<std::vector<uint8_t>> messages;
    size_t bytes = 0;
  };
  std::map<fi_addr_t, Early> early_;                                // progress thread
  std::map<fi_addr_t, std::shared_ptr<FabricConnection>> by_addr_;  // progress thread

  std::thread::id thread_id_;  // set by start(), before the thread runs

  std::mutex mu_;
  std::condition_variable called_;                          // a call() finished, or the thread ended
  bool started_ = false, ended_ = false;                    // GUARDED_BY(mu_)
  std::deque<std::shared_ptr<FrameInFlight>> send_queue_;  // GUARDED_BY(mu_)
  std::vector<std::function<void()>> tasks_;               // GUARDED_BY(mu_)
};

}  // namespace hearsay::fabric
