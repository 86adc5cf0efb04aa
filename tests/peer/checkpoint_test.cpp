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

#include "hearsay/checkpoint.pb.h"
#include "hearsay/config.pb.h"
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

namespace {

std::unique_ptr<Optimizer> adamw(Backend& b, size_t n) {
  OptimizerSpec spec;
  spec.name = "adamw";
  spec.weight_decay = 0.05f;
  return create_optimizer(b, n, spec);
}

std::unique_ptr<Optimizer> sgd_with_momentum(Backend& b, size_t n) {
  OptimizerSpec spec;
  spec.momentum = 0.9f;
  return create_optimizer(b, n, spec);
}

}  // namespace

TEST_CASE("checkpoint: AdamW's moments and step count round-trip through a file, and a foreign optimizer is refused") {
  TempDir dir;
  const std::string path = dir.file("opt.ckpt");
  auto b = create_backend("cpu", 1);
  const size_t n = 4;
  const auto a = adamw(*b, n);
  std::vector<float> w{0.5f, -1.0f, 2.0f, 0.25f}, g(n);
  for (int s = 0; s < 6; ++s) {
    for (size_t i = 0; i < n; ++i) g[i] = 0.3f * w[i] - 0.1f * float(s) + float(i) * 0.2f;
    a->step(w.data(), g.data(), 0.01f);
  }
  ckpt::Checkpoint c;
  c.set_num_params(n);
  save_optimizer_state(a->save_state(), c);
  write_checkpoint(path, c);
  const auto back = read_checkpoint(path);
  REQUIRE(back.has_value());
  CHECK(back->optimizer() == "adamw");
  CHECK(back->optimizer_steps() == 6);
  CHECK(back->optimizer_buffers_size() == 2);
  CHECK(back->velocity().empty());  // the fields of old checkpoints are no longer written
  CHECK(back->adam_m().empty());
  const OptimizerState s = load_optimizer_state(*back, "checkpoint " + path);
  const OptimizerState want = a->save_state();
  CHECK(s.optimizer == "adamw");
  CHECK(s.steps == 6);
  CHECK(s.buffers == want.buffers);
  const auto r = adamw(*b, n);
  r->load_state(s, "checkpoint " + path);
  std::vector<float> wr = w;
  a->step(w.data(), g.data(), 0.01f);
  r->step(wr.data(), g.data(), 0.01f);
  CHECK(wr == w);

  // For another model, a damaged name or buffer, or an SGD config.
  CHECK_THROWS_WITH_AS(adamw(*b, n + 1)->load_state(s, "ck"),
                       doctest::Contains("ck: the optimizer's buffer 'm' holds 4 values, the model has 5 parameters"), InputError);
  ckpt::Checkpoint odd = *back;
  odd.set_optimizer("lion");
  CHECK_THROWS_WITH_AS(load_optimizer_state(odd, "ck"),
                       doctest::Contains("ck: holds the state of an unknown optimizer 'lion' (known: adamw, sgd)"), InputError);
  ckpt::Checkpoint ragged = *back;
  ragged.mutable_optimizer_buffers(1)->mutable_values()->pop_back();
  CHECK_THROWS_WITH_AS(load_optimizer_state(ragged, "ck"), doctest::Contains("ck: the optimizer's buffer 'v' has 15 bytes"),
                       InputError);
  ckpt::Checkpoint twice = *back;
  *twice.add_optimizer_buffers() = back->optimizer_buffers(0);
  CHECK_THROWS_WITH_AS(load_optimizer_state(twice, "ck"), doctest::Contains("ck: the optimizer's buffer 'm' appears twice"),
                       InputError);
  const auto sgd = sgd_with_momentum(*b, n);
  CHECK_THROWS_WITH_AS(sgd->load_state(s, "checkpoint " + path),
                       doctest::Contains("holds the state of optimizer 'adamw', but this config's optim.optimizer is 'sgd'"), InputError);
}

