// Checkpoints: the file round-trips, a damaged one is refused, and a peer killed with
// SIGKILL and started again goes on from its checkpoint's step.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <fcntl.h>
#include <regex>
#include <thread>

#include "hearsay/checkpoint.pb.h"
#include "hearsay/config.pb.h"
#include "hearsay/backend.h"
#include "hearsay/checkpoint.h"
#include "hearsay/config.h"
#include "hearsay/log.h"
#include "hearsay/peer.h"
#include "hearsay/error.h"
#include "hearsay/optim.h"
#include "test_util.h"

using namespace hearsay;
using hearsay::test::TempDir;

TEST_CASE("checkpoint: a file round-trips, a damaged, truncated or foreign one is refused with the reason") {
  TempDir dir;
  const std::string path = dir.file("sub/p.ckpt");
  CHECK_FALSE(read_checkpoint(path, 1 << 20).has_value());  // none yet: a fresh start
  ckpt::Checkpoint c;
  c.set_peer("p");
  c.set_step(123);
  const std::vector<float> params{1.5f, -2.0f, 3.25f};
  c.set_params(floats_to_bytes(params.data(), params.size()));
  write_checkpoint(path, c);
  const auto back = read_checkpoint(path, 1 << 20);
  REQUIRE(back.has_value());
  CHECK(back->step() == 123);
  std::vector<float> got(3);
  bytes_to_floats(back->params(), got.data(), 3, "params");
  CHECK(got == params);
  CHECK_THROWS_WITH_AS(bytes_to_floats(back->params(), got.data(), 4, "params"), doctest::Contains("another model"), InputError);

  std::string bytes = test::read_file(path);
  auto refused = [&](const std::string& content, const std::string& why) {
    test::write_file(path, content);
    CHECK_THROWS_WITH_AS(read_checkpoint(path, 1 << 20), doctest::Contains(why.c_str()), InputError);
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
  const auto back = read_checkpoint(path, 1 << 20);
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

TEST_CASE("checkpoint: a FIFO, a link to a device and a file larger than the run can need are refused before they are read") {
  TempDir dir;
  const std::string fifo = dir.file("fifo.ckpt"), zero = dir.file("zero.ckpt"), huge = dir.file("huge.ckpt");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE(::symlink("/dev/zero", zero.c_str()) == 0);
  // 3 GiB, sparse: nothing of it is on disk, and nothing of it may be read.
  const int fd = ::open(huge.c_str(), O_WRONLY | O_CREAT, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, off_t{3} << 30) == 0);
  ::close(fd);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(read_checkpoint(fifo, 1 << 20), doctest::Contains("not a regular file (a FIFO)"), InputError);
  CHECK_THROWS_WITH_AS(read_checkpoint(zero, 1 << 20), doctest::Contains("not a regular file (a device)"), InputError);
  CHECK_THROWS_WITH_AS(read_checkpoint(huge, 64 << 20),
                       doctest::Contains("3221225472 bytes, more than this run's model and state can need (67108864 at most)"),
                       InputError);
  // Each refused at once: no wait for a FIFO's writer, no pass over gigabytes.
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
}

TEST_CASE("checkpoint: non-finite or absurd values, a step or time out of range, and another run's provenance are refused, naming what") {
  const CheckpointExpectation want{"a", "cl", "seed=1;model=0a0a0a0a;optim=1b1b1b1b;batch=16", 3, 100};
  ckpt::Checkpoint good;
  good.set_peer("a");
  good.set_cluster("cl");
  good.set_training_digest(want.training_digest);
  good.set_num_params(3);
  good.set_step(40);
  good.set_wall_s(12.5);
  const std::vector<float> params{0.5f, -1.0f, 2.0f};
  good.set_params(floats_to_bytes(params.data(), 3));
  CHECK_NOTHROW(vet_checkpoint_values(good, want, "ck"));
  CHECK(checkpoint_provenance_mismatch(good, want).empty());

  auto with_param = [&](float v) {
    ckpt::Checkpoint c = good;
    std::vector<float> p = params;
    p[1] = v;
    c.set_params(floats_to_bytes(p.data(), 3));
    return c;
  };
  auto refused = [&](const ckpt::Checkpoint& c, const std::string& why) {
    CHECK_THROWS_WITH_AS(vet_checkpoint_values(c, want, "ck"), doctest::Contains(why.c_str()), InputError);
  };
  refused(with_param(std::numeric_limits<float>::quiet_NaN()), "ck: parameter element 1 is nan");
  refused(with_param(std::numeric_limits<float>::infinity()), "ck: parameter element 1 is inf");
  refused(with_param(3e38f), "ck: parameter element 1 is 30000000054977");
  ckpt::Checkpoint momentum = good;
  const std::vector<float> nan_velocity{0.0f, std::nanf(""), 0.0f};
  auto* b = momentum.add_optimizer_buffers();
  b->set_name("velocity");
  b->set_values(floats_to_bytes(nan_velocity.data(), 3));
  refused(momentum, "ck: optimizer buffer 'velocity' element 1 is nan");
  for (const int64_t step : {int64_t{-5}, int64_t{1} << 62, int64_t{101}}) {
    ckpt::Checkpoint c = good;
    c.set_step(step);
    refused(c, "its step " + std::to_string(step) + " is outside this run's 0..100");
  }
  ckpt::Checkpoint timeless = good;
  timeless.set_wall_s(std::nan(""));
  refused(timeless, "its time (wall_s nan) is not a time");
  ckpt::Checkpoint bigger = good;
  bigger.set_num_params(4);
  refused(bigger, "holds a model of 4 parameters, this config's has 3");

  ckpt::Checkpoint other = good;
  other.set_peer("b");
  other.set_cluster("elsewhere");
  other.set_training_digest("seed=1;model=0a0a0a0a;optim=2c2c2c2c;batch=32");
  const std::string why = checkpoint_provenance_mismatch(other, want);
  CHECK(why.find("it is peer 'b's, this is 'a'") != std::string::npos);
  CHECK(why.find("it is of cluster 'elsewhere', this is 'cl'") != std::string::npos);
  CHECK(why.find("trained under another config (its batch, optim differs from this config's)") != std::string::npos);
}

namespace {

std::string run_config(double lr, uint64_t seed, const std::string& ckpt_dir, bool weights_from_other_run = false) {
  return "name: \"vet\"\nseed: " + std::to_string(seed) +
         "\nmodel { kind: MLP hidden: [16] }\n"
         "data { format: SYNTHETIC synthetic_train: 512 synthetic_test: 64 synthetic_dim: 8 num_classes: 4 }\n"
         "optim { lr: " + std::to_string(lr) + " }\ntrain { batch_size: 16 max_steps: 20 epochs: 100 }\n"
         "log { every_steps: 10 }\ncheckpoint { dir: \"" + ckpt_dir + "\" weights_from_other_run: " +
         (weights_from_other_run ? "true" : "false") + " }\n";
}

TrainResult train(const std::string& text) {
  EventLog log("", "vet");
  Peer peer(peer_spec(parse_config(text, "vet.textproto")), log, nullptr);
  return peer.run();
}

}  // namespace

TEST_CASE("checkpoint: a checkpoint of another config (another lr and seed) is refused with what differs, or taken as initial "
          "weights when asked") {
  TempDir dir;
  const std::string ckpt = dir.file("ckpt");
  CHECK(train(run_config(0.05, 1, ckpt)).steps == 20);
  // The same run, resumed: at its end already.
  CHECK(train(run_config(0.05, 1, ckpt)).steps == 20);
  CHECK_THROWS_WITH_AS(train(run_config(0.2, 7, ckpt)),
                       doctest::Contains("not this run's checkpoint: it was trained under another config (its optim, seed differs"),
                       InputError);
  // Asked for: its parameters, from step 0.
  const TrainResult r = train(run_config(0.2, 7, ckpt, true));
  const TrainResult fresh = train(run_config(0.2, 7, dir.file("fresh")));
  CHECK(r.steps == 20);
  CHECK(r.losses.size() == 20);  // all 20 steps taken: from step 0
  CHECK(r.losses[0] != fresh.losses[0]);  // but not from this config's own initial weights
}
