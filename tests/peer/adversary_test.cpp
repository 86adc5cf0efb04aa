// Real hearsay-peer processes on loopback against a hostile neighbour played by this test:
// an insider that holds the cluster secret (a compromised or broken site) and sends NaN
// models, models of absurd norm and a flood of synchronous updates for future rounds.
// The honest peers must refuse those updates, quarantine the sender, keep their memory
// bounded and train on with each other.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>

#include "hearsay/wire.pb.h"
#include "hearsay/transport.h"
#include "../../src/transport/session.h"
#include "test_util.h"

using namespace hearsay;
using test::TempDir;
using test::write_file;

namespace {

using SteadyClock = std::chrono::steady_clock;
constexpr const char* kSecret = "adversary-test-secret-0123456789";

// A child process running hearsay-peer, its output in a file; tracks its peak RSS.
struct PeerProcess {
  pid_t pid = -1;
  std::string out_path;
  long peak_rss_kb = 0;
  long baseline_rss_kb = 0;  // once it is training, before anything hostile arrives
  int status = -1;

  // `shell_prefix`: commands to run first in the child's shell (e.g. "ulimit -n 256;").
  PeerProcess(const std::string& args, const std::string& out, const std::string& shell_prefix = "") : out_path(out) {
    const std::string cmd = shell_prefix + "exec env HEARSAY_SECRET=" + std::string(kSecret) + " " + HEARSAY_BIN_DIR +
                            "/hearsay-peer --quiet " + args + " > " + out + " 2>&1";
    pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
  }
  ~PeerProcess() {
    if (status < 0 && pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  // What the process holds beyond its own start-up (libraries such as CUDA's map hundreds
  // of MB in some builds): the peak since the baseline was taken.
  long growth_kb() const { return peak_rss_kb - baseline_rss_kb; }
  void take_baseline() {
    sample_rss();
    baseline_rss_kb = peak_rss_kb;
  }
  void sample_rss() {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string key;
    while (in >> key) {
      if (key == "VmRSS:") {
        long kb = 0;
        in >> kb;
        peak_rss_kb = std::max(peak_rss_kb, kb);
        return;
      }
    }
  }
  // Polls (sampling RSS) until the process exits or `seconds` pass. True if it exited.
  bool poll(double seconds) {
    const auto deadline = SteadyClock::now() + std::chrono::duration<double>(seconds);
    while (SteadyClock::now() < deadline) {
      if (status >= 0) return true;
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return true;
      }
      sample_rss();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::string output() const { return test::read_file(out_path); }
};

// a, b, c: this test plays b. a listens first; b and c dial a; c dials b.
std::string cluster_config(const TempDir& dir, int base_port, int epochs = 20, bool tls = true) {
  const std::string cfg = R"(
    name: "adversary"
    seed: 3
    model { kind: MLP hidden: [256, 256] }
    data { format: SYNTHETIC synthetic_train: 6000 synthetic_test: 1000 synthetic_dim: 64 num_classes: 4 }
    optim { lr: 0.05 momentum: 0.9 }
    train { batch_size: 32 epochs: )" + std::to_string(epochs) + R"( }
    log { every_steps: 50 }
    cluster {
      id: "adversary"
      secret_env: "HEARSAY_SECRET"
      connect_timeout_s: 10
      tls: )" + std::string(tls ? "true" : "false") + R"(
      peers { name: "a" address: "127.0.0.1:)" + std::to_string(base_port) + R"(" }
      peers { name: "b" address: "127.0.0.1:)" + std::to_string(base_port + 1) + R"(" }
      peers { name: "c" address: "127.0.0.1:)" + std::to_string(base_port + 2) + R"(" }
      gossip { algorithm: "adpsgd" topology: "random" guard { quarantine_s: 600 } }
    }
  )";
  write_file(dir.file("cluster.textproto"), cfg);
  return dir.file("cluster.textproto");
}

TransportOptions insider(const std::string& name) {
  TransportOptions o;
  o.peer_id = name;
  o.cluster_id = "adversary";
  o.secret = kSecret;
  o.cluster_peers = {"a", "b", "c"};
  return o;
}

OutFrame model_frame(const std::vector<float>& values, uint64_t id, bool synchronous = false, uint64_t round = 0) {
  wire::Envelope e;
  auto* u = e.mutable_update();
  u->set_sender("b");
  u->set_clock(1);
  u->set_step(1);
  u->set_update_id(id);
  u->set_kind(synchronous ? wire::GRADIENT : wire::MODEL);
  u->set_tensor_length(values.size());
  u->set_segment_length(values.size());
  u->set_synchronous(synchronous);
  u->set_round(round);
  auto data = std::make_shared<std::vector<float>>(values);
  return make_frame(e, reinterpret_cast<const uint8_t*>(data->data()), data->size() * sizeof(float), data);
}

// A stranger's raw connection: it speaks the wire format by hand and forges what it likes.
struct RawClient {
  int fd = -1;
  FrameDecoder decoder;
  std::vector<wire::Envelope> got;
  bool closed = false;

  // `receive_buffer`: bytes of the socket's receive buffer (0: the kernel's default); a
  // small one makes a side that never reads fill up at once.
  explicit RawClient(int port, int receive_buffer = 0) {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (receive_buffer > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof receive_buffer);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) closed = true;
    timeval tv{0, 50000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() {
    if (fd >= 0) ::close(fd);
  }
  // False once the other side has closed the connection.
  bool send(const wire::Envelope& e) { return send_bytes(flatten(make_frame(e))); }
  bool send_bytes(const std::string& bytes) {
    for (size_t at = 0; at < bytes.size();) {
      const ssize_t n = ::send(fd, bytes.data() + at, bytes.size() - at, MSG_NOSIGNAL);
      if (n <= 0) return false;
      at += static_cast<size_t>(n);
    }
    return true;
  }
  void hello(const std::string& name, const std::string& nonce) {
    wire::Envelope e;
    auto* h = e.mutable_hello();
    h->set_peer_id(name);
    h->set_cluster_id("adversary");
    h->set_protocol_version(kProtocolVersion);
    h->set_nonce(nonce);
    send(e);
  }
  void proof(const std::string& name, const std::string& p) {
    wire::Envelope e;
    e.mutable_hello()->set_peer_id(name);
    e.mutable_hello()->set_proof(p);
    send(e);
  }
  // Reads until `done()` holds, the other side closes, or `seconds` pass.
  void read_until(const std::function<bool()>& done, double seconds = 5) {
    const auto deadline = SteadyClock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    while (!done() && !closed && SteadyClock::now() < deadline) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) closed = true;
      if (n <= 0) continue;
      decoder.feed(reinterpret_cast<const uint8_t*>(buf), static_cast<size_t>(n), [&](InFrame&& f) { got.push_back(*f.envelope); });
    }
  }
  std::string field(bool want_proof) const {
    for (const auto& e : got) {
      if (want_proof && e.hello().has_proof()) return e.hello().proof();
      if (!want_proof && e.hello().has_nonce()) return e.hello().nonce();
    }
    return {};
  }
  std::string nonce() {
    read_until([&] { return !field(false).empty(); });
    return field(false);
  }
  std::string proof() {
    read_until([&] { return !field(true).empty(); });
    return field(true);
  }
  // Whether the other side closed the connection within `seconds`.
  bool refused(double seconds = 5) {
    read_until([] { return false; }, seconds);
    return closed;
  }
};

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// The value of "key": in the last line of `log` holding `event`, as a number.
double last_number(const std::string& log, const std::string& event, const std::string& key) {
  const size_t at = log.rfind("\"event\":\"" + event + "\"");
  if (at == std::string::npos) return std::nan("");
  const size_t k = log.find("\"" + key + "\":", at);
  if (k == std::string::npos) return std::nan("");
  return std::atof(log.c_str() + k + key.size() + 3);
}

}  // namespace

TEST_CASE("adversary: NaN models, absurd norms and a future-round flood from an admitted neighbour are refused, "
          "it is quarantined, memory stays bounded and the honest peers train on") {
  TempDir dir;
  const int port = 17431;
  const std::string cfg = cluster_config(dir, port, 60);
  PeerProcess a("--config " + cfg + " --peer a --log " + dir.file("a.jsonl"), dir.file("a.out"));
  auto b = create_transport("tcp", insider("b"));
  std::mutex mu;
  std::map<std::string, uint64_t> tensor_length;  // learnt from what the honest peers send us
  b->set_receiver([&](const std::string& from, InFrame&& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (f.envelope->has_update()) tensor_length[from] = f.envelope->update().tensor_length();
  });
  b->listen("127.0.0.1:" + std::to_string(port + 1));
  b->connect("a", "127.0.0.1:" + std::to_string(port));
  PeerProcess c("--config " + cfg + " --peer c --log " + dir.file("c.jsonl"), dir.file("c.out"));
  auto wait_for_models = [&] {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(20);
    while (SteadyClock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (tensor_length.size() == 2) return tensor_length["a"];
      }
      a.poll(0.05);
      c.poll(0.05);
    }
    return uint64_t{0};
  };
  const uint64_t n = wait_for_models();
  CAPTURE(a.output());
  CAPTURE(c.output());
  REQUIRE(n > 0);
  a.take_baseline();
  c.take_baseline();
  std::vector<float> poison(n, 0.01f);
  poison[n / 2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> huge(n, 1e6f);
  uint64_t id = 1;
  auto poison_then_huge = [&](const std::string& to) {
    b->send(to, model_frame(poison, id++), nullptr);
    for (int i = 0; i < 5; ++i) b->send(to, model_frame(huge, id++), nullptr);
  };
  // A peer keeps only the newest model from each neighbour until its next mix, so bad
  // models sent back to back may be refused as one. a gets them one at a time, each
  // after a has refused the last, until it has refused the guard's 3 strikes in a row.
  auto refusals = [&] { return count(a.output(), "refused an update from 'b'"); };
  for (const std::vector<float>* bad : std::initializer_list<const std::vector<float>*>{&poison, &huge, &huge}) {
    const size_t before = refusals();
    b->send("a", model_frame(*bad, id++), nullptr);
    for (int i = 0; i < 400 && refusals() == before; ++i) {
      if (a.poll(0.025)) break;  // a finished training: the checks below say what it refused
    }
  }
  // c gets the flood (2,500 full-size updates for rounds nobody will reach: 8 MB if kept).
  for (uint64_t r = 0; r < 2500; ++r) b->send("c", model_frame(std::vector<float>(n, 1.0f), id++, true, 1000 + r), nullptr);
  poison_then_huge("c");
  // Keep at it while they train: everything must be refused without a word from us.
  for (int i = 0; i < 40 && !(a.poll(0.05) && c.poll(0.05)); ++i) {
    for (const std::string to : {"a", "c"}) b->send(to, model_frame(huge, id++), nullptr);
  }
  REQUIRE(a.poll(120));
  REQUIRE(c.poll(120));
  b->close();
  const std::string alog = test::read_file(dir.file("a.jsonl")), clog = test::read_file(dir.file("c.jsonl"));
  CAPTURE(a.output());
  CAPTURE(c.output());
  CHECK(a.status == 0);
  CHECK(c.status == 0);
  for (const std::string* log : {&alog, &clog}) {
    CHECK(log->find(R"("event":"quarantine")") != std::string::npos);
    CHECK(log->find(R"("neighbour":"b","state":"on")") != std::string::npos);
    CHECK(log->find(R"("event":"diverged")") == std::string::npos);
    CHECK(log->find(R"("quarantined":["b"])") != std::string::npos);
    // Trained on with the honest neighbour: well above chance (0.25) on 4 separable classes.
    CHECK(last_number(*log, "end", "final_test_acc") > 0.8);
  }
  CHECK(a.output().find("refused an update from 'b': non-finite: element " + std::to_string(n / 2) + " is NaN") !=
        std::string::npos);
  CHECK(a.output().find("refused an update from 'b': norm:") != std::string::npos);
  CHECK(c.output().find("refused an update from 'b': synchronous: already holding") != std::string::npos);
  // Stated bound (docs/ARCHITECTURE.md): whatever b sends, a peer of this size grows by
  // less than 96 MB over what it held once training (the flood alone is 8 MB if kept, and
  // 2,500 kept frames would be 2,500 x the model). A CPU-only build grows by under 1 MB;
  // one with the CUDA libraries linked in pages 35-55 MB of them in as it runs, in the
  // strangers' test as much as here.
  MESSAGE("peak RSS: a " << a.peak_rss_kb / 1024 << " MB (+" << a.growth_kb() / 1024 << " MB), c " << c.peak_rss_kb / 1024
                         << " MB (+" << c.growth_kb() / 1024 << " MB)");
  if (!test::kSanitized) {  // under a sanitizer a process's memory is mostly the sanitizer's
    CHECK(a.growth_kb() < 96 * 1024);
    CHECK(c.growth_kb() < 96 * 1024);
  }
}

TEST_CASE("adversary: strangers without the secret (reflection, relay, replay, a name outside the cluster, 1,000 idle "
          "connections past the descriptor limit) are not admitted, the peer keeps training and admits an honest peer after") {
  // TLS off, so the strangers reach the admission handshake itself (with TLS on, they fail
  // one layer earlier, at the pre-shared key).
  TempDir dir;
  const int port = 17434;
  const std::string cfg = cluster_config(dir, port, 60, /*tls=*/false);
  // a may hold at most 48 descriptors (fewer than its cap of unadmitted connections): the
  // flood below runs it out of them.
  PeerProcess a("--config " + cfg + " --peer a --log " + dir.file("a.jsonl"), dir.file("a.out"), "ulimit -n 48; ");
  PeerProcess c("--config " + cfg + " --peer c --log " + dir.file("c.jsonl"), dir.file("c.out"));
  const auto started = SteadyClock::now() + std::chrono::seconds(20);
  while (test::read_file(dir.file("a.jsonl")).find(R"("state":"up","neighbour":"c")") == std::string::npos && SteadyClock::now() < started) {
    a.poll(0.05);
  }
  CAPTURE(a.output());
  CAPTURE(c.output());
  a.take_baseline();
  const std::string zeros(32, 'z'), ones(32, '1');

  // Reflection: a's own name; then a's nonce of one connection played into a second one,
  // and the proof a signs there handed back on the first.
  RawClient own(port);
  own.hello("a", zeros);
  CHECK(own.refused());
  CHECK(own.field(true).empty());
  RawClient first(port), second(port);
  first.hello("c", zeros);
  const std::string a_nonce = first.nonce();
  REQUIRE(a_nonce.size() == 32);
  second.hello("c", a_nonce);
  const std::string reflected = second.proof();
  REQUIRE_FALSE(reflected.empty());
  first.proof("c", reflected);
  CHECK(first.refused());
  // Replay: that proof, with the same nonce, on a new connection (a's nonce is new).
  RawClient replay(port);
  replay.hello("c", a_nonce);
  replay.proof("c", reflected);
  CHECK(replay.refused());
  // Relay: claim c towards a, and have the real c sign a's nonce (claiming a towards c).
  RawClient to_a(port), to_c(port + 2);
  to_a.hello("c", ones);
  const std::string nonce_for_c = to_a.nonce();
  to_c.hello("a", nonce_for_c);
  const std::string relayed = to_c.proof();
  REQUIRE_FALSE(relayed.empty());
  to_a.proof("c", relayed);
  CHECK(to_a.refused());
  // A name the cluster does not have.
  RawClient mallory(port);
  mallory.hello("mallory", zeros);
  CHECK(mallory.refused());
  CHECK(mallory.field(true).empty());

  // 1,000 idle connections: more than a's descriptors; a caps the unadmitted ones, rides
  // out EMFILE, and its memory stays bounded.
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::max<rlim_t>(lim.rlim_cur, std::min<rlim_t>(lim.rlim_max, 4096));
  setrlimit(RLIMIT_NOFILE, &lim);
  {
    std::vector<std::unique_ptr<RawClient>> idle;
    for (int i = 0; i < 1000; ++i) idle.push_back(std::make_unique<RawClient>(port));
    a.poll(2.0);
  }
  // Afterwards an honest peer (b, holding the secret) is admitted.
  auto o = insider("b");
  o.tls = false;
  auto b = create_transport("tcp", o);
  std::atomic<int> frames{0};
  b->set_receiver([&](const std::string&, InFrame&&) { ++frames; });
  b->listen("127.0.0.1:" + std::to_string(port + 1));
  b->connect("a", "127.0.0.1:" + std::to_string(port));
  const auto deadline = SteadyClock::now() + std::chrono::seconds(15);
  while (!b->link_stats("a").connected && SteadyClock::now() < deadline) a.poll(0.05);
  CHECK(b->link_stats("a").connected);
  REQUIRE(a.poll(120));
  REQUIRE(c.poll(120));
  b->close();
  const std::string out = a.output();
  CHECK(a.status == 0);
  CHECK(c.status == 0);
  CHECK(frames > 0);  // b took part in the gossip once admitted
  CHECK(out.find("claims this peer's own name 'a'") != std::string::npos);
  // Reflection, replay, relay: each refused and logged (a link event each); on stderr the
  // same refusal from the same host is said once, then with its count.
  CHECK(count(test::read_file(dir.file("a.jsonl")), "admission: wrong proof") >= 3);
  CHECK(count(out, "admission: wrong proof") >= 1);
  CHECK(out.find("'mallory' is not a peer of cluster 'adversary'") != std::string::npos);
  CHECK(out.find("Too many open files") != std::string::npos);  // the acceptor said so, and went on
  for (const std::string name : {"a.jsonl", "c.jsonl"}) {
    const std::string log = test::read_file(dir.file(name));
    CHECK(last_number(log, "end", "final_test_acc") > 0.8);
  }
  MESSAGE("peak RSS: a " << a.peak_rss_kb / 1024 << " MB (+" << a.growth_kb() / 1024 << " MB over its start)");
  if (!test::kSanitized) CHECK(a.growth_kb() < 96 * 1024);  // 1,000 strangers cost it less than the stated bound
}

TEST_CASE("adversary: an admitted insider that floods probes and heartbeats and never reads is cut off at a bounded "
          "backlog, again at each reconnection, the peer's memory stays bounded and its honest neighbour trains on at its rate") {
  TempDir dir;
  const int port = 17441;
  std::string cfg_text = test::read_file(cluster_config(dir, port, 40, /*tls=*/false));
  const size_t every = cfg_text.find("every_steps: 50");
  REQUIRE(every != std::string::npos);
  cfg_text.replace(every, std::string("every_steps: 50").size(), "every_steps: 20");
  write_file(dir.file("cluster.textproto"), cfg_text);
  const std::string cfg = dir.file("cluster.textproto");
  PeerProcess a("--config " + cfg + " --peer a --log " + dir.file("a.jsonl"), dir.file("a.out"));
  PeerProcess c("--config " + cfg + " --peer c --log " + dir.file("c.jsonl"), dir.file("c.out"));
  const auto started = SteadyClock::now() + std::chrono::seconds(20);
  while (count(test::read_file(dir.file("c.jsonl")), R"("event":"step")") < 3 && SteadyClock::now() < started) a.poll(0.05);
  CAPTURE(a.output());
  CAPTURE(c.output());
  a.take_baseline();
  const size_t c_before = test::read_file(dir.file("c.jsonl")).size();

  // The insider holds the secret: it dials a as b, proves itself, then sends requests as
  // fast as it can and reads nothing (a receive buffer of 4 KiB, never drained).
  wire::Envelope probe, heartbeat;
  probe.mutable_probe()->set_seq(1);
  heartbeat.mutable_heartbeat()->set_seq(1);
  std::string burst;
  for (int i = 0; i < 512; ++i) burst += flatten(make_frame(i % 2 ? probe : heartbeat));
  int admitted = 0, cut_off = 0;
  const auto attack_ends = SteadyClock::now() + std::chrono::seconds(6);
  while (SteadyClock::now() < attack_ends) {
    RawClient b(port, 4096);
    const std::string mine(32, 'b');
    b.hello("b", mine);
    const std::string theirs = b.nonce();
    if (theirs.size() != 32) {
      a.poll(0.1);  // a may still hold the last connection under b's name
      continue;
    }
    b.proof("b", admission_proof(kSecret, AdmissionTranscript{"adversary", "b", "a", mine, theirs}, Role::kDialler));
    ++admitted;
    // Until a closes the connection (a send fails) or the attack's time is up.
    while (SteadyClock::now() < attack_ends && b.send_bytes(burst)) a.sample_rss();
    if (SteadyClock::now() < attack_ends) ++cut_off;
  }
  const size_t c_during = test::read_file(dir.file("c.jsonl")).size();
  REQUIRE(a.poll(180));
  REQUIRE(c.poll(180));
  const std::string alog = test::read_file(dir.file("a.jsonl")), clog = test::read_file(dir.file("c.jsonl"));
  CHECK(a.status == 0);
  CHECK(c.status == 0);
  CHECK(admitted >= 2);
  CHECK(cut_off >= 2);  // closed by a each time, not by the attack's end
  CHECK((a.output() + alog).find("backlog: 'b' sent 4096 requests while 256 replies to it waited unread; closed") != std::string::npos);
  for (const std::string* log : {&alog, &clog}) CHECK(last_number(*log, "end", "final_test_acc") > 0.8);
  // c's pace while a was attacked, against its pace before: the step events' throughput,
  // medians of each part of its log.
  auto median_rate = [&](size_t from, size_t to) {
    std::vector<double> rates;
    for (size_t at = clog.find(R"("event":"step")", from); at != std::string::npos && at < to; at = clog.find(R"("event":"step")", at + 1)) {
      const size_t k = clog.find("\"samples_per_s\":", at);
      if (k != std::string::npos) rates.push_back(std::atof(clog.c_str() + k + 16));
    }
    std::sort(rates.begin(), rates.end());
    return rates.empty() ? 0.0 : rates[rates.size() / 2];
  };
  const double before = median_rate(0, c_before), during = median_rate(c_before, c_during);
  MESSAGE("insider admitted " << admitted << " times, cut off " << cut_off << " times; a's peak RSS " << a.peak_rss_kb / 1024
                              << " MB (+" << a.growth_kb() / 1024 << " MB); c's samples/s " << before << " before, " << during
                              << " during the attack");
  CHECK(during > 0.5 * before);
  // Stated bound (docs/ARCHITECTURE.md, "Bounds"): 256 replies of under 100 bytes per
  // connection, and the sockets' buffers; 64 MB covers what CUDA's libraries page in.
  if (!test::kSanitized) CHECK(a.growth_kb() < 64 * 1024);
}

TEST_CASE("adversary: a synchronous part of finite 3e38s from an admitted insider is refused before it is added (dgc, demo), "
          "named in the log, and the honest peers stop saying so, not as divergence") {
  for (const std::string algorithm : {"dgc", "demo"}) {
    CAPTURE(algorithm);
    TempDir dir;
    const int port = algorithm == "dgc" ? 17451 : 17454;
    std::string text = test::read_file(cluster_config(dir, port, 5, /*tls=*/false));
    const size_t at = text.find("gossip { algorithm: \"adpsgd\" topology: \"random\" guard { quarantine_s: 600 } }");
    REQUIRE(at != std::string::npos);
    const std::string gossip = algorithm == "dgc" ? "gossip { algorithm: \"dgc\" codec { name: \"topk\" density: 0.01 } }"
                                                  : "gossip { algorithm: \"demo\" }";
    text.replace(at, std::string("gossip { algorithm: \"adpsgd\" topology: \"random\" guard { quarantine_s: 600 } }").size(), gossip);
    if (algorithm == "demo") text.replace(text.find("optim { lr: 0.05 momentum: 0.9 }"), 33, "optim { lr: 0.05 }");
    write_file(dir.file("cluster.textproto"), text);
    const std::string cfg = dir.file("cluster.textproto");
    PeerProcess a("--config " + cfg + " --peer a --log " + dir.file("a.jsonl"), dir.file("a.out"));
    auto o = insider("b");
    o.tls = false;
    auto b = create_transport("tcp", o);
    std::mutex mu;
    std::map<std::string, uint64_t> n;  // each honest peer's, once its link to b carries its part
    b->set_receiver([&](const std::string& from, InFrame&& f) {
      std::lock_guard<std::mutex> lock(mu);
      if (f.envelope->has_update()) n[from] = f.envelope->update().tensor_length();
    });
    b->listen("127.0.0.1:" + std::to_string(port + 1));
    b->connect("a", "127.0.0.1:" + std::to_string(port));
    PeerProcess c("--config " + cfg + " --peer c --log " + dir.file("c.jsonl"), dir.file("c.out"));
    const auto deadline = SteadyClock::now() + std::chrono::seconds(30);
    // Both links up and both peers in round 0 (each sent b its part): a send before a's
    // link to b was admitted would be lost, and a would wait out its sync timeout.
    uint64_t len = 0;
    while (len == 0 && SteadyClock::now() < deadline && !a.poll(0.05)) {
      std::lock_guard<std::mutex> lock(mu);
      if (n.size() == 2) len = n["a"];
    }
    CAPTURE(a.output());
    CAPTURE(c.output());
    REQUIRE(len > 0);
    // Round 0's part, to both: finite, and 3e38 each.
    for (const std::string to : {"a", "c"}) b->send(to, model_frame(std::vector<float>(len, 3e38f), 1, true, 0), nullptr);
    REQUIRE(a.poll(60));
    REQUIRE(c.poll(60));
    b->close();
    for (PeerProcess* p : {&a, &c}) {
      const std::string out = p->output();
      CHECK(p->status == 2);
      CHECK(out.find("refused peer b's update for round 0 (norm: ") != std::string::npos);
      CHECK(out.find("diverged") == std::string::npos);
    }
    for (const std::string name : {"a.jsonl", "c.jsonl"}) {
      const std::string log = test::read_file(dir.file(name));
      CHECK(log.find(R"("event":"refused","neighbour":"b","round":0,"reason":"norm: )") != std::string::npos);
      CHECK(log.find(R"("event":"diverged")") == std::string::npos);
      CHECK(log.find(R"("event":"step")") == std::string::npos);  // nothing of it was ever stepped on
    }
  }
}
