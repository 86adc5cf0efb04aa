// A TCP relay on loopback that can cut its connection: a link that drops in the middle
// of a transfer, for the tests and benchmarks of resumption (engine_stream_test.cpp,
// bench/large_transfer_bench.cpp). It accepts at its own port and forwards each accepted
// connection, both ways, to `target`; cut_after(n) closes the connection being relayed
// once n more bytes have gone from the dialler to the target, and every later connection
// is relayed whole. Plain sockets and one thread per connection; a test's scale.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace hearsay::test {

class TcpRelay {
 public:
  // `target`: "127.0.0.1:PORT".
  explicit TcpRelay(const std::string& target) {
    const auto colon = target.rfind(':');
    target_port_ = static_cast<uint16_t>(std::stoi(target.substr(colon + 1)));
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    ::setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 8) != 0) {
      throw std::runtime_error("relay: cannot listen");
    }
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~TcpRelay() {
    stop_ = true;
    ::shutdown(listener_, SHUT_RDWR);
    ::close(listener_);
    acceptor_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : relays_) t.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // Cuts the connection being relayed once `bytes` more have gone from the dialler to the
  // target (counted from now).
  void cut_after(uint64_t bytes) {
    cut_at_ = forwarded_ + bytes;
    armed_ = true;
  }
  int connections() const { return connections_; }
  int cuts() const { return cuts_; }
  uint64_t forwarded() const { return forwarded_; }  // dialler to target, every connection

 private:
  void accept_loop() {
    while (!stop_) {
      const int in = ::accept(listener_, nullptr, nullptr);
      if (in < 0) return;
      const int out = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in t{};
      t.sin_family = AF_INET;
      t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      t.sin_port = htons(target_port_);
      if (::connect(out, reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) {
        ::close(in);
        ::close(out);
        continue;
      }
      ++connections_;
      std::lock_guard<std::mutex> lock(mu_);
      relays_.emplace_back([this, in, out] { relay(in, out); });
    }
  }
  void relay(int in, int out) {
    std::vector<char> buf(1 << 16);
    pollfd fds[2] = {{in, POLLIN, 0}, {out, POLLIN, 0}};
    while (!stop_) {
      if (::poll(fds, 2, 100) < 0) break;
      bool closed = false;
      for (int k = 0; k < 2 && !closed; ++k) {
        if ((fds[k].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
        size_t want = buf.size();
        if (k == 0 && armed_) want = static_cast<size_t>(std::min<uint64_t>(want, cut_at_ - std::min(cut_at_.load(), forwarded_.load())));
        const ssize_t n = want == 0 ? 0 : ::recv(fds[k].fd, buf.data(), want, 0);
        if (n <= 0) {
          closed = true;
          break;
        }
        if (!send_all(fds[1 - k].fd, buf.data(), static_cast<size_t>(n))) closed = true;
        if (k == 0) forwarded_ += static_cast<uint64_t>(n);
      }
      if (armed_ && forwarded_ >= cut_at_) {
        armed_ = false;
        ++cuts_;
        closed = true;
      }
      if (closed) break;
    }
    ::shutdown(in, SHUT_RDWR);
    ::shutdown(out, SHUT_RDWR);
    ::close(in);
    ::close(out);
  }
  static bool send_all(int fd, const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  uint16_t target_port_ = 0, port_ = 0;
  int listener_ = -1;
  std::atomic<bool> stop_{false}, armed_{false};
  std::atomic<uint64_t> cut_at_{0}, forwarded_{0};
  std::atomic<int> connections_{0}, cuts_{0};
  std::mutex mu_;
  std::vector<std::thread> relays_;  // GUARDED_BY(mu_)
  std::thread acceptor_;
};

}  // namespace hearsay::test
