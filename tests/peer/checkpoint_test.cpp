// Checkpoints: the file round-trips, a damaged one is refused, and a peer killed with
// SIGKILL and started again goes on from its checkpoint's step.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fcntl.h>
#include <regex>
#include <thread>

#include "hearsay/backend.h"
#include "hearsay/checkpoint.h"
#include "hearsay/error.h"
#include "hearsay/optim.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::TempDir;

TEST_CASE("checkpoint: a file round-trips, a damaged, truncated or foreign one is refused with the reason") {
  TempDir dir;
  const std::string path = dir.file("sub/p.ckpt");
  CHECK_FALSE(read_checkpoint(path).has_value());  // none yet: a fresh start
  ckpt::Checkpoint c;
  c.set_peer("p");
  c.set_step(123);
  const std::vector<float> params{1.5f, -2.0f, 3.25f};
  c.set_params(floats_to_bytes(params.data(), params.size()));
  write_checkpoint(path, c);
  const auto back = read_checkpoint(path);
  REQUIRE(back.has_value());
  CHECK(back->step() == 123);
  std::vector<float> got(3);
  bytes_to_floats(back->params(), got.data(), 3, "params");
  CHECK(got == params);
  CHECK_THROWS_WITH_AS(bytes_to_floats(back->params(), got.data(), 4, "params"), doctest::Contains("another model"), InputError);

  std::string bytes = test::read_file(path);
  auto refused = [&](const std::string& content, const std::string& why) {
    test::write_file(path, content);
    CHECK_THROWS_WITH_AS(read_checkpoint(path), doctest::Contains(why.c_str()), InputError);
  };
  std::string flipped = bytes;
  flipped[bytes.size() - 2] ^= 0x20;
  refused(flipped, "checksum mismatch");
  refused(bytes.substr(0, bytes.size() - 5), "truncated");
  refused("HSCK", "shorter than its header");
  refused(std::string(40, 'x'), "bad magic");
}

TEST_CASE("checkpoint: AdamW's moments and step count round-trip through a file, and a foreign kind is refused") {
  TempDir dir;
  const std::string path = dir.file("opt.ckpt");
  auto b = create_backend("cpu", 1);
  const size_t n = 4;
  SgdParams ap;
  ap.kind = OptimizerKind::kAdamW;
  ap.weight_decay = 0.05f;
  Sgd a(*b, n, ap);
  std::vector<float> w{0.5f, -1.0f, 2.0f, 0.25f}, g(n);
  for (int s = 0; s < 6; ++s) {
    for (size_t i = 0; i < n; ++i) g[i] = 0.3f * w[i] - 0.1f * float(s) + float(i) * 0.2f;
    a.step(w.data(), g.data(), 0.01f);
  }
  ckpt::Checkpoint c;
  c.set_num_params(n);
  save_optimizer_state(a.state(), c);
  write_checkpoint(path, c);
  const auto back = read_checkpoint(path);
  REQUIRE(back.has_value());
  CHECK(back->optimizer() == "adamw");
  CHECK(back->optimizer_steps() == 6);
  CHECK(back->velocity().empty());
  const Sgd::State s = load_optimizer_state(*back, n, "checkpoint " + path);
  const Sgd::State want = a.state();
  CHECK(s.kind == OptimizerKind::kAdamW);
  CHECK(s.steps == 6);
  CHECK(s.m == want.m);
  CHECK(s.v == want.v);
  Sgd r(*b, n, ap);
  r.restore(s, "checkpoint " + path);
  std::vector<float> wr = w;
  a.step(w.data(), g.data(), 0.01f);
  r.step(wr.data(), g.data(), 0.01f);
  CHECK(wr == w);

  // For another model, a damaged kind, or an SGD config.
  CHECK_THROWS_WITH_AS(load_optimizer_state(*back, n + 1, "ck"), doctest::Contains("ck: adam_m"), InputError);
  ckpt::Checkpoint odd = *back;
  odd.set_optimizer("lion");
  CHECK_THROWS_WITH_AS(load_optimizer_state(odd, n, "ck"), doctest::Contains("ck: holds the state of an unknown optimizer 'lion'"), InputError);
  Sgd sgd(*b, n, SgdParams{0.1f, 0.9f, 0.0f, false});
  CHECK_THROWS_WITH_AS(sgd.restore(s, "checkpoint " + path),
                       doctest::Contains("holds the state of optimizer 'adamw', but this config's optim.kind is 'sgd'"), InputError);

  // A checkpoint from before AdamW (no optimizer field) holds SGD's velocity: an AdamW
  // config refuses it rather than starting its moments from nothing.
  ckpt::Checkpoint old;
  const std::vector<float> vel{1, 2, 3, 4};
  old.set_velocity(floats_to_bytes(vel.data(), vel.size()));
  const Sgd::State os = load_optimizer_state(old, n, "old");
  CHECK(os.kind == OptimizerKind::kSgd);
  CHECK(os.velocity == vel);
  CHECK_THROWS_WITH_AS(r.restore(os, "old"), doctest::Contains("optimizer 'sgd', but this config's optim.kind is 'adamw'"), InputError);
  sgd.restore(os, "old");
  CHECK(sgd.state().velocity == vel);
}

