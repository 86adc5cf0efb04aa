// /metrics over HTTP with libmicrohttpd (Debian's libmicrohttpd-dev): its own thread polls
// the socket, so a scrape never runs on the training loop. Requests carry no body that
// we read; anything but GET or HEAD of /metrics is answered with an error status.
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cstring>

#include "../transport/address.h"
#include "hearsay/error.h"
#include "hearsay/metrics.h"

namespace hearsay {

struct MetricsServer::Daemon {
  MHD_Daemon* d = nullptr;
  ~Daemon() {
    if (d != nullptr) MHD_stop_daemon(d);
  }
};

namespace {

constexpr unsigned kMaxConnections = 16;
constexpr unsigned kIdleTimeout_s = 10;

MHD_Result reply(MHD_Connection* c, unsigned status, const std::string& body, const char* type) {
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, "Allow", "GET, HEAD");
  const MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

MHD_Result on_request(void* cls, MHD_Connection* c, const char* url, const char* method, const char*, const char*,
                      size_t* upload_size, void** state) {
  // The first call for a request only announces it (its headers); a body, if a client
  // sends one, is skipped, and the answer goes with the last call.
  if (*state == nullptr) {
    static int announced;
    *state = &announced;
    return MHD_YES;
  }
  if (*upload_size != 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0, head = std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (!get && !head) return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", "text/plain");
  if (std::strcmp(url, "/metrics") != 0) return reply(c, MHD_HTTP_NOT_FOUND, "not found: the metrics are at /metrics\n", "text/plain");
  const auto& render = *static_cast<const std::function<std::string()>*>(cls);
  return reply(c, MHD_HTTP_OK, render(), "text/plain; version=0.0.4; charset=utf-8");
}

}  // namespace

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
  const unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | (v6 ? MHD_USE_IPv6 : 0);
  daemon_->d = MHD_start_daemon(flags, 0, nullptr, nullptr, &on_request, &render_, MHD_OPTION_SOCK_ADDR, found->ai_addr,
                                MHD_OPTION_CONNECTION_LIMIT, kMaxConnections, MHD_OPTION_CONNECTION_TIMEOUT, kIdleTimeout_s,
                                MHD_OPTION_END);
  if (daemon_->d == nullptr) {
    throw InputError(what + ": cannot serve metrics at '" + address +
                     "' (the address is not this host's, or the port is in use or not allowed)");
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_->d, MHD_DAEMON_INFO_BIND_PORT);
  port_ = info != nullptr ? info->port : 0;
}

MetricsServer::~MetricsServer() = default;

}  // namespace hearsay
