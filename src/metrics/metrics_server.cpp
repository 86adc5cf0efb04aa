// /metrics over HTTP with libmicrohttpd (Debian's libmicrohttpd-dev, 0.9.75). A thread of
// this server's own runs MHD's loop, so a scrape never runs on the training loop.
//
// Bounded against slow or hostile clients (docs/OPERATIONS.md, "Metrics"): MHD's own
// timeout is an idle timeout that every byte resets, so a client trickling a byte a second
// would hold its connection forever. Every connection here has a total deadline from its
// accept instead: the loop shuts down the socket of one still open after kDeadline, whatever
// it is sending. With one request per connection (every answer says "Connection: close")
// that is a deadline per request, and a slot held by a slow client is free again within
// kDeadline. A request is answered as soon as its headers are in: a body is never read
// (a scrape has none), so an endless or ill-framed body costs nothing.
#include <microhttpd.h>
#include <netdb.h>
#include <strings.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "../transport/address.h"
#include "hearsay/error.h"
#include "hearsay/metrics.h"

namespace hearsay {

namespace {

using Steady = std::chrono::steady_clock;

// Enough for many scrapers and a burst of attackers' connections at once: at the limit MHD
// stops accepting, and a real scrape would wait in the listen queue behind them. Bounded
// all the same (each costs a descriptor and up to kConnectionMemory).
constexpr unsigned kMaxConnections = 256;
// One address (one attacker) holds half at most. Not lower: a scraper may share an address
// with whatever else connects (loopback, a NAT), and at its limit MHD closes the new one.
constexpr unsigned kMaxPerAddress = 128;
// Everything a scrape needs, sent and answered on a LAN or a WAN in milliseconds.
constexpr auto kDeadline = std::chrono::seconds(2);
// How often the loop wakes to look for connections past their deadline at most.
constexpr int32_t kTick_ms = 100;
// A request's line and headers (the answer's body is not kept in this pool).
constexpr size_t kConnectionMemory = 16 * 1024;

// MHD's daemon and the loop that runs it; the callbacks below get it as their closure.
class Loop {
 public:
  MHD_Daemon* d = nullptr;
  std::string what;  // for messages: whose server this is

  ~Loop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (d != nullptr) MHD_stop_daemon(d);
  }
  void start() {
    thread_ = std::thread([this] { run(); });
  }

  void opened(MHD_Connection* c, int fd) { open_[c] = {fd, Steady::now()}; }
  void closed(MHD_Connection* c) { open_.erase(c); }

 private:
  struct Open {
    int fd;
    Steady::time_point accepted;
    bool shut = false;
  };

  void run() {
    bool reported = false;
    while (!stop_.load()) {
      if (MHD_run_wait(d, kTick_ms) != MHD_YES) {
        if (!reported) std::fprintf(stderr, "hearsay: %s: the metrics server's poll failed; retrying\n", what.c_str());
        reported = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(kTick_ms));
      }
      shut_overdue(Steady::now());
    }
  }

  // A connection past its deadline is shut down, not closed: MHD still owns the descriptor
  // and closes it when its next poll sees the end of the stream (and tells on_connection).
  // The entry goes only then (MHD tells before it closes the descriptor), so a descriptor
  // number is never touched after MHD closed it and something else may have it.
  void shut_overdue(Steady::time_point now) {
    for (auto& [c, o] : open_) {
      if (!o.shut && now - o.accepted >= kDeadline) {
        shutdown(o.fd, SHUT_RDWR);
        o.shut = true;
      }
    }
  }

  std::atomic<bool> stop_{false};
  // Filled and read only on the loop thread: MHD calls on_connection from inside
  // MHD_run_wait there (and from MHD_stop_daemon, once the loop has ended).
  std::map<MHD_Connection*, Open> open_;
  std::thread thread_;
};

