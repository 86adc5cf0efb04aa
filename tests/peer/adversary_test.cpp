// Real hearsay-peer processes on loopback against a hostile neighbour played by this test:
// an insider that holds the cluster secret (a compromised or broken site) and sends NaN
// models, models of absurd norm and a flood of synchronous updates for future rounds.
// The honest peers must refuse those updates, quarantine the sender, keep their memory
// bounded and train on with each other.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <thread>

#include "hearsay/transport.h"
#include "test_util.h"

using namespace hearsay;
using test::TempDir;
using test::write_file;

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kSecret = "adversary-test-secret-0123456789";

// A child process running hearsay-peer, its output in a file; tracks its peak RSS.
struct PeerProcess {
  pid_t pid = -1;
  std::string out_path;
  long peak_rss_kb = 0;
  int status = -1;

  PeerProcess(const std::string& args, const std::string& out) : out_path(out) {
    const std::string cmd = "exec env HEARSAY_SECRET=" + std::string(kSecret) + " " + HEARSAY_BIN_DIR +
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
    const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < deadline) {
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
std::string cluster_config(const TempDir& dir, int base_port) {
  const std::string cfg = R"(
    name: "adversary"
    seed: 3
    model { kind: MLP hidden: [256, 256] }
    data { format: SYNTHETIC synthetic_train: 6000 synthetic_test: 1000 synthetic_dim: 64 num_classes: 4 }
    optim { lr: 0.05 momentum: 0.9 }
    train { batch_size: 32 epochs: 20 }
    log { every_steps: 50 }
    cluster {
      id: "adversary"
      secret_env: "HEARSAY_SECRET"
      connect_timeout_s: 10
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
  const std::string cfg = cluster_config(dir, port);
  PeerProcess a("--config " + cfg + " --peer a --log " + dir.file("a.jsonl"), dir.file("a.out"));
  auto b = create_transport("tcp", insider("b"));
  std::mutex mu;
  std::map<std::string, uint64_t> tensor_length;  // learnt from what the honest peers send us
  b->set_receiver([&](const std::string& from, InFrame&& f) {
    std::lock_guard<std::mutex> lock(mu);
    if (f.envelope.has_update()) tensor_length[from] = f.envelope.update().tensor_length();
  });
  b->listen("127.0.0.1:" + std::to_string(port + 1));
  b->connect("a", "127.0.0.1:" + std::to_string(port));
  PeerProcess c("--config " + cfg + " --peer c --log " + dir.file("c.jsonl"), dir.file("c.out"));
  auto wait_for_models = [&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    while (Clock::now() < deadline) {
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
  std::vector<float> poison(n, 0.01f);
  poison[n / 2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> huge(n, 1e6f);
  uint64_t id = 1;
  // c first gets the flood (2,500 full-size updates for rounds nobody will reach: 8 MB if kept).
  for (uint64_t r = 0; r < 2500; ++r) b->send("c", model_frame(std::vector<float>(n, 1.0f), id++, true, 1000 + r), nullptr);
  for (const std::string to : {"a", "c"}) {
    b->send(to, model_frame(poison, id++), nullptr);
    for (int i = 0; i < 5; ++i) b->send(to, model_frame(huge, id++), nullptr);
  }
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
  // Stated bound (docs/ARCHITECTURE.md): a peer of this size stays under 150 MB whatever b sends.
  MESSAGE("peak RSS: a " << a.peak_rss_kb / 1024 << " MB, c " << c.peak_rss_kb / 1024 << " MB");
  CHECK(a.peak_rss_kb < 150 * 1024);
  CHECK(c.peak_rss_kb < 150 * 1024);
}