TEST_CASE("checkpoint: one written before optimizer_buffers still resumes: SGD's velocity, AdamW's moments") {
  auto b = create_backend("cpu", 1);
  const size_t n = 4;
  // Before AdamW: no optimizer field, SGD's velocity in its own field. An AdamW config
  // refuses it rather than starting its moments from nothing.
  ckpt::Checkpoint old;
  const std::vector<float> vel{1, 2, 3, 4};
  old.set_velocity(floats_to_bytes(vel.data(), vel.size()));
  old.set_optimizer_steps(9);
  const OptimizerState os = load_optimizer_state(old, "old");
  CHECK(os.optimizer == "sgd");
  CHECK(os.steps == 9);
  REQUIRE(os.buffers.count("velocity") == 1);
  CHECK(os.buffers.at("velocity") == vel);
  CHECK_THROWS_WITH_AS(adamw(*b, n)->load_state(os, "old"),
                       doctest::Contains("optimizer 'sgd', but this config's optim.optimizer is 'adamw'"), InputError);
  const auto sgd = sgd_with_momentum(*b, n);
  sgd->load_state(os, "old");
  CHECK(sgd->steps() == 9);
  CHECK(sgd->save_state().buffers.at("velocity") == vel);

  // AdamW's moments in adam_m and adam_v, as the first AdamW checkpoints kept them.
  ckpt::Checkpoint old_adamw;
  const std::vector<float> m{0.1f, -0.2f, 0.3f, 0.0f}, v{0.01f, 0.04f, 0.09f, 0.0f};
  old_adamw.set_optimizer("adamw");
  old_adamw.set_optimizer_steps(3);
  old_adamw.set_adam_m(floats_to_bytes(m.data(), m.size()));
  old_adamw.set_adam_v(floats_to_bytes(v.data(), v.size()));
  const auto a = adamw(*b, n);
  a->load_state(load_optimizer_state(old_adamw, "old"), "old");
  const OptimizerState back = a->save_state();
  CHECK(back.steps == 3);
  CHECK(back.buffers.at("m") == m);
  CHECK(back.buffers.at("v") == v);
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

// The status a process exited with, or minus the signal that ended it: a peer that stops
// on SIGTERM exits 143 itself, which a death by SIGTERM must not pass for.
int wait_exit_status(pid_t pid) {
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
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

// Loopback ports 17397-17398, which no other test uses (peer_test's cases run in parallel).
// Steps take a fixed 20 ms (emulated_step_s), so the pace does not depend on how loaded
// the machine is or on a sanitizer's slowdown.
TEST_CASE("checkpoint: a peer killed with SIGKILL and restarted resumes from its checkpoint's step and rejoins") {
  TempDir dir;
  test::write_file(dir.file("c.textproto"), R"(
    seed: 5
    model { kind: LOGREG }
    data { format: SYNTHETIC synthetic_train: 4096 synthetic_dim: 16 num_classes: 4 }
    train { batch_size: 16 max_steps: 2000 epochs: 0 eval_every_steps: 1000000 emulated_step_s: 0.02 }
    log { every_steps: 10 }
    checkpoint { dir: ")" + dir.file("ckpt") + R"(" every_steps: 40 }
    cluster {
      secret_env: "HEARSAY_TEST_CHECKPOINT_SECRET"
      peers { name: "a" address: "127.0.0.1:17397" }
      peers { name: "b" address: "127.0.0.1:17398" }
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
  INFO("a's output: " << test::read_file(dir.file("a.out")) << "\nb's output: " << test::read_file(dir.file("b.out")));
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
  // Both stop cleanly on SIGTERM, a writing a last checkpoint, and exit as a shell
  // reports a process SIGTERM ended (143).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(a, SIGTERM);
  kill(b, SIGTERM);
  CHECK(wait_exit_status(a) == 143);
  CHECK(wait_exit_status(b) == 143);
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