namespace {

pid_t spawn(const std::vector<std::string>& args, const std::string& out) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// The largest step of the last `event` line of a log, or -1.
int64_t last_step_of(const std::string& log, const std::string& event) {
  const std::string text = test::read_file(log);
  const std::regex re("\"event\":\"" + event + "\",\"step\":([0-9]+)");
  int64_t last = -1;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), re); it != std::sregex_iterator(); ++it) {
    last = std::stoll((*it)[1]);
  }
  return last;
}

}  // namespace

TEST_CASE("checkpoint: a peer killed with SIGKILL and restarted resumes from its checkpoint's step and rejoins") {
  TempDir dir;
  test::write_file(dir.file("c.textproto"), R"(
    seed: 5
    model { kind: LOGREG }
    data { format: SYNTHETIC synthetic_train: 4096 synthetic_dim: 16 num_classes: 4 }
    train { batch_size: 16 max_steps: 2000 epochs: 0 eval_every_steps: 1000000 }
    log { every_steps: 10 }
    checkpoint { dir: ")" + dir.file("ckpt") + R"(" every_steps: 40 }
    cluster {
      secret_env: "HEARSAY_TEST_CHECKPOINT_SECRET"
      peers { name: "a" address: "127.0.0.1:17393" slowdown: 300 }
      peers { name: "b" address: "127.0.0.1:17394" slowdown: 300 }
      gossip { algorithm: "adpsgd" topology: "complete" }
    }
  )");
  setenv("HEARSAY_TEST_CHECKPOINT_SECRET", "checkpoint-test-secret", 1);  // the peers inherit it
  const std::string bin = std::string(HEARSAY_BIN_DIR) + "/hearsay-peer";
  auto args = [&](const std::string& name) {
    return std::vector<std::string>{bin, "--config", dir.file("c.textproto"), "--peer", name, "--quiet", "--log", dir.file(name + ".jsonl")};
  };
  const pid_t b = spawn(args("b"), dir.file("b.out"));
  pid_t a = spawn(args("a"), dir.file("a.out"));
  // Wait for a's second checkpoint, then kill it without warning.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (last_step_of(dir.file("a.jsonl"), "checkpoint") < 80 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t saved = last_step_of(dir.file("a.jsonl"), "checkpoint");
  REQUIRE(saved >= 80);
  kill(a, SIGKILL);
  CHECK(wait_exit(a) == 128 + SIGKILL);
  const int64_t reached = last_step_of(dir.file("a.jsonl"), "step");
  MESSAGE("a: checkpoint at step " << saved << ", killed after step " << reached);
  // Started again, it picks up at the checkpoint, not at step 0.
  a = spawn(args("a"), dir.file("a.out"));
  const auto deadline2 = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (last_step_of(dir.file("a.jsonl"), "resume") < 0 && std::chrono::steady_clock::now() < deadline2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int64_t resumed = last_step_of(dir.file("a.jsonl"), "resume");
  CHECK(resumed >= saved);
  CHECK(resumed <= reached);
  // Both stop cleanly on SIGTERM, a writing a last checkpoint.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(a, SIGTERM);
  kill(b, SIGTERM);
  CHECK(wait_exit(a) == 0);
  CHECK(wait_exit(b) == 0);
  const std::string log = test::read_file(dir.file("a.jsonl"));
  const auto resume_at = log.find("\"event\":\"resume\"");
  REQUIRE(resume_at != std::string::npos);
  // Linked to b in each of its two lives; after the resume its steps count on from the
  // checkpoint.
  size_t ups = 0;
  for (auto at = log.find("\"state\":\"up\""); at != std::string::npos; at = log.find("\"state\":\"up\"", at + 1)) ++ups;
  CHECK(ups >= 2);
  const std::string after = log.substr(resume_at);
  const std::smatch m = [&] {
    std::smatch s;
    std::regex_search(after, s, std::regex("\"event\":\"step\",\"step\":([0-9]+)"));
    return s;
  }();
  REQUIRE(!m.empty());
  CHECK(std::stoll(m[1]) > resumed);
  CHECK(std::stoll(m[1]) <= resumed + 10);
  CHECK(last_step_of(dir.file("a.jsonl"), "checkpoint") > resumed);
}