void on_connection(void* cls, MHD_Connection* c, void**, MHD_ConnectionNotificationCode code) {
  auto& loop = *static_cast<Loop*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    loop.closed(c);
  } else if (const MHD_ConnectionInfo* info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD)) {
    loop.opened(c, info->connect_fd);
  }
}

MHD_Result reply(MHD_Connection* c, unsigned status, const std::string& body, const char* type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  // One request per connection: the deadline from accept is then the request's.
  MHD_add_response_header(r, "Connection", "close");
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
  const MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result count_content_length(void* cls, MHD_ValueKind, const char* key, const char*) {
  if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) ++*static_cast<int*>(cls);
  return MHD_YES;
}

// The answer to a request that is refused on its headers alone ({0, ""} when it is not).
// MHD itself takes the first of two Content-Lengths and waits for that many bytes.
std::pair<unsigned, const char*> refusal(MHD_Connection* c, bool get_or_head) {
  int lengths = 0;
  MHD_get_connection_values(c, MHD_HEADER_KIND, &count_content_length, &lengths);
  const char* te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
  const char* length = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (lengths > 1) return {MHD_HTTP_BAD_REQUEST, "more than one Content-Length\n"};
  if (lengths == 1 && te != nullptr) return {MHD_HTTP_BAD_REQUEST, "both Content-Length and Transfer-Encoding\n"};
  if (!get_or_head) return {MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n"};
  if (te != nullptr || (length != nullptr && std::strcmp(length, "0") != 0)) {
    return {MHD_HTTP_BAD_REQUEST, "a scrape carries no body\n"};
  }
  return {0, ""};
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method, const char*, const char*,
                      size_t*, void**) {
  // Answered on the first call, when the headers are in and before any body is read: MHD
  // then reads no body and closes the connection once the answer is out.
  const bool get_or_head =
      std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 || std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (const auto [status, why] = refusal(c, get_or_head); status != 0) return reply(c, status, why, "text/plain");
  if (std::strcmp(url, "/metrics") != 0) {
    return reply(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n", "text/plain");
  }
  const auto& render = *static_cast<const std::function<std::string()>*>(cls);
  return reply(c, MHD_HTTP_OK, render(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace

struct MetricsServer::Daemon {
  Loop loop;
};

MetricsServer::MetricsServer(const std::string& address, std::function<std::string()> render, const std::string& what)
    : render_(std::move(render)), daemon_(std::make_unique<Daemon>()) {
  const auto [host, port] = split_host_port(address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    throw InputError(what + ": cannot resolve '" + address + "': " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> hold(found, freeaddrinfo);
  const bool v6 = found->ai_family == AF_INET6;
  // No MHD_USE_INTERNAL_POLLING_THREAD: the loop is ours (Loop::run), so that it can
  // enforce the deadline between MHD's polls, on the thread that owns the connections.
  const unsigned flags = MHD_USE_AUTO | (v6 ? MHD_USE_IPv6 : 0);
  Loop& loop = daemon_->loop;
  loop.what = what;
  loop.d = MHD_start_daemon(
      flags, 0, nullptr, nullptr, &on_request, &render_, MHD_OPTION_SOCK_ADDR, found->ai_addr, MHD_OPTION_CONNECTION_LIMIT,
      kMaxConnections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxPerAddress, MHD_OPTION_CONNECTION_TIMEOUT,
      static_cast<unsigned>(kDeadline.count()), MHD_OPTION_CONNECTION_MEMORY_LIMIT, kConnectionMemory,
      MHD_OPTION_NOTIFY_CONNECTION, &on_connection, &loop, MHD_OPTION_END);
  if (loop.d == nullptr) {
    throw InputError(what + ": cannot serve metrics at '" + address +
                     "' (the address is not this host's, or the port is in use or not allowed)");
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(loop.d, MHD_DAEMON_INFO_BIND_PORT);
  port_ = info != nullptr ? info->port : 0;
  loop.start();
}

MetricsServer::~MetricsServer() = default;

}  // namespace hearsay
